"""LoRA (`lora:`, models/lora.py): adapters beside the kernels of a base from model.from_hf.

With B at zero the step-0 logits are the base's bit for bit; after 50 steps every base weight is
bitwise unchanged and the loss fell; the merged model (W + alpha/rank * A @ B, in numpy) gives
the unmerged log probabilities within 1e-5; 1 device (XLA), batch=2,model=2 and FSDP give the
same 20 losses within 1e-5; `plan` equals the live shards with the base frozen in bf16; the
adapters are laid out after their kernels; a run's checkpoints hold the adapters alone, resume,
evaluate, generate and score on its base, and refuse another base in one line."""

from __future__ import annotations

import json
import re
import shutil

import hf_models
import numpy as np
import pytest
import yaml
from conftest import ROOT

from dtcli import recipe as R
from dtcli.errors import UsageError
from dtcli.layout import WeightInfo
from dtcli.models import lora, transformer

TP_RULES = {
    r"block_\d+\.attention\.(query|key|value)\.kernel": ["unsharded", "model", "unsharded"],
    r"block_\d+\.attention\.proj\.kernel": ["model", "unsharded", "unsharded"],
    r"block_\d+\.mlp\.fc\.kernel": ["unsharded", "model"],
    r"block_\d+\.mlp\.proj\.kernel": ["model", "unsharded"],
}
EVERY_KERNEL = r"(attention|mlp)\.\w+\.kernel"  # q, k, v, proj, fc, proj: every kind
LORA = {"targets": EVERY_KERNEL, "rank": 4, "alpha": 8.0}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A random transformers GPT-2 (2 layers, 32 wide, 4 heads, biases) and a text to tune on."""
    tmp = tmp_path_factory.mktemp("lora")
    hf_models.gpt2(tmp / "hf")
    text = tmp / "text.txt"
    text.write_text("\n".join(hf_models.LINES * 8))
    return tmp


def raw(base, mesh: dict, rules: dict | None = None, fsdp: bool = False, **keys) -> dict:
    out = {
        "task": "language_model",
        "devices": "cpu:8",
        "mesh": mesh,
        "layouts": {"rules": TP_RULES if rules is None else rules, "fsdp": fsdp},
        "model": {"from_hf": str(base / "hf"), "transformer": {"context": 16}},
        "lora": LORA,
        "data": {"source": "text", "path": str(base / "text.txt"), "batch_size": 8},
        "optimizer": {"name": "adamw", "learning_rate": 1e-2},
        "train": {"steps": 50},
    }
    out.update(keys)
    return out


def session_of(recipe_raw: dict, use_devices: int | None):
    """The recipe built in this process, its base's weights loaded (as train does)."""
    from dtcli import session as T
    from dtcli.session import finetune

    s = T.prepare(R.load(recipe_raw), use_devices=use_devices)
    finetune.load_base(s)
    return s


