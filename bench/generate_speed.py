"""`dtcli generate` with the KV cache against without it (--no-cache): tokens/s, one process.

recipes/tiny_gpt.yaml's GPT (4 layers, 128 wide, context 64) is trained a few steps into a
temporary run (or RUN_DIR is used), restored once on one device, and both forward passes
generate the same greedy text of --tokens new tokens (so the window restarts several times)
after a warm-up run each (tracing and compiling are not timed); the timed runs alternate
between them, so machine noise hits both alike. Each run's rate is Stats.per_second: new tokens
over the wall time from the first forward pass to the last token.

    python bench/generate_speed.py                    # trains 20 steps into a temporary run
    python bench/generate_speed.py RUN_DIR --tokens 256 --repeats 5 --prompts 1
    python bench/generate_speed.py --set "model.transformer.context=256"   # a longer window

It prints each run's rate and, last, one JSON line with the medians and their ratio.

Measured on 2 shared cores of a Xeon (one virtual CPU device; medians of 5 alternated runs,
greedy texts identical every time), dtcli at the KV-cache commit:
    python bench/generate_speed.py                 context 64:  193 vs 114 tokens/s (1.7x)
    ... --set "model.transformer.context=256"      context 256: 174 vs  43 tokens/s (4.0x)
    ... --prompts 8 --repeats 3                    context 64, 8 prompts: 1127 vs 260 (4.3x)
A decode step of the 4-block GPT costs about 4.5 ms whatever the context: ~300 small ops, each
with the executor's fixed cost, dominate its arithmetic on a CPU; the window pass grows with the
context. The cache wins more with a longer context, more prompts, a bigger model.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
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


def measure(run: Path, tokens: int, repeats: int, prompts: int) -> None:
    from dtcli import generate

    gen = generate.Generator(run, mesh="batch=1", devices="cpu:1")
    texts = [f"ROMEO {i}:".encode() for i in range(prompts)]
    rates: dict[bool, list[float]] = {True: [], False: []}
    outputs = {}
    for repeat in range(repeats + 1):  # the first of each: the warm-up (compiling)
        for cache in (True, False) if repeat % 2 else (False, True):
            settings = generate.Settings(tokens, temperature=0.0, cache=cache)
            outputs[cache] = [t for _, t in gen.texts(texts, settings)]
            stats = gen.stats
            name = "cache   " if cache else "no-cache"
            note = " (warm-up)" if repeat == 0 else ""
            print(f"{name} {stats.per_second:8.1f} tokens/s  {stats.seconds:6.2f} s{note}")
            if repeat:
                rates[cache].append(stats.per_second)
    if outputs[True] != outputs[False]:
        sys.exit("the greedy texts with and without the cache differ")
    with_cache, without = statistics.median(rates[True]), statistics.median(rates[False])
    result = {
        "tokens": tokens,
        "prompts": prompts,
        "context": gen.context,
        "cache_tokens_per_sec": round(with_cache, 1),
        "no_cache_tokens_per_sec": round(without, 1),
        "ratio": round(with_cache / without, 2),
        "same_greedy_text": True,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
