"""dtcli's tiny_gpt.yaml against nanoGPT's own train.py: ms/step on the same machine, side by side.

nanoGPT is the peer a user would pick for a small GPT. This runs its unchanged `train.py`
(../shared/peers/nanogpt) and `dtcli train recipes/tiny_gpt.yaml` (the same model, optimizer and
schedule), each in a fresh process, alternated so that machine noise hits all rows alike.

On the CPU (`--device cpu`, the default): nanoGPT's README CPU settings (4 layers, 4 heads, 128
wide, context 64, batch 12, no dropout, AdamW with warmup, cosine decay and clipping), once with
`compile=False` as that line says and once with `compile=True`, both with the same thread count.

On a GPU (`--device gpu`): nanoGPT's GPU settings, its config/train_shakespeare_char.py unchanged
(6 layers, 6 heads, 384 wide, context 256, batch 64, dropout 0.2, bfloat16 autocast, fused AdamW,
flash attention) with `compile=True` (its default) and `compile=False`; dtcli the same model on
`--devices gpu` with `train.precision=bf16`, its steps compiled by XLA (`train.compile: auto` on
one device) and, as a second dtcli row, by DTensor (`train.compile=dtensor`). Adds tokens/s and
the MFU of each: its model's training FLOPs per token (6 per matmul weight plus attention, the
formula nanoGPT's own MFU uses) times tokens/s over the GPU's dense bf16 peak.

The same arithmetic, with one difference that favours nanoGPT: its shakespeare_char vocabulary
has 65 characters, dtcli's bytes 256 (a 4x bigger output head, ~4% of the step's FLOPs at 128
wide). `--byte-row` adds a nanoGPT row (`compile` as the main nanoGPT row) on the same text
as dtcli's byte tokens (vocabulary 256): exactly dtcli's arithmetic.

`--bf16-rows` (CPU) adds the same two in bfloat16: dtcli's recipe with `train.precision=bf16`
(matmuls in bf16, the rest float32; on a CPU with AMX or AVX512-BF16 its steps then run on
TensorFlow's oneDNN kernels, not XLA: mesh.compiles_with_xla), and nanoGPT's train.py with its
one CPU line (`ctx = nullcontext() if device_type == 'cpu' else ...autocast`) made to autocast
on the CPU too, `--dtype=bfloat16`: PyTorch's own mixed precision, matmuls in bf16.

`--shape gpt2-small`: GPT-2 small's body instead (12 layers, 12 heads, 768 wide, no dropout) at
context 128 and batch 4, on both sides (nanoGPT's flags, dtcli's --set model.transformer.*,
data.batch_size), both on dtcli's bytes (vocabulary 256), with a warmup of a quarter of the
steps (at most 100) and a cosine decay over them on both, and short evaluations (nanoGPT's at
iteration 0 over 2 batches, dtcli's between its stretches over 0.5% of the text), so that a run
of tens of steps spends its time on the steps it times. `--vocab gpt2` (or `--vocab bytes gpt2`)
adds the row set with GPT-2's vocabulary, 50,304, on both sides over the same byte ids (nanoGPT:
a meta.pkl of vocab_size 50304; dtcli: model.transformer.vocab_size=50304): the head and tied
embedding are then a third of the model's FLOPs. With `--device gpu` the same shape on the GPU.
`--dtcli-compile xla dtensor graph` adds a dtcli row `dtcli compile=X` per setting (with
`--bf16-rows` a `dtcli bf16 compile=X` too), train.compile=X; a dtcli that does not know a
setting refuses its recipe, and that row is reported as failed.

    python bench/nanogpt.py --torch-python /path/to/venv-with-torch/bin/python
    python bench/nanogpt.py --threads 1 2 --steps 200 --repeats 2 --no-compile-row
    python bench/nanogpt.py --threads 2 1 --byte-row        # and nanoGPT on dtcli's bytes
    python bench/nanogpt.py --widths 128 256 512 --threads 2      # docs/benchmarks.md's width sweep
    python bench/nanogpt.py --device gpu --steps 400 --repeats 1  # nanoGPT's GPU settings
    python bench/nanogpt.py --threads 2 1 --bf16-rows   # both in bfloat16 too (AMX CPUs)
    python bench/nanogpt.py --shape gpt2-small --steps 40 --threads 2 1 --bf16-rows \
        --vocab bytes gpt2 --dtcli-compile xla dtensor > gpt2.txt   # the last line: JSON

ms/step: nanoGPT's own per-iteration time (its `iter N: ... time Xms` lines), the median after
the first 10 iterations (compiling and the first evaluation); dtcli's from its metrics.jsonl,
the training time of the stretches after the first (which holds the first call's compile), over
their steps: both leave out the compiling start and every evaluation, nanoGPT's figure is a
median of single steps (each ends with the loss read back), dtcli's a mean over 3/4 of the run
(its host reads the losses once per call, as it ships).
Threads (CPU): each run may use only `--threads N` cores (its CPU affinity); PyTorch is told N
threads (OMP_NUM_THREADS/MKL_NUM_THREADS); TensorFlow's thread pools take their defaults from the
cores it sees, as for a user. The first-step time of each (compile included) is printed too:
`first s` of a row's first run, whose compiled code no cache held (dtcli's XLA cache and
torch.compile's inductor cache are kept in the benchmark's temporary folder), and `warm`, the
median of its later runs, which load what the first compiled. `dtcli/this`: dtcli's ms/step over
the row's (above 1: dtcli is the slower). `GF/step`: the model's training FLOPs per step by
nanoGPT's formula (6 per matmul weight, the tied head once, plus attention: dtcli's
models.transformer.flops_per_token, over the row's own vocabulary), `GFLOP/s` that over the
row's time; bench/matmul_limit.py reads the JSON line to set them against TensorFlow's matmul
rate.
A row that fails prints why and the others go on. Prints a table and, last, one JSON line with
every row.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import pickle
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
NANOGPT = SHARED / "peers" / "nanogpt"
SHAKESPEARE = SHARED / "data" / "tinyshakespeare" / "input.txt"
ITER = re.compile(r"^iter (\d+): loss ([\d.]+), time ([\d.]+)ms")
NANOGPT_VOCAB, DTCLI_VOCAB = 65, 256
# nanoGPT's data folders: its own characters, and dtcli's bytes (the `--byte-row`).
# `--vocab gpt2`: the same byte ids, nanoGPT's head as wide as GPT-2's (its meta.pkl's vocab_size).
NANOGPT_DATA = {
    "chars": "shakespeare_char",
    "bytes": "shakespeare_bytes",
    "gpt2": "shakespeare_gpt2",
}
BYTE_ROW = "nanoGPT bytes"
# `--bf16-rows`: dtcli with train.precision=bf16, and nanoGPT's train.py with its one CPU line
# changed so that, as on a GPU, the step runs under torch.amp.autocast (bfloat16) on the CPU.
BF16_ROWS = ("dtcli bf16", "nanoGPT bf16 autocast")
CPU_AUTOCAST = "train_cpu_autocast.py"
CPU_CONTEXT = "ctx = nullcontext() if device_type == 'cpu' else "
# --dtcli-compile: dtcli's train.compile settings (graph: a later dtcli's; an older one refuses
# it at load, and the bench reports that row as failed).
COMPILES = ("auto", "xla", "dtensor", "graph")


@dataclass(frozen=True)
class Settings:
    """One side-by-side setting: the model and batch both sides train."""

    device: str  # "cpu" or "gpu"
    batch: int
    context: int
    layers: int
    heads: int
    dropout: float
    width: int  # the default width (--widths sweeps others)
    shape: str = "readme"  # --shape: nanoGPT's README settings, or "gpt2-small"

    def tokens_per_step(self) -> int:
        return self.batch * self.context


CPU = Settings("cpu", batch=12, context=64, layers=4, heads=4, dropout=0.0, width=128)
# nanoGPT's config/train_shakespeare_char.py, as its README runs it on a GPU.
GPU = Settings("gpu", batch=64, context=256, layers=6, heads=6, dropout=0.2, width=384)
# --shape gpt2-small: GPT-2 small's body (124 M parameters with GPT-2's vocabulary) at a context
# and batch a 2-core CPU trains in about a second a step.
GPT2_SMALL = Settings(
    "cpu", batch=4, context=128, layers=12, heads=12, dropout=0.0, width=768, shape="gpt2-small"
)
SHAPES = ("readme", "gpt2-small")
# --vocab: the vocabulary both sides' heads get. bytes: dtcli's 256 byte ids (on the README
# shape nanoGPT's main rows keep their 65 characters, as its README trains); gpt2: GPT-2's
# 50,304 (50,257 padded to a multiple of 64, as nanoGPT pads it) over the same byte ids.
VOCAB_SIZES = {"chars": NANOGPT_VOCAB, "bytes": DTCLI_VOCAB, "gpt2": 50304}
# gpt2-small: nanoGPT's evaluation batches (one evaluation, at iteration 0, before any timed
# iteration) and dtcli's held-out share of the text (its evaluations fall between the timed
# stretches): small, so that a GPT-2-small run spends its time on the steps it times.
SHORT_EVAL_ITERS, SHORT_EVAL_FRACTION = 2, 0.005
# The fewest steps per run: the README shape warms up for 100 (4 stretches follow); a
# gpt2-small step takes a second or more on a CPU, so 20 (nanoGPT's median over its 11th
# iteration on, dtcli's 3 stretches of 5 after the first).
MIN_STEPS = {"readme": 120, "gpt2-small": 20}


class RowFailed(Exception):
    """One run of a row failed; the benchmark reports it and goes on."""


def prepare_nanogpt(work: Path, text: Path, nanogpt: Path) -> Path:
    """nanoGPT's files in `work`, with data/shakespeare_char made as its prepare.py makes it
    (characters sorted, uint16 ids, the first 90% for training), and data/shakespeare_bytes:
    the same text as dtcli's byte tokens (ids = byte values, a vocabulary of 256), which
    nanoGPT's train.py reads the same way (`--dataset`, vocab_size from meta.pkl)."""
    import numpy as np

    repo = work / "nanogpt"
    shutil.copytree(nanogpt, repo)
    train = (repo / "train.py").read_text()
    if CPU_CONTEXT not in train:
        raise SystemExit(f"{nanogpt / 'train.py'}: no line {CPU_CONTEXT!r} (another nanoGPT)")
    (repo / CPU_AUTOCAST).write_text(train.replace(CPU_CONTEXT, "ctx = "))
    chars_text = text.read_text()
    chars = sorted(set(chars_text))
    index = {c: i for i, c in enumerate(chars)}
    char_ids = np.array([index[c] for c in chars_text], dtype=np.uint16)
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": index}
    _write_dataset(repo / "data" / NANOGPT_DATA["chars"], char_ids, meta)
    byte_ids = np.frombuffer(text.read_bytes(), dtype=np.uint8).astype(np.uint16)
    for vocab in ("bytes", "gpt2"):
        meta = {"vocab_size": VOCAB_SIZES[vocab], "itos": {}, "stoi": {}}
        _write_dataset(repo / "data" / NANOGPT_DATA[vocab], byte_ids.copy(), meta)
    return repo


