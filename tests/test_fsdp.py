"""Models bigger than one device: FSDP (weights and optimizer state sharded on the data axis,
alone or with tensor parallel), bf16 compute and activation checkpointing in dtcli's GPT. Each
gives the 1-device numbers (within float32 noise; bf16 within its own tolerance), and each
really happens (bytes on the devices, bf16 matmuls in the step, a recompute in the gradient)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import test_language_model
import test_mesh_invariance
from conftest import ROOT, run_cli, write_corpus

from dtcli.errors import UsageError
from dtcli.layout import WeightInfo, WeightPlan, apply_fsdp, check_fsdp_layers
from dtcli.recipe import read_raw

# Checked: FSDP, bf16 and rematerialized runs equal to the 1-device numbers, bytes on the
# devices, and traced graphs (Grappler rewrites only what runs); Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")

U = "unsharded"
# A GPT that holds every kind of weight, shrunk, as tests/test_language_model.py trains it.
TINY = test_language_model.TINY
# recipes/tiny_gpt_tensor_parallel.yaml's Megatron rules
TP_RULES = read_raw(ROOT / "recipes" / "tiny_gpt_tensor_parallel.yaml")["layouts"]["rules"]
FSDP = ["layouts.fsdp=true", "layouts.rules={}"]
FSDP_TP = ["layouts.fsdp=true", "layouts.rules=" + json.dumps(TP_RULES)]
# recipes/gpt_fsdp_tp.yaml (FSDP x TP by its own rules) with tiny_gpt.yaml's optimizer, in
# float32, so that it compares with the tiny GPT on one device
SHIPPED = [
    "train.precision=float32",
    "optimizer.learning_rate=1e-3",
    "optimizer.beta_2=0.99",
    "optimizer.min_learning_rate=1e-4",
    "train.steps=2000",
    "train.eval_every=250",
    "train.steps_per_call=10",
]


# --------------------------------------------------------------------------- the plan (pure)


def plan(path: str, shape: tuple[int, ...], spec: tuple[str, ...], layer: str = "Dense"):
    return WeightPlan(WeightInfo(path, shape, layer), None, spec)


def test_fsdp_shards_each_weights_largest_free_dim_on_the_data_axis():
    axes = {"batch": 4, "model": 2}
    plans = [
        plan("emb.embeddings", (256, 128), (U, U)),  # the largest dim: rows
        plan("fc.kernel", (128, 512), (U, "model")),  # the rules took dim 1: dim 0 is left
        plan("square", (64, 64), (U, U)),  # a tie: the first dim
        plan("head", (10,), (U,)),  # 10 does not divide by 4: stays replicated
        plan("odd", (6, 8), (U, U)),  # the largest dim does not divide: the next one does
        plan("done", (8, 8), ("batch", U)),  # a rule put it on the data axis already
        plan(
            "conv.kernel", (3, 3, 8, 16), (U, U, U, U), "Conv2D"
        ),  # DTensor refuses sharded filters
    ]
    got = {p.weight.path: (p.spec, p.fsdp) for p in apply_fsdp(plans, "batch", axes)}
    assert got == {
        "emb.embeddings": (("batch", U), True),
        "fc.kernel": (("batch", "model"), True),
        "square": (("batch", U), True),
        "head": ((U,), False),
        "odd": ((U, "batch"), True),
        "done": (("batch", U), False),
        "conv.kernel": ((U, U, U, U), False),
    }
    # on a data axis of one device there is nothing to shard
    assert apply_fsdp(plans, "batch", {"batch": 1, "model": 8}) == plans
    # a model that cannot gather two-axis weights keeps the rules' tensor-parallel weights
    kept = apply_fsdp(plans, "batch", axes, gathers=False)
    assert [p.spec for p in kept][:2] == [("batch", U), (U, "model")]


def test_fsdp_pads_a_weight_no_dim_of_divides_where_the_layers_slice_it_off():
    """The Core MLP 784-300-100-10 on batch=8: 300x100 pads its rows to 304 (38 a device), as
    FSDP2 pads; where the layers cannot slice padding off it stays replicated, saying why."""
    axes = {"batch": 8}
    plans = [
        plan("dense_0.kernel", (784, 300), (U, U)),
        plan("dense_1.kernel", (300, 100), (U, U)),
        plan("dense_2.bias", (10,), (U,)),
    ]
    padded = apply_fsdp(plans, "batch", axes, pads=True)
    assert [(p.spec, p.padded) for p in padded] == [
        (("batch", U), None),  # 784 divides: no padding
        (("batch", U), (304, 100)),
        (("batch",), (16,)),
    ]
    assert [p.shard_shape(axes) for p in padded] == [(98, 300), (38, 100), (2,)]
    assert padded[1].bytes_per_device(axes) == 38 * 100 * 4
    assert padded[1].stored_shape == (304, 100) and padded[0].stored_shape == (784, 300)
    gpt = apply_fsdp(plans, "batch", axes)
    assert [p.fsdp_kept for p in gpt][1:] == [
        "no dim divides by batch=8 (dtcli's GPT pads none)"
    ] * 2
    keras = apply_fsdp(plans, "batch", axes, gathers=False)
    assert keras[1].fsdp_kept.endswith("(a tf-keras layer cannot slice padding off)")
    assert keras[2].fsdp_kept.startswith("a tf-keras bias or scale")


# recipes/mnist_cnn_2d.yaml's weights (model.layers under its rules) on batch=2,model=4
CNN_2D = [
    plan("conv2d_0.kernel", (3, 3, 1, 32), (U, U, U, U), "Conv2D"),
    plan("conv2d_0.bias", (32,), (U,), "Conv2D"),
    plan("conv2d_1.kernel", (3, 3, 32, 64), (U, U, U, U), "Conv2D"),
    plan("conv2d_1.bias", (64,), (U,), "Conv2D"),
    plan("dense_0.kernel", (1600, 64), (U, "model")),
    plan("dense_0.bias", (64,), ("model",)),
    plan("dense_1.kernel", (64, 10), ("model", U)),
    plan("dense_1.bias", (10,), (U,)),
]


def test_fsdp_on_tf_keras_layers_shards_only_what_dtensor_gathers():
    """mnist_cnn_2d with layouts.fsdp died in DTensor: the output bias on 'batch' made the
    logits split on the class dim and the accuracy's ArgMax failed to expand. tf-keras
    biases and scales, convolution kernels and tensor-parallel kernels stay as the rules put
    them, each saying why (`dtcli plan` prints it)."""
    got = apply_fsdp(CNN_2D, "batch", {"batch": 2, "model": 4}, gathers=False)
    assert [p.spec for p in got] == [p.spec for p in CNN_2D]
    why = {p.weight.path: p.fsdp_kept for p in got}
    assert why["conv2d_0.kernel"].startswith("a convolution kernel")
    assert why["dense_1.bias"].startswith("a tf-keras bias or scale")
    assert why["conv2d_1.bias"] == why["dense_1.bias"]
    assert why["dense_1.kernel"].startswith("split on 'model' by the rules")
    # a rule that puts a tf-keras bias on the data axis itself is refused, naming it
    biased = [*CNN_2D[:-1], WeightPlan(CNN_2D[-1].weight, r"dense_1\.bias", ("batch",))]
    with pytest.raises(UsageError, match=r"dense_1\\.bias'.*'dense_1.bias' on the data axis"):
        check_fsdp_layers(biased, "batch", {"batch": 2, "model": 4})


def test_fsdp_on_a_tensor_parallel_cnn_trains_as_one_device(cpu8):
    """mnist_cnn_2d's case, shrunk (test_mesh_invariance's CNN on the embedded digits, its
    Dense layers tensor-parallel on batch=2,model=4) with layouts.fsdp: it died in DTensor's
    SPMD expansion ("Expected shape: <256> got shape: <128>"); now the same losses as one
    device."""
    from dtcli import recipe as R
    from dtcli import session as T

    sets = [
        "data.flatten=false",
        test_mesh_invariance.SMALL_CNN,
        "layouts.rules=" + json.dumps(test_mesh_invariance.TP_RULES),
        "layouts.fsdp=true",
    ]
    losses = {}
    for mesh, use in (("batch=1", 1), ("batch=2,model=4", None)):
        recipe = R.load(ROOT / "recipes" / "quickstart.yaml", R.Overrides(sets, mesh, "cpu:8"))
        losses[mesh] = T.run_steps(T.prepare(recipe, use_devices=use), 5)
    np.testing.assert_allclose(losses["batch=2,model=4"], losses["batch=1"], rtol=1e-5)


def test_a_weight_on_the_data_and_a_model_axis_is_refused_for_keras_layers():
    axes = {"batch": 4, "model": 2}
    mixed = [WeightPlan(WeightInfo("dense_0.kernel", (64, 32), "Dense"), "d0", ("batch", "model"))]
    with pytest.raises(UsageError, match=r"layouts.rules.d0'.*'dense_0.kernel'.*'batch'.*'model'"):
        check_fsdp_layers(mixed, "batch", axes)
    # the same on a model axis of size 1 is no mix at all
    check_fsdp_layers(mixed, "batch", {"batch": 8, "model": 1})


def test_plan_refuses_mixed_rules_on_a_layer_list_naming_the_rule(cli):
    rules = {r"dense_0\.kernel": ["batch", "model"]}
    result = run_cli(
        "plan",
        ROOT / "recipes" / "quickstart.yaml",
        "--set",
        "layouts.rules=" + json.dumps(rules),
    )
    assert result.code == 2
    assert len(result.err_lines) == 1
    assert "layouts.rules.dense_0\\.kernel" in result.err and "at once" in result.err


def test_plan_says_why_fsdp_leaves_a_weight_and_what_it_pads(cli):
    cnn = run_cli(
        "plan",
        ROOT / "recipes" / "quickstart.yaml",
        *("--set", "data.flatten=false", "--set", test_mesh_invariance.SMALL_CNN),
        *("--set", "layouts.fsdp=true"),
    )
    assert cnn.code == 0, cnn.err
    notes = cnn.out[cnn.out.index("layouts.fsdp leaves weights as the rules put them:") :]
    assert "\n  conv2d_0.kernel: a convolution kernel (DTensor needs" in notes
    assert "\n  conv2d_0.bias, dense_0.bias, dense_1.bias: a tf-keras bias or scale" in notes
    assert "\n  dense_0.kernel, dense_1.kernel: split on 'model' by the rules" in notes
    assert "warning: layouts.fsdp shards no weight on the data axis 'batch'" in cnn.out
    mlp = run_cli(
        "plan",
        ROOT / "recipes" / "mnist_core_mlp_fsdp.yaml",
        *(x for s in PADDED_SETS for x in ("--set", s)),
        "--json",
    )
    assert mlp.code == 0, mlp.err
    weights = {w["path"]: w for w in json.loads(mlp.out.splitlines()[-1])["weights"]}
    kernel = weights["dense_1.kernel"]
    assert (kernel["shape"], kernel["padded_shape"]) == ([300, 100], [304, 100])
    assert (kernel["shard_shape"], kernel["bytes_per_device"]) == ([38, 100], 38 * 100 * 4)
    assert weights["dense_0.kernel"]["padded_shape"] is None
    assert all(w["fsdp"] and w["fsdp_kept"] is None for w in weights.values())


# --------------------------------------------------------------------------- live runs


def tiny_session(text_file, mesh: str, sets=(), recipe: str = "tiny_gpt.yaml"):
    from dtcli import recipe as R
    from dtcli import session as T

    recipe = R.load(
        ROOT / "recipes" / recipe,
        R.Overrides((f"data.path={text_file}", *TINY, *sets), mesh=mesh, devices="cpu:8"),
    )
    return T.prepare(recipe, use_devices=1 if mesh == "batch=1" else None)


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("text") / "corpus.txt", 20_000)


def local_bytes(variable) -> list[int]:
    """The bytes of each local device's shard of a variable, unpacked from the device."""
    from tensorflow.experimental import dtensor

    if not hasattr(variable, "layout"):  # an XLA run's plain variable, on its one device
        return [variable.numpy().nbytes]
    return [t.numpy().nbytes for t in dtensor.unpack(variable.read_value())]


