"""One recipe, several settings side by side: `dtcli train` per variant, alternated, same machine.

Each variant is a name and `--set` overrides; each round trains every variant once, in turn, in
a fresh process (so noise on the machine falls on all of them alike), and reads its last
`metrics.jsonl` record: seconds per step after the first call (compiling excluded), tokens/s,
the first call's compile seconds and the final eval loss.

    python bench/variants.py recipes/tiny_gpt.yaml --steps 200 \\
        --variant float32: --variant bf16:train.precision=bf16 --repeats 2
    python bench/variants.py recipes/tiny_gpt.yaml --steps 200 \\
        --variant plain: --variant remat:model.transformer.remat=true

The recipe's own settings hold unless a variant or `--set` changes them; `--steps` sets
train.steps and train.eval_every (one evaluation, at the end). `--env NAME:VAR=VALUE` sets an
environment variable for one variant's runs (XLA_FLAGS, say). A run that fails is counted and its
error line shown, and the rounds go on: a variant's figures are the medians of its runs that
trained, and `trained` says how many did (whether bf16 steps go NaN on a GPU, say, is a count over
repeats). Exit 1 when any run failed. Last line: one JSON object.

    python bench/variants.py recipes/tiny_gpt.yaml --steps 200 --repeats 5 \
        --set devices=gpu --set train.precision=bf16 --variant default: \
        --variant no-autotune: --env no-autotune:XLA_FLAGS=--xla_gpu_autotune_level=0
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def run_once(recipe: str, sets: list[str], steps: int, out: Path, env: dict[str, str]) -> dict:
    """One `dtcli train` run's figures, or {"error": its last error line} when it failed."""
    args = [sys.executable, "-m", "dtcli", "train", recipe, "--out", str(out), "--no-progress"]
    for value in [f"train.steps={steps}", f"train.eval_every={steps}", *sets]:
        args += ["--set", value]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env})
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()] or ["(no output)"]
        errors = [line for line in lines if line.startswith("error")]
        return {"error": f"exit {proc.returncode}: {(errors or lines)[-1][:300]}"}
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    # `seconds` counts the epoch's training time, the first call (compiling) included.
    trained = last["seconds"] - last["compile_seconds"]
    return {
        "s_per_step": trained / (steps - 1),
        "tokens_per_sec": last.get("tokens_per_sec"),
        "compile_seconds": last["compile_seconds"],
        "eval_loss": last["eval_loss"],
    }


FIGURES = ("s_per_step", "tokens_per_sec", "compile_seconds", "eval_loss")


def parse_variants(texts: list[str], envs: list[str]) -> list[tuple[str, list[str], dict]]:
    """(name, --set values, environment) per `--variant NAME:k=v,k=v`, with its `--env`s."""
    variants = []
    for text in texts:
        name, _, rest = text.partition(":")
        variants.append((name, [s for s in rest.split(",") if s], {}))
    by_name = {name: env for name, _, env in variants}
    for text in envs:
        name, _, assignment = text.partition(":")
        var, eq, value = assignment.partition("=")
        if name not in by_name or not eq or not var:
            raise SystemExit(f"--env {text!r}: expected NAME:VAR=VALUE for a --variant NAME")
        by_name[name][var] = value
    return variants


def summarize(runs: list[dict]) -> dict:
    """Medians over the runs that trained, how many did, and the failed runs' errors."""
    good = [run for run in runs if "error" not in run]
    summary = {key: statistics.median(r[key] for r in good) if good else None for key in FIGURES}
    summary["trained"] = f"{len(good)}/{len(runs)}"
    summary["errors"] = [run["error"] for run in runs if "error" in run]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--variant", action="append", required=True, help="NAME:key=v,key=v")
    parser.add_argument("--env", action="append", default=[], help="NAME:VAR=VALUE")
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    common = list(args.sets)
    if SHAKESPEARE.is_file() and not any(s.startswith("data.path=") for s in common):
        common.append(f"data.path={SHAKESPEARE}")
    variants = parse_variants(args.variant, args.env)
    results: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, sets, env in variants:
                out = Path(tmp) / f"{name}-{r}"
                results[name].append(run_once(args.recipe, common + sets, args.steps, out, env))
                print(name, r, json.dumps(results[name][-1]), flush=True)
    summary = {name: summarize(runs) for name, runs in results.items()}
    for name, s in summary.items():
        if s["s_per_step"] is None:
            print(f"{name:>12}: trained {s['trained']}")
            continue
        print(
            f"{name:>12}: {s['s_per_step'] * 1e3:9.1f} ms/step  {s['tokens_per_sec']:9,.0f} "
            f"tokens/s  first call {s['compile_seconds']:6.1f} s  eval loss "
            f"{s['eval_loss']:.4f}  trained {s['trained']}"
        )
    print(json.dumps(summary))
    if any(s["errors"] for s in summary.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