def logits(s, x: np.ndarray) -> np.ndarray:
    """The model's logits of windows `x` in a tf.function (as the steps run it), on the host."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    from dtcli.infer.forward import on_host
    from dtcli.layout import replicated

    @tf.function
    def forward(window):
        out = s.model.forward(window, training=False)
        return dtensor.relayout(out, replicated(s.mesh, 3)) if s.mesh else out

    return on_host(forward(s.packer.pack(x)))


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


# --------------------------------------------------------------------------- arithmetic


def test_adapters_follow_their_kernels_shapes_and_layouts(cpu8):
    """A [input dims..., r], B [r, output dims...] for Dense and both attention kinds, listed
    as the built model lists them (frozen base, float32 adapters after their kernel); a
    column-parallel kernel's A replicated and B split, a row-parallel one's A split and B
    replicated."""
    from dtcli.layout import plan_weights
    from dtcli.models.compute import Compute
    from dtcli.models.keras import keras_variables

    cfg = R.TransformerConfig(layers=1, d_model=32, heads=4, context=8, bias=True, kv_heads=2)
    found = lora.adapters(R.LoraConfig(targets=EVERY_KERNEL, rank=4), transformer.weights(cfg, 64))
    shapes = {a.prefix: (a.a_shape, a.b_shape) for a in found.values()}
    assert shapes == {
        "block_0.attention.query": ((32, 4), (4, 4, 8)),
        "block_0.attention.key": ((32, 4), (4, 2, 8)),
        "block_0.attention.value": ((32, 4), (4, 2, 8)),
        "block_0.attention.proj": ((4, 8, 4), (4, 32)),
        "block_0.mlp.fc": ((32, 4), (4, 128)),
        "block_0.mlp.proj": ((128, 4), (4, 32)),
    }
    listed = lora.with_adapters(transformer.weights(cfg, 64), found, "bf16")
    built = transformer.build(cfg, 64, Compute(frozen=True, stored="bfloat16"), adapters=found)
    made = [
        WeightInfo(p, tuple(v.shape), owner, v.trainable, v.dtype.name)
        for p, v, owner in keras_variables(built)
    ]
    assert listed == made
    assert {w.path for w in made if w.trainable} == {
        f"{a.prefix}.{n}" for a in found.values() for n in ("lora_a", "lora_b")
    }
    axes = {"batch": 4, "model": 2}
    plans = lora.with_adapter_plans(listed, lambda some: plan_weights(TP_RULES, some, axes))
    spec = {p.weight.path: p.spec for p in plans}
    assert spec["block_0.attention.query.lora_a"] == ("unsharded", "unsharded")
    assert spec["block_0.attention.query.lora_b"] == ("unsharded", "model", "unsharded")
    assert spec["block_0.attention.proj.lora_a"] == ("model", "unsharded", "unsharded")
    assert spec["block_0.attention.proj.lora_b"] == ("unsharded", "unsharded")
    assert spec["block_0.mlp.fc.lora_b"] == ("unsharded", "model")
    assert spec["block_0.mlp.proj.lora_a"] == ("model", "unsharded")


@pytest.mark.parametrize(
    "targets, rank, expect",
    [
        ("nothing", 4, "finds none of the model's weights; the kernels are block_0.attention"),
        (r"\.bias$|ln_|embedding", 4, "finds only token_embedding.embeddings"),
        (EVERY_KERNEL, 40, "'lora.rank': 40 is larger than the input size 32 (dims [32]) of"),
    ],
)
def test_targets_and_rank_are_checked_by_arithmetic(targets, rank, expect):
    cfg = R.TransformerConfig(layers=2, d_model=32, heads=4, context=8, bias=True)
    with pytest.raises(UsageError) as err:
        lora.adapters(R.LoraConfig(targets=targets, rank=rank), transformer.weights(cfg, 64))
    assert expect in str(err.value)
    assert "block_1." not in str(err.value)  # block_0's kernels stand for every block's


# --------------------------------------------------------------------------- training


@pytest.fixture(scope="module")
def tuned(base, cpu8):
    """50 LoRA steps on batch=2,model=2 (tensor-parallel kernels), and the base alone on the
    same mesh: logits of 4 windows before and after, every weight before and after."""
    from dtcli import models
    from dtcli import session as T

    s = session_of(raw(base, {"batch": 2, "model": 2}), use_devices=4)
    plain = session_of(raw(base, {"batch": 2, "model": 2}, lora=None), use_devices=4)
    x = np.asarray(s.data.eval.x[:4], np.int32)
    out = {"x": x, "base_logits": logits(plain, x), "step0_logits": logits(s, x)}
    out["before"] = models.host_weights(s.model, s.mesh)
    out["losses"] = T.run_steps(s, 50)
    out["after"] = models.host_weights(s.model, s.mesh)
    out["logits"] = logits(s, x)
    return s, plain, out


def test_step_0_is_the_base_and_50_steps_leave_it_unchanged(tuned):
    s, _, out = tuned
    assert np.array_equal(out["step0_logits"], out["base_logits"])  # B is zero: bit for bit
    adapters = {p for p in out["after"] if lora.is_adapter(p)}
    assert {id(v) for v in s.model.trainable_variables} == {
        id(s.model.variables[p]) for p in adapters
    }
    for path, value in out["before"].items():
        if path in adapters:
            assert not np.array_equal(value, out["after"][path]), path
        else:
            assert np.array_equal(value, out["after"][path]), path  # the base: bitwise
    assert out["losses"][-1] < 0.8 * out["losses"][0], out["losses"][::10]


def test_merged_model_gives_the_unmerged_log_probabilities(tuned):
    """W + alpha/rank * A @ B (numpy) in the base model: within 1e-5 of the adapters unmerged."""
    from dtcli import models

    s, plain, out = tuned
    scale = LORA["alpha"] / LORA["rank"]
    for adapter in models.adapters_of(s.recipe, s.data.num_classes).values():
        a, b = out["after"][adapter.a_path], out["after"][adapter.b_path]
        delta = np.tensordot(a.astype(np.float64), b, axes=1)  # A's r with B's r
        merged = (out["after"][adapter.kernel] + scale * delta).astype(np.float32)
        var = plain.model.variables[adapter.kernel]
        var.assign(models.place(merged, var, plain.mesh))
    real = s.recipe.model.transformer.vocab_size  # the ids past it have -inf logits

    def logp(z: np.ndarray) -> np.ndarray:
        return log_softmax(z[..., :real])

    gap = np.abs(logp(logits(plain, out["x"])) - logp(out["logits"])).max()
    print(f"merged against unmerged log probabilities: max difference {gap:.2e}")
    assert gap <= 1e-5
    assert np.abs(logp(out["base_logits"]) - logp(out["logits"])).max() > 1e-2


def test_one_device_and_fsdp_train_the_same_20_steps(tuned, base):
    """One device (XLA, plain variables) and FSDP on batch=8 (adapters sharded on the data
    axis too) against batch=2,model=2's first 20 losses."""
    from dtcli import session as T

    _, _, out = tuned
    one = session_of(raw(base, {"batch": 1}, rules={}), use_devices=1)
    assert one.xla
    fsdp = session_of(raw(base, {"batch": 8}, rules={}, fsdp=True), use_devices=None)
    sharded = {p.weight.path for p in fsdp.plans if p.fsdp}
    assert "block_0.mlp.fc.lora_b" in sharded and "block_0.mlp.fc.kernel" in sharded
    want = np.asarray(out["losses"][:20])
    for name, s in (("1 device", one), ("fsdp batch=8", fsdp)):
        losses = np.asarray(T.run_steps(s, 20))
        print(f"{name}: losses {np.max(np.abs(losses / want - 1)):.1e} relative from 2x2's")
        np.testing.assert_allclose(losses, want, rtol=1e-5)


