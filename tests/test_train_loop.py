"""Several steps per compiled call (`train.steps_per_call`): the same training as one step per
call, a padded last block that changes nothing, and a non-finite loss inside a call that keeps
the last finite weights and names its step. In this process, on the session's 8 virtual CPUs."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from conftest import RECIPES

from dtcli import models
from dtcli import pipeline as pipeline_lib
from dtcli import recipe as R
from dtcli import session as T
from dtcli import steps as steps_lib
from dtcli.train.loop import non_finite_hint

# A 2-D mesh, so that both the batch split and the tensor-parallel layers are in the step.
SETS = ["optimizer.name=adam", "optimizer.learning_rate=0.01", "data.batch_size=32"]


def session(k: int, extra: list[str] = ()) -> T.Session:
    return T.prepare(
        R.load(RECIPES / "quickstart.yaml", [*SETS, f"train.steps_per_call={k}", *extra]),
        splits=("train",),
    )


def weights(s: T.Session) -> dict[str, np.ndarray]:
    return models.host_weights(s.model, s.mesh)


@pytest.fixture(scope="module")
def one_per_call(cpu8):
    """7 steps, one per call, the split placed on the devices (auto, as the digits fit): the
    reference."""
    s = session(1)
    assert s.placed is not None and s.train_feed.on_device
    losses = T.run_steps(s, 7)
    return losses, weights(s), int(s.optimizer.iterations.numpy())


@pytest.mark.parametrize("k", [3, 16])
def test_k_steps_per_call_train_as_one_per_call(one_per_call, k):
    # 7 steps: blocks of 3 end with a padded block (3, 3, 1 + 2 empty); 16: one padded block.
    losses, reference, iterations = one_per_call
    s = session(k)
    got = T.run_steps(s, 7)
    assert len(got) == 7
    np.testing.assert_allclose(got, losses, rtol=1e-5)
    for path, value in weights(s).items():
        np.testing.assert_allclose(value, reference[path], rtol=1e-5, atol=1e-6, err_msg=path)
    # Padding steps apply no update: the optimizer counted exactly the real steps.
    assert int(s.optimizer.iterations.numpy()) == iterations == 7


# tanh, not relu: relu turns the NaN of a poisoned example into 0 and the loss stays finite.
TANH = ["model.layers=[{Dense: {units: 128, activation: tanh}}, {Dense: {units: 10}}]"]


def poison(s: T.Session, batch: int) -> None:
    """One NaN pixel in the `batch`-th batch of epoch 0: that step's loss is NaN."""
    cfg = s.recipe.data
    order = pipeline_lib.epoch_order(len(s.data.train), s.recipe.seed, 0, cfg.shuffle)
    s.data.train.x[order[batch * cfg.batch_size]].flat[0] = np.nan
    if s.placed is not None:  # the split on the devices is a copy: place the poisoned one
        s.placed = (s.packer.place(s.data.train.x), s.placed[1])


def test_the_split_placed_on_the_devices_trains_as_batches_from_the_host(one_per_call):
    """data.placement device gathers each batch on the devices; host copies it: the same
    examples in the same order, so the same numbers."""
    losses, reference, _ = one_per_call
    s = session(3, ["data.placement=host"])
    assert s.placed is None and not s.train_feed.on_device
    np.testing.assert_allclose(T.run_steps(s, 7), losses, rtol=1e-6)
    for path, value in weights(s).items():
        np.testing.assert_allclose(value, reference[path], rtol=1e-6, atol=1e-7, err_msg=path)