def _write_dataset(data: Path, ids, meta: dict) -> None:
    data.mkdir(parents=True)
    cut = int(0.9 * len(ids))
    ids[:cut].tofile(data / "train.bin")
    ids[cut:].tofile(data / "val.bin")
    (data / "meta.pkl").write_bytes(pickle.dumps(meta))


def thread_env(threads: int | None, cache: Path) -> dict[str, str]:
    """The environment of a run: its threads, and `cache`, the folder of the compiled code it
    keeps across runs (dtcli's XLA cache, torch.compile's inductor cache), one per row in the
    benchmark's temporary folder: a row's first run compiles from nothing, whatever earlier
    runs left in the user's caches, and its later runs load what it compiled. On the CPU each
    run gets `threads` cores (`cores`); PyTorch is told to use that many threads, TensorFlow
    sizes its pools from the cores it may use, as it does for a user."""
    env = dict(os.environ)
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["DTCLI_XLA_CACHE"] = str(cache)
    # dtcli's cache folder too: `train.compile: auto`'s kept choice of compiler (the row's first
    # run measures it, in its first step; later runs read it)
    env["DTCLI_CACHE_DIR"] = str(cache)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    for key in ("TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        env.pop(key, None)
    if threads is None:  # a GPU run: the host's threads as each framework sets them
        return env
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env[key] = str(threads)
    return env


def cores(threads: int | None):
    """A run's preexec_fn: the process may use only the first `threads` cores (None: all)."""
    if threads is None or not hasattr(os, "sched_setaffinity"):
        return None
    mine = sorted(os.sched_getaffinity(0))  # main() refused more threads than these
    return lambda: os.sched_setaffinity(0, mine[:threads])


def run(args: list[str], name: str, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise RowFailed(f"{name}: no result in {timeout:.0f} s") from None
    if done.returncode:
        raise RowFailed(
            f"{name} failed (exit {done.returncode}):\n{done.stdout[-1500:]}{done.stderr[-3000:]}"
        )
    return done


def warmup_steps(s: Settings, steps: int) -> int | None:
    """Both sides' warmup on the gpt2-small shape (a run of tens of steps must end its warmup
    before its last step); None on the README shape: each side's own (100 steps)."""
    return None if s.shape == "readme" else min(100, steps // 4)


def nanogpt_args(
    s: Settings, steps: int, width: int, compile_: bool, vocab: str = "chars", bf16: bool = False
) -> list[str]:
    """nanoGPT's train.py command line (after the Python) for one run."""
    args = [
        CPU_AUTOCAST if bf16 else "train.py",
        "config/train_shakespeare_char.py",
        f"--dataset={NANOGPT_DATA[vocab]}",
        f"--device={'cuda' if s.device == 'gpu' else 'cpu'}",
        f"--compile={compile_}",
        f"--eval_iters={20 if s.shape == 'readme' else SHORT_EVAL_ITERS}",
        "--log_interval=1",
        f"--max_iters={steps}",
        f"--eval_interval={steps + 1000}",  # one evaluation, at iteration 0 (not timed)
    ]
    if s.device == "cpu" or s.shape != "readme":  # on a GPU the README's: the config file's
        args += [
            f"--block_size={s.context}",
            f"--batch_size={s.batch}",
            f"--n_layer={s.layers}",
            f"--n_head={s.heads}",
            f"--n_embd={width}",
            f"--dropout={s.dropout}",
        ]
    if s.shape == "readme":
        args += ["--lr_decay_iters=2000"] if s.device == "cpu" else []
    else:
        args += [f"--warmup_iters={warmup_steps(s, steps)}", f"--lr_decay_iters={steps}"]
    return args + (["--dtype=bfloat16"] if bf16 else [])


def run_nanogpt(
    repo: Path,
    python: str,
    s: Settings,
    threads,
    steps,
    width,
    compile_,
    timeout,
    vocab="chars",
    bf16=False,
):
    args = [python, *nanogpt_args(s, steps, width, compile_, vocab, bf16)]
    cache = repo.parent / f"cache-nanogpt-{compile_}-{vocab}-{width}-{threads}-{bf16}"
    env = thread_env(threads, cache)
    out = run(args, "nanoGPT", timeout, cwd=repo, env=env, preexec_fn=cores(threads))
    iters = [m for line in out.stdout.splitlines() if (m := ITER.match(line))]
    times = [float(m.group(3)) for m in iters]
    if len(times) < 20:
        raise RowFailed(f"nanoGPT printed {len(times)} iterations:\n{out.stdout[-2000:]}")
    return statistics.median(times[10:]), times[0] / 1000, f"last loss {iters[-1].group(2)}"


def dtcli_sets(
    s: Settings,
    text: Path,
    steps: int,
    width: int,
    compile_: str,
    vocab: str = "bytes",
    bf16: bool = False,
) -> dict[str, object]:
    """dtcli's --set overrides of recipes/tiny_gpt.yaml for one run: 4 stretches of steps."""
    stretch = steps // 4
    sets: dict[str, object] = {
        "data.path": text,
        "model.transformer.d_model": width,
        "train.steps": 4 * stretch,
        "train.eval_every": stretch,
        "train.checkpoint_every": 0,
    }
    if s.device == "gpu" or s.shape != "readme":  # the README's CPU shape is the recipe's own
        sets |= {
            "model.transformer.layers": s.layers,
            "model.transformer.heads": s.heads,
            "model.transformer.context": s.context,
            "model.transformer.dropout": s.dropout,
            "data.batch_size": s.batch,
        }
    if s.shape != "readme":
        sets |= {
            "optimizer.warmup_steps": warmup_steps(s, steps),
            "data.eval_fraction": SHORT_EVAL_FRACTION,
            "data.eval_batch_size": s.batch,
        }
    if vocab == "gpt2":  # bytes read as ever; the tables (and the tied head) 50,304 rows
        sets["model.transformer.vocab_size"] = VOCAB_SIZES["gpt2"]
    if s.device == "gpu":
        sets["devices"] = "gpu"
    if s.device == "gpu" or bf16:
        sets["train.precision"] = "bf16"
    if s.device == "gpu" or compile_ != "auto":
        sets["train.compile"] = compile_
    return sets


def run_dtcli(
    work: Path,
    text: Path,
    s: Settings,
    threads,
    steps,
    width,
    compile_,
    timeout,
    vocab="bytes",
    bf16=False,
):
    out_dir = work / f"dtcli-{time.monotonic_ns()}"
    sets = dtcli_sets(s, text, steps, width, compile_, vocab, bf16)
    args = [sys.executable, "-m", "dtcli", "train", str(ROOT / "recipes" / "tiny_gpt.yaml")]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    args += ["--no-progress", "--out", str(out_dir)]
    cache = work / f"cache-dtcli-{compile_}-{vocab}-{width}-{threads}-{bf16}"
    env = thread_env(threads, cache)
    try:
        run(args, f"dtcli (train.compile={compile_})", timeout, env=env, preexec_fn=cores(threads))
        lines = (out_dir / "metrics.jsonl").read_text().splitlines()
    finally:  # a GPT-2-small run's checkpoint is a gigabyte or more
        shutil.rmtree(out_dir, ignore_errors=True)
    records = [json.loads(line) for line in lines]
    later = records[1:]
    stretch = sets["train.eval_every"]
    seconds = sum(r["train_tokens"] / r["tokens_per_sec"] for r in later)
    ms = 1000 * seconds / (len(later) * stretch)
    first = records[0].get("compile_seconds", float("nan"))
    return ms, first, f"eval loss {records[-1]['eval_loss']:.4f}"


def flops_per_token(s: Settings, width: int, vocab: int) -> float:
    """Training FLOPs per token of the GPT both train (dtcli's formula, nanoGPT's estimate_mfu:
    6 per matmul weight, the tied embedding counted once, plus attention). dtcli's models
    package imports no TensorFlow at import, so the bench's parent process stays free of it."""
    from dtcli.models.transformer import flops_per_token as gpt_flops
    from dtcli.recipe import TransformerConfig

    cfg = TransformerConfig(layers=s.layers, d_model=width, heads=s.heads, context=s.context)
    return gpt_flops(cfg, vocab, s.context)


def gpu_peak() -> tuple[str, float | None]:
    """The first GPU's name (nvidia-smi) and its dense bf16 peak from dtcli's table."""
    from dtcli.devices import PEAK_FLOPS

    try:
        name = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return "unknown GPU", None
    return name, next((peak for key, peak in PEAK_FLOPS.items() if key in name), None)


def has_torch(python: str) -> bool:
    """Whether `python` runs and imports torch (each nanoGPT row needs it)."""
    try:
        proc = subprocess.run([python, "-c", "import torch"], capture_output=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def parser_of() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--torch-python", default=sys.executable, help="a Python with torch (default: this one)"
    )
    parser.add_argument(
        "--device",
        choices=["cpu", "gpu"],
        default="cpu",
        help="cpu: nanoGPT's README CPU settings; gpu: its train_shakespeare_char.py",
    )
    parser.add_argument(
        "--shape",
        choices=SHAPES,
        default="readme",
        help="readme: --device's nanoGPT settings (default); gpt2-small: 12 layers, 768 wide, "
        "12 heads, context 128, batch 4, no dropout",
    )
    parser.add_argument(
        "--vocab",
        choices=["bytes", "gpt2"],
        nargs="+",
        default=["bytes"],
        help="one row set per vocabulary: bytes (256; nanoGPT's README rows keep their 65 "
        "characters), gpt2 (50,304 on both sides; default: bytes)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[2, 1],
        help="CPU: the cores each run may use, one table block per count (default: 2 1)",
    )
    parser.add_argument(
        "--widths",
        type=int,
        nargs="+",
        default=None,
        help="model widths to sweep, the rest as --device sets it (default: its own width)",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=200,
        help="steps per run (each row; default %(default)s; at least 120, gpt2-small 20)",
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="alternated runs of each row (default %(default)s)"
    )
    parser.add_argument(
        "--no-compile-row",
        action="store_true",
        help="skip nanoGPT's second row (compile=True on the CPU, compile=False on a GPU)",
    )
    parser.add_argument(
        "--byte-row",
        action="store_true",
        help="one more nanoGPT row on dtcli's byte vocabulary (256): the same arithmetic",
    )
    parser.add_argument(
        "--bf16-rows",
        action="store_true",
        help="CPU: dtcli with train.precision=bf16 and nanoGPT under bfloat16 autocast",
    )
    parser.add_argument(
        "--dtcli-compile",
        nargs="+",
        choices=COMPILES,
        default=[],
        help="more dtcli rows, `dtcli compile=X` with train.compile=X each (auto: the `dtcli` "
        "row itself)",
    )
    parser.add_argument(
        "--timeout", type=float, default=1800, help="seconds a run may take (default %(default)s)"
    )
    parser.add_argument(
        "--text",
        type=Path,
        default=SHAKESPEARE,
        help="tiny Shakespeare's input.txt (default: ../shared/data/...)",
    )
    parser.add_argument(
        "--nanogpt",
        type=Path,
        default=NANOGPT,
        help="nanoGPT's repository (default: ../shared/peers/nanogpt)",
    )
    return parser


def settings_of(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Settings:
    """The setting the arguments ask for; a bad argument ends the program (exit 2)."""
    if args.steps < MIN_STEPS[args.shape]:
        parser.error(
            f"--steps: at least {MIN_STEPS[args.shape]} for --shape {args.shape} (nanoGPT's "
            "first 10 are not timed; 4 stretches follow)"
        )
    if min(args.threads) < 1:
        parser.error("--threads: each at least 1")
    if args.repeats < 1:
        parser.error("--repeats: at least 1")
    if not 0 < args.timeout < float("inf"):  # NaN too
        parser.error("--timeout: seconds above 0")
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    if args.device == "cpu" and usable and max(args.threads) > usable:
        parser.error(f"--threads: at most {usable}, the cores this process may use")
    if not args.text.is_file():
        parser.error(f"--text: no file {args.text}")
    if not (args.nanogpt / "train.py").is_file():
        parser.error(f"--nanogpt: no train.py in {args.nanogpt} (nanoGPT's repository)")
    if not has_torch(args.torch_python):
        parser.error(f"--torch-python: {args.torch_python} cannot import torch (nanoGPT's rows)")
    if args.bf16_rows and args.device == "gpu":
        parser.error("--bf16-rows: CPU only (on a GPU every row already runs bf16)")
    if args.byte_row and args.shape != "readme":
        parser.error(f"--byte-row: --shape {args.shape} trains nanoGPT on bytes already")
    if args.shape == "gpt2-small":
        s = dataclasses.replace(GPT2_SMALL, device=args.device)
    else:
        s = GPU if args.device == "gpu" else CPU
    if any(w < 1 or w % s.heads for w in args.widths or ()):
        parser.error(f"--widths: each a positive multiple of the {s.heads} heads")
    return s


def main() -> None:
    parser = parser_of()
    args = parser.parse_args()
    s = settings_of(args, parser)
    gpu = gpu_peak() if s.device == "gpu" else None
    if gpu and gpu[0] == "unknown GPU":
        parser.error("--device gpu: nvidia-smi lists no NVIDIA GPU on this machine")
    widths = args.widths or [s.width]
    threads_list = [None] if s.device == "gpu" else args.threads
    names = row_names(s, args.no_compile_row, args.byte_row, args.bf16_rows, args.dtcli_compile)
    # (name, vocab, width, threads) -> each run's (ms/step, first step s, a loss to show)
    rows: dict[tuple[str, str, int, int | None], list[tuple[float, float, str]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-nanogpt-") as tmp:
        repo = prepare_nanogpt(Path(tmp), args.text, args.nanogpt)
        for repeat in range(args.repeats):
            for vocab, width, threads in itertools.product(args.vocab, widths, threads_list):
                for name in names:
                    if name == BYTE_ROW and vocab != "bytes":
                        continue
                    try:
                        result = run_row(name, args, s, Path(tmp), repo, threads, width, vocab)
                    except RowFailed as failed:
                        print(f"  repeat {repeat + 1} {name} ({vocab}): {failed}", flush=True)
                        continue
                    rows.setdefault((name, vocab, width, threads), []).append(result)
                    print(
                        f"  repeat {repeat + 1} {name:24s} {vocab} width {width} threads "
                        f"{threads or '-'}: {result[0]:.1f} ms/step, first {result[1]:.1f} s, "
                        f"{result[2]}",
                        flush=True,
                    )
    report(rows, s, gpu)


def row_names(
    s: Settings,
    no_compile_row: bool,
    byte_row: bool = False,
    bf16_rows: bool = False,
    dtcli_compiles: list[str] = (),
) -> list[str]:
    if s.device == "gpu":  # nanoGPT's GPU default compiles; dtcli's one-device default is XLA
        names = ["dtcli", "nanoGPT", "nanoGPT compile=False", "dtcli compile=dtensor"]
        names = [n for n in names if not (no_compile_row and n == "nanoGPT compile=False")]
    else:
        names = ["nanoGPT", "dtcli"] + ([] if no_compile_row else ["nanoGPT compile=True"])
        names += list(BF16_ROWS) if bf16_rows else []
    for compile_ in dtcli_compiles:
        if compile_ == "auto":  # the `dtcli` row (and `dtcli bf16`) itself
            continue
        more = [f"dtcli compile={compile_}"]
        more += [f"dtcli bf16 compile={compile_}"] if bf16_rows else []
        names += [name for name in more if name not in names]
    return names + ([BYTE_ROW] if byte_row else [])


def run_row(name, args, s: Settings, work: Path, repo: Path, threads, width, vocab="bytes"):
    t = args.timeout
    bf16 = name.startswith("dtcli bf16") or name == BF16_ROWS[1]
    if name.startswith("dtcli"):
        compile_ = name.split("compile=")[1] if "compile=" in name else "auto"
        return run_dtcli(work, args.text, s, threads, args.steps, width, compile_, t, vocab, bf16)
    compiled = name.endswith("compile=True") or (s.device == "gpu" and name == "nanoGPT")
    data = nanogpt_data(name, vocab, s)
    python = args.torch_python
    return run_nanogpt(repo, python, s, threads, args.steps, width, compiled, t, data, bf16)


def nanogpt_data(name: str, vocab: str, s: Settings) -> str:
    """The data folder (NANOGPT_DATA's key) of a nanoGPT row in the row set of `vocab`: on the
    README shape the bytes set's main rows train on nanoGPT's own characters."""
    if vocab == "bytes" and s.shape == "readme" and name != BYTE_ROW:
        return "chars"
    return vocab


def row_vocab(name: str, vocab: str, s: Settings) -> int:
    """The model vocabulary (its output head's width) a row trains with."""
    return VOCAB_SIZES[vocab if name.startswith("dtcli") else nanogpt_data(name, vocab, s)]


def report(rows: dict, s: Settings, gpu: tuple[str, float | None] | None) -> None:
    table = []
    if gpu:
        print(f"\n{gpu[0]}, dense bf16 peak {gpu[1] or float('nan'):.3g} FLOP/s")
    print(
        f"\n{'run':24s} {'vocab':>6s} {'width':>5s} {'threads':>7s} {'ms/step':>8s} "
        f"{'tokens/s':>10s} {'GF/step':>8s} {'GFLOP/s':>8s} {'first s':>8s} {'warm':>6s} "
        f"{'dtcli/this':>10s}" + (f" {'MFU':>6s}" if gpu else "")
    )
    for (name, vocab, width, threads), results in rows.items():
        ms = statistics.median(r[0] for r in results)
        first = results[0][1]  # the first run's: compiled from nothing
        warm = statistics.median(r[1] for r in results[1:]) if len(results) > 1 else float("nan")
        dtcli_ms = median_ms(rows, "dtcli", vocab, width, threads)
        tokens = s.tokens_per_step() * 1000 / ms
        vocab_size = row_vocab(name, vocab, s)
        step_flops = flops_per_token(s, width, vocab_size) * s.tokens_per_step()
        flops = step_flops * 1000 / ms
        row = {
            "run": name,
            "device": s.device,
            "shape": s.shape,
            "layers": s.layers,
            "heads": s.heads,
            "context": s.context,
            "batch": s.batch,
            "width": width,
            "vocab": vocab_size,
            "threads": threads,
            "ms_per_step": round(ms, 2),
            "tokens_per_sec": round(tokens),
            "flops_per_step": step_flops,
            "gflops_per_sec": round(flops / 1e9, 2),
            "first_step_s": round(first, 2),
            "warm_first_step_s": None if len(results) == 1 else round(warm, 2),
            "dtcli_ratio": round(dtcli_ms / ms, 3),
            "runs_ms": [round(r[0], 2) for r in results],
        }
        line = (
            f"{name:24s} {vocab_size:6d} {width:5d} {threads or '-':>7} {ms:8.1f} "
            f"{round(tokens):10,d} {step_flops / 1e9:8.2f} {flops / 1e9:8.1f} {first:8.1f} "
            f"{'-' if len(results) == 1 else f'{warm:.1f}':>6s} {row['dtcli_ratio']:10.2f}"
        )
        if gpu:
            row |= {"gpu": gpu[0], "flops_per_sec": flops}
            if gpu[1]:
                row["mfu"] = round(flops / gpu[1], 4)
                line += f" {row['mfu']:6.1%}"
        table.append(row)
        print(line)
    for line in bf16_ratios(rows):
        print(line)
    print(json.dumps({"rows": table}))


def median_ms(rows: dict, name: str, vocab: str, width: int, threads: int | None) -> float:
    """A row's median ms/step over its runs; nan where it has none (it failed or was not run)."""
    results = rows.get((name, vocab, width, threads))
    return statistics.median(r[0] for r in results) if results else float("nan")


def bf16_ratios(rows: dict) -> list[str]:
    """With `--bf16-rows`: dtcli bf16's ms/step over nanoGPT's (float32, its CPU line) and over
    nanoGPT's under bf16 autocast, per vocabulary, width and thread count (above 1: dtcli is
    the slower)."""
    lines = []
    for name, vocab, width, threads in rows:
        if name != BF16_ROWS[0]:
            continue
        mine = median_ms(rows, name, vocab, width, threads)
        peer = median_ms(rows, "nanoGPT", vocab, width, threads)
        peer_bf16 = median_ms(rows, BF16_ROWS[1], vocab, width, threads)
        lines.append(
            f"dtcli bf16 {vocab} width {width} threads {threads}: {mine / peer:.2f} of "
            f"nanoGPT's ms/step, {mine / peer_bf16:.2f} of nanoGPT bf16 autocast's"
        )
    return lines


if __name__ == "__main__":
    main()