# --------------------------------------------------------------------------- memory


# From here on the module's commands run without Grappler's rewrites (conftest.without_grappler,
# torn down with the module): their checks are bytes, files, messages and equalities with the
# run's own records; the training numerics above keep the rewrites.
@pytest.mark.usefixtures("without_grappler")
def test_plan_equals_the_live_shards_with_a_bf16_base(base, cli, tmp_path):
    """Trainable (adapters, float32), frozen (the base, bfloat16) and optimizer bytes per
    device: the plan's equal each device's live shards."""
    from test_memory import live_bytes

    from dtcli import memory, plan
    from dtcli import session as T

    recipe_raw = raw(base, {"batch": 4, "model": 2}, fsdp=True)
    recipe_raw["lora"] = {**LORA, "base_precision": "bf16"}
    s = session_of(recipe_raw, use_devices=None)
    T.run_steps(s, 1)
    kernel = s.model.variables["block_0.mlp.fc.kernel"]
    assert kernel.dtype.name == "bfloat16" and not kernel.trainable
    live = live_bytes(s)
    frozen = [v for v in s.model.module.variables if not v.trainable]
    live["frozen"] = [sum(n) for n in zip(*[live_bytes_of(v) for v in frozen])]
    loaded = R.load(recipe_raw)
    planned = plan.make_report(loaded).memory
    assert planned == memory.plan_memory(loaded, s.axes)
    assert live["weights"] == [planned.weights] * 8
    assert live["frozen"] == [planned.frozen] * 8
    assert live["gradients"] == [planned.trainable] * 8 == [planned.gradients] * 8
    assert live["optimizer"] == [planned.optimizer] * 8
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe_raw))
    shown = cli("plan", tmp_path / "r.yaml").out
    for kind, dtype, size in (
        ("frozen", "bfloat16", planned.frozen),
        ("trainable", "float32", planned.trainable),
    ):
        row = rf"\nweights: {kind} \({dtype}\) +{re.escape(memory.size_text(size))}\n"
        assert re.search(row, shown), row
    recipe_raw["lora"] = LORA  # the base in float32: twice the frozen bytes, nothing else
    float32 = memory.plan_memory(R.load(recipe_raw), s.axes)
    assert float32.frozen == 2 * planned.frozen
    assert (float32.trainable, float32.optimizer) == (planned.trainable, planned.optimizer)


