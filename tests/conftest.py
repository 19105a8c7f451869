"""Shared helpers. TensorFlow runs in this process on 8 virtual CPUs (the `cpu8` fixture,
`run_cli`, `run_here`): importing it costs most of a fresh process. Only what needs another device
count, signals, exit codes seen by a shell or several clients runs in a fresh process
(`dtcli`, `run_python`): the virtual CPU count is fixed once TensorFlow's runtime starts."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

# XLA's compiled steps stay out of the user's cache (dtcli keeps them there by default), in this
# process and the fresh ones (env() copies this); the tests of the cache name their own folder.
os.environ["DTCLI_XLA_CACHE"] = "off"

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
SHARED_MNIST = ROOT.parent / "shared" / "data" / "mnist"


SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def write_corpus(path: Path, size: int) -> Path:
    """`size` bytes of text for a language-model test: tiny Shakespeare's start where ../shared
    is there (CI has it), else words drawn with a fixed seed. Never the README, whose every edit
    would change the numbers a test compares (an edit once moved one AdamW weight past
    test_xla's bound: a near-zero gradient's last bits, amplified)."""
    if SHAKESPEARE.is_file():
        path.write_bytes(SHAKESPEARE.read_bytes()[:size])
    else:
        words = "the king and queen of a fair city said to all that come here now".split()
        drawn = np.random.default_rng(0).choice(words, size // 4 + 1)
        path.write_text(" ".join(drawn)[:size])
    return path


def _bench_script(name: str) -> ModuleType:
    """bench/NAME.py as a module: plain `pytest` puts tests/, not the repository, on sys.path."""
    spec = importlib.util.spec_from_file_location(f"bench.{name}", ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    # Registered first: a dataclass in the script looks its module up while it is made.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# Writes examples as TFRecord files `source: tfrecord` reads (bench's tool for real data sets).
write_tfrecords = _bench_script("make_tfrecords").write_tfrecords


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["TF_CPP_MIN_LOG_LEVEL"] = "3"
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION", None)
    return e


def run_python(code: str, timeout: int = 600, extra_env: dict | None = None) -> object:
    """Run `code` in a fresh interpreter; it prints one JSON value on its last line."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**env(), **(extra_env or {})},
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dtcli(
    *args: object, timeout: int = 600, cwd: Path | None = None, extra_env: dict | None = None
) -> Result:
    """Run `dtcli ARGS...` in a fresh process, as a user would -> Result."""
    proc = subprocess.run(
        [sys.executable, "-m", "dtcli.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env={**env(), **(extra_env or {})},
    )
    return Result(proc.returncode, proc.stdout, proc.stderr)


# The files that take longest, slowest first: CPU seconds (user + sys, the process and its children)
# of each file alone, `pytest -n 0`, on the 2 shared cores with other engineers' runs beside them
# (load 5-12, 2026-11-27, noisy; remeasure on a quiet machine): launch 129, lora 93 (2026-11-27,
# earlier), sweep 90 (its trials are fresh processes), language_model 76, train_e2e 71, bad_inputs
# 55, xla 53, mesh_invariance 51, rundir 50 and hf_import 50 (earlier), accumulate 48,
# train_eval_tasks 48 (its launch of 2 clients ~15 s wall), fsdp 48, peft_export 45 (earlier),
# real_data 41, harness 39 (lm_run's 100 steps included, as eval_tasks' 28: the suite trains it
# once, the first of the two to need it while the other waits, so the two stay apart here),
# train_loop 39, tokens 39, generate 38, eval_hf_parity 37 (torch trains two models), score 29,
# eval_tasks 28, instruction_data 28, sft_e2e 26 and doctor 26 (earlier), track 26, from_run 26,
# generate_chat 24, packing 22, memory 21, plan 18, cli_errors 16, resume_steps 13 (earlier),
# sharding 6, pipeline 5; the rest 3 or less. xdist hands out whole files (`--dist loadfile`,
# `--no-loadscope-reorder`) in collection order: the long ones start first and the short ones
# fill in at the end, so that no worker is left alone with a long file while the other idles
# (longest-first scheduling). Rough is enough; a file not named here runs after these, in name
# order. A new file goes where its own CPU seconds alone rank it (`/usr/bin/time -v pytest -n 0
# tests/FILE`: user + sys, which count the fresh processes it starts, such as a sweep's trials or
# a launch's clients); one of more than ~20 s must be named here, or it starts last and the other
# worker idles while it runs.
SLOWEST_FILES = [
    "test_launch.py",
    "test_lora.py",
    "test_sweep.py",
    "test_language_model.py",
    "test_train_e2e.py",
    "test_bad_inputs.py",
    "test_xla.py",
    "test_mesh_invariance.py",
    "test_rundir.py",
    "test_hf_import.py",
    "test_accumulate.py",
    "test_train_eval_tasks.py",
    "test_fsdp.py",
    "test_peft_export.py",
    "test_real_data.py",
    "test_harness.py",
    "test_train_loop.py",
    "test_tokens.py",
    "test_generate.py",
    "test_eval_hf_parity.py",
    "test_score.py",
    "test_eval_tasks.py",
    "test_instruction_data.py",
    "test_sft_e2e.py",
    "test_doctor.py",
    "test_track.py",
    "test_from_run.py",
    "test_generate_chat.py",
    "test_packing.py",
    "test_memory.py",
    "test_plan.py",
    "test_cli_errors.py",
    "test_resume_steps.py",
    "test_sharding.py",
    "test_pipeline.py",
]


def pytest_collection_modifyitems(config, items) -> None:
    """Under xdist, the slowest files first (see SLOWEST_FILES); a file's tests keep their
    order. A run without xdist keeps pytest's order."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {name: i for i, name in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable


@pytest.fixture(autouse=True, scope="session")
def heartbeat_after_an_hour() -> None:
    """A command blocked for BEAT_EVERY / 2 seconds (4.5) with its output in no terminal, as a
    test's is, says so in a line (progress.Heartbeat): on a loaded machine an in-process compile
    takes that long, and a test that reads a command's every line would meet one by chance. The
    heartbeat's own tests set their interval. (A fresh process keeps the 9 s.)"""
    from dtcli import progress

    progress.BEAT_EVERY = 3600.0


@pytest.fixture
def shared_mnist() -> Path:
    if not (SHARED_MNIST / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST not available at {SHARED_MNIST} (a fresh clone has no ../shared)")
    return SHARED_MNIST


@pytest.fixture(scope="session")
def cpu8() -> None:
    """TensorFlow in this process on 8 virtual CPUs, configured once for the whole session.

    Every in-process test that touches TensorFlow asks for it, whatever the order the tests run
    in; a test that needs another device count runs in a fresh process instead.
    """
    use_cpu8()


@pytest.fixture(scope="module")
def without_grappler(cpu8):
    """Grappler's graph rewrites off for a module's functions: a module of commands on 8-device
    meshes whose checks are files, messages and equalities with its own runs or with
    transformers, not kernels' last bits. DTensor has each of the 8 virtual devices rewrite its
    own copy of every function, which was about half a command's CPU time there (a 3-step LoRA
    train: 8.8 s against 16.7). The rest of the suite keeps the rewrites users run."""
    with grappler_off():
        yield


@contextlib.contextmanager
def grappler_off():
    """Grappler's graph rewrites off for the functions TensorFlow builds meanwhile (see
    without_grappler)."""
    import tensorflow as tf

    before = tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False)
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    try:
        yield
    finally:
        tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": before})


def use_cpu8() -> None:
    """8 virtual CPUs for TensorFlow in this process (a no-op once configured)."""
    from dtcli import devices

    devices.configure("cpu:8", 8)


@contextlib.contextmanager
def in_process(cwd: Path, stdout: io.StringIO, stderr: io.StringIO | None = None):
    """Run code here as a fresh process would: on 8 virtual CPUs, from `cwd`, its output caught."""
    use_cpu8()
    before = Path.cwd()
    try:
        os.chdir(cwd)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr or sys.stderr):
            yield
    finally:
        os.chdir(before)


