"""Language models: byte-level text windows, the built-in GPT trained the same on any mesh
(1 device, batch=8, batch=4 x model=2, model=8 with 8 heads), the learning-rate schedule, a
train.steps run's evaluation points, and `dtcli generate` giving the same text on any mesh."""

from __future__ import annotations

import json
import math
import re
import signal

import numpy as np
import pytest
from conftest import ROOT, write_corpus

MESHES = ["batch=1", "batch=8", "batch=4,model=2", "model=8"]
# recipes/tiny_gpt_tensor_parallel.yaml's rules, shrunk: 1 block 32 wide with 8 heads (a block
# holds every kind of weight; more would only cost compile time).
TINY = [
    "model.transformer={layers: 1, d_model: 32, heads: 8, mlp_ratio: 2, context: 16}",
    "data.batch_size=8",
    "data.eval_batch_size=8",
    "train.steps_per_call=10",
    "optimizer.warmup_steps=5",
    "optimizer.min_learning_rate=1e-4",
]
SPLIT_EMBEDDINGS = {r"(token|position)_embedding\.embeddings": ["unsharded", "model"]}
SGD = ["optimizer.name=sgd", "optimizer.no_decay=null", "optimizer.momentum=0.9"]


def tiny_recipe(tmp_text, sets=(), mesh="batch=1"):
    from dtcli import recipe as R

    path = ROOT / "recipes" / "tiny_gpt_tensor_parallel.yaml"
    # The recipe keeps its embeddings replicated (faster); split on their feature dim here,
    # so the equality checks cover a sharded table and tied head too.
    rules = {**SPLIT_EMBEDDINGS, **R.read_raw(path)["layouts"]["rules"]}
    overrides = (f"data.path={tmp_text}", f"layouts.rules={json.dumps(rules)}", *TINY, *sets)
    return R.load(path, R.Overrides(overrides, mesh=mesh, devices="cpu:8"))


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("text") / "corpus.txt", 20_000)


# --------------------------------------------------------------------------- data


def test_text_windows_are_the_bytes_and_the_next_bytes(text_file):
    from dtcli import data as D
    from dtcli import recipe as R

    cfg = R.DataConfig(source="text", path=str(text_file), context=16)
    ds = D.load(cfg)
    raw = np.frombuffer(text_file.read_bytes(), np.uint8)
    cut = int(len(raw) * 0.9)
    assert ds.num_classes == 256 and ds.input_shape == (16,)
    # training windows start at every byte of the first 90%
    assert len(ds.train) == cut - 16
    for i in (0, 1, 777, len(ds.train) - 1):
        np.testing.assert_array_equal(ds.train.x[i], raw[i : i + 16])
        np.testing.assert_array_equal(ds.train.y[i], raw[i + 1 : i + 17])
    # evaluation windows tile the last 10% without overlap: each byte predicted once
    assert len(ds.eval) == (len(raw) - cut - 1) // 16
    np.testing.assert_array_equal(ds.eval.x[1], raw[cut + 16 : cut + 32])
    np.testing.assert_array_equal(ds.eval.y[1], raw[cut + 17 : cut + 33])
    # a batch copies only its own windows (views of the file's bytes until then)
    assert not ds.train.x.flags.owndata


def test_text_defaults_to_the_standard_library_sources():
    from dtcli import data as D
    from dtcli import recipe as R

    ds = D.load(R.DataConfig(source="text", context=8))
    assert "standard library" in ds.description
    assert len(ds.train) > 1_000_000  # megabytes of real Python
    head = bytes(ds.train.x[0]) + bytes(ds.train.y[0][-1:])
    first = D.stdlib_sources()[0].read_bytes()[:9]
    assert head == first