def live_bytes_of(variable) -> list[int]:
    from tensorflow.experimental import dtensor

    return [shard.numpy().nbytes for shard in dtensor.unpack(variable.read_value())]


def gpt2_small(tmp_path, lora_keys: dict | None) -> dict:
    """GPT-2 small's shape (12 x 768, vocab 50257 -> 50304), planned on 8 devices."""
    from dtcli import memory

    folder = tmp_path / "gpt2"
    folder.mkdir(exist_ok=True)
    shutil.copy(ROOT / "tests" / "data" / "hf" / "gpt2" / "config.json", folder)
    hf_models.tokenizer_json(folder)
    recipe = R.load(
        {
            "task": "language_model",
            "mesh": {"batch": 8},
            "model": {"from_hf": str(folder), "transformer": {"context": 1024}},
            "lora": lora_keys,
            "data": {"source": "text", "batch_size": 8},
            "optimizer": {"name": "adamw"},
        }
    )
    return memory.plan_memory(recipe, {"batch": 8})


def test_gpt2_small_optimizer_bytes_rank_8_against_full_fine_tuning(tmp_path):
    """Pure arithmetic: q and v adapters of rank 8 (peft's GPT-2 default) against every weight
    trained."""
    full = gpt2_small(tmp_path, None)
    tuned = gpt2_small(tmp_path, {"targets": r"attention\.(query|value)\.kernel$", "rank": 8})
    adapters = 12 * 2 * (768 * 8 + 8 * 768)  # blocks x (q, v) x (A + B)
    assert tuned.trainable == 4 * adapters
    assert tuned.optimizer == 2 * 4 * adapters + 12  # m and v, + iterations and the rate
    assert tuned.frozen == full.weights
    print(
        f"GPT-2 small, AdamW, per device: optimizer {full.optimizer:,} B full, "
        f"{tuned.optimizer:,} B LoRA rank 8 (q, v): {full.optimizer / tuned.optimizer:.0f}x"
    )
    assert full.optimizer > 300 * tuned.optimizer


# --------------------------------------------------------------------------- a run


def write_recipe(base, path, **keys) -> None:
    recipe_raw = raw(base, {"batch": 4, "model": 2}, **keys)
    recipe_raw["lora"] = {"targets": r"attention\.(query|value)\.kernel$", "rank": 2}
    recipe_raw["train"] = {"steps": 4, "eval_every": 2, "log_every": 1}
    path.write_text(yaml.safe_dump(recipe_raw))


