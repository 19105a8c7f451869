"""Gradient accumulation (`train.accumulate: N`): N micro-batches of data.batch_size / N per
optimizer step train exactly as one batch of data.batch_size (SGD, AdamW, L2 regularization, an
epoch's padded last batch, the split on the devices or copied from the host, 1 device and a 2-D
mesh, the GPT with clipping and a schedule), count every token of the step, split each batch
along the data axis, refuse a batch they do not divide, and resume exactly. In this process, on
the session's 8 virtual CPUs."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
from conftest import RECIPES, ROOT, run_cli

from dtcli import models
from dtcli import pipeline as pipeline_lib
from dtcli import recipe as R
from dtcli import session as T
from dtcli import steps as steps_lib

# 180 digits in batches of 32: 6 steps an epoch, the last one 20 real examples and 12 padding,
# so 20 steps cross three padded batches, whose micro-batches hold unequal counts (a loss
# normalized per micro-batch instead of per step would differ there).
MLP = ["data.batch_size=32", "data.train_range=[0,180]", "train.steps_per_call=4"]
OPTIMIZERS = {
    "sgd": ["optimizer.name=sgd", "optimizer.learning_rate=0.05", "optimizer.momentum=0.9"],
    "adamw": ["optimizer.name=adamw", "optimizer.learning_rate=0.01"],
    # An L2 penalty on the first kernel: the regularization must count once per step.
    "sgd-l2": [
        "optimizer.name=sgd",
        "optimizer.learning_rate=0.05",
        "model.layers=[{Dense: {units: 128, activation: relu, kernel_regularizer: l2}},"
        " {Dense: {units: 10}}]",
    ],
}
# Weights: max |difference| over max |reference| per weight. SGD leaves float32 rounding as it
# is; Adam divides by sqrt(v) and amplifies it (DTENSOR_NOTES).
WEIGHTS_RTOL = {"sgd": 1e-5, "adamw": 1e-4, "sgd-l2": 1e-5}
MESHES = {"batch=1": 1, "batch=4,model=2": None}  # the mesh -> use_devices


def mlp_session(mesh: str, opt: str, n: int, extra: tuple[str, ...] = ()) -> T.Session:
    # DTensor on one device too: tests/test_xla.py checks XLA with accumulation.
    sets = [*MLP, *OPTIMIZERS[opt], f"train.accumulate={n}", "train.compile=dtensor", *extra]
    recipe = R.load(RECIPES / "quickstart.yaml", R.Overrides(sets, mesh, "cpu:8"))
    return T.prepare(recipe, splits=("train",), use_devices=MESHES[mesh])


def train(s: T.Session, steps: int) -> dict[str, np.ndarray]:
    """`steps` steps in data order -> every per-step output (loss, count, ...) of them."""
    call, _ = steps_lib.make_steps(s)
    k = steps_lib.steps_per_call(s)
    outs: list[dict] = []
    epoch = 0
    while len(outs) < steps:
        batches = s.train_feed.epoch(epoch, 0, steps - len(outs))
        while block := list(itertools.islice(batches, k)):
            out = steps_lib.train_block(s, call, block)
            assert out["applied"] == len(block)
            outs += [{name: out[name][j] for name in steps_lib.PER_STEP if name in out}
                     for j in range(len(block))]  # fmt: skip
        epoch += 1
    return {name: np.array([o[name] for o in outs]) for name in outs[0]}


def weights(s: T.Session) -> dict[str, np.ndarray]:
    return models.host_weights(s.model, s.mesh)


def worst_relative(got: dict, want: dict) -> float:
    return max(
        float(np.max(np.abs(got[k] - want[k])) / max(np.max(np.abs(want[k])), 1e-12)) for k in want
    )


@pytest.fixture(scope="module")
def one_batch(cpu8):
    """20 steps of one batch of 32 (accumulate 1) per (mesh, optimizer): the references."""
    out = {}
    for mesh, opt in itertools.product(MESHES, OPTIMIZERS):
        s = mlp_session(mesh, opt, 1)
        out[mesh, opt] = train(s, 20), weights(s)
    return out


@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("mesh", list(MESHES))
def test_four_micro_batches_train_as_one_batch(one_batch, mesh, opt):
    """accumulate 4 (micro-batches of 8: on batch=4,model=2 two rows per device, the hidden
    layers tensor-parallel): per-step losses to 1e-5 relative, the final weights to 1e-5
    (SGD) or 1e-4 (AdamW) of each weight's largest value."""
    want, want_weights = one_batch[mesh, opt]
    s = mlp_session(mesh, opt, 4)
    assert s.local_device_count == (1 if mesh == "batch=1" else 8)
    assert s.placed is not None  # the digits fit: positions gathered on the devices
    got = train(s, 20)
    assert int(s.optimizer.iterations.numpy()) == 20
    # Every example of a step counts once, padding none: 32 a step, 20 in a last batch.
    np.testing.assert_array_equal(got["count"], want["count"])
    assert set(got["count"]) == {32.0, 20.0}
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    assert want["loss"][-1] < want["loss"][0] - 0.2  # it learned
    worst = worst_relative(weights(s), want_weights)
    print(f"{opt} on {mesh}: worst relative weight difference {worst:.1e}")
    assert worst <= WEIGHTS_RTOL[opt]


