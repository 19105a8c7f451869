"""dtcli's tiny_gpt.yaml against nanoGPT's own train.py: ms/step on the same machine, side by side.

nanoGPT is the peer a user would pick for a small GPT on a CPU. This runs its unchanged
`train.py` (../shared/peers/nanogpt, PyTorch on the CPU) at its README's CPU settings (4 layers,
4 heads, 128 wide, context 64, batch 12, no dropout, AdamW with warmup, cosine decay and
clipping), once with `compile=False` as that line says and once with `compile=True`, and
`dtcli train recipes/tiny_gpt.yaml` (the same model, optimizer and schedule), each in a fresh
process with the same thread count, alternated so that machine noise hits all rows alike.

The same arithmetic, with one difference that favours nanoGPT: its shakespeare_char vocabulary
has 65 characters, dtcli's bytes 256 (a 4x bigger output head, ~4% of the step's FLOPs).

    python bench/nanogpt.py --torch-python /path/to/venv-with-torch/bin/python
    python bench/nanogpt.py --threads 1 2 --steps 200 --repeats 2 --no-compile-row
    python bench/nanogpt.py --widths 128 256 512 --threads 2      # the README's width sweep

ms/step: nanoGPT's own per-iteration time (its `iter N: ... time Xms` lines), the median after
the first 10 iterations (compiling and the first evaluation); dtcli's from its metrics.jsonl,
the training time of the stretches after the first (which holds the first call's compile).
Threads: OMP_NUM_THREADS/MKL_NUM_THREADS for PyTorch, TF_NUM_INTRAOP_THREADS for TensorFlow
(one inter-op thread for both). The first-step time of each (compile included) is printed too.
Prints a table and, last, one JSON line with every row.
"""

from __future__ import annotations

import argparse
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
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHARED = ROOT.parent / "shared"
NANOGPT = SHARED / "peers" / "nanogpt"
SHAKESPEARE = SHARED / "data" / "tinyshakespeare" / "input.txt"
ITER = re.compile(r"^iter (\d+): loss [\d.]+, time ([\d.]+)ms")
BATCH, CONTEXT, LAYERS, HEADS = 12, 64, 4, 4


def prepare_nanogpt(work: Path, text: Path) -> Path:
    """nanoGPT's files in `work`, with data/shakespeare_char made as its prepare.py makes it
    (characters sorted, uint16 ids, the first 90% for training)."""
    import numpy as np

    repo = work / "nanogpt"
    shutil.copytree(NANOGPT, repo)
    data = repo / "data" / "shakespeare_char"
    data.mkdir(parents=True)
    chars_text = text.read_text()
    chars = sorted(set(chars_text))
    index = {c: i for i, c in enumerate(chars)}
    ids = np.array([index[c] for c in chars_text], dtype=np.uint16)
    cut = int(0.9 * len(ids))
    ids[:cut].tofile(data / "train.bin")
    ids[cut:].tofile(data / "val.bin")
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": index}
    (data / "meta.pkl").write_bytes(pickle.dumps(meta))
    return repo