@pytest.fixture(scope="session")
def digit_files(tmp_path_factory, cpu8) -> dict[str, list[str]]:
    """The embedded digits (the quickstart's data, in its train/eval split) as TFRecord files and
    as an image folder: recipe settings for `source: tfrecord` and `source: images`."""
    import tensorflow as tf

    from dtcli import data as data_lib
    from dtcli import recipe as R

    folder = tmp_path_factory.mktemp("digits")
    digits = data_lib.load(R.DataConfig(flatten=False))
    shape = ["data.shape=[8,8,1]", "data.flatten=true"]
    out: dict[str, list[str]] = {}
    for name, split in (("train", digits.train), ("eval", digits.eval)):
        # TFRecords of the digits' own float32 values (the quickstart's data exactly); PNGs of
        # them as bytes.
        write_tfrecords(split.x, split.y, folder / "tfrecord", name, 3)
        pixels = np.round(split.x * 255).astype(np.uint8)
        for i, (image, label) in enumerate(zip(pixels, split.y)):
            target = folder / "images" / name / f"class{label}" / f"{i:04d}.png"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(tf.io.encode_png(image).numpy())
    out["tfrecord"] = [
        "data.source=tfrecord",
        f"data.path={folder}/tfrecord/train-*",
        f"data.eval_path={folder}/tfrecord/eval-*",
        "data.dtype=float32",
        *shape,
    ]
    out["images"] = [
        "data.source=images",
        f"data.path={folder}/images/train",
        f"data.eval_path={folder}/images/eval",
        *shape,
    ]
    return out