@pytest.mark.usefixtures("without_grappler")
def test_a_lora_run_saves_adapters_resumes_evaluates_generates_scores(base, cli, tmp_path):
    """Its checkpoints hold the adapters, optimizer and counters, never the base, and name the
    base by digests; it resumes, and eval, generate and score run it unmerged; another base at
    the recipe's model.from_hf is refused in one line by each, the run left as it was."""
    from conftest import checkpoint_tensors, snapshot

    from dtcli import checkpoint as ckpt_lib
    from dtcli import data as data_lib
    from dtcli import rundir
    from dtcli.export import plain

    hf = tmp_path / "hf"
    shutil.copytree(base / "hf", hf)
    write_recipe(
        base, tmp_path / "r.yaml", model={"from_hf": str(hf), "transformer": {"context": 16}}
    )
    run = tmp_path / "run"
    result = cli("train", tmp_path / "r.yaml", "--out", run, "--no-progress")
    assert result.code == 0, result.err
    assert "trainable (LoRA)" in result.err
    ckpt = rundir.complete_checkpoints(run)[-1]
    meta = ckpt_lib.read_meta(ckpt)
    assert meta["base"]["from"] == "model.from_hf" and meta["base"]["path"] == str(hf)
    assert set(meta["base"]["digests"]) == {"model.safetensors", "config.json"}
    assert checkpoint_tensors(ckpt) == {}  # nothing under model/: no base weight
    import tensorflow as tf

    keys = tf.train.load_checkpoint(str(ckpt / "ckpt")).get_variable_to_shape_map()
    assert {k.split("/")[0] for k in keys} == {"lora", "optimizer", "_CHECKPOINTABLE_OBJECT_GRAPH"}
    size = sum(f.stat().st_size for f in ckpt.iterdir())
    print(f"a LoRA checkpoint: {size:,} B; its base's model.safetensors: ", end="")
    print(f"{(hf / 'model.safetensors').stat().st_size:,} B")
    assert size < (hf / "model.safetensors").stat().st_size / 5
    adapters = plain.lora_adapters(rundir.checkpoint_recipe(ckpt, "export"), ckpt)
    assert sorted(adapters.arrays) == [
        f"block_{i}.attention.{p}.lora_{ab}"
        for i in (0, 1)
        for p in ("query", "value")
        for ab in "ab"
    ]
    assert adapters.arrays["block_1.attention.value.lora_b"].shape == (2, 4, 8)
    assert np.abs(adapters.arrays["block_1.attention.value.lora_b"]).max() > 0
    assert adapters.lora.rank == 2 and adapters.transformer.d_model == 32

    result = cli("train", "--resume", run, "--set", "train.steps=6", "--no-progress")
    assert result.code == 0, result.err
    assert rundir.complete_checkpoints(run)[-1].name == "ckpt-00000006"
    result = cli("eval", run, "--json", "--no-progress")
    assert result.code == 0, result.err
    evaluated = json.loads(result.out)
    with open(run / "metrics.jsonl") as f:
        last = [json.loads(line) for line in f][-1]
    assert evaluated["loss"] == pytest.approx(last["eval_loss"], rel=1e-5)
    assert cli("generate", run, "--prompt", "All:", "--tokens", "4", "--no-progress").code == 0
    assert cli("score", run, "--text", "We are accounted poor", "--no-progress").code == 0
    # The SavedModel (plain variables: the base loaded, then the adapters) gives eval's loss.
    assert cli("export", run, "--out", tmp_path / "sm").code == 0
    served = tf.saved_model.load(str(tmp_path / "sm")).signatures["serving_default"]
    split = data_lib.load(R.load(run / "recipe.yaml").data, ("eval",), run / "tokenizer.json", 131)
    z = served(x=tf.constant(split.eval.x, tf.int32))["logits"].numpy()[..., :131]
    loss = -np.take_along_axis(log_softmax(z), split.eval.y[..., None].astype(int), -1).mean()
    assert loss == pytest.approx(evaluated["loss"], rel=1e-5)
    result = cli("export", run, "--out", tmp_path / "hf_out", "--format", "hf")
    assert result.code == 2 and "--format hf: the run holds LoRA adapters" in result.err

    # Another base of the same shape at the same path: one weight fine-tuned a little.
    from safetensors.numpy import load_file, save_file

    tensors = load_file(hf / "model.safetensors")
    tensors["transformer.h.0.attn.c_attn.weight"] += 0.01
    save_file(tensors, hf / "model.safetensors", metadata={"format": "pt"})
    before = snapshot(run)
    for args in (
        ("train", "--resume", run, "--set", "train.steps=8"),
        ("eval", run),
        ("generate", run, "--prompt", "All:"),
        ("score", run, "--text", "All:"),
    ):
        result = cli(*args, "--no-progress")
        assert result.code == 2, result.err
        assert result.err_lines == [
            f"error: checkpoint {rundir.complete_checkpoints(run)[-1]} holds LoRA adapters of "
            f"base {hf} (model.from_hf); model.from_hf {hf} is another base (model.safetensors "
            "differs)"
        ], args
    assert snapshot(run) == before