def thread_env(threads: int) -> dict[str, str]:
    env = dict(os.environ)
    for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        env[key] = str(threads)
    env["TF_NUM_INTEROP_THREADS"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    return env


def run_nanogpt(repo: Path, python: str, threads: int, steps: int, width: int, compile_: bool):
    args = [
        python,
        "train.py",
        "config/train_shakespeare_char.py",
        "--device=cpu",
        f"--compile={compile_}",
        "--eval_iters=20",
        "--log_interval=1",
        f"--block_size={CONTEXT}",
        f"--batch_size={BATCH}",
        f"--n_layer={LAYERS}",
        f"--n_head={HEADS}",
        f"--n_embd={width}",
        f"--max_iters={steps}",
        "--lr_decay_iters=2000",
        "--dropout=0.0",
        f"--eval_interval={steps + 1000}",  # one evaluation, at iteration 0 (not timed)
    ]
    out = subprocess.run(
        args, cwd=repo, env=thread_env(threads), capture_output=True, text=True, check=False
    )
    times = [float(m.group(2)) for line in out.stdout.splitlines() if (m := ITER.match(line))]
    if out.returncode or len(times) < 20:
        sys.exit(
            f"nanoGPT failed (exit {out.returncode}):\n{out.stdout[-2000:]}{out.stderr[-2000:]}"
        )
    return statistics.median(times[10:]), times[0] / 1000


def run_dtcli(work: Path, text: Path, threads: int, steps: int, width: int) -> tuple[float, float]:
    out_dir = work / f"dtcli-{time.monotonic_ns()}"
    stretch = steps // 4
    args = [
        sys.executable,
        "-m",
        "dtcli",
        "train",
        str(ROOT / "recipes" / "tiny_gpt.yaml"),
        "--set",
        f"data.path={text}",
        "--set",
        f"model.transformer.d_model={width}",
        "--set",
        f"train.steps={4 * stretch}",
        "--set",
        f"train.eval_every={stretch}",
        "--set",
        "train.checkpoint_every=0",
        "--no-progress",
        "--out",
        str(out_dir),
    ]
    done = subprocess.run(args, env=thread_env(threads), capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"dtcli failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    records = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out_dir, ignore_errors=True)
    later = records[1:]
    seconds = sum(r["train_tokens"] / r["tokens_per_sec"] for r in later)
    ms = 1000 * seconds / (len(later) * stretch)
    first = records[0].get("compile_seconds", float("nan"))
    return ms, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--torch-python", default=sys.executable, help="a Python with torch")
    parser.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--widths", type=int, nargs="+", default=[128])
    parser.add_argument("--steps", type=int, default=200, help="steps per run (each row)")
    parser.add_argument("--repeats", type=int, default=2, help="alternated runs of each row")
    parser.add_argument("--no-compile-row", action="store_true", help="skip compile=True")
    parser.add_argument("--text", type=Path, default=SHAKESPEARE)
    args = parser.parse_args()
    if args.steps < 120:
        parser.error("--steps: at least 120 (both warm up for 100 steps; 4 stretches follow)")

    names = ["nanoGPT", "dtcli"] + ([] if args.no_compile_row else ["nanoGPT compile=True"])
    rows: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-nanogpt-") as tmp:
        repo = prepare_nanogpt(Path(tmp), args.text)
        for repeat in range(args.repeats):
            for width in args.widths:
                for threads in args.threads:
                    for name in names:
                        if name == "dtcli":
                            result = run_dtcli(Path(tmp), args.text, threads, args.steps, width)
                        else:
                            compiled = name.endswith("compile=True")
                            result = run_nanogpt(
                                repo, args.torch_python, threads, args.steps, width, compiled
                            )
                        rows.setdefault((name, width, threads), []).append(result)
                        print(
                            f"  repeat {repeat + 1} {name:20s} width {width} threads {threads}: "
                            f"{result[0]:.1f} ms/step",
                            flush=True,
                        )
    report(rows)


def report(rows: dict) -> None:
    table = []
    print(
        f"\n{'run':22s} {'width':>5s} {'threads':>7s} {'ms/step':>8s} {'tokens/s':>9s} "
        f"{'first s':>8s} {'dtcli/this':>10s}"
    )
    for (name, width, threads), results in rows.items():
        ms = statistics.median(r[0] for r in results)
        first = statistics.median(r[1] for r in results)
        dtcli_ms = statistics.median(r[0] for r in rows[("dtcli", width, threads)])
        row = {
            "run": name,
            "width": width,
            "threads": threads,
            "ms_per_step": round(ms, 2),
            "tokens_per_sec": round(BATCH * CONTEXT * 1000 / ms),
            "first_step_s": round(first, 2),
            "dtcli_ratio": round(dtcli_ms / ms, 3),
            "runs_ms": [round(r[0], 2) for r in results],
        }
        table.append(row)
        print(
            f"{name:22s} {width:5d} {threads:7d} {ms:8.1f} {row['tokens_per_sec']:9,d} "
            f"{first:8.1f} {row['dtcli_ratio']:10.2f}"
        )
    print(json.dumps({"rows": table}))


if __name__ == "__main__":
    main()