def test_tfds_text_by_name_reads_its_splits_bytes(tmp_path, cpu8):
    """`data.name: tiny_shakespeare` (TFDS; here its mock data, no network): the training
    tokens are the train split's text, the evaluation tokens validation+test's."""
    import tensorflow_datasets as tfds
    from tensorflow_datasets.testing import mock_data

    from dtcli import data as D
    from dtcli import recipe as R
    from dtcli.errors import UsageError

    cfg = R.DataConfig(
        source="text",
        name="tiny_shakespeare",
        context=4,
        data_dir=str(tmp_path),
        eval_split="validation+test",
    )
    with mock_data(num_examples=3):
        ds = D.load(cfg)
        builder = tfds.builder("tiny_shakespeare", data_dir=str(tmp_path))
        texts = {
            split: b"".join(
                bytes(r["text"]) for r in tfds.as_numpy(builder.as_dataset(split=split))
            )
            for split in ("train", "validation+test")
        }
    assert bytes(ds.train.tokens) == texts["train"] and len(texts["train"]) > 4
    assert bytes(ds.eval.tokens) == texts["validation+test"]
    assert ds.num_classes == 256 and "TFDS tiny_shakespeare" in ds.description
    with pytest.raises(UsageError, match="data.name.*'mnist' has no text feature"):
        D.load(R.DataConfig(source="text", name="mnist", context=4, data_dir=str(tmp_path)))


# --------------------------------------------------------------------------- schedule


def nanogpt_lr(it, lr=1e-3, warmup=100, decay=2000, low=1e-4):
    """nanoGPT's train.py get_lr, verbatim in meaning."""
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    if it > decay:
        return low
    ratio = (it - warmup) / (decay - warmup)
    return low + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - low)


def test_cosine_schedule_is_nanogpts(cpu8):
    import tensorflow as tf

    from dtcli import optimizers
    from dtcli import recipe as R

    cfg = R.OptimizerConfig(
        learning_rate=1e-3, schedule="cosine", warmup_steps=100, min_learning_rate=1e-4
    )
    for step in (0, 1, 50, 99, 100, 101, 500, 1000, 1999, 2000, 2500):
        got = float(optimizers.learning_rate_at(cfg, tf.constant(step, tf.int64), 2000))
        assert got == pytest.approx(nanogpt_lr(step), rel=1e-5), step
    constant = R.OptimizerConfig(learning_rate=3e-4)
    assert float(optimizers.learning_rate_at(constant, tf.constant(7), 100)) == pytest.approx(3e-4)


# --------------------------------------------------------------------------- meshes


def train_20(text_file, mesh, sets=()):
    from dtcli import models
    from dtcli import session as T

    # One device on DTensor too, as the meshes: XLA's own compile would add ~20 s here, and
    # test_xla.py holds XLA to DTensor's numbers on this GPT.
    recipe = tiny_recipe(text_file, (*sets, "train.compile=dtensor"), mesh)
    s = T.prepare(recipe, use_devices=1 if mesh == "batch=1" else None)
    losses = T.run_steps(s, 20)
    return losses, models.host_weights(s.model, s.mesh), s


@pytest.fixture(scope="module")
def adamw_runs(cpu8, text_file):
    return {mesh: train_20(text_file, mesh) for mesh in MESHES}


@pytest.mark.parametrize("mesh", MESHES[1:])
def test_gpt_trains_the_same_on_any_mesh_adamw(adamw_runs, mesh):
    """AdamW with warmup, cosine decay, clipping and no decay of LayerNorm: losses to 1e-5 at
    every step, weights to 1e-3 (Adam amplifies float32 noise, DTENSOR_NOTES)."""
    base_losses, base, _ = adamw_runs["batch=1"]
    losses, weights, session = adamw_runs[mesh]
    assert session.local_device_count == 8
    np.testing.assert_allclose(losses, base_losses, rtol=1e-5)
    assert base_losses[-1] < base_losses[0] - 0.5  # it learned
    for path in base:
        scale = max(float(np.max(np.abs(base[path]))), 1e-12)
        assert float(np.max(np.abs(weights[path] - base[path]))) / scale <= 1e-3, path


