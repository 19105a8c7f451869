"""`dtcli plan --auto --measure K`: each candidate trained K steps in a fresh `dtcli train`
process, its step time read from the run's metrics.jsonl with the first call (one step, the
compilation) left out.

The candidate runs from the recipe --write would write (autoplan.recipe_file), so a measured
candidate is one `dtcli train OUT.yaml` runs. Each run gets K + 1 steps and one evaluation at
the end (not timed); its run directory goes under a temporary folder, removed afterwards.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from dtcli.errors import one_line

TIMEOUT_ENV = "DTCLI_MEASURE_TIMEOUT"  # seconds one candidate's run may take (default 1800)


def step_ms(metrics_file: Path, steps: int) -> float:
    """Milliseconds per step after the first call, from a run's last metrics.jsonl record:
    `seconds` counts the epoch's training time, the first call (one step, compiling) included."""
    last = json.loads(metrics_file.read_text().splitlines()[-1])
    return (last["seconds"] - last["compile_seconds"]) / steps * 1e3


def train_args(recipe_file: Path, run_dir: Path, steps: int, warmup: int = 0) -> list[str]:
    """`dtcli train` of K + 1 steps (the first call's step is the compilation's: not timed), a
    warmup that a short run would never leave cut to half of it (step time does not depend on
    the learning rate), one evaluation at the end."""
    total = steps + 1
    more = ["--set", f"optimizer.warmup_steps={total // 2}"] if warmup >= total else []
    return [
        sys.executable,
        "-m",
        "dtcli",
        "train",
        str(recipe_file),
        "--out",
        str(run_dir),
        "--no-progress",
        "--set",
        f"train.steps={total}",
        "--set",
        f"train.eval_every={total}",
        "--set",
        "train.checkpoint_every=0",
        *more,
    ]


def measure_one(
    recipe_text: str, steps: int, timeout: float, warmup: int = 0
) -> tuple[float | None, str | None]:
    """(ms per step, None) or (None, why it could not be measured)."""
    with tempfile.TemporaryDirectory(prefix="dtcli-measure-") as tmp:
        recipe_file = Path(tmp) / "candidate.yaml"
        recipe_file.write_text(recipe_text)
        run_dir = Path(tmp) / "run"
        try:
            proc = subprocess.run(
                train_args(recipe_file, run_dir, steps, warmup),
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            return None, f"dtcli train ran past {timeout:g} s"
        if proc.returncode != 0:
            lines = [line for line in proc.stderr.splitlines() if line.strip()]
            return None, lines[-1] if lines else f"dtcli train exited {proc.returncode}"
        try:
            return step_ms(run_dir / "metrics.jsonl", steps), None
        except (OSError, ValueError, KeyError, IndexError) as exc:
            return None, f"no step time in the run's metrics.jsonl ({one_line(exc)})"


def measure_all(
    jobs: list[tuple[str, str, int]],
    steps: int,
    console: object,
    timeout: float,
    measure: Callable[[str, int, float, int], tuple[float | None, str | None]] = measure_one,
) -> list[tuple[float | None, str | None]]:
    """Measure each (label, recipe text, warmup steps) in turn behind a progress bar."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = [
        TextColumn("measuring"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[now]}"),
        TimeElapsedColumn(),
    ]
    out = []
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("measure", total=len(jobs), now="")
        for label, text, warmup in jobs:
            progress.update(task, now=label)
            out.append(measure(text, steps, timeout, warmup))
            progress.advance(task)
    return out
