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
environment variable for one variant's runs (XLA_FLAGS, say); `--tree NAME:DIR` runs one
variant's `dtcli train` in DIR, another checkout of dtcli (another commit: `git archive COMMIT
| tar -x -C DIR`), so two commits alternate on the same machine. A run that fails is counted and its
error line shown, and the rounds go on: a variant's figures are the medians of its runs that
trained, and `trained` says how many did (whether bf16 steps go NaN on a GPU, say, is a count over
repeats). Exit 1 when any run failed. Last line: one JSON object.

    python bench/variants.py recipes/tiny_gpt.yaml --steps 200 --repeats 5 \
        --set devices=gpu --set train.precision=bf16 --variant default: \
        --variant no-autotune: --env no-autotune:XLA_FLAGS=--xla_gpu_autotune_level=0
    python bench/variants.py recipes/gpt_fsdp_tp.yaml --steps 8 --repeats 3 \
        --variant before: --tree before:/tmp/before --variant after:
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


def run_once(
    recipe: str, sets: list[str], steps: int, out: Path, env: dict[str, str], tree: Path = ROOT
) -> dict:
    """One `dtcli train` run's figures, or {"error": its last error line} when it failed.
    `tree`: the checkout whose dtcli runs (`python -m` imports the working folder's first)."""
    args = [sys.executable, "-m", "dtcli", "train", recipe, "--out", str(out), "--no-progress"]
    for value in [f"train.steps={steps}", f"train.eval_every={steps}", *sets]:
        args += ["--set", value]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=tree, env={**os.environ, **env})
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()] or ["(no output)"]
        errors = [line for line in lines if line.startswith("error")]
        return {"error": f"exit {proc.returncode}: {(errors or lines)[-1][:300]}"}
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    # `seconds` counts the epoch's training time, the first call (compiling) included: both
    # figures are of the steps after it. (--steps sets eval_every: one record, every step.)
    s_per_step = (last["seconds"] - last["compile_seconds"]) / (steps - 1)
    tokens = last.get("train_tokens")  # language models
    return {
        "s_per_step": s_per_step,
        "tokens_per_sec": None if tokens is None else tokens / steps / s_per_step,
        "compile_seconds": last["compile_seconds"],
        "eval_loss": last["eval_loss"],
    }


FIGURES = ("s_per_step", "tokens_per_sec", "compile_seconds", "eval_loss")


def parse_variants(texts: list[str], envs: list[str]) -> list[tuple[str, list[str], dict]]:
    """(name, --set values, environment) per `--variant NAME:k=v,k=v`, with its `--env`s.
    ValueError, naming the argument, for a name given twice or an --env that is no
    NAME:VAR=VALUE of a variant."""
    variants = []
    for text in texts:
        name, _, rest = text.partition(":")
        if not name or any(name == other for other, _, _ in variants):
            raise ValueError(f"--variant {text!r}: expected a NAME no other variant has")
        variants.append((name, [s for s in rest.split(",") if s], {}))
    by_name = {name: env for name, _, env in variants}
    for text in envs:
        name, colon, assignment = text.partition(":")
        var, eq, value = assignment.partition("=")
        if not colon or not eq or not var:
            raise ValueError(f"--env {text!r}: expected NAME:VAR=VALUE")
        if name not in by_name:
            raise ValueError(f"--env {text!r}: no --variant is named {name!r}")
        by_name[name][var] = value
    return variants


def parse_trees(texts: list[str], names: list[str]) -> dict[str, Path]:
    """The checkout per `--tree NAME:DIR` (DIR holding dtcli/); ValueError, naming the argument,
    for no such variant or a DIR without dtcli."""
    trees = {}
    for text in texts:
        name, colon, folder = text.partition(":")
        if not colon or name not in names:
            raise ValueError(f"--tree {text!r}: expected NAME:DIR of a --variant's NAME")
        if not (Path(folder) / "dtcli" / "__init__.py").is_file():
            raise ValueError(f"--tree {text!r}: {folder!r} holds no dtcli/__init__.py")
        trees[name] = Path(folder).resolve()
    return trees


def summarize(runs: list[dict]) -> dict:
    """Medians over the runs that trained, how many did, and the failed runs' errors."""
    good = [run for run in runs if "error" not in run]
    summary = {}
    for key in FIGURES:  # tokens/s: language models only
        values = [r[key] for r in good if r[key] is not None]
        summary[key] = statistics.median(values) if values else None
    summary["trained"] = f"{len(good)}/{len(runs)}"
    summary["errors"] = [run["error"] for run in runs if "error" in run]
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--variant", action="append", required=True, help="NAME:key=v,key=v")
    parser.add_argument("--env", action="append", default=[], help="NAME:VAR=VALUE")
    parser.add_argument("--tree", action="append", default=[], help="NAME:DIR")
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    if args.steps < 2:  # the first step (compiling) is not timed
        parser.error(f"--steps {args.steps}: expected at least 2")
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: expected at least 1")
    try:
        variants = parse_variants(args.variant, args.env)
        trees = parse_trees(args.tree, [name for name, _, _ in variants])
    except ValueError as exc:
        parser.error(str(exc))
    common = list(args.sets)
    if SHAKESPEARE.is_file() and not any(s.startswith("data.path=") for s in common):
        common.append(f"data.path={SHAKESPEARE}")
    results: dict[str, list[dict]] = {name: [] for name, _, _ in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, sets, env in variants:
                out = Path(tmp) / f"{name}-{r}"
                tree = trees.get(name, ROOT)
                results[name].append(
                    run_once(args.recipe, common + sets, args.steps, out, env, tree)
                )
                print(name, r, json.dumps(results[name][-1]), flush=True)
    summary = {name: summarize(runs) for name, runs in results.items()}
    for name, s in summary.items():
        if s["s_per_step"] is None:
            print(f"{name:>12}: trained {s['trained']}; {s['errors'][0]}")
            continue
        rate = "-" if s["tokens_per_sec"] is None else f"{s['tokens_per_sec']:,.0f}"
        print(
            f"{name:>12}: {s['s_per_step'] * 1e3:9.1f} ms/step  {rate:>9} tokens/s  first call "
            f"{s['compile_seconds']:6.1f} s  eval loss {s['eval_loss']:.4f}  trained {s['trained']}"
        )
    print(json.dumps(summary))
    if any(s["errors"] for s in summary.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