@pytest.mark.parametrize("placement", ["device", "host"])
def test_a_non_finite_loss_inside_a_call_keeps_the_last_finite_weights(cpu8, placement):
    clean = session(1, TANH)
    T.run_steps(clean, 5)
    s = session(4, [*TANH, f"data.placement={placement}"])
    assert (s.placed is not None) == (placement == "device")
    poison(s, 5)  # the 6th step: the second call's second step
    state = T.EpochState(0)
    with pytest.raises(T.NonFiniteLoss) as caught:
        T.run_epoch(s, steps_lib.make_steps(s)[0], state)
    assert caught.value.step == 6 and np.isnan(caught.value.loss)
    # Step 5 was applied, step 6 and the rest of its call were not.
    assert int(s.optimizer.iterations.numpy()) == 5 and state.batch == 5
    reference = weights(clean)
    for path, value in weights(s).items():
        assert np.all(np.isfinite(value)), path
        np.testing.assert_allclose(value, reference[path], rtol=1e-5, atol=1e-6, err_msg=path)


def test_an_epoch_in_blocks_counts_every_example_once(cpu8):
    """An epoch of 1437 examples in batches of 32 (45 steps, the last padded) in calls of 4."""
    s = session(4)
    state = T.run_epoch(s, steps_lib.make_steps(s)[0], T.EpochState(0))
    assert state.batch == 45 == steps_lib.epoch_steps(s)
    assert state.count == len(s.data.train) == 1437
    assert int(s.optimizer.iterations.numpy()) == 45


def test_a_run_resumed_mid_epoch_on_tfrecords_ends_equal(cpu8, digit_files, tmp_path):
    """Streamed input, shuffled (files permuted, a seeded buffer): stopped after the first call
    of an epoch, checkpointed, restored into a new session and finished, the run ends with the
    weights of one that never stopped (the resumed epoch skips what was trained, in the same
    order)."""
    from dtcli import checkpoint as ckpt_lib

    sets = [*digit_files["tfrecord"], "train.steps_per_epoch=10", "data.shuffle_buffer=200"]
    whole = session(4, sets)
    assert not whole.train_feed.in_memory
    call = steps_lib.make_steps(whole)[0]
    for epoch in (0, 1):
        T.run_epoch(whole, call, T.EpochState(epoch))

    cut = session(4, sets)
    call = steps_lib.make_steps(cut)[0]
    T.run_epoch(cut, call, T.EpochState(0))
    calls = []
    state = T.run_epoch(
        cut, call, T.EpochState(1), stop=lambda: len(calls) > 0, trained=lambda: calls.append(1)
    )
    assert state.batch == 4  # one call of the second epoch, then stopped
    saver = ckpt_lib.Checkpointer(tmp_path, cut.checkpoint_objects(), keep=1)
    saved = saver.save(int(cut.optimizer.iterations.numpy()), {"step": 14})

    resumed = session(4, sets)
    ckpt_lib.Checkpointer(tmp_path, resumed.checkpoint_objects(), keep=1).restore(saved)
    assert int(resumed.optimizer.iterations.numpy()) == 14
    T.run_epoch(resumed, steps_lib.make_steps(resumed)[0], T.EpochState(1, batch=state.batch))
    assert int(resumed.optimizer.iterations.numpy()) == 20
    reference = weights(whole)
    for path, value in weights(resumed).items():
        np.testing.assert_allclose(value, reference[path], rtol=1e-5, atol=1e-6, err_msg=path)


def test_weights_start_as_on_the_host_and_the_first_call_runs_one_step(cpu8):
    """The initial weights are cut into each device's shard on the host (dense_0's kernel split
    on its output dim, dense_1's on its input dim): the same values as the host model. A
    process's first call runs one step (so the first loss comes right after compiling), the
    later calls K, and every step of the epochs runs once."""
    s = session(16)
    _, initial = models.weight_plans(s.recipe, s.data.input_shape, s.data.num_classes, s.axes)
    assert s.model.variables["dense_1.kernel"].layout.sharding_specs[0] == "model"
    for path, value in weights(s).items():
        np.testing.assert_array_equal(value, initial[path], err_msg=path)

    calls = []

    class Calls:  # the profiler's hooks see each call's first step and step count
        def before_call(self, first: int, count: int) -> None:
            calls.append((first, count))

        def after_call(self, last: int) -> None:
            pass

    train_call, _ = steps_lib.make_steps(s)
    steps = steps_lib.epoch_steps(s)  # 45: 1437 digits in batches of 32
    for epoch in (0, 1):
        state = T.run_epoch(s, train_call, T.EpochState(epoch), profiler=Calls())
        assert state.batch == steps
    assert calls == [(1, 1), (2, 16), (18, 16), (34, 12), (46, 16), (62, 16), (78, 13)]
    assert int(s.optimizer.iterations.numpy()) == 2 * steps == 90


