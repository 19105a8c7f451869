"""The memory plan (dtcli.memory): its weight, gradient and optimizer bytes equal the local shards a
live run allocates on each device, exactly; `--memory` is parsed and enforced by `plan` and
`train` (before anything is allocated); the transformer's weights by arithmetic equal the built
model's."""

from __future__ import annotations

import json
import math

import pytest
from conftest import RECIPES, run_cli, run_python
from test_language_model import SPLIT_EMBEDDINGS

from dtcli import memory, recipe
from dtcli.errors import UsageError
from dtcli.models import transformer

# Checked: bytes of the shards a run allocates, and messages; Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")

GPT_TP = str(RECIPES / "tiny_gpt_tensor_parallel.yaml")
SMALL_GPT = {"layers": 2, "d_model": 32, "heads": 4, "mlp_ratio": 4, "context": 16}
# Every weight sharded on the data axis by plain rules (DTENSOR_NOTES.md, "FSDP by layouts").
FSDP_RULES = {
    r"(token|position)_embedding\.embeddings": ["unsharded", "batch"],
    r"block_\d+\.attention\.(query|key|value)\.kernel": ["batch", "unsharded", "unsharded"],
    r"block_\d+\.attention\.proj\.kernel": ["unsharded", "unsharded", "batch"],
    r"block_\d+\.mlp\.fc\.kernel": ["batch", "unsharded"],
    r"block_\d+\.mlp\.proj\.kernel": ["unsharded", "batch"],
}
# The Core MLP's hidden layer split on `model` (column-, then row-parallel).
MLP_TP = {r"dense_0\.kernel": ["unsharded", "model"], r"dense_1\.kernel": ["model", "unsharded"]}


def gpt_raw(text_file: str, mesh: dict, rules: dict, **transformer_keys: object) -> dict:
    return {
        "name": "gpt",
        "task": "language_model",
        "devices": "cpu:8",
        "mesh": mesh,
        "layouts": {"rules": rules},
        "model": {"transformer": {**SMALL_GPT, **transformer_keys}},
        "data": {"source": "text", "path": text_file, "batch_size": 8},
        "optimizer": {"name": "adamw", "learning_rate": 1e-3},
        "train": {"steps": 2, "eval_every": 2},
    }