QUICK = str(RECIPES / "quickstart.yaml")
# Short epochs of 3 steps each, a checkpoint after every epoch, all kept.
SHORT = [
    "--set",
    "train.steps_per_epoch=3",
    "--set",
    "train.checkpoint_every=1",
    "--set",
    "train.keep=5",
    "--no-progress",
]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory, cpu8) -> Path:
    """The quickstart for 3 short epochs: checkpoints at steps 3, 6 and 9. Shared: copy it before
    changing anything in it."""
    from dtcli import cli as cli_lib
    from dtcli import rundir

    out = tmp_path_factory.mktemp("runs") / "q3"
    assert cli_lib.run(["train", QUICK, "--epochs", "3", "--out", str(out), *SHORT]) == 0
    assert [p.name for p in rundir.complete_checkpoints(out)] == [
        "ckpt-00000003",
        "ckpt-00000006",
        "ckpt-00000009",
    ]
    return out


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]

    # The names of subprocess.CompletedProcess, so a test reads the same either way.
    @property
    def returncode(self) -> int:
        return self.code

    @property
    def stdout(self) -> str:
        return self.out

    @property
    def stderr(self) -> str:
        return self.err


class StampedStream(io.StringIO):
    """Text written to it, and when each line of it was (as a log with timestamps would
    show): `stamps`, one time.monotonic() per line, whichever thread wrote it."""

    def __init__(self) -> None:
        super().__init__()
        self.stamps: list[float] = []
        self._written = threading.Condition()

    def write(self, text: str) -> int:
        with self._written:
            n = super().write(text)
            self.stamps += [time.monotonic()] * text.count("\n")
            self._written.notify_all()
        return n

    def wait_for(self, count: int, start: str, timeout: float = 30.0) -> bool:
        """Whether `count` lines starting with `start` were written within `timeout` seconds."""

        def there() -> bool:
            return sum(x.startswith(start) for x in self.getvalue().splitlines()) >= count

        with self._written:
            return self._written.wait_for(there, timeout)

    def largest_gap(self) -> float:
        """The longest time between two lines written one after the other."""
        return max((b - a for a, b in zip(self.stamps, self.stamps[1:])), default=0.0)


def run_cli(*args: object, cwd: Path | None = None) -> Result:
    """Run `dtcli ARGS...` in this process on the session's 8 virtual CPUs -> Result.

    Much faster than a fresh process (TensorFlow is imported once); any scope may call it. A
    command that needs another device count must run in a fresh process (`dtcli`)."""
    return run_cli_into(io.StringIO(), *args, cwd=cwd)


def run_cli_into(err: io.StringIO, *args: object, cwd: Path | None = None) -> Result:
    """run_cli, its stderr written into `err` (a StampedStream, say)."""
    from dtcli import cli as cli_lib

    out = io.StringIO()
    with in_process(cwd or ROOT, out, err):
        code = cli_lib.run([str(a) for a in args])
    return Result(code, out.getvalue(), err.getvalue())


