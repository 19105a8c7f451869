"""`dtcli plan`: the per-weight table and per-device bytes, checked by arithmetic and against the
live sharded variables."""

from __future__ import annotations

import json

import pytest
from conftest import RECIPES, run_cli, run_here, write_corpus

from dtcli.layout import WeightInfo, plan_weights
from dtcli.models import transformer
from dtcli.plan import Report
from dtcli.recipe import TransformerConfig

TP = str(RECIPES / "mnist_mlp_tensor_parallel.yaml")


def mlp_report(axes: dict[str, int], slots: int = 2) -> Report:
    weights = [
        WeightInfo("dense_0.kernel", (784, 128), "Dense"),
        WeightInfo("dense_0.bias", (128,), "Dense"),
        WeightInfo("dense_1.kernel", (128, 10), "Dense"),
        WeightInfo("dense_1.bias", (10,), "Dense"),
    ]
    rules = {
        r"dense_0\.kernel": ["unsharded", "model"],
        r"dense_0\.bias": ["model"],
        r"dense_1\.kernel": ["model", "unsharded"],
        r"nothing\.here": ["model"],
    }
    plans = plan_weights(rules, weights, axes)
    return Report("mlp", axes, "cpu:8", "batch", plans, rules, slots, 128, (784,), 10)


def test_per_device_bytes_are_the_shard_arithmetic():
    report = mlp_report({"batch": 1, "model": 8})
    rows = {w["path"]: w for w in report.to_json()["weights"]}
    assert rows["dense_0.kernel"]["shard_shape"] == [784, 16]
    assert rows["dense_0.kernel"]["bytes_per_device"] == 784 * 16 * 4
    assert rows["dense_1.kernel"]["shard_shape"] == [16, 10]
    assert rows["dense_1.bias"]["rule"] is None and rows["dense_1.bias"]["shard_shape"] == [10]
    assert report.to_json()["unused_rules"] == [r"nothing\.here"]
    totals = report.totals()
    replicated = (784 * 128 + 128 + 128 * 10 + 10) * 4
    per_device = (784 * 16 + 16 + 16 * 10 + 10) * 4
    assert totals["parameters"] == {"per_device": per_device, "replicated": replicated}
    assert totals["optimizer_slots"] == {"per_device": 2 * per_device, "replicated": 2 * replicated}
    assert totals["total"]["per_device"] == 3 * per_device


def test_batch_shard_per_device():
    batch = mlp_report({"batch": 4, "model": 2}).batch()
    assert batch["global_shape"] == [128, 784]
    assert batch["per_device_shape"] == [32, 784]
    assert batch["input_bytes_per_device"] == 32 * 784 * 4
    assert batch["logits_per_device_shape"] == [32, 10]