@pytest.fixture(scope="module")
def text_file(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("text") / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    return str(path)


def live_bytes(session) -> dict[str, list[int]]:
    """Bytes of each device's local shards: every model variable, the trainable ones (each
    gradient's layout), and every variable the optimizer tracks (slots and scalars)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    def per_device(variables: list) -> list[int]:
        sums = [0] * session.devices.local_count
        for var in variables:
            for i, shard in enumerate(dtensor.unpack(var.read_value())):
                sums[i] += shard.numpy().nbytes
        return sums

    optimizer = tf.train.TrackableView(session.optimizer.trackable).descendants()
    return {
        "weights": per_device(session.model.module.variables),
        "gradients": per_device(session.model.trainable_variables),
        "optimizer": per_device([v for v in optimizer if isinstance(v, tf.Variable)]),
    }


def check_live(raw: dict, step: bool = True) -> dict:
    """`raw` built in this process (and one step trained: anything an optimizer makes on its
    first step exists then), then its plan against the live shards."""
    from dtcli import plan, session

    loaded = recipe.from_mapping(raw)
    s = session.prepare(loaded, splits=("train",))
    if step:
        session.run_steps(s, 1)
    live = live_bytes(s)
    planned = plan.make_report(loaded).memory
    assert planned == memory.plan_memory(loaded, s.axes)  # train's check: the same figures
    for item, per_device in live.items():
        assert per_device == [getattr(planned, item)] * len(per_device), item
    return live


@pytest.mark.parametrize("case", ["fsdp batch=8", "megatron batch=4,model=2"])
def test_gpt_plan_equals_the_live_shards_on_every_device(case, text_file, cpu8):
    if case.startswith("fsdp"):
        # One block (it holds every kind of weight the rules split): the step trained below
        # compiles the whole model on 8 devices.
        raw = gpt_raw(text_file, {"batch": 8}, FSDP_RULES, layers=1)
    else:
        # The recipe's Megatron rules, with the embeddings split on features (the recipe
        # keeps them replicated): the plan must count a sharded table too.
        rules = {**SPLIT_EMBEDDINGS, **recipe.read_raw(GPT_TP)["layouts"]["rules"]}
        raw = gpt_raw(text_file, {"batch": 4, "model": 2}, rules, bias=True, tie_embeddings=False)
    # The tf-keras optimizer's first step is trained on the FSDP mesh (and with the Core MLP's).
    live = check_live(raw, step=case.startswith("fsdp"))
    cfg = recipe.from_mapping(raw).model.transformer
    replicated = 4 * sum(math.prod(w.shape) for w in transformer.weights(cfg, 256))
    assert live["weights"][0] < replicated / (7 if case.startswith("fsdp") else 1.5)


def mlp_raw(mesh: dict, rules: dict) -> dict:
    return {
        "name": "mlp",
        "devices": "cpu:8",
        "mesh": mesh,
        "layouts": {"rules": rules},
        "model": {"api": "core", "hidden": [32]},
        "data": {"source": "synthetic", "shape": [12], "classes": 4, "count": 64, "batch_size": 16},
        "optimizer": {"name": "sgd", "momentum": 0.9, "learning_rate": 0.1},
    }


def test_core_mlp_with_sgd_momentum_plan_equals_the_live_shards(cpu8):
    live = check_live(mlp_raw({"batch": 4, "model": 2}, MLP_TP))
    # dense_0: [12, 16] + [32] on each device, dense_1: [16, 4] + [4]; one momentum slot each.
    weights = (12 * 16 + 32 + 16 * 4 + 4) * 4
    assert live["weights"][0] == weights
    assert live["optimizer"][0] == weights + 8  # + iterations (int64)


def test_the_estimate_follows_micro_batch_precision_remat_and_gathers():
    """Pure arithmetic (no TensorFlow): what each recipe key changes, and what it leaves."""

    def plan(rules: dict = FSDP_RULES, train: dict | None = None, **model: object) -> memory.Memory:
        raw = gpt_raw("unused.txt", {"batch": 8}, rules, **model)
        raw["data"]["batch_size"] = 32
        raw["train"] = {**raw["train"], **(train or {})}
        return memory.plan_memory(recipe.from_mapping(raw), {"batch": 8})

    base = plan()
    acts = base.activations
    s, b, h = SMALL_GPT["context"], 4, SMALL_GPT["d_model"]
    assert acts.details["micro_batch"] == b and acts.parts["gathered_weights"] > 0
    half = plan(train={"accumulate": 2})
    assert half.activations.parts["blocks"] * 2 == acts.parts["blocks"]
    assert half.gradients == 2 * base.gradients  # the running sum and the micro-batch's
    assert (half.weights, half.optimizer) == (base.weights, base.optimizer)
    bf16 = plan(train={"precision": "bf16"})
    assert bf16.activations.total < acts.total and bf16.weights == base.weights
    remat = plan(remat=True).activations
    per_block = acts.details["per_block_bytes"]
    assert remat.parts["blocks"] == 2 * 4 * s * b * h + per_block  # 2 blocks' inputs + one
    assert remat.parts["gathered_weights"] < acts.parts["gathered_weights"]
    assert "gathered_weights" not in plan(rules={}).activations.parts


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("tie", [True, False])
def test_transformer_weights_by_arithmetic_equal_the_built_model(bias, tie, cpu8):
    from dtcli.models.keras import keras_variables

    cfg = recipe.TransformerConfig(**SMALL_GPT, bias=bias, tie_embeddings=tie)
    built = transformer.build(cfg, 256)
    listed = [(p, tuple(v.shape), owner, v.trainable) for p, v, owner in keras_variables(built)]
    arithmetic = [(w.path, w.shape, w.layer, w.trainable) for w in transformer.weights(cfg, 256)]
    assert arithmetic == listed
    params = sum(math.prod(w.shape) for w in transformer.weights(cfg, 256))
    assert params == transformer.parameters(cfg, 256)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("16GiB", 16 * 2**30),
        ("512MiB", 512 * 2**20),
        ("1.5GB", 1_500_000_000),
        ("1000000", 1_000_000),
        (" 2 kib ", 2048),
        ("3TB", 3 * 10**12),
        ("10B", 10),
    ],
)
def test_memory_sizes(text, expected):
    assert memory.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "16XB", "1.5", "-1GiB", "0", "0.1B", "1e9", "16 G"])
def test_bad_memory_sizes_name_the_option(text):
    with pytest.raises(UsageError, match=r"^--memory '.*': expected"):
        memory.parse_size(text)


def test_plan_json_carries_every_figure_and_fits(cli):
    proc = cli("plan", GPT_TP, "--json", "--memory", "16GiB")
    assert proc.code == 0, proc.err
    report = json.loads(proc.out.strip().splitlines()[-1])
    figures = report["memory_bytes"]
    assert set(figures) == {"weights", "gradients", "optimizer", "activations", "total"}
    assert figures["total"] == sum(v for k, v in figures.items() if k != "total")
    assert report["budget_bytes"] == 16 * 2**30 and report["fits"] is True
    # AdamW: 2 slots per trainable weight, + iterations (int64) and the learning rate (float32).
    assert figures["optimizer"] == 2 * figures["weights"] + 12
    no_budget = json.loads(cli("plan", GPT_TP, "--json").out.strip().splitlines()[-1])
    assert no_budget["fits"] is None and no_budget["budget_bytes"] is None  # CPUs report none


def test_plan_below_its_total_is_refused_in_one_line(cli):
    total = json.loads(cli("plan", GPT_TP, "--json").out.strip().splitlines()[-1])
    need = total["memory_bytes"]["total"]
    proc = cli("plan", GPT_TP, "--memory", str(need - 1))
    assert proc.code == 2
    assert len(proc.err_lines) == 1 and proc.err_lines[0].startswith(f"error: --memory {need - 1}")
    assert "fits" in proc.out and "NO" in proc.out  # the plan is shown first
    assert cli("plan", GPT_TP, "--memory", str(need)).code == 0


def test_train_refuses_before_the_model_is_built_and_trains_just_above(tmp_path, monkeypatch, cpu8):
    """--memory one byte under the plan is refused in one line before any model is built and
    leaves no run folder; exactly the plan trains. (The same with dtcli's GPT in a fresh
    process: test_train_refuses_a_transformer_without_importing_tensorflow.)"""
    from dtcli import models

    raw = mlp_raw({"batch": 4, "model": 2}, MLP_TP)
    raw["train"] = {"steps_per_epoch": 2, "steps_per_call": 2}
    path = tmp_path / "mlp.yaml"
    path.write_text(json.dumps(raw))
    need = memory.plan_memory(recipe.from_mapping(raw), {"batch": 4, "model": 2}).total
    out = tmp_path / "run"
    with monkeypatch.context() as m:

        def no_build(*args: object, **kwargs: object) -> None:
            raise AssertionError("the model was built")

        m.setattr(models, "build", no_build)
        proc = run_cli("train", path, "--memory", need - 1, "--out", out, "--no-progress")
    assert proc.code == 2, proc.err
    assert len(proc.err_lines) == 1
    line = proc.err_lines[0]
    assert line.startswith(f"error: --memory {need - 1}: the plan needs {need:,} B per device")
    assert "(largest: " in line and line.endswith("; or give --no-memory-check")
    assert not out.exists()
    proc = run_cli("train", path, "--memory", need, "--out", out, "--no-progress")
    assert proc.code == 0, proc.err
    assert (out / "recipe.yaml").is_file()


def test_train_refuses_a_transformer_without_importing_tensorflow(tmp_path):
    """dtcli's transformer is planned by arithmetic: the refusal needs no TensorFlow at all."""
    out = tmp_path / "run"
    result = run_python(
        f"""
        import json, sys
        from dtcli import cli
        code = cli.run(["train", "{RECIPES / "tiny_gpt.yaml"}", "--memory", "1MiB",
                        "--out", "{out}"])
        print(json.dumps({{"code": code, "tensorflow": "tensorflow" in sys.modules}}))
        """
    )
    assert result == {"code": 2, "tensorflow": False}
    assert not out.exists()


def test_a_tf_keras_model_is_planned_on_the_devices_the_run_then_finds():
    """A tf-keras layer list is built on the host to be planned; the devices are configured
    before (TensorFlow fixes them when it runs its first op), so the run still gets its 8."""
    result = run_python(
        f"""
        import json
        from dtcli import memory, recipe, session
        r = recipe.load("{RECIPES / "quickstart.yaml"}")
        memory.check_before_run(r, memory.budget_from_args("1GiB"))
        print(json.dumps(session.prepare(r, splits=()).devices.count))
        """
    )
    assert result == 8