def test_tensor_parallel_really_splits_heads_and_mlp(adamw_runs):
    _, _, session = adamw_runs["model=8"]
    shards = {p.weight.path: p.spec for p in session.plans}
    assert shards["block_0.attention.query.kernel"] == ("unsharded", "model", "unsharded")
    assert shards["block_0.mlp.proj.kernel"] == ("model", "unsharded")
    kernel = session.model.variables["block_0.attention.query.kernel"]
    from tensorflow.experimental import dtensor

    # each of the 8 devices holds one head of [32, 8, 4]
    assert dtensor.unpack(kernel.read_value())[0].shape == (32, 1, 4)


def test_gpt_trains_the_same_on_any_mesh_sgd_weights(cpu8, text_file):
    """With SGD (momentum) nothing amplifies float32 noise: the weights agree to 1e-5 (on the
    mesh that splits the most: every head and MLP unit on its own device)."""
    base_losses, base, _ = train_20(text_file, "batch=1", SGD)
    losses, weights, _ = train_20(text_file, "model=8", SGD)
    np.testing.assert_allclose(losses, base_losses, rtol=1e-5)
    assert base_losses[-1] < base_losses[0]
    for path in base:
        scale = max(float(np.max(np.abs(base[path]))), 1e-12)
        assert float(np.max(np.abs(weights[path] - base[path]))) / scale <= 1e-5, path


# --------------------------------------------------------------------------- a run, generate


# What lm_run's late signals reached: the handlers the run found (none should), and the
# handlers in place once the command line returned (those it found).
LATE_SIGNALS: dict = {}