def run_here(code: str) -> object:
    """`run_python`'s twin for code that runs on 8 virtual CPUs: in this process (TensorFlow is
    imported once), from the repository root; it prints one JSON value on its last line."""
    out = io.StringIO()
    with in_process(ROOT, out):
        exec(compile(textwrap.dedent(code), "<run_here>", "exec"), {"__name__": "run_here"})
    return json.loads(out.getvalue().strip().splitlines()[-1])


@pytest.fixture
def cli(cpu8):
    """Run `dtcli ARGS...` in this process (see run_cli)."""
    return run_cli


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden ones too) with its bytes; folders as None."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    out: dict = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():  # (perhaps to nothing): where it points
            out[rel] = f"-> {os.readlink(path)}".encode()
        else:
            out[rel] = None if path.is_dir() else path.read_bytes()
    return out


def checkpoint_tensors(checkpoint: Path) -> dict:
    """The model's weights stored in a checkpoint folder, by their checkpoint keys."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(Path(checkpoint) / "ckpt"))
    return {
        key: reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if key.startswith("model/") and "OPTIMIZER_SLOT" not in key
    }


LM_TASKS = ROOT / "tests" / "data" / "lm_tasks"  # lm-eval task YAMLs over local JSON files
LM_CONTEXT = 64
# A tiny GPT on tiny Shakespeare with a byte-level BPE of 300 ids (the model's vocabulary 320),
# context 64: trained enough that its choices are no coin toss (the eval loss well under the
# first step's) and small enough to train in seconds. 100 steps (300 until 2026-11-27): eval loss
# 3.94 against lm_run's bound 4.33; its nearest ties, which a mesh's float noise (1e-5 relative at
# most, test_harness) could flip, are further apart than at 300 steps: tiny_mc's best two choice
# sums 1.2e-3 relative apart (1.0e-4 at 300), tiny_gen's greedy top-2 logits 2.7e-2 (5.3e-6).
LM_TRAIN = [
    f"model.transformer={{layers: 2, d_model: 64, heads: 4, mlp_ratio: 2, context: {LM_CONTEXT}}}",
    "data.tokenizer=bpe:300",
    "data.batch_size=16",
    "data.eval_batch_size=8",
    "train.steps_per_call=50",
    "train.steps=100",
    "train.eval_every=100",
    "train.log_every=50",
    "optimizer.learning_rate=1e-2",
    "optimizer.warmup_steps=5",
]


@pytest.fixture(scope="session")
def lm_run(tmp_path_factory, cpu8) -> Path:
    """A language model's run directory (LM_TRAIN, trained on batch=8): shared by every test
    that evaluates a language model, and by the xdist workers of one run (the first to need it
    trains it in its process while the others wait on a lock, then all read it: test_harness
    and test_eval_tasks run on different workers); copy it before changing anything."""
    import fcntl

    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:  # one process: its own
        return _train_lm_run(tmp_path_factory.mktemp("lm_run"))
    folder = tmp_path_factory.getbasetemp().parent / f"lm_run-{run_id}"
    folder.mkdir(exist_ok=True)
    with open(folder / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not (folder / "trained").exists():
            _train_lm_run(folder)
            (folder / "trained").write_text("")
    return folder / "run"


def _train_lm_run(folder: Path) -> Path:
    corpus = write_corpus(folder / "corpus.txt", 100_000)
    sets = [x for s in (f"data.path={corpus}", *LM_TRAIN) for x in ("--set", s)]
    out = folder / "run"
    # Megatron's rules: the session restores onto batch=2,model=2 too.
    recipe = RECIPES / "tiny_gpt_tensor_parallel.yaml"
    # Its checks are the eval loss below and, later, equalities with its own checkpoint:
    # Grappler's rewrites off (without_grappler), whichever module trains it first.
    with grappler_off():
        r = run_cli("train", recipe, *sets, "--mesh", "batch=8", "--devices", "cpu:8", "--out", out)
    assert r.code == 0, r.err
    (record,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # ln(320) = 5.77 nats: a uniform guess over the model's vocabulary, where training starts.
    assert record["eval_loss"] < 0.75 * math.log(320), record
    return out
