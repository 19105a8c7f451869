"""dtcli's tensor parallel against PyTorch's own (torch.distributed.tensor.parallel): ms/step and
per-step losses of the same GPT trained from the same weights on the same batches, CPU only.

A user who wants tensor parallelism without dtcli would reach for PyTorch's: nanoGPT's GPT with
column/row-wise plans, gloo, one process per device. This trains both, each in a fresh process,
alternated (dtcli, torch, dtcli, torch ...) for `--repeats`, on two meshes:

    batch=1,model=2   dtcli --devices cpu:2; torch: 2 processes, a 1-D tensor-parallel mesh
    batch=2,model=4   dtcli --devices cpu:8 (recipes/tiny_gpt_tensor_parallel.yaml's rules);
                      torch: 8 processes, a 2-D mesh (dp=2, tp=4): tensor parallel inside each
                      dp group, every gradient averaged over dp (the loss is the global batch's)

The same model: a random GPT-2-shaped one that transformers makes and saves (bench/
tp_peer_torch.py init, under `--torch-python`), which dtcli trains through `model.from_hf` and
the torch side loads into nanoGPT's model.py with c_attn split into q, k and v before any
sharding (bench/tp_peer_torch.py says how). Byte tokens (vocabulary 256) on both: the folder's
tokenizer.json is dtcli's own byte tokenizer. The same batches: dtcli's training windows of
`--text` in dtcli's order (every token starts a window; each stretch of `--stretch` steps draws
from the permutation dtcli.pipeline.epoch_order makes for it), written to a file the torch
side reads. The same optimizer: the recipe's AdamW, schedule (its first `--steps` steps: decay
over the recipe's own train.steps) and clipping; float32; no dropout. The first step's loss is
the initial weights' on the first batch: equal on both sides (~1e-7) shows the same start. The
recipe's evaluation reads the last 1% of the text (not timed; the training windows are the rest).

Model size: tiny_gpt_tensor_parallel.yaml's (4 layers, 128 wide, 4 heads, context 64, batch
12), the model dtcli ships a tensor-parallel recipe for; `--width 512` (or more `--layers`)
makes the matmuls, not the dispatch, the step: both sides' figures at both sizes say how each
scales. `--steps 48` (3 stretches of 16, dtcli's steps_per_call as the recipe ships it): the
whole bench (2 meshes, `--repeats 2`) took 10 minutes on a 2-core machine that others shared
(dtcli's first call on 8 virtual CPUs is most of it).

    python bench/tp_peer.py --torch-python /path/to/venv-with-torch/bin/python
    python bench/tp_peer.py --torch-python PY --width 512 --repeats 3 --json

ms/step: the wall time of the steps after the first stretch (the first holds dtcli's compile
and torch's warm-up; its first step is shown apart as `first s`), data feed and host loop
included: dtcli's from its metrics.jsonl (training time of the later stretches, as
bench/nanogpt.py reads it), torch's from rank 0's timer around its loop. Medians over the
repeats. Threads: dtcli runs N virtual CPUs on the machine's cores with TensorFlow's default
pools; torch N processes of one thread each (torch.set_num_threads(1)). `dtcli/torch`: the
ratio of the medians (above 1: dtcli is the slower). `loss rel diff`: the largest relative
difference of the two tools' per-step training losses over the steps (float32: ~1e-5 or less;
measured 6e-7 to 9e-7). The JSON rows add the same for the gradient norms before clipping
(`grad_norm_rel_diff`) and the learning rates (`lr_rel_diff`), the first step's loss alone
(`first_loss_rel_diff`: the same weights and batch), each run's ms/step and the threads.
Tensor parallelism over virtual CPUs on a few cores measures dispatch and collectives on one
host, not what either tool does on GPUs. Prints a table and, with `--json`, one JSON line last.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
NANOGPT = SHARED / "peers" / "nanogpt"
SHAKESPEARE = SHARED / "data" / "tinyshakespeare" / "input.txt"
RECIPE = ROOT / "recipes" / "tiny_gpt_tensor_parallel.yaml"
TORCH_SIDE = Path(__file__).resolve().parent / "tp_peer_torch.py"
VOCAB = 256  # bytes
# (mesh as dtcli names it, data-parallel size, tensor-parallel size)
MESHES = (("batch=1,model=2", 1, 2), ("batch=2,model=4", 2, 4))
# A small evaluation (the bench times training only): 1% of the text, a few batches a stretch.
EVAL_FRACTION = 0.01
TORCH_CHECK = (
    "import torch, torch.distributed as d, transformers, safetensors; "
    "from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel; "
    "assert d.is_available() and d.is_gloo_available()"
)


class RunFailed(Exception):
    """One run failed; the benchmark says why and goes on."""


def recipe_for(args: argparse.Namespace, hf_dir: Path, mesh: tuple[str, int, int]) -> dict:
    """tiny_gpt_tensor_parallel.yaml started from `hf_dir` on `mesh`, for `args.steps` steps."""
    recipe = yaml.safe_load(RECIPE.read_text())
    name, dp, tp = mesh
    recipe["devices"] = f"cpu:{dp * tp}"
    recipe["mesh"] = {"batch": dp, "model": tp}
    recipe["model"] = {"from_hf": str(hf_dir), "transformer": {"context": args.context}}
    recipe["data"] |= {"path": str(args.text), "batch_size": args.batch}
    recipe["data"]["eval_fraction"] = EVAL_FRACTION
    # The first --steps steps of the recipe's own schedule (its warmup outlasts a short run).
    recipe["optimizer"]["decay_steps"] = recipe["train"]["steps"]
    recipe["train"] |= {
        "steps": args.steps,
        "eval_every": args.stretch,
        "log_every": 1,
        "checkpoint_every": 0,
    }
    return recipe


def learning_rates(opt: dict, steps: int) -> list[float]:
    """The rate of each step as dtcli.optimizers.learning_rate_at computes it (cosine)."""
    peak, low = opt["learning_rate"], opt.get("min_learning_rate", 0.0)
    warmup, decay = opt.get("warmup_steps", 0), opt["decay_steps"]
    rates = []
    for step in range(steps):
        ratio = min(max((step - warmup) / (decay - warmup), 0.0), 1.0)
        rate = low + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (peak - low)
        rates.append(peak * (step + 1.0) / (warmup + 1.0) if step < warmup else rate)
    return rates


def write_batches(text: Path, context: int, batch: int, steps: int, stretch: int, seed: int, out):
    """dtcli's training batches in its order: the text's first (1 - eval_fraction) bytes, a
    window at every token, stretch e's batches the first of epoch_order(seed, e)."""
    from dtcli.pipeline import epoch_order

    data = np.fromfile(text, dtype=np.uint8)
    train = data[: int(len(data) * (1 - EVAL_FRACTION))]
    windows = np.lib.stride_tricks.sliding_window_view(train, context + 1)
    picks = [
        epoch_order(len(windows), seed, e, True)[: stretch * batch] for e in range(steps // stretch)
    ]
    np.save(out, windows[np.concatenate(picks)].reshape(steps, batch, context + 1))


def prepare(args: argparse.Namespace, work: Path) -> tuple[Path, Path]:
    """The shared start: the model folder (weights, config, dtcli's byte tokenizer) and the
    batches file."""
    from dtcli.data.tokenizer import ByteTokenizer

    hf_dir = work / "hf"
    shape = ["--layers", args.layers, "--width", args.width, "--heads", args.heads]
    shape += ["--context", args.context, "--vocab", VOCAB, "--seed", args.seed]
    command = [args.torch_python, str(TORCH_SIDE), "init", str(hf_dir), *map(str, shape)]
    run(command, "transformers' model", args.timeout)
    (hf_dir / "tokenizer.json").write_text(ByteTokenizer().to_json())
    batches = work / "batches.npy"
    seed = yaml.safe_load(RECIPE.read_text())["seed"]
    write_batches(args.text, args.context, args.batch, args.steps, args.stretch, seed, batches)
    return hf_dir, batches


def run(command: list, name: str, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"{name}: no result in {timeout:.0f} s") from None
    if done.returncode:
        raise RunFailed(f"{name} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return done


def run_dtcli(args, work: Path, hf_dir: Path, mesh) -> dict:
    """One dtcli run: its per-step losses, ms/step of the later stretches, first-step seconds."""
    out = work / f"dtcli-{time.monotonic_ns()}"
    recipe = work / f"recipe-{mesh[0]}.yaml"
    recipe.write_text(yaml.safe_dump(recipe_for(args, hf_dir, mesh)))
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", DTCLI_XLA_CACHE=str(work / "xla"))
    command = [sys.executable, "-m", "dtcli", "train", str(recipe), "--no-progress"]
    run(command + ["--out", str(out)], f"dtcli on {mesh[0]}", args.timeout, env=env)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    shutil.rmtree(out, ignore_errors=True)
    later = records[1:]
    seconds = sum(r["train_tokens"] / r["tokens_per_sec"] for r in later)
    return {
        "losses": [s["loss"] for s in steps],
        "ms_per_step": 1000 * seconds / (len(later) * args.stretch),
        "first_step_s": records[0].get("compile_seconds", float("nan")),
        "learning_rates": [s.get("learning_rate") for s in steps],
        "grad_norms": [s.get("grad_norm") for s in steps],
    }


def run_torch(args, work: Path, hf_dir: Path, batches: Path, mesh) -> dict:
    """One PyTorch run (world-size processes): its losses, ms/step after the first stretch."""
    _, dp, tp = mesh
    shipped = yaml.safe_load(RECIPE.read_text())
    opt = shipped["optimizer"] | {"decay_steps": shipped["train"]["steps"]}
    out = work / f"torch-{time.monotonic_ns()}.json"
    config = {
        "dp": dp,
        "tp": tp,
        "heads": args.heads,
        "port": free_port(),
        "nanogpt": str(args.nanogpt),
        "hf_dir": str(hf_dir),
        "batches": str(batches),
        "steps": args.steps,
        "timed_from": args.stretch,
        "out": str(out),
        "optimizer": {
            "learning_rates": learning_rates(opt, args.steps),
            "beta_1": opt.get("beta_1", 0.9),
            "beta_2": opt["beta_2"],
            "epsilon": opt["epsilon"],
            "weight_decay": opt["weight_decay"],
            "clip_norm": opt.get("clip_norm"),
        },
    }
    path = work / f"torch-{mesh[0]}.json"
    path.write_text(json.dumps(config))
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    command = [args.torch_python, str(TORCH_SIDE), "train", str(path)]
    run(command, f"torch on {mesh[0]}", args.timeout, env=env)
    return json.loads(out.read_text()) | {"learning_rates": config["optimizer"]["learning_rates"]}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rel_diff(a: list[float], b: list[float]) -> float:
    """The largest relative difference of two loss curves over their steps (inf: lengths differ)."""
    if len(a) != len(b) or not a:
        return float("inf")
    return max(abs(x - y) / abs(x) for x, y in zip(a, b))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch-python", required=True, help="a Python with torch, transformers")
    parser.add_argument("--layers", type=int, default=4, help="blocks (default %(default)s)")
    parser.add_argument("--width", type=int, default=128, help="d_model (default %(default)s)")
    parser.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    parser.add_argument("--context", type=int, default=64, help="tokens a window (default 64)")
    parser.add_argument("--batch", type=int, default=12, help="global batch (default 12)")
    parser.add_argument("--steps", type=int, default=48, help="steps a run (default 48)")
    parser.add_argument(
        "--stretch", type=int, default=16, help="steps between evaluations (default 16)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="alternated runs (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="the initial weights' torch seed")
    names = [m[0] for m in MESHES]
    parser.add_argument("--meshes", nargs="+", choices=names, default=names, help="(default: both)")
    parser.add_argument("--timeout", type=float, default=1200, help="seconds a run may take")
    parser.add_argument("--text", type=Path, default=SHAKESPEARE, help="the training text")
    parser.add_argument("--nanogpt", type=Path, default=NANOGPT, help="nanoGPT's repository")
    parser.add_argument("--json", action="store_true", help="one JSON line last")
    args = parser.parse_args()
    dp = max(m[1] for m in MESHES if m[0] in args.meshes)
    tp = max(m[2] for m in MESHES if m[0] in args.meshes)
    checks = [
        (args.layers >= 1, "--layers: at least 1"),
        (args.heads >= 1 and args.heads % tp == 0, f"--heads: a multiple of {tp} (model axis)"),
        (args.width >= 1 and args.width % args.heads == 0, "--width: a multiple of --heads"),
        (args.context >= 1, "--context: at least 1"),
        (args.batch >= 1 and args.batch % dp == 0, f"--batch: a multiple of {dp} (batch axis)"),
        (args.stretch >= 1, "--stretch: at least 1"),
        (args.steps >= 2 * args.stretch, "--steps: at least 2 stretches (the first is not timed)"),
        (args.steps % args.stretch == 0, "--steps: a multiple of --stretch"),
        (args.repeats >= 1, "--repeats: at least 1"),
        (0 < args.timeout < float("inf"), "--timeout: seconds above 0"),
        (args.text.is_file(), f"--text: no file {args.text}"),
        ((args.nanogpt / "model.py").is_file(), f"--nanogpt: no model.py in {args.nanogpt}"),
    ]
    for ok, message in checks:
        if not ok:
            parser.error(message)
    if args.text.stat().st_size * (1 - EVAL_FRACTION) < args.steps * args.batch + args.context:
        parser.error(f"--text: {args.text} is too short for --steps x --batch windows")
    try:
        probe = [args.torch_python, "-c", TORCH_CHECK]
        ok = subprocess.run(probe, capture_output=True, timeout=300).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    if not ok:
        parser.error(
            f"--torch-python: {args.torch_python} cannot import torch, torch.distributed's "
            "tensor parallel (gloo), transformers and safetensors"
        )
    return args


def main() -> None:
    args = parse_args()
    meshes = [m for m in MESHES if m[0] in args.meshes]
    results: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-tp-peer-") as tmp:
        try:
            hf_dir, batches = prepare(args, Path(tmp))
        except RunFailed as failed:
            raise SystemExit(f"error: {failed}") from None
        for repeat in range(args.repeats):
            for mesh in meshes:
                for tool in ("dtcli", "torch"):
                    try:
                        if tool == "dtcli":
                            result = run_dtcli(args, Path(tmp), hf_dir, mesh)
                        else:
                            result = run_torch(args, Path(tmp), hf_dir, batches, mesh)
                    except RunFailed as failed:
                        print(f"  repeat {repeat + 1} {tool} {mesh[0]}: {failed}", flush=True)
                        continue
                    results.setdefault((mesh[0], tool), []).append(result)
                    print(
                        f"  repeat {repeat + 1} {tool:5s} {mesh[0]}: "
                        f"{result['ms_per_step']:.1f} ms/step, first step "
                        f"{result['first_step_s']:.2f} s, loss {result['losses'][-1]:.5f}",
                        flush=True,
                    )
    report(args, meshes, results)


def report(args: argparse.Namespace, meshes: list, results: dict) -> None:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"\n{args.layers} layers x {args.width} wide, {args.heads} heads, context {args.context}, "
        f"batch {args.batch}, vocabulary {VOCAB}, float32, {args.steps} steps (timed: the "
        f"{args.steps - args.stretch} after the first {args.stretch}); {cpu_name()}, {cores} cores"
    )
    head = f"{'mesh':16s} {'dtcli ms':>9s} {'torch ms':>9s} {'dtcli/torch':>11s} "
    print(head + f"{'first s dtcli':>13s} {'first s torch':>13s} {'loss rel diff':>13s}")
    rows = []
    for name, dp, tp in meshes:
        mine, peer = results.get((name, "dtcli"), []), results.get((name, "torch"), [])
        if not mine or not peer:
            print(f"{name:16s} (no result: a side failed in every repeat)")
            continue
        row = row_of(name, dp, tp, mine, peer)
        rows.append(row)
        print(
            f"{name:16s} {row['dtcli_ms']:9.1f} {row['torch_ms']:9.1f} "
            f"{row['dtcli_over_torch']:11.2f} "
            f"{row['dtcli_first_step_s']:13.2f} {row['torch_first_step_s']:13.2f} "
            f"{row['loss_rel_diff']:13.2e}"
        )
    print(
        "threads: dtcli N virtual CPUs on the machine's cores, TensorFlow's default pools; "
        "torch N processes (gloo), torch.set_num_threads(1) each"
    )
    if args.json:
        shape = {k: getattr(args, k) for k in ("layers", "width", "heads", "context", "batch")}
        print(json.dumps({"rows": rows, "model": shape | {"vocab": VOCAB}, "cpu": cpu_name()}))


def row_of(name: str, dp: int, tp: int, mine: list[dict], peer: list[dict]) -> dict:
    """One mesh's row: medians over the repeats; the loss difference the largest of any pair."""
    dtcli_ms = statistics.median(r["ms_per_step"] for r in mine)
    torch_ms = statistics.median(r["ms_per_step"] for r in peer)
    diff = max(rel_diff(a["losses"], b["losses"]) for a in mine for b in peer)
    return {
        "mesh": name,
        "dtcli_ms": round(dtcli_ms, 2),
        "torch_ms": round(torch_ms, 2),
        "loss_rel_diff": float(f"{diff:.3g}"),
        "dtcli_over_torch": round(dtcli_ms / torch_ms, 3),
        # The same gradients (their norms before clipping) and the same schedule: dtcli's
        # logged norms and rates against the torch side's.
        "grad_norm_rel_diff": float(
            f"{rel_diff(mine[0]['grad_norms'], peer[0]['grad_norms']):.3g}"
        ),
        "lr_rel_diff": float(
            f"{rel_diff(mine[0]['learning_rates'], peer[0]['learning_rates']):.3g}"
        ),
        "first_loss_rel_diff": float(
            f"{abs(mine[0]['losses'][0] - peer[0]['losses'][0]) / mine[0]['losses'][0]:.3g}"
        ),
        "dtcli_first_step_s": round(mine[0]["first_step_s"], 2),
        "torch_first_step_s": round(peer[0]["first_step_s"], 2),
        "dtcli_runs_ms": [round(r["ms_per_step"], 2) for r in mine],
        "torch_runs_ms": [round(r["ms_per_step"], 2) for r in peer],
        "steps": len(mine[0]["losses"]),
        "dtcli_threads": f"{dp * tp} virtual CPUs, TensorFlow's default pools",
        "torch_threads": f"{dp * tp} processes x 1 thread",
    }


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


if __name__ == "__main__":
    main()
