"""`dtcli plan --auto --measure K [--repeats R]`: each candidate trained K steps in a fresh
`dtcli train` process, R times (round by round, so that load from other processes falls on every
candidate alike), its step time read from the run's metrics.jsonl with the first call (one step,
the compilation) left out.

The candidate runs from the recipe --write would write (autoplan.recipe_file), so a measured
candidate is one `dtcli train OUT.yaml` runs. Each run gets K + 1 steps and one evaluation at
the end (not timed); its run directory goes under a temporary folder, removed afterwards.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtcli.errors import one_line
from dtcli.progress import PLAIN_EVERY

TIMEOUT_ENV = "DTCLI_MEASURE_TIMEOUT"  # seconds one candidate's run may take (default 1800)
HEARTBEAT = PLAIN_EVERY  # seconds between plain lines while a run goes on


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
    recipe_text: str,
    steps: int,
    timeout: float,
    warmup: int = 0,
    tick: Callable[[float], None] | None = None,
) -> tuple[float | None, str | None]:
    """(ms per step, None) or (None, why it could not be measured); `tick(seconds)` is called
    every HEARTBEAT seconds while the run goes on."""
    with tempfile.TemporaryDirectory(prefix="dtcli-measure-") as tmp:
        recipe_file = Path(tmp) / "candidate.yaml"
        recipe_file.write_text(recipe_text)
        run_dir = Path(tmp) / "run"
        args = train_args(recipe_file, run_dir, steps, warmup)
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        start = time.monotonic()
        while True:
            try:
                _, err = proc.communicate(timeout=HEARTBEAT)  # again after a timeout: no loss
                break
            except subprocess.TimeoutExpired:
                elapsed = time.monotonic() - start
                if elapsed > timeout:
                    proc.kill()
                    proc.communicate()
                    return None, f"dtcli train ran past {timeout:g} s"
                if tick is not None:
                    tick(elapsed)
        if proc.returncode != 0:
            lines = [line for line in err.splitlines() if line.strip()]
            return None, lines[-1] if lines else f"dtcli train exited {proc.returncode}"
        try:
            return step_ms(run_dir / "metrics.jsonl", steps), None
        except (OSError, ValueError, KeyError, IndexError) as exc:
            return None, f"no step time in the run's metrics.jsonl ({one_line(exc)})"


@dataclass
class Timing:
    """One candidate's measurements: ms per step of each run, or why one failed (then no
    further run of it)."""

    runs_ms: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def median_ms(self) -> float | None:
        return statistics.median(self.runs_ms) if self.runs_ms and not self.error else None


def measure_all(
    jobs: list[tuple[str, str, int]],
    steps: int,
    repeats: int,
    console: Any,
    timeout: float,
    measure: Callable[..., tuple[float | None, str | None]] = measure_one,
    progress: bool = True,
) -> list[Timing]:
    """Measure each (label, recipe text, warmup steps) `repeats` times, a round over every
    job at a time (every other round in reverse order), saying on `console` what it is doing
    as it goes: a bar on a terminal, else a plain line when a run starts, every HEARTBEAT
    seconds while it runs and when it ends; `progress` False: nothing."""
    out = [Timing() for _ in jobs]
    runs = len(jobs) * repeats
    with _Say(console, runs, progress) as say:
        for r in range(repeats):
            # every other round backwards: load that grows or fades over the rounds falls on
            # the first and the last candidates alike
            order = range(len(jobs)) if r % 2 == 0 else range(len(jobs) - 1, -1, -1)
            for n, i in enumerate(order):
                (label, text, warmup), timing = jobs[i], out[i]
                if timing.error is not None:
                    continue
                k = r * len(jobs) + n + 1
                what = f"{k}/{runs}: {label}" + (
                    f" (run {r + 1} of {repeats})" if repeats > 1 else ""
                )
                say.start(what)
                ms, error = measure(text, steps, timeout, warmup, say.tick)
                if error is not None:
                    timing.error = error
                    say.done(f"{what}: failed")
                else:
                    timing.runs_ms.append(ms)
                    say.done(f"{what}: {ms:,.1f} ms a step")
    return out


class _Say:
    """What measure_all says: a rich bar with the run's label on a terminal, plain lines
    elsewhere (a log shows what it is doing and that it is alive); nothing where `on` is
    False (--no-progress)."""

    def __init__(self, console: Any, total: int, on: bool = True):
        self.console, self.total, self.on = console, total, on
        self.bar = None
        self.what = ""

    def __enter__(self) -> _Say:
        if self.on and self.console.is_terminal:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            columns = [
                TextColumn("measuring"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[now]}"),
                TimeElapsedColumn(),
            ]
            self.bar = Progress(*columns, console=self.console, transient=True)
            self.bar.__enter__()
            self.task = self.bar.add_task("measure", total=self.total, now="")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def _line(self, text: str) -> None:
        if self.on:
            self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def start(self, what: str) -> None:
        self.what = what
        if self.bar is not None:
            self.bar.update(self.task, now=what.split(": ", 1)[1])
        else:
            self._line(f"measuring {what}")

    def tick(self, seconds: float) -> None:
        if self.bar is None:
            self._line(f"measuring {self.what}: {seconds:.0f} s")

    def done(self, text: str) -> None:
        self._line(f"measured {text}")
        if self.bar is not None:
            self.bar.advance(self.task)
