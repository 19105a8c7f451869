"""dtcli's Adam / AdamW update is tf-keras' own, to the bit (it only computes the step's scalars
once instead of per weight, and reads and writes each variable once), on plain variables and on
a mesh with split weights; and the gradient norm, one all-reduce on a mesh, is
tf.linalg.global_norm. In this process, on the session's 8 virtual CPUs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from dtcli import optimizers
from dtcli.recipe import OptimizerConfig

# [4, 6] split on its columns, [6] on `model`, [3, 4] replicated: every kind of split; and a
# second [4, 6] like the first (on a mesh the update stacks like weights).
SHAPES = {
    "kernel": ([4, 6], ["unsharded", "model"]),
    "bias": ([6], ["model"]),
    "norm": ([3, 4], []),
    "kernel_2": ([4, 6], ["unsharded", "model"]),
}


def weights_and_grads(mesh, seed: int = 0):
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    rng = np.random.default_rng(seed)
    weights, grads = [], []
    for name, (shape, specs) in SHAPES.items():
        value = rng.normal(size=shape).astype(np.float32)
        steps = [rng.normal(size=shape).astype(np.float32) for _ in range(3)]
        if mesh is None:
            weights.append(tf.Variable(value, name=name))
            grads.append([tf.constant(g) for g in steps])
            continue
        layout = dtensor.Layout(specs or ["unsharded"] * len(shape), mesh)
        whole = dtensor.Layout.replicated(mesh, len(shape))
        weights.append(dtensor.DVariable(
            dtensor.relayout(dtensor.copy_to_mesh(value, whole), layout), name=name))  # fmt: skip
        grads.append([dtensor.relayout(dtensor.copy_to_mesh(
            g, dtensor.Layout.replicated(mesh, len(shape))), layout) for g in steps])  # fmt: skip
    return weights, [list(step) for step in zip(*grads)]


def three_steps(cfg: OptimizerConfig, mesh, own: bool) -> list[np.ndarray]:
    """3 updates with a changing rate (a schedule's), by dtcli's update (`own`) or by
    tf-keras' apply_gradients, from the same weights and gradients."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    weights, grads = weights_and_grads(mesh)
    optimizer = optimizers.KerasOptimizer(cfg, mesh)
    optimizer.build(weights, [weights[2]])  # the [3, 4] weight not decayed

    @tf.function
    def step(step_grads, rate):
        if own:
            optimizer.apply(step_grads, weights, rate)
        else:
            optimizer.impl.learning_rate = rate
            optimizer.impl.apply_gradients(zip(step_grads, weights))

    for i, step_grads in enumerate(grads):
        rate = tf.constant(0.01 * (i + 1), tf.float32)
        if mesh is not None:
            rate = dtensor.copy_to_mesh(rate, dtensor.Layout.replicated(mesh, 0))
        step(step_grads, rate)
    if mesh is None:
        return [w.numpy() for w in weights]
    whole = [dtensor.Layout.replicated(mesh, len(w.shape)) for w in weights]
    return [dtensor.unpack(dtensor.relayout(w.read_value(), r))[0].numpy() for w, r in zip(
        weights, whole)]  # fmt: skip


@pytest.mark.parametrize("name", ["adam", "adamw"])
@pytest.mark.parametrize("on_mesh", [False, True], ids=["plain", "batch=2,model=2"])
def test_adam_updates_are_tf_keras_own_to_the_bit(cpu8, name, on_mesh):
    from tensorflow.experimental import dtensor

    mesh = None
    if on_mesh:
        mesh = dtensor.create_mesh([("batch", 2), ("model", 2)], device_type="CPU", devices=[
            f"CPU:{i}" for i in range(4)])  # fmt: skip
    cfg = OptimizerConfig(name=name, weight_decay=0.1)
    got = three_steps(cfg, mesh, own=True)
    want = three_steps(cfg, mesh, own=False)
    start, _ = weights_and_grads(None)
    for g, w, s in zip(got, want, start):
        assert np.array_equal(g, w)
        assert not np.allclose(g, s.numpy())  # the weights moved


def test_the_gradient_norm_summed_once_per_split_is_the_global_norm(cpu8):
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    mesh = dtensor.create_mesh([("batch", 2), ("model", 2)], device_type="CPU", devices=[
        f"CPU:{i}" for i in range(4)])  # fmt: skip
    weights, grads = weights_and_grads(mesh)
    _, plain_grads = weights_and_grads(None)
    got = float(tf.function(optimizers.global_norm)(grads[0], weights))
    want = float(tf.linalg.global_norm(plain_grads[0]))
    assert got == pytest.approx(want, rel=1e-6)


def test_the_update_reads_and_writes_each_weight_and_slot_once_and_stacks_like_ones_on_a_mesh(
    cpu8,
):
    """On a mesh every op runs on every device; reading a slot back after its write is also
    what DTensor's all-reduce combining pass may reorder (steps/step.py)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    mesh = dtensor.create_mesh([("batch", 2), ("model", 2)], device_type="CPU", devices=[
        f"CPU:{i}" for i in range(4)])  # fmt: skip
    weights, grads = weights_and_grads(mesh)
    optimizer = optimizers.KerasOptimizer(OptimizerConfig(name="adamw", weight_decay=0.1), mesh)
    optimizer.build(weights, [weights[2]])
    rate = dtensor.copy_to_mesh(tf.constant(0.01), dtensor.Layout.replicated(mesh, 0))
    step = tf.function(lambda g, r: optimizer.apply(g, weights, r))
    graph = step.get_concrete_function(grads[0], rate).graph
    handles = {id(inner): outer for outer, inner in graph.captures}
    uses: dict[int, Counter] = {}  # by variable handle: the ops taking it
    for op in graph.get_operations():
        for handle in op.inputs:
            if id(handle) in handles:
                uses.setdefault(id(handles[id(handle)]), Counter())[op.type] += 1
    impl = optimizer.impl
    for variable in [*weights, *impl._momentums, *impl._velocities]:
        assert uses[id(variable.handle)] == {"ReadVariableOp": 1, "AssignVariableOp": 1}
    # The two like kernels updated as one: a sqrt for Adam's step size, one per group.
    assert [op.type for op in graph.get_operations()].count("Sqrt") == 1 + 3


def test_the_gradient_norm_is_one_all_reduce_whatever_each_gradient_is_split_on(cpu8, tmp_path):
    import tensorflow as tf
    from tensorflow.experimental import dtensor
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    mesh = dtensor.create_mesh([("batch", 2), ("model", 2)], device_type="CPU", devices=[
        f"CPU:{i}" for i in range(4)])  # fmt: skip
    u = "unsharded"
    splits = [  # FSDP x TP's kernels both ways round, norms, replicated and model-only weights
        ([4, 6], ["batch", "model"]),
        ([6, 4], ["model", "batch"]),
        ([4, 2, 3], ["batch", "model", u]),
        ([2, 3, 4], ["model", u, "batch"]),
        ([4], ["batch"]),
        ([3, 4], [u, u]),
        ([5, 6], [u, "model"]),
    ]
    rng = np.random.default_rng(1)
    values = [rng.normal(size=shape).astype(np.float32) for shape, _ in splits]
    grads = [dtensor.relayout(dtensor.copy_to_mesh(value, dtensor.Layout.replicated(
        mesh, value.ndim)), dtensor.Layout(specs, mesh)) for value, (_, specs) in zip(
        values, splits)]  # fmt: skip
    weights = [dtensor.DVariable(g) for g in grads]
    norm = tf.function(optimizers.global_norm)
    norm(grads, weights)  # traced and lowered before the trace
    tf.profiler.experimental.start(str(tmp_path))
    got = float(norm(grads, weights))
    tf.profiler.experimental.stop()

    want = np.sqrt(sum(np.sum(np.square(v.astype(np.float64))) for v in values))
    assert got == pytest.approx(want, rel=1e-6)
    # The all-reduces the lowered program holds, by name (a trace may show one more than once).
    space = xplane_pb2.XSpace()
    space.ParseFromString(next(tmp_path.glob("plugins/profile/*/*.xplane.pb")).read_bytes())
    names = {m.name for p in space.planes for m in p.event_metadata.values()}
    assert len({n for n in names if n.endswith(":CollectiveReduceV2")}) == 1
