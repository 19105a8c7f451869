"""`dtcli generate` on one device: XLA against DTensor, with the KV cache and without it
(--no-cache): tokens/s, one process.

recipes/tiny_gpt.yaml's GPT (4 layers, 128 wide, context 64) is trained a few steps into a
temporary run (or RUN_DIR is used) and restored twice on one device: on plain variables whose
forward passes XLA compiles (train.compile=xla, what one device runs by default) and on a
one-device DTensor mesh (train.compile=dtensor, what generate ran before it followed
train.compile). All four variants generate the same greedy text of --tokens new tokens (so the
window restarts several times) after a warm-up run each; the timed runs alternate between them,
so machine noise hits all alike. Each run's rate is Stats.steady: new tokens over the wall time
after the first 2 steps (which trace and compile), as the tokens/s line gives it.

    python bench/generate_speed.py                    # trains 20 steps into a temporary run
    python bench/generate_speed.py RUN_DIR --tokens 256 --repeats 5 --prompts 1
    python bench/generate_speed.py --set "model.transformer.context=256"   # a longer window

It prints each run's rate and, last, one JSON line with the medians and their ratios.

Measured on 2 cores of a Xeon SHARED with other work (noisy: load average 10 for these, 16-26
for the others below), one virtual CPU device, medians of 5 alternated runs, greedy texts
identical every time; runs of tiny_gpt trained 300 steps at each context:
    dtcli train recipes/tiny_gpt.yaml --set data.path=../shared/data/tinyshakespeare/input.txt \
      --set train.steps=300 --set train.eval_every=300 --set optimizer.warmup_steps=75 \
      --set data.eval_batch_size=12 --set model.transformer.context=64 --out /tmp/b64
    python bench/generate_speed.py /tmp/b64       (and /tmp/b256, trained with context=256)
tokens/s after the first 2 steps, XLA / DTensor (CPU time a token, XLA / DTensor):
    context 64,  cache:    442 / 177  2.5x   (1.05 / 3.17 ms)
    context 64,  no cache: 218 / 159  1.37x  (2.20 / 4.78 ms)
    context 256, cache:    601 / 305  1.97x  (1.15 / 3.54 ms)
    context 256, no cache:  71 /  65  1.08x  (7.80 / 10.45 ms)
Under the heavier load the cache's ratio was 1.5-2.3x at context 64 and 0.87-1.75x at 256, and
the window pass at context 256 fell to 0.41-0.67x in wall time, while XLA's CPU time a token
stayed the lower in every run: most likely XLA's kernels split over two threads and wait for a
core busy elsewhere (pinned to one core, `taskset -c 1`: 0.98x; one window pass alone with
TF_NUM_INTRAOP_THREADS=1, best of 5: XLA 6.5 ms, DTensor 6.9). Re-measure on a quiet machine.
A decode step on DTensor pays the executor's fixed cost on each of its ~300 small ops; XLA
fuses them into a few kernels. The window pass grows with the context, so the cache wins more
with a longer context, more prompts, a bigger model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def train_tiny(out: Path, steps: int, extra: list[str]) -> Path:
    """recipes/tiny_gpt.yaml trained `steps` steps on one device into `out`; `extra`: more
    --set KEY=VALUE (another context, say)."""
    from dtcli import cli

    text = SHAKESPEARE if SHAKESPEARE.is_file() else ROOT / "README.md"
    sets = {
        "data.path": text,
        "train.steps": steps,
        "train.eval_every": steps,
        "optimizer.warmup_steps": max(1, steps // 4),
        "data.eval_batch_size": 12,
    }
    args = ["train", str(ROOT / "recipes" / "tiny_gpt.yaml"), "--out", str(out), "--no-progress"]
    for key, value in sets.items():
        args += ["--set", f"{key}={value}"]
    for assignment in extra:
        args += ["--set", assignment]
    if cli.run(args) != 0:
        sys.exit("training the tiny GPT failed")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="?", help="a language model's run (default: train one)")
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=1, help="prompts generated together")
    parser.add_argument("--train-steps", type=int, default=20)
    parser.add_argument("--set", action="append", default=[], help="a recipe key for training")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.run_dir) if args.run_dir else None
        run = run or train_tiny(Path(tmp) / "run", args.train_steps, args.set)
        measure(run, args.tokens, args.repeats, args.prompts)


# What runs: (path, cache). The path is the recipe key generate follows on one device.
VARIANTS = [(path, cache) for path in ("xla", "dtensor") for cache in (True, False)]


def measure(run: Path, tokens: int, repeats: int, prompts: int) -> None:
    from dtcli import generate

    gens = {
        path: generate.Generator(run, "batch=1", "cpu:1", sets=(f"train.compile={path}",))
        for path in ("xla", "dtensor")
    }
    texts = [f"ROMEO {i}:".encode() for i in range(prompts)]
    rates: dict[tuple[str, bool], list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[tuple[str, bool], list[float]] = {v: [] for v in VARIANTS}
    outputs = {}
    for repeat in range(repeats + 1):  # the first of each: the warm-up (compiling)
        # Each repeat in the other order: no variant always runs first.
        for path, cache in VARIANTS if repeat % 2 else VARIANTS[::-1]:
            gen = gens[path]
            settings = generate.Settings(tokens, temperature=0.0, cache=cache)
            started = time.process_time()
            outputs[path, cache] = [t for _, t in gen.texts(texts, settings)]
            stats = gen.stats
            # CPU time of this process per new token, first steps included: on a shared machine
            # it moves less than the wall time does (waits for a core are not in it).
            cpu_ms = 1000 * (time.process_time() - started) / stats.tokens
            note = " (warm-up)" if repeat == 0 else ""
            print(
                f"{name(path, cache):17s} {stats.steady:8.1f} tokens/s after the first "
                f"{stats.WARM} steps  {stats.seconds:6.2f} s in all  {cpu_ms:6.2f} ms of CPU a "
                f"token{note}",
                flush=True,
            )
            if repeat:
                rates[path, cache].append(stats.steady)
                cpu[path, cache].append(cpu_ms)
    if len({tuple(o) for o in outputs.values()}) != 1:
        sys.exit("the greedy texts of the variants differ")
    median = {v: statistics.median(r) for v, r in rates.items()}
    result = {
        "tokens": tokens,
        "prompts": prompts,
        "context": gens["xla"].context,
        **{f"{name(*v).replace(' ', '_')}_tokens_per_sec": round(median[v], 1) for v in VARIANTS},
        **{
            f"{name(*v).replace(' ', '_')}_cpu_ms_per_token": round(statistics.median(cpu[v]), 2)
            for v in VARIANTS
        },
        "xla_over_dtensor_cache": round(median["xla", True] / median["dtensor", True], 2),
        "xla_over_dtensor_no_cache": round(median["xla", False] / median["dtensor", False], 2),
        "cache_over_no_cache_xla": round(median["xla", True] / median["xla", False], 2),
        "same_greedy_text": True,
    }
    print(json.dumps(result))


def name(path: str, cache: bool) -> str:
    return f"{path} {'cache' if cache else 'no-cache'}"


if __name__ == "__main__":
    main()
