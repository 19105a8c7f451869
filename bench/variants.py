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
train.steps and train.eval_every (one evaluation, at the end). Last line: one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHAKESPEARE = ROOT.parent / "shared" / "data" / "tinyshakespeare" / "input.txt"


def run_once(recipe: str, sets: list[str], steps: int, out: Path) -> dict:
    args = [sys.executable, "-m", "dtcli", "train", recipe, "--out", str(out), "--no-progress"]
    for value in [f"train.steps={steps}", f"train.eval_every={steps}", *sets]:
        args += ["--set", value]
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(args)}\n{proc.stderr[-2000:]}")
    last = json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])
    # `seconds` counts the epoch's training time, the first call (compiling) included.
    trained = last["seconds"] - last["compile_seconds"]
    return {
        "s_per_step": trained / (steps - 1),
        "tokens_per_sec": last.get("tokens_per_sec"),
        "compile_seconds": last["compile_seconds"],
        "eval_loss": last["eval_loss"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe")
    parser.add_argument("--variant", action="append", required=True, help="NAME:key=v,key=v")
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    common = list(args.sets)
    if SHAKESPEARE.is_file() and not any(s.startswith("data.path=") for s in common):
        common.append(f"data.path={SHAKESPEARE}")
    variants = []
    for text in args.variant:
        name, _, rest = text.partition(":")
        variants.append((name, [s for s in rest.split(",") if s]))
    results: dict[str, list[dict]] = {name: [] for name, _ in variants}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            for name, sets in variants:
                out = Path(tmp) / f"{name}-{r}"
                results[name].append(run_once(args.recipe, common + sets, args.steps, out))
                print(name, r, json.dumps(results[name][-1]), flush=True)
    summary = {}
    for name, runs in results.items():
        summary[name] = {
            key: statistics.median(run[key] for run in runs)
            for key in ("s_per_step", "tokens_per_sec", "compile_seconds", "eval_loss")
        }
        s = summary[name]
        print(
            f"{name:>12}: {s['s_per_step'] * 1e3:9.1f} ms/step  {s['tokens_per_sec']:9,.0f} "
            f"tokens/s  first call {s['compile_seconds']:6.1f} s  eval loss {s['eval_loss']:.4f}"
        )
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
