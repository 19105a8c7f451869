"""Packed windows in dtcli's GPT (data.packing; models/transformer.py): a window [3, context] of
token ids, segment ids and position ids computes each of its examples as that example alone in a
window of its own (no attention and no position crosses a boundary), for learned positions and
rope, in float32 and bf16, with remat, on batch=2,model=2 and with FSDP; the loss of a packed
batch (targets -1 at each example's last token and at padding) is the sum of its examples'
losses; a window of one segment is the unpacked window bit for bit; plan counts a packed shape.

The packed batches are built here by hand, laid out as data.packing's source writes them."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest
from conftest import RECIPES

from dtcli import recipe
from dtcli.models import transformer

# Checked: a packed window equal to its examples alone (1e-5); Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")

VOCAB, TABLE, CONTEXT = 100, 128, 16
VARIANTS = {
    "learned-gelu-layernorm": dict(positions="learned", max_positions=24, bias=True),
    "rope-swiglu-rmsnorm-kv2": dict(
        positions="rope", activation="swiglu", norm="rmsnorm", kv_heads=2, bias=False
    ),
}


def small(variant: str, **kw: Any) -> recipe.TransformerConfig:
    base = dict(layers=2, d_model=32, heads=4, context=CONTEXT)
    return recipe.TransformerConfig(**{**base, **VARIANTS[variant], **kw})


def draw_examples(count: int, seed: int) -> list[np.ndarray]:
    """`count` examples of 2 to 9 token ids."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, VOCAB, int(rng.integers(2, 10))).astype(np.int32) for _ in range(count)]


def targets(example: np.ndarray) -> np.ndarray:
    """Each token's next token within the example; -1 (outside the loss) at its last."""
    return np.append(example[1:], -1).astype(np.int32)