def test_micro_batches_copied_from_the_host_train_as_one_batch(one_batch):
    """data.placement host: the micro-batches' examples packed on the host, not gathered."""
    want, want_weights = one_batch["batch=4,model=2", "adamw"]
    s = mlp_session("batch=4,model=2", "adamw", 2, ("data.placement=host",))
    assert s.placed is None
    got = train(s, 20)
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    assert worst_relative(weights(s), want_weights) <= 1e-4


def test_a_micro_batch_holds_its_share_of_every_data_shard(cpu8):
    """Micro-batch j holds the j-th quarter of each data shard's rows: sharded along the data
    axis like the batch (every device holds rows of every micro-batch), and a client of a
    multi-client run, which reads only its shards' rows, splits them the same way."""
    from tensorflow.experimental import dtensor

    s = mlp_session("batch=4,model=2", "sgd", 4)
    packer = s.packer
    block = np.arange(2 * 32).reshape(2, 32)  # two batches of 32 rows: 4 shards of 8
    micro = packer.micro_batches(block, 4)
    assert micro.shape == (8, 8)
    for k, j in itertools.product(range(2), range(4)):  # batch k, micro-batch j
        want = [32 * k + 8 * shard + 2 * j + r for shard in range(4) for r in range(2)]
        assert micro[4 * k + j].tolist() == want
    # On the mesh each device holds its shard's two rows of every micro-batch.
    packed = packer.pack(micro, 1)
    for device, part in zip(s.mesh.local_device_locations(), dtensor.unpack(packed)):
        shard = device["batch"]
        assert part.numpy()[:, 0].tolist() == [row[2 * shard] for row in micro]
    # A client holding shards 2 and 3 reads rows 16...31 of each batch; its micro-batches are
    # those rows of the global micro-batches.
    client = copy.copy(packer)
    client.local_shards = [2, 3]
    rows = client.rows(32)
    assert rows.tolist() == list(range(16, 32))
    np.testing.assert_array_equal(client.micro_batches(block[:, rows], 4), micro[:, 4:])


def test_a_non_finite_loss_in_a_late_micro_batch_stops_its_step(cpu8):
    """A NaN pixel in the last micro-batch of step 6 (row 7 of the batch: shard 0's fourth
    pair of rows on batch=4): steps 1-5 are applied, step 6 and the rest of its call are not,
    and the error names step 6. The weights are those of 5 clean steps."""
    tanh = ["model.layers=[{Dense: {units: 64, activation: tanh}}, {Dense: {units: 10}}]"]
    clean = mlp_session("batch=4,model=2", "sgd", 1, tanh)
    train(clean, 5)
    s = mlp_session("batch=4,model=2", "sgd", 4, (*tanh, "data.placement=host"))
    order = pipeline_lib.epoch_order(len(s.data.train), s.recipe.seed, 0, True)
    s.data.train.x[order[5 * 32 + 7]].flat[0] = np.nan
    state = T.EpochState(0)
    with pytest.raises(T.NonFiniteLoss) as caught:
        T.run_epoch(s, steps_lib.make_steps(s)[0], state)
    assert caught.value.step == 6 and np.isnan(caught.value.loss)
    assert int(s.optimizer.iterations.numpy()) == 5 and state.batch == 5
    assert worst_relative(weights(s), weights(clean)) <= 1e-5


# --------------------------------------------------------------------------- the GPT