def optimizer_slots(session) -> list:
    return [v for v in session.optimizer.trackable.variables if len(v.shape) > 0]


@pytest.fixture(scope="module")
def fsdp_runs(cpu8, text_file):
    """20 AdamW steps (warmup, cosine, clipping) of the tiny GPT: 1 device, FSDP over batch=8,
    FSDP x tensor parallel over batch=4,model=2 (the shipped recipes/gpt_fsdp_tp.yaml, shrunk,
    in float32)."""
    from dtcli import session as T

    out = {}
    for name, mesh, sets, recipe in (
        ("one", "batch=1", (), "tiny_gpt.yaml"),
        ("fsdp", "batch=8", FSDP, "tiny_gpt.yaml"),
        ("fsdp_tp", "batch=4,model=2", SHIPPED, "gpt_fsdp_tp.yaml"),
    ):
        s = tiny_session(text_file, mesh, sets, recipe)
        out[name] = (T.run_steps(s, 20), s)
    return out


@pytest.mark.parametrize("name", ["fsdp", "fsdp_tp"])
def test_fsdp_trains_as_one_device(fsdp_runs, name):
    base, _ = fsdp_runs["one"]
    losses, session = fsdp_runs[name]
    np.testing.assert_allclose(losses, base, rtol=1e-5)
    assert base[-1] < base[0] - 0.5  # it learned