def test_plan_json_for_the_tensor_parallel_recipe_is_about_one_eighth():
    proc = run_cli("plan", TP, "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    params = report["totals_bytes"]["parameters"]
    assert report["mesh"] == {"batch": 1, "model": 8}
    assert params["per_device"] / params["replicated"] == pytest.approx(1 / 8, abs=0.002)
    assert report["unused_rules"] == []
    assert {w["path"]: w["rule"] for w in report["weights"]}["dense_1.bias"] is None


def test_plan_rejects_a_sharded_convolution_kernel_before_any_work(tmp_path):
    proc = run_cli(
        "plan",
        RECIPES / "mnist_cnn_2d.yaml",
        "--set",
        r"layouts.rules={conv2d_0\.kernel: [unsharded, unsharded, unsharded, model]}",
    )
    assert proc.returncode == 2
    assert "shards convolution kernel 'conv2d_0.kernel'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_plan_of_every_shipped_recipe_matches_the_live_shards(tmp_path):
    """For each recipe: the table renders, and the bytes it reports per weight, parameters and
    optimizer slots equal the sizes of the live shards on device 0 (`dtensor.unpack`); its
    memory plan's weights, gradients and optimizer state (slots and scalars) those on every
    device. A GPT is built shrunk, each of its weights laid out as at the recipe's own size
    (that plan by arithmetic: gpt_fsdp_tp's 8 blocks 512 wide are checked below)."""
    corpus = write_corpus(tmp_path / "corpus.txt", 20_000)
    result = run_here(
        f"""
        import copy, io, json
        from pathlib import Path
        from rich.console import Console
        import tensorflow as tf
        from tensorflow.experimental import dtensor
        from dtcli import plan as P, recipe as R, session as T

        def per_device(variables):
            return [sum(int(t.numpy().nbytes) for t in shards) for shards in
                    zip(*(dtensor.unpack(v.read_value()) for v in variables))]

        out = {{}}
        for path in sorted(Path("{RECIPES}").glob("*.yaml")):
            raw = R.read_raw(path)
            # Same shapes, no download: TFDS/IDX MNIST is 28x28 grey, 10 classes.
            if raw["data"]["source"] in ("tfds", "idx"):
                raw["data"].update(source="synthetic", shape=[28, 28], classes=10, count=256,
                                   eval_count=64)
            if raw["devices"] == "cpu:1":  # this process has 8 CPUs: the same model on them
                raw.update(devices="cpu:8", mesh={{"batch": 4, "model": 2}})
            # The standard library's sources (MBs) only to train a BPE's merges: a small text
            # gives the same shapes (the same vocabulary for both the plan and the build).
            if raw["data"]["source"] == "text" and not raw["data"].get("path"):
                raw["data"]["path"] = "{corpus}"
            # A GPT's blocks are alike (a rule matches block_0's weights as it does block_7's):
            # 2 blocks 128 wide hold every kind of weight, at a fraction of the cost of
            # gpt_fsdp_tp's 8 blocks 512 wide. Its plan at the recipe's own size (arithmetic,
            # nothing built) gives each weight the layout the shrunk one gets (asserted below).
            blocks = raw["model"].get("transformer")
            full = None
            if blocks:
                report = P.make_report(R.from_mapping(copy.deepcopy(raw))).to_json()
                full = {{"totals": report["totals_bytes"], "transformer": dict(blocks),
                        "sharding": {{w["path"]: w["sharding"] for w in report["weights"]}}}}
                blocks.update(layers=min(blocks["layers"], 2),
                              d_model=min(blocks["d_model"], 128))
            recipe = R.from_mapping(raw)
            report = P.make_report(recipe)
            text = io.StringIO()
            P.render(report, Console(file=text, width=200))
            s = T.prepare(recipe, splits=())  # the model and optimizer; no data read
            live = {{p: int(dtensor.unpack(v.read_value())[0].numpy().nbytes)
                    for p, v in s.model.variables.items()}}
            opt = s.optimizer.trackable
            slot_vars = (list(opt.slots.values()) if hasattr(opt, "slots") else
                         [v for v in opt.variables if "iteration" not in v.name])
            slot_bytes = sum(int(dtensor.unpack(v.read_value())[0].numpy().nbytes)
                             for v in slot_vars)
            out[path.stem] = {{
                "planned": {{w["path"]: w["bytes_per_device"]
                            for w in report.to_json()["weights"]}},
                "sharding": {{w["path"]: w["sharding"] for w in report.to_json()["weights"]}},
                "full": full,
                "live": live,
                "totals": report.totals(),
                "slot_bytes": slot_bytes,
                "table_has_every_weight": all(p in text.getvalue() for p in live),
                "memory": report.memory.to_json(),
                "live_memory": {{
                    "weights": per_device(s.model.module.variables),
                    "gradients": per_device(s.model.trainable_variables),
                    "optimizer": per_device([v for v in tf.train.TrackableView(opt).descendants()
                                             if isinstance(v, tf.Variable)]),
                }},
            }}
        print(json.dumps(out))
        """
    )
    assert {
        "quickstart",
        "mnist_mlp_tensor_parallel",
        "mnist_mlp_2d",
        "mnist_cnn_2d",
        "tiny_gpt_tensor_parallel",
    } <= set(result)
    for name, r in result.items():
        assert r["table_has_every_weight"], name
        assert r["planned"] == r["live"], name
        assert r["totals"]["parameters"]["per_device"] == sum(r["live"].values()), name
        assert r["totals"]["optimizer_slots"]["per_device"] == r["slot_bytes"], name
        for item, live in r["live_memory"].items():
            assert live == [r["memory"][item]] * 8, (name, item)
        if r["full"] is not None:  # built shrunk: every weight laid out as at full size
            assert {p: r["full"]["sharding"][p] for p in r["sharding"]} == r["sharding"], name
    tp = result["mnist_mlp_tensor_parallel"]["totals"]["parameters"]
    assert tp["per_device"] / tp["replicated"] == pytest.approx(1 / 8, abs=0.002)
    # gpt_fsdp_tp at its own size, by arithmetic: 25.4 M parameters, each device 1/8 of them
    # (FSDP x tensor parallel; only the LayerNorms' 1/4, a few thousand) and of AdamW's slots.
    full = result["gpt_fsdp_tp"]["full"]
    cfg = TransformerConfig(**full["transformer"])
    assert (cfg.layers, cfg.d_model) == (8, 512)
    totals = full["totals"]
    assert totals["parameters"]["replicated"] == 4 * transformer.parameters(cfg, 256)
    assert totals["parameters"]["per_device"] / totals["parameters"]["replicated"] == (
        pytest.approx(1 / 8, abs=1e-4)
    )
    assert totals["optimizer_slots"]["per_device"] == 2 * totals["parameters"]["per_device"]


@pytest.mark.parametrize(
    "sets, expected",
    [
        (
            ["model.layers=[{Dense: {units: 127, activation: relu}}, {Dense: {units: 10}}]"],
            "has size 127, which does not divide by mesh axis 'model' of size 2",
        ),
        (
            [r"layouts.rules={dense_1\.bias: [model, unsharded]}"],
            "gives 2 dims but weight 'dense_1.bias' has rank 1",
        ),
        (["data.batch_size=30"], "30 does not divide by the data axis 'batch' of size 4"),
    ],
    ids=["not divisible", "rank", "batch"],
)
def test_plan_fails_as_train_does(sets, expected):
    args = [a for s in sets for a in ("--set", s)]
    proc = run_cli("plan", RECIPES / "quickstart.yaml", *args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0]