def run_of_width(width: int) -> tuple[T.Session, object]:
    """A run on a 2-device mesh whose train call nests two loops (K=2 steps of 2 micro-batches),
    its model `width` wide: each a trace and a DTensor lowering of its own."""
    sets = [
        "data.train_range=[0,128]",
        "train.steps_per_call=2",
        "train.accumulate=2",
        "model.api=core",
        "model.layers=null",
        f"model.hidden=[{width}]",
    ]
    recipe = R.load(RECIPES / "quickstart.yaml", R.Overrides([*SETS, *sets], "batch=2", "cpu:8"))
    s = T.prepare(recipe, splits=("train",), use_devices=2)
    return s, steps_lib.make_steps(s)[0]


def block(s: T.Session, call: object, first: int) -> dict:
    out = steps_lib.train_block(s, call, list(s.train_feed.epoch(0, first, first + 2)))
    assert out["applied"] == 2
    return out


def test_many_runs_steps_kept_in_one_process_lower_without_a_name_clash(cpu8):
    """Eight runs' steps kept alive in one process, as a notebook or the suite keeps them, each
    lowered by DTensor: none clashes by function name with another's lowering (before
    steps.lowering.MeshSteps most of them took a loop name of a live earlier lowering: "Cannot
    add function 'while/while1_body' because a different function with the same name already
    exists"). The first run, whose lowering the later ones released, trains on when called
    again (traced and lowered anew), to the numbers of a run that never stopped."""
    runs = [run_of_width(8 + n) for n in range(8)]
    firsts = [block(s, call, 0) for s, call in runs]
    s, call = runs[0]
    again = block(s, call, 2)
    reference = run_of_width(8)
    np.testing.assert_array_equal(block(*reference, 0)["loss"], firsts[0]["loss"])
    np.testing.assert_array_equal(block(*reference, 2)["loss"], again["loss"])


@pytest.mark.parametrize(
    "device_type, mesh, precision, suspect",
    [
        ("GPU", None, "bf16", "train.precision=float32"),  # XLA, bf16 on a GPU: XLA's compile
        ("GPU", None, "float32", "lower optimizer.learning_rate"),
        ("GPU", "a mesh", "bf16", "lower optimizer.learning_rate"),  # DTensor: trains on GPUs
        ("CPU", None, "bf16", "lower optimizer.learning_rate"),
    ],
)
def test_a_non_finite_loss_names_the_likelier_suspect(device_type, mesh, precision, suspect):
    session = SimpleNamespace(
        devices=SimpleNamespace(device_type=device_type),
        xla=mesh is None,
        recipe=SimpleNamespace(train=SimpleNamespace(precision=precision)),
    )
    hint = non_finite_hint(session)
    assert suspect in hint
    assert ("train.compile=dtensor" in hint) == (suspect == "train.precision=float32")


def test_a_no_op_resume_of_a_run_stopped_inside_an_epoch_says_how_far_it_went():
    """A run stopped at batch 110 of its 5th epoch, resumed to 4 epochs: nothing to train, and
    the line says the run went past them, not that it has exactly 4."""
    from rich.console import Console

    from dtcli.train.console import nothing_to_train

    console = Console(record=True, width=300)
    nothing_to_train(console, R.TrainConfig(epochs=4), 4, 830, batch=110)
    nothing_to_train(console, R.TrainConfig(epochs=4), 4, 720)
    first, second = console.export_text().splitlines()
    assert first == (
        "nothing to train: the run has 4 epochs and 110 batches of epoch 5 (step 830) and "
        "train.epochs is 4; --epochs is the total, give more"
    )
    assert second.startswith("nothing to train: the run has 4 epochs and train.epochs is 4;")