@pytest.mark.parametrize("name, ratio", [("fsdp", 8), ("fsdp_tp", 7.5)])
def test_fsdp_holds_a_slice_of_weights_and_optimizer_state(fsdp_runs, name, ratio):
    """Measured on the devices: each weight and each of its Adam slots holds 1/(product of the
    axes it is split on) on every device; all together 1/8 of one device's bytes on batch=8,
    and on batch=4,model=2 1/8 for the two-axis weights (the LayerNorm gains split only 4 ways:
    the rules leave them to FSDP alone)."""
    _, one = fsdp_runs["one"]
    _, session = fsdp_runs[name]
    shares = {
        p.weight.path: math.prod(session.axes[a] for a in p.spec if a != U) for p in session.plans
    }
    assert all(p.fsdp or "batch" in p.spec for p in session.plans)
    full = total = 0
    for path, var in session.model.variables.items():
        sizes = local_bytes(var)
        assert sizes == [var.shape.num_elements() * 4 // shares[path]] * 8, path
    for var in session.model.trainable_variables + optimizer_slots(session):
        total += local_bytes(var)[0]
    for var in one.model.trainable_variables + optimizer_slots(one):
        full += local_bytes(var)[0]
    assert len(optimizer_slots(session)) == 2 * len(session.model.trainable_variables)
    assert full / total >= ratio
    if name == "fsdp":
        assert full == 8 * total


def test_optimizer_slots_take_their_weights_layout(fsdp_runs):
    _, session = fsdp_runs["fsdp_tp"]
    layouts = {v.shape: v.layout.sharding_specs for v in session.model.trainable_variables}
    slots = optimizer_slots(session)
    assert slots
    for slot in slots:
        assert slot.layout.sharding_specs == layouts[slot.shape], slot.name


# --------------------------------------------------------------------------- bf16, remat


def gradients(session):
    """The gradients of one batch's loss, gathered to the host, and the traced function (its
    graph shows what the step computes)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from dtcli.steps import step as step_lib

    x, y, mask = session.packer.pack_batch(next(iter(session.train_feed.epoch(0))))
    variables = session.model.trainable_variables

    @tf.function
    def grads(x, y, mask):
        with tf.GradientTape() as tape:
            out = step_lib.sums(session.model.forward(x, training=True), y, mask, True)
            loss = out["ce_sum"] / out["count"]
        return tape.gradient(loss, variables)

    values = grads(x, y, mask)
    if session.mesh is None:  # an XLA run's plain variables
        return [g.numpy() for g in values], grads.get_concrete_function(x, y, mask).graph
    host = [
        dtensor.unpack(dtensor.relayout(g, dtensor.Layout.replicated(session.mesh, g.shape.rank)))[
            0
        ].numpy()
        for g in values
    ]
    return host, grads.get_concrete_function(x, y, mask).graph


def op_types(graph) -> list[str]:
    """Every op in a graph and in the functions it calls (a recompute lives in one)."""
    definition = graph.as_graph_def()
    ops = [n.op for n in definition.node]
    for function in definition.library.function:
        ops += [n.op for n in function.node_def]
    return ops


@pytest.mark.parametrize("mesh, sets", [("batch=1", ()), ("batch=4,model=2", FSDP_TP)])
def test_remat_recomputes_and_gives_the_same_gradients(cpu8, text_file, mesh, sets):
    plain, plain_graph = gradients(tiny_session(text_file, mesh, sets))
    remat_session = tiny_session(
        text_file,
        mesh,
        [*sets, "model.transformer.remat=true"],
    )
    remat, remat_graph = gradients(remat_session)
    for a, b in zip(plain, remat):
        assert float(np.max(np.abs(a - b))) <= 1e-6
    # the block's forward runs again in the backward pass: GELU's erfc twice, not once
    assert op_types(plain_graph).count("Erfc") == 1
    assert op_types(remat_graph).count("Erfc") == 2


def test_bf16_runs_the_matmuls_in_bf16_and_keeps_float32_state(fsdp_runs, text_file):
    from dtcli import session as T

    base, _ = fsdp_runs["one"]
    s = tiny_session(text_file, "batch=1", ["train.precision=bf16"])
    losses = T.run_steps(s, 20)
    np.testing.assert_allclose(losses, base, rtol=5e-3)
    assert losses != base  # really another computation
    state = s.model.trainable_variables + optimizer_slots(s)
    assert {v.dtype.name for v in state} == {"float32"}
    _, graph = gradients(s)
    matmuls = [
        n for n in graph.as_graph_def().node if n.op in ("BatchMatMulV2", "MatMul", "Einsum")
    ]
    assert matmuls and all(n.attr["T"].type == 14 for n in matmuls)  # 14: DT_BFLOAT16


# --------------------------------------------------------------------------- checkpoints


def host_state(session) -> dict[str, np.ndarray]:
    """Every weight, optimizer slot and the step count, gathered to the host (at their own
    shapes: without FSDP's padding)."""
    from dtcli import models

    state = models.host_weights(session.model, session.mesh)
    for i, var in enumerate(optimizer_slots(session)):
        state[f"slot{i}"] = models.host_value(var, session.mesh)
    state["iterations"] = int(session.optimizer.iterations.numpy())
    return state


@pytest.mark.parametrize("source, target", [("one", "fsdp"), ("fsdp_tp", "data_parallel")])
def test_checkpoints_cross_between_data_parallel_and_fsdp(
    fsdp_runs, text_file, tmp_path, source, target
):
    """A checkpoint of 20 steps written on one device restores under FSDP (computing in bf16),
    and one written under FSDP x tensor parallel restores under plain data parallel: every
    weight, Adam slot and the step count exactly. (The steps after it are the same math on any of these meshes:
    test_fsdp_trains_as_one_device.)"""
    import tensorflow as tf

    _, trained = fsdp_runs[source]
    tf.train.Checkpoint(**trained.checkpoint_objects()).write(str(tmp_path / "ckpt"))
    # the FSDP side computes in bf16: the checkpoint holds float32 weights either way
    mesh, sets = (
        ("batch=8", [*FSDP, "train.precision=bf16"]) if target == "fsdp" else ("batch=8", ())
    )
    fresh = tiny_session(text_file, mesh, sets)
    assert any(p.fsdp for p in fresh.plans) == (target == "fsdp")
    tf.train.Checkpoint(**fresh.checkpoint_objects()).read(str(tmp_path / "ckpt")).assert_consumed()
    want, got = host_state(trained), host_state(fresh)
    assert want["iterations"] == got["iterations"] == 20
    assert want.keys() == got.keys()
    for key in want:
        np.testing.assert_array_equal(got[key], want[key], err_msg=key)


# --------------------------------------------------------------------------- padded FSDP

# recipes/mnist_core_mlp_fsdp.yaml (784-300-100-10 on batch=8) on synthetic MNIST-shaped data:
# the same weights, padded as the shipped recipe pads them, with no files to read.
PADDED_SETS = [
    "data.source=synthetic",
    "data.shape=[784]",
    "data.classes=10",
    "data.count=1280",
    "data.eval_count=256",
]


def padded_session(mesh: str, use_devices: int | None = None):
    from dtcli import recipe as R
    from dtcli import session as T

    recipe = R.load(
        ROOT / "recipes" / "mnist_core_mlp_fsdp.yaml", R.Overrides(PADDED_SETS, mesh, "cpu:8")
    )
    return T.prepare(recipe, use_devices=use_devices)


@pytest.fixture(scope="module")
def padded_runs(cpu8):
    """20 Adam steps of the shipped padded-FSDP recipe: on one device, and on batch=8."""
    from dtcli import session as T

    out = {}
    for name, mesh, use in (("one", "batch=1", 1), ("fsdp", "batch=8", None)):
        s = padded_session(mesh, use)
        out[name] = (T.run_steps(s, 20), s)
    return out


def test_padded_fsdp_trains_as_one_device(padded_runs):
    base, _ = padded_runs["one"]
    losses, session = padded_runs["fsdp"]
    padded = {p.weight.path: p.padded for p in session.plans if p.padded}
    assert padded == {
        "dense_0.bias": (304,),
        "dense_1.kernel": (304, 100),
        "dense_1.bias": (104,),
        "dense_2.kernel": (104, 10),
        "dense_2.bias": (16,),
    }
    np.testing.assert_allclose(losses, base, rtol=1e-5)
    assert base[-1] < base[0] - 0.5  # it learned


def padding(variable, mesh) -> np.ndarray:
    """The padded rows of a padded variable, gathered to the host."""
    from tensorflow.experimental import dtensor

    full = dtensor.relayout(
        variable.read_value(), dtensor.Layout.replicated(mesh, variable.shape.rank)
    )
    value = dtensor.unpack(full)[0].numpy()
    dim = variable.padded_dim
    return np.take(value, range(variable.unpadded_shape[dim], value.shape[dim]), axis=dim)


def test_padded_fsdp_holds_an_eighth_as_the_plan_says_and_never_trains_the_padding(padded_runs):
    """Weights + Adam state per device on the devices (each local shard) against one device's:
    <= 0.13 (0.125 and a bit of padding), and byte for byte what `dtcli plan` and train's
    memory check say. After 20 steps the padding of every weight and slot is still 0."""
    from dtcli import memory, plan

    _, one = padded_runs["one"]
    _, session = padded_runs["fsdp"]
    state = session.model.trainable_variables + optimizer_slots(session)
    per_device = [sum(sizes) for sizes in zip(*(local_bytes(v) for v in state))]
    replicated = sum(
        local_bytes(v)[0] for v in one.model.trainable_variables + optimizer_slots(one)
    )
    assert len(set(per_device)) == 1
    assert per_device[0] / replicated <= 0.13
    report = plan.make_report(session.recipe)
    totals = report.totals()["total"]
    assert (totals["per_device"], totals["replicated"]) == (per_device[0], replicated)
    planned = memory.plan_memory(session.recipe, session.axes)
    assert planned.weights == per_device[0] // 3  # Adam: the weights and 2 slots
    padded = [v for v in state if hasattr(v, "unpadded_shape")]
    assert len(padded) == 3 * 5  # five weights padded, and their two slots each
    for var in padded:
        assert not padding(var, session.mesh).any(), var.name


def test_a_padded_checkpoint_restores_unpadded_on_any_mesh(padded_runs, tmp_path):
    """Written under padded FSDP, a checkpoint holds every weight and slot at its own shape;
    it restores on one device (plain variables), on batch=4 (which pads only the last bias,
    10 -> 12) and on batch=8 again, with equal weights, slots and eval numbers."""
    import tensorflow as tf

    from dtcli import session as T
    from dtcli.steps import make_steps

    _, trained = padded_runs["fsdp"]
    assert len([p for p in trained.plans if p.padded]) == 5
    path = tf.train.Checkpoint(**trained.checkpoint_objects()).write(str(tmp_path / "ckpt"))
    shapes = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    assert shapes["model/layers/1/kernel/.ATTRIBUTES/VARIABLE_VALUE"] == [300, 100]
    assert shapes["optimizer/slots/v5_v/.ATTRIBUTES/VARIABLE_VALUE"] == [10]
    want = host_state(trained)

    def evaluated(session):
        return T.evaluate(session, make_steps(session)[1], session.eval_feed)

    expected = evaluated(trained)
    for mesh, use in (("batch=1", 1), ("batch=4", 4), ("batch=8", None)):
        fresh = padded_session(mesh, use)
        padded = {p.weight.path: p.padded for p in fresh.plans if p.padded}
        assert padded == {"batch=4": {"dense_2.bias": (12,)}}.get(mesh, padded), mesh
        tf.train.Checkpoint(**fresh.checkpoint_objects()).read(path).assert_consumed()
        got = host_state(fresh)
        assert got.keys() == want.keys()
        for key in want:
            np.testing.assert_array_equal(got[key], want[key], err_msg=f"{mesh}: {key}")
        result = evaluated(fresh)
        assert result["examples"] == expected["examples"] == 256
        assert result["loss"] == pytest.approx(expected["loss"], rel=1e-6), mesh
        assert result["accuracy"] == expected["accuracy"], mesh


def test_a_cpu_mesh_gathers_a_bf16_weight_in_float32_and_casts_after(cpu8):
    """DTensor runs a CPU mesh's collectives in float32, casting a bfloat16 tensor to float32
    and back around its all-gather: gathered in float32, the weight saves those two casts."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from dtcli.models.compute import Compute

    mesh = dtensor.create_mesh([("batch", 2), ("model", 2)], device_type="CPU", devices=[
        f"CPU:{i}" for i in range(4)])  # fmt: skip
    value = np.arange(24, dtype=np.float32).reshape(4, 6) / 7
    whole = dtensor.copy_to_mesh(value, dtensor.Layout.replicated(mesh, 2))
    weight = dtensor.DVariable(dtensor.relayout(whole, dtensor.Layout(["batch", "model"], mesh)))
    compute = Compute(gather_axis="batch", bf16=True)
    read = tf.function(lambda: compute.weight(weight))

    ops = read.get_concrete_function().graph.get_operations()
    relayouts = [op for op in ops if op.type == "Relayout"]
    assert [op.inputs[0].dtype for op in relayouts] == [tf.float32]
    got = read()
    assert got.dtype == tf.bfloat16
    assert dtensor.fetch_layout(got).sharding_specs == ["unsharded", "model"]
    want = tf.cast(tf.constant(value), tf.bfloat16).numpy()
    whole_got = dtensor.relayout(got, dtensor.Layout.replicated(mesh, 2))
    assert np.array_equal(dtensor.unpack(whole_got)[0].numpy(), want)