@pytest.mark.usefixtures("without_grappler")
def test_a_lora_run_on_a_dtcli_run_with_its_base_in_bf16(cli, tmp_path):
    """model.from_run as the base (a tiny GPT trained 2 steps, run A), stored in bfloat16 (read
    from A's float32 checkpoint on the host, cast, placed): the run trains, its checkpoints name
    A's checkpoint by A's own digests, and it evaluates; A trained again at the same path with
    another seed is another base, refused in one line."""
    from conftest import RECIPES, write_corpus

    from dtcli import checkpoint as ckpt_lib
    from dtcli import rundir

    corpus = write_corpus(tmp_path / "corpus.txt", 20_000)
    tiny = {"layers": 1, "d_model": 32, "heads": 4, "mlp_ratio": 2, "context": 16}
    a = tmp_path / "A"

    def train_a(seed: int) -> None:
        sets = [f"model.transformer={json.dumps(tiny)}", f"data.path={corpus}", f"seed={seed}"]
        sets += ["data.batch_size=8", "train.steps=2", "optimizer.warmup_steps=1"]
        args = [x for s in sets for x in ("--set", s)]
        gpt = RECIPES / "tiny_gpt.yaml"
        result = cli("train", gpt, "--out", a, "--mesh", "batch=8", "--no-progress", *args)
        assert result.code == 0, result.err

    train_a(0)
    recipe = {
        "devices": "cpu:8",
        "mesh": {"batch": 8},
        "model": {"from_run": str(a)},
        "lora": {"rank": 2, "base_precision": "bf16"},
        "data": {"source": "text", "path": str(corpus), "batch_size": 8},
        "train": {"steps": 2},
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    run = tmp_path / "run"
    result = cli("train", tmp_path / "r.yaml", "--out", run, "--no-progress")
    assert result.code == 0, result.err
    base_ckpt = rundir.complete_checkpoints(a)[-1]
    files = ckpt_lib.read_meta(base_ckpt)["files"]
    meta = ckpt_lib.read_meta(rundir.complete_checkpoints(run)[-1])
    assert meta["base"] == {
        "from": "model.from_run",
        "path": str(base_ckpt.resolve()),
        "digests": {name: files[name]["sha256"] for name in sorted(files)},
    }
    assert cli("eval", run, "--no-progress").code == 0
    assert cli("export", run, "--out", tmp_path / "sm").code == 0  # plain variables, bf16 base
    shutil.rmtree(a)
    train_a(1)
    result = cli("eval", run, "--no-progress")
    assert result.code == 2 and len(result.err_lines) == 1, result.err
    assert result.err_lines[0].startswith(
        f"error: checkpoint {rundir.complete_checkpoints(run)[-1]} holds LoRA adapters of base "
        f"{base_ckpt.resolve()} (model.from_run); model.from_run {base_ckpt.resolve()} is "
        "another base (ckpt.data-"
    ), result.err