def alone(example: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The example alone in a window [context] (padded with id 0) and its targets (-1 past it)."""
    x, y = np.zeros(CONTEXT, np.int32), np.full(CONTEXT, -1, np.int32)
    x[: len(example)], y[: len(example)] = example, targets(example)
    return x, y


def packed(examples: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, list[list[int]]]:
    """The examples packed in order into windows [N, 3, context] (a window closes where the
    next example does not fit), their targets [N, context], and each window's examples (their
    indices)."""
    windows: list[list[int]] = [[]]
    used = 0
    for i, example in enumerate(examples):
        if used + len(example) > CONTEXT:
            windows.append([])
            used = 0
        windows[-1].append(i)
        used += len(example)
    x = np.zeros((len(windows), 3, CONTEXT), np.int32)
    y = np.full((len(windows), CONTEXT), -1, np.int32)
    for w, members in enumerate(windows):
        start = 0
        for segment, i in enumerate(members, 1):
            span = slice(start, start + len(examples[i]))
            x[w, 0, span], x[w, 1, span] = examples[i], segment
            x[w, 2, span] = np.arange(len(examples[i]))
            y[w, span] = targets(examples[i])
            start = span.stop
    return x, y, windows


def log_probs(logits: Any) -> np.ndarray:
    logits = np.asarray(logits, np.float64)
    top = logits.max(-1, keepdims=True)
    return logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))


def twin_models(cfg: recipe.TransformerConfig, bf16: bool = False) -> tuple[Any, Any]:
    """The GPT for unpacked windows and for packed ones, on the same (seeded) weights."""
    import tf_keras

    from dtcli.models.compute import Compute
    from dtcli.models.keras import keras_variables

    compute = Compute(None, bf16)
    tf_keras.utils.set_random_seed(0)
    plain = transformer.build(cfg, TABLE, compute)
    window = transformer.build(cfg, TABLE, compute, (3, CONTEXT))
    for (path, var, _), (path_p, var_p, _) in zip(keras_variables(plain), keras_variables(window)):
        assert path == path_p
        var_p.assign(var)
    return plain, window


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_packed_window_gives_each_example_its_log_probs_alone(variant, bf16, cpu8):
    """Per-token log probabilities (1e-5). Rope depends on relative positions alone, so
    positions that did not restart would show only in rounding: the bf16 case does show it."""
    plain, window = twin_models(small(variant), bf16)
    examples = draw_examples(8, seed=1)
    x, _, windows = packed(examples)
    assert max(len(w) for w in windows) >= 3  # the test packs several examples a window
    got = log_probs(window(x))
    alone_x = np.stack([alone(e)[0] for e in examples])
    want = log_probs(plain(alone_x))
    for w, members in enumerate(windows):
        start = 0
        for i in members:
            n = len(examples[i])
            diff = np.abs(got[w, start : start + n] - want[i, :n]).max()
            # bf16: each example's matmuls see the same bfloat16 inputs either way.
            assert diff <= 1e-5, (w, i, diff)
            start += n


def test_a_packed_batchs_loss_and_gradients_are_its_examples_summed_with_remat(cpu8):
    """Through steps/step.py's sums (targets -1 at each example's last token and at padding):
    the packed batch's cross-entropy sum and count are its examples' one at a time, and so are
    its gradients, with each block recomputed in the backward pass (remat)."""
    import tensorflow as tf

    from dtcli.steps.step import sums

    plain, window = twin_models(small("rope-swiglu-rmsnorm-kv2", remat=True))
    examples = draw_examples(8, seed=2)
    x, y, _ = packed(examples)

    def loss_and_grads(model: Any, x: np.ndarray, y: np.ndarray) -> tuple[dict, list]:
        with tf.GradientTape() as tape:
            out = sums(model(x, training=True), y, tf.ones(len(x)), True)
        grads = tape.gradient(out["ce_sum"], model.trainable_variables)
        return {k: float(v) for k, v in out.items()}, [tf.convert_to_tensor(g) for g in grads]

    got, got_grads = loss_and_grads(window, x, y)
    want = {"ce_sum": 0.0, "count": 0.0}
    want_grads = [0.0] * len(got_grads)
    for example in examples:
        ex, ey = alone(example)
        out, grads = loss_and_grads(plain, ex[None], ey[None])
        want = {k: want[k] + out[k] for k in want}
        want_grads = [a + g for a, g in zip(want_grads, grads)]
    assert got["count"] == want["count"] == sum(len(e) - 1 for e in examples)
    assert got["ce_sum"] == pytest.approx(want["ce_sum"], rel=1e-5)
    for var, g, w in zip(window.trainable_variables, got_grads, want_grads):
        scale = max(float(np.abs(w).max()), 1e-12)
        assert float(np.abs(g - w).max()) / scale <= 1e-5, var.name


@pytest.mark.parametrize("bf16", [False, True], ids=["float32", "bf16"])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_window_of_one_segment_is_the_unpacked_window_bit_for_bit(variant, bf16, cpu8):
    """Packing computes what the unpacked path computes where nothing is packed: the same mask
    values, the same position rows, the same logits to the bit."""
    plain, window = twin_models(small(variant), bf16)
    tokens = np.random.default_rng(3).integers(0, VOCAB, (2, CONTEXT)).astype(np.int32)
    x = np.stack([tokens, np.ones_like(tokens), np.tile(np.arange(CONTEXT), (2, 1))], axis=1)
    np.testing.assert_array_equal(window(x).numpy(), plain(tokens).numpy())


# --------------------------------------------------------------------------- on a mesh

STEPS = 3


def packed_session_losses(monkeypatch, mesh: str, sets: tuple[str, ...]) -> tuple:
    """STEPS AdamW steps of the rope GPT (remat) on one batch of hand-packed windows on `mesh`
    of 4 virtual CPUs, through dtcli's session and steps; -> (losses, the session, the
    windows, their targets, the initial weights)."""
    from dtcli import data as data_lib
    from dtcli import models
    from dtcli import session as session_lib
    from dtcli import steps as steps_lib
    from dtcli.session import build as build_lib

    batch = 4
    x, y, _ = packed(draw_examples(40, seed=4))
    x, y = x[:batch], y[:batch]
    # The same batch at every step (data in order), so that the loss falls.
    split = data_lib.Split(np.concatenate([x] * STEPS), np.concatenate([y] * STEPS))
    dataset = data_lib.Dataset(split, split, TABLE, "hand-packed windows")
    monkeypatch.setattr(build_lib, "_load_data", lambda *args: dataset)
    model = (
        "model.transformer={layers: 2, d_model: 32, heads: 4, kv_heads: 2, activation: swiglu, "
        f"norm: rmsnorm, positions: rope, context: {CONTEXT}, remat: true}}"
    )
    sets = (
        model,
        f"data.batch_size={batch}",
        "data.shuffle=false",
        f"train.steps_per_call={STEPS}",
        f"train.steps={STEPS}",
        f"train.eval_every={STEPS}",
        "train.compile=dtensor",
        "optimizer.warmup_steps=0",
        "optimizer.learning_rate=1e-2",
        *sets,
    )
    r = recipe.load(
        RECIPES / "tiny_gpt_tensor_parallel.yaml", recipe.Overrides(sets, mesh, "cpu:8")
    )
    s = session_lib.prepare(r, splits=("train",), use_devices=4)
    initial = models.host_weights(s.model, s.mesh)
    call, _ = steps_lib.make_steps(s)
    block = list(itertools.islice(s.train_feed.epoch(0, 0, STEPS), STEPS))
    losses = np.asarray(steps_lib.train_block(s, call, block)["loss"])
    return losses, s, x, y, initial


def loss_one_example_at_a_time(cfg: recipe.TransformerConfig, weights: dict, x, y) -> float:
    """The mean loss of the examples of packed windows `x`, each alone on one device."""
    import tensorflow as tf

    from dtcli.models.keras import keras_variables
    from dtcli.steps.step import sums

    model = transformer.build(cfg, TABLE)
    for path, var, _ in keras_variables(model):
        var.assign(weights[path])
    ce, count = 0.0, 0.0
    for window, window_y in zip(x, y):
        for segment in range(1, int(window[1].max()) + 1):
            at = window[1] == segment
            ex, ey = alone(window[0][at])
            assert np.array_equal(ey[: at.sum()], window_y[at])  # the targets packed are its own
            out = sums(model(ex[None]), ey[None], tf.ones(1), True)
            ce, count = ce + float(out["ce_sum"]), count + float(out["count"])
    return ce / count


def test_packed_steps_on_batch2_model2_and_fsdp_give_the_examples_losses(cpu8, monkeypatch):
    """The packed batch's loss on batch=2,model=2 (Megatron rules) and with FSDP on top (every
    weight also sharded on batch where it divides) is its examples' loss one at a time (1e-5);
    the later steps agree between the two (their gradients are the same) and the loss falls."""
    tp, s, x, y, initial = packed_session_losses(monkeypatch, "batch=2,model=2", ())
    assert tuple(s.data.input_shape) == (3, CONTEXT)
    spec = {p.weight.path: p.spec for p in s.plans}["block_0.attention.query.kernel"]
    assert spec == ("unsharded", "model", "unsharded")
    want = loss_one_example_at_a_time(s.recipe.model.transformer, initial, x, y)
    assert tp[0] == pytest.approx(want, rel=1e-5)
    assert tp[-1] < tp[0]
    fsdp, s, _, _, _ = packed_session_losses(monkeypatch, "batch=2,model=2", ("layouts.fsdp=true",))
    spec = {p.weight.path: p.spec for p in s.plans}["block_0.attention.query.kernel"]
    assert spec == ("batch", "model", "unsharded")
    np.testing.assert_allclose(fsdp, tp, rtol=1e-5)


# --------------------------------------------------------------------------- plan


def test_plan_counts_a_packed_window_by_its_tokens_and_its_mask():
    """plan of a packed example shape (3, context): the logits and blocks of `context`
    positions (not 3), the segment and position rows and the attention mask on top, rope's cos
    and sin per block; the step's FLOPs those of the unpacked window (the mask saves none)."""
    from dtcli import devices as devices_lib
    from dtcli import plan
    from dtcli.autoplan import workload

    def report(shape: tuple[int, ...], variant: str) -> Any:
        r = recipe.Recipe(
            task="language_model",
            mesh={"batch": 2},
            model=recipe.ModelConfig(transformer=small(variant)),
            data=recipe.DataConfig(source="text", context=CONTEXT, batch_size=8),
        )
        return r, plan.make_report(r, planned=(devices_lib.Devices("CPU", 2), shape, TABLE))

    b, s, head_dim = 4, CONTEXT, 8  # per device
    for variant in VARIANTS:
        r, unpacked = report((CONTEXT,), variant)
        _, packed_ = report((3, CONTEXT), variant)
        acts, acts_unpacked = packed_.memory.activations, unpacked.memory.activations
        assert packed_.batch()["logits_per_device_shape"] == [b, CONTEXT, TABLE]
        assert acts.parts["logits"] == acts_unpacked.parts["logits"] == 2 * 4 * b * s * TABLE
        assert acts.parts["inputs"] == 4 * 4 * b * s  # tokens, segments, positions, targets
        assert acts.parts["packing_mask"] == 4 * b * s * s
        assert "packing_mask" not in acts_unpacked.parts
        rope = 2 * 4 * b * s * head_dim if variant.startswith("rope") else 0  # cos and sin
        per_block = acts.details["per_block_bytes"]
        assert per_block == acts_unpacked.details["per_block_bytes"] + rope
        axes = {"batch": 2}
        steps = [
            workload.workload(r, report_.plans, axes, shape, TABLE)
            for report_, shape in ((unpacked, (CONTEXT,)), (packed_, (3, CONTEXT)))
        ]
        assert steps[0].flops_per_device > 0 and steps[0] == steps[1]