GPT = [
    "model.transformer={layers: 1, d_model: 32, heads: 8, mlp_ratio: 2, context: 16}",
    "data.batch_size=8",
    "train.steps_per_call=4",
    "optimizer.warmup_steps=2",
    "optimizer.min_learning_rate=1e-4",
    "optimizer.learning_rate=3e-3",
]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    """A few KB of generated text (a seeded mix of words: something to learn)."""
    rng = np.random.default_rng(0)
    words = ["the", "mesh", "shards", "a", "batch", "of", "tokens", "and", "gradients", "sum"]
    text = " ".join(rng.choice(words, 1500)) + "\n"
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text(text)
    return path


def gpt_steps(text_file, n: int, steps: int = 6) -> tuple[dict, dict, T.Session]:
    recipe = R.load(
        ROOT / "recipes" / "tiny_gpt_tensor_parallel.yaml",
        R.Overrides(
            (f"data.path={text_file}", *GPT, f"train.accumulate={n}"), "batch=2,model=2", "cpu:8"
        ),
    )
    s = T.prepare(recipe, splits=("train",), use_devices=4)
    return train(s, steps), weights(s), s


def test_a_gpt_accumulating_two_micro_batches_trains_as_one_batch(cpu8, text_file):
    """AdamW with warmup, cosine decay and clipping to norm 1 (which acts on the summed
    gradient: the first steps' norms are above 1) on batch=2,model=2 over 4 of the virtual
    CPUs (half the compile time of 8), heads and MLP split: losses, gradient norms and rates to
    1e-5, weights to 1e-4, every token of a step counted."""
    want, want_weights, _ = gpt_steps(text_file, 1)
    got, got_weights, s = gpt_steps(text_file, 2)
    context = s.recipe.model.transformer.context
    assert got["count"].tolist() == [8 * context] * 6  # batch_size * context tokens a step
    np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-5)
    assert want["loss"][-1] < want["loss"][0] - 0.3
    assert max(want["grad_norm"]) > 1.0  # clipping acted
    np.testing.assert_allclose(got["grad_norm"], want["grad_norm"], rtol=1e-5)
    np.testing.assert_allclose(got["learning_rate"], want["learning_rate"], rtol=1e-6)
    assert worst_relative(got_weights, want_weights) <= 1e-4


# --------------------------------------------------------------------------- recipe, resume


def test_accumulate_that_does_not_divide_the_batch_is_refused(cpu8):
    result = run_cli("config", RECIPES / "quickstart.yaml", "--set", "train.accumulate=3")
    assert result.code == 2, result.err
    assert result.err_lines == [
        "error: recipe key 'train.accumulate': data.batch_size 64 does not divide into 3 "
        "micro-batches (expected a divisor of data.batch_size)"
    ]


def test_a_run_accumulating_resumes_to_the_uninterrupted_end(cpu8, tmp_path):
    """accumulate 2: 10 steps, then resumed to 20, ends as 20 steps in one run (the data order
    per optimizer step is the same; a checkpoint is on a step boundary)."""
    from conftest import checkpoint_tensors

    from dtcli import metrics, rundir

    common = [
        *("--set", "train.accumulate=2", "--set", "train.eval_every=10"),
        *("--set", "train.log_every=1", "--set", "train.steps_per_call=4"),
        *("--set", "data.batch_size=32", "--no-progress"),
    ]
    whole, split = tmp_path / "whole", tmp_path / "split"
    quick = RECIPES / "quickstart.yaml"
    assert run_cli("train", quick, "--set", "train.steps=20", *common, "--out", whole).code == 0
    assert run_cli("train", quick, "--set", "train.steps=10", *common, "--out", split).code == 0
    resumed = run_cli("train", "--resume", split, "--set", "train.steps=20", "--no-progress")
    assert resumed.code == 0, resumed.err
    a, b = (metrics.read(run / "steps.jsonl") for run in (whole, split))
    assert [r["step"] for r in b] == list(range(1, 21))
    np.testing.assert_allclose([r["loss"] for r in b], [r["loss"] for r in a], rtol=1e-6)
    end = [checkpoint_tensors(rundir.complete_checkpoints(run)[-1]) for run in (whole, split)]
    assert end[0].keys() == end[1].keys() and len(end[0]) >= 4
    for key, value in end[0].items():
        np.testing.assert_allclose(end[1][key], value, rtol=1e-6, atol=1e-7, err_msg=key)