@pytest.fixture(scope="module")
def lm_run(cpu8, text_file, tmp_path_factory):
    """In this process, after the sessions above: every train call with a different number of
    steps to run (here 4, 4, 2) once made DTensor lower the call again, and that lowering's
    functions could clash by name with the first's (see pipeline.Packer.flags).

    Piped (not a terminal), with a plain progress line at every call (not every 10 s), a
    heartbeat every 0.2 s of silence (not 10 s) and a first call that compiles until it spoke
    twice; the user presses Ctrl-C and a scheduler sends SIGTERM as `done:` appears, and again
    once the run returned (the run directory printed, TensorFlow shutting down): one run serves
    the tests of what a run writes, what it prints, and generation from it (each trained a run
    of its own before)."""
    from conftest import StampedStream, run_cli_into

    from dtcli import progress as progress_lib
    from dtcli.session import epoch as epoch_lib
    from dtcli.train import run as run_lib

    original_summary, original_train = run_lib.summary, run_lib.train
    original_block = epoch_lib.train_block
    heard = LATE_SIGNALS.setdefault("heard", [])
    err = LATE_SIGNALS["stderr"] = StampedStream()

    def hear(signum, frame):  # stands in for Python's defaults, which would end this process
        heard.append(signal.Signals(signum).name)

    def late_signals() -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.raise_signal(sig)  # this thread: handled before raise_signal returns

    def summary_then_signals(*args, **kwargs):
        original_summary(*args, **kwargs)
        late_signals()

    def train_then_signals(*args, **kwargs):
        result = original_train(*args, **kwargs)
        late_signals()
        return result

    def a_long_first_compile(*args, **kwargs):
        if not args[0].compiled:  # blocked until the heartbeat spoke twice (30 s without it)
            err.wait_for(2, "compiling the training step... ")
        return original_block(*args, **kwargs)

    out = tmp_path_factory.mktemp("lm") / "run"
    sets = [x for s in TINY for x in ("--set", s)]
    found = {sig: signal.signal(sig, hear) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(progress_lib, "PLAIN_EVERY", 0.0)  # every call's line, not every 10 s
            patch.setattr(progress_lib, "BEAT_EVERY", 0.2)
            patch.setattr(run_lib, "summary", summary_then_signals)
            patch.setattr(run_lib, "train", train_then_signals)
            patch.setattr(epoch_lib, "train_block", a_long_first_compile)
            result = run_cli_into(
                err,
                "train",
                ROOT / "recipes" / "tiny_gpt.yaml",
                "--set",
                f"data.path={text_file}",
                *sets,
                *("--set", "train.steps=10", "--set", "train.eval_every=4"),
                *("--set", "train.keep=1", "--set", "train.checkpoint_every=1"),
                *("--mesh", "batch=8", "--devices", "cpu:8", "--out", out),
            )
        LATE_SIGNALS["after"] = {sig: signal.getsignal(sig) for sig in found}
    finally:
        for sig, handler in found.items():
            signal.signal(sig, handler)
    LATE_SIGNALS["hear"] = hear
    assert result.code == 0, result.err
    return out, result


def test_a_steps_run_evaluates_every_eval_every_steps_and_at_the_end(lm_run):
    out, result = lm_run
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [4, 8, 10]
    last = records[-1]
    assert last["eval_perplexity"] == pytest.approx(math.exp(last["eval_loss"]), rel=1e-6)
    # byte tokens: each predicts one byte of text, so bits per byte are nats per token / ln 2
    assert last["eval_bpb"] == pytest.approx(last["eval_loss"] / math.log(2), rel=1e-12)
    assert json.loads((out / "tokenizer.json").read_text())["model"]["type"] == "BPE"
    assert last["tokens_per_sec"] > 0 and last["flops_per_sec_per_device"] > 0
    # the last 2,000 of 20,000 bytes in windows of 16 (+1 for the last target): 124 windows
    assert last["eval_tokens"] == (2000 - 1) // 16 * 16
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert {"loss", "grad_norm", "learning_rate"} <= set(steps[0])
    # logged every 10 steps: step 10, after the 5-step warmup, on the cosine's way down
    assert steps[0]["step"] == 10 and 1e-4 < steps[0]["learning_rate"] < 1e-3
    # the last evaluation's line (not a progress line): where, losses, the rate
    assert any(
        x.startswith("step 10/10 loss ") and " | eval loss " in x and " tok/s" in x
        for x in result.err_lines
    ), result.err


def test_generate_continues_a_prompt_of_bytes_that_are_not_utf8(lm_run):
    """`--prompt $'\\xff\\xfeab'`: Python passes such bytes as surrogate escapes; the byte
    vocabulary covers them, so the model continues exactly those bytes."""
    from conftest import run_cli

    from dtcli import generate

    out, _ = lm_run
    escaped = b"\xff\xfeab".decode("utf-8", errors="surrogateescape")  # as sys.argv holds it
    r = run_cli("generate", out, "--prompt", escaped, "--tokens", 12, "--temperature", 0)
    # stderr: only the rate (no warning)
    assert r.code == 0 and r.err_lines[0].startswith("tokens/s: ") and len(r.err_lines) == 1
    from_bytes = "".join(generate.stream(out, b"\xff\xfeab", 12, temperature=0))
    assert r.out == from_bytes + "\n"


def test_generate_greedy_is_the_same_on_any_mesh_and_sampling_follows_the_seed(lm_run):
    from conftest import run_cli

    from dtcli import generate

    out, _ = lm_run
    # (trained on batch=8) on 1 device, and tensor-parallel on model=4
    greedy = [
        "".join(
            generate.stream(
                out, "ROMEO:", 24, temperature=0, mesh=mesh, devices="cpu:8", use_devices=n
            )
        )
        for mesh, n in (("batch=1", 1), ("model=4", 4))
    ]
    assert greedy[0] == greedy[1]
    assert len(greedy[0].encode("utf-8", errors="surrogateescape")) >= 24  # only the new text
    sampled = [run_cli("generate", out, "--tokens", 24, "--seed", 1, "--top-k", 20) for _ in "ab"]
    assert all(r.code == 0 for r in sampled), [r.err for r in sampled]
    assert sampled[0].out == sampled[1].out
    assert sampled[0].out.strip() and sampled[0].out != greedy[0] + "\n"


# --------------------------------------------------------------------------- what a run prints


def test_an_lm_run_prints_plain_progress_its_size_its_best_and_a_late_ctrl_c_is_no_error(
    lm_run, tmp_path
):
    """Piped (not a terminal): plain progress lines (step, loss, tok/s, eta), and no gap over
    10 s between two lines, a long first compile included (the heartbeat); the header counts
    parameters; `done:` names the best evaluation and its checkpoint; a Ctrl-C or a SIGTERM
    after `done:` exits 0 (143 would make a scheduler requeue a finished job), however late;
    recipe.yaml lists no classifier-only key and still resumes and evaluates.
    (lm_run's run, trained in calls of 4, 4 and 2 steps; resumed here in a copy of it.)"""
    import shutil

    from conftest import run_cli

    from dtcli import recipe as R
    from dtcli.models import transformer

    out = tmp_path / "run"
    shutil.copytree(lm_run[0], out)
    result = lm_run[1]
    assert result.code == 0, result.err
    assert LATE_SIGNALS["heard"] == []  # neither reached the handlers the run found
    hear = LATE_SIGNALS["hear"]  # ... which the command line put back as it returned
    assert LATE_SIGNALS["after"] == {signal.SIGINT: hear, signal.SIGTERM: hear}
    lines = result.err_lines
    stderr = LATE_SIGNALS["stderr"]
    assert stderr.largest_gap() <= 10.0
    compiling = [x for x in lines if x.startswith("compiling the training step... ")]
    assert len(compiling) >= 2, lines
    lines = [x for x in lines if not re.fullmatch(r".*\.\.\. \d+s", x)]  # the heartbeat's
    plain = [x for x in lines if x.startswith("step ") and "eval loss" not in x]
    assert len(plain) >= 3, lines
    assert " eta " not in plain[0]  # the first call compiles: no eta counted from it
    assert all(" tok/s | eta " in x for x in plain[1:]), plain
    recipe = R.load(out / "recipe.yaml")
    count = transformer.parameters(recipe.model.transformer, 256)
    assert count < 10**5 and f"keras model, {count:,} parameters in " in lines[0], lines[0]
    done = next(x for x in lines if x.startswith("done: "))
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    best = min(records, key=lambda r: r["eval_loss"])
    assert f"best eval loss {best['eval_loss']:.4f} at step {best['step']}" in done, done
    kept = (out / "checkpoints" / f"ckpt-{best['step']:08d}").is_dir()
    assert ("is kept" if kept else "no checkpoint of it is kept") in done, done
    saved = (out / "recipe.yaml").read_text()
    for key in ("shape:", "classes:", "flatten:", "image_key:", "label_key:", "encoding:"):
        assert key not in saved, key
    resumed = run_cli("train", "--resume", out, "--set", "train.steps=16", "--no-progress")
    assert resumed.code == 0, resumed.err
    assert R.load(out / "recipe.yaml").train.steps == 16
    # each evaluation's line counts steps of the new total (from 10, eval_every 4: 12 and 16)
    assert re.findall(r"^step (\d+)/(\d+) loss ", resumed.err, re.M) == [("12", "16"), ("16", "16")]
    evaluated = run_cli("eval", out, "--no-progress", "--json")
    assert evaluated.code == 0, evaluated.err
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    assert json.loads(evaluated.out.splitlines()[-1])["step"] == last["step"] > 10


def test_a_steps_runs_bar_counts_steps_not_epochs():
    import io

    from rich.console import Console

    from dtcli import progress as progress_lib

    console = Console(file=io.StringIO(), force_terminal=True)
    bar = progress_lib.Bar(console, enabled=True, unit="tok/s", total_steps=10)
    bar.start(2, 3, 4, done=1, first=4)  # the second stretch of 4 steps, 1 of it done
    try:
        assert bar.progress.columns[0].text_format == "step"
        task = bar.progress.tasks[0]
        assert (task.completed, task.total) == (5, 10)
        bar.update(3, 2.5, 0.1, 100.0)
        assert bar.progress.tasks[0].completed == 7
    finally:
        bar.stop()
    epochs = progress_lib.Bar(console, enabled=True)
    epochs.start(2, 3, 4)
    try:
        assert epochs.progress.columns[0].text_format == "epoch 2/3"
    finally:
        epochs.stop()
