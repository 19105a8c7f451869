"""`dtcli train` at two commits, side by side: time to the first step and examples/s.

Each version trains the same recipe in its own fresh process (as a user runs it); the versions
alternate, `--repeats` times, so that machine noise hits both alike. The base commit is checked
out into a temporary git worktree and run from there with the same Python environment.

    python bench/versions.py --base 2c94ec9                      # the quick start
    python bench/versions.py --base 2c94ec9 --recipe recipes/mnist_core_mlp.yaml \
        --set data.source=idx --set data.path=../shared/data/mnist

Reported per version (min / median / max over the repeats):
- first step: seconds from starting the process to the first training step's loss being written
  (steps.jsonl, with `train.log_every=1`): imports, device set-up, data, model, compilation;
- examples/s: training examples over training seconds of the epochs after the first (the first
  holds the compilation); the same definition dtcli writes per epoch in metrics.jsonl;
- the last epoch's eval loss, which must agree (the same math on the same examples).
The last line is one JSON object with the medians and the ratios (head / base).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUN = "import sys; from dtcli.cli import main; sys.argv[0] = 'dtcli'; main()"


def run_once(code_root: Path, recipe: Path, sets: list[str], workdir: Path) -> dict:
    out = workdir / f"run-{time.monotonic_ns()}"
    args = [sys.executable, "-c", RUN, "train", str(recipe), "--out", str(out)]
    for s in ["train.log_every=1", *sets]:
        args += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(code_root)}
    started = time.perf_counter()
    proc = subprocess.Popen(
        args, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    first = None
    steps = out / "steps.jsonl"
    while proc.poll() is None:
        if first is None and steps.exists() and steps.stat().st_size > 0:
            first = time.perf_counter() - started
        time.sleep(0.02)
    if proc.returncode != 0:
        sys.exit(f"{code_root}: dtcli train failed:\n{proc.stderr.read()}")
    epochs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    later = epochs[1:] or epochs
    examples = sum(e["train_examples"] for e in later)
    seconds = sum(e["seconds"] for e in later)
    return {
        "first_step_s": first if first is not None else float("nan"),
        "examples_per_sec": examples / seconds,
        "eval_loss": epochs[-1]["eval_loss"],
        "wall_s": time.perf_counter() - started,
    }


def summary(values: list[float]) -> str:
    return (
        f"{min(values):,.2f} / {statistics.median(values):,.2f} / {max(values):,.2f}"
        if values
        else "-"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="git revision to compare against")
    parser.add_argument("--recipe", default="recipes/quickstart.yaml")
    parser.add_argument("--set", action="append", default=[], dest="sets")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    recipe = (ROOT / args.recipe).resolve()
    with tempfile.TemporaryDirectory(prefix="dtcli-versions-") as tmp:
        tmp = Path(tmp)
        base_root = tmp / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base_root), args.base],
            check=True,
            capture_output=True,
        )
        try:
            versions = {"base": base_root, "head": ROOT}
            results: dict[str, list[dict]] = {name: [] for name in versions}
            for repeat in range(args.repeats):
                for name, code_root in versions.items():
                    r = run_once(code_root, recipe, args.sets, tmp)
                    results[name].append(r)
                    print(
                        f"repeat {repeat + 1} {name}: first step {r['first_step_s']:.2f} s, "
                        f"{r['examples_per_sec']:,.0f} ex/s, eval loss {r['eval_loss']:.6f}",
                        flush=True,
                    )
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base_root)],
                check=False,
                capture_output=True,
            )
    print(f"\n{args.recipe} {' '.join(args.sets)}; min / median / max over {args.repeats}")
    print(f"{'':6} {'first step (s)':>26} {'examples/s':>32} {'eval loss':>10}")
    medians = {}
    for name, rs in results.items():
        first = [r["first_step_s"] for r in rs]
        rate = [r["examples_per_sec"] for r in rs]
        medians[name] = {
            "first_step_s": statistics.median(first),
            "examples_per_sec": statistics.median(rate),
            "eval_loss": rs[-1]["eval_loss"],
        }
        print(f"{name:6} {summary(first):>26} {summary(rate):>32} {rs[-1]['eval_loss']:>10.6f}")
    base, head = medians["base"], medians["head"]
    print(
        json.dumps(
            {
                "base": args.base,
                "recipe": args.recipe,
                **{f"{k}_{name}": v for name, m in medians.items() for k, v in m.items()},
                "first_step_ratio": head["first_step_s"] / base["first_step_s"],
                "throughput_ratio": head["examples_per_sec"] / base["examples_per_sec"],
            }
        )
    )


if __name__ == "__main__":
    main()
