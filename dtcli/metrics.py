"""Metrics: one JSON object per epoch in metrics.jsonl, per-step losses in steps.jsonl, the
names TensorBoard groups them under, the recipe as hyperparameters. Where those files live is
dtcli.rundir's business; the trackers (TensorBoard's events among them) are dtcli.track's.

Neither reading nor writing imports TensorFlow (plotting and the Profiler do).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from dtcli import storage
from dtcli.errors import TrainingError


def tensorboard_tag(name: str) -> str:
    """TensorBoard groups tags by their first '/': train/loss beside train/accuracy, eval/...,
    time/, perf/ (rates, FLOP/s). A name with a '/' of its own is its tag: steps.jsonl's keys
    as the trackers name them (step/loss, step/grad_norm: grouped under step/), an lm-eval
    task's TASK/METRIC (grouped by task)."""
    if "/" in name:
        return name
    for group in ("train", "eval"):
        if name.startswith(group + "_"):
            return f"{group}/{name[len(group) + 1 :]}"
    if name.endswith("seconds"):
        return f"time/{name}"
    if name.startswith("peak_memory"):
        return f"memory/{name}"
    return f"perf/{name}"


def hparams_of(recipe: dict[str, Any]) -> dict[str, bool | int | float | str]:
    """The recipe flattened for TensorBoard's HParams tab: dotted keys, scalar values (lists and
    mappings written as text)."""
    out: dict[str, bool | int | float | str] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(value, f"{prefix}.{key}" if prefix else str(key))
        elif isinstance(node, (bool, int, float, str)):
            out[prefix] = node
        elif node is not None:
            out[prefix] = json.dumps(node)

    walk(recipe, "")
    return out


class MetricsWriter:
    """Appends epoch records to metrics.jsonl and per-step losses to steps.jsonl (the trackers,
    TensorBoard among them, are dtcli.track's)."""

    def __init__(self, metrics: Path, steps: Path):
        self.metrics = storage.as_path(metrics)
        self.steps = storage.as_path(steps)

    def _append(self, path: Path, record: dict[str, Any]) -> None:
        try:
            storage.append_line(path, json.dumps(record))
        except OSError as exc:
            raise TrainingError(
                f"writing {path} failed ({exc.strerror or exc}); the run stopped; its "
                "checkpoints are intact"
            ) from None

    def epoch(self, record: dict[str, Any]) -> None:
        self._append(self.metrics, record)

    def step_loss(self, step: int, loss: float, **more: float) -> None:
        """One step's loss, and what else the step reports (grad_norm, learning_rate)."""
        self._append(self.steps, {"step": step, "loss": loss, **more})


class Profiler:
    """`--profile START:STOP`: a TensorBoard profiler trace (the Profile tab) of the optimizer
    steps START to STOP. A compiled call runs K steps, so the trace starts before the first call
    holding a step >= START and stops after the call that reaches STOP: it may cover up to K-1
    steps more on each side."""

    def __init__(self, logdir: Path, start: int, stop: int):
        self.logdir, self.start, self.stop = logdir, start, stop
        self.running = False
        self.traced: tuple[int, int] | None = None  # the steps the trace covers, once written
        self._first = 0

    def before_call(self, first: int, count: int) -> None:
        """A call will run the steps first .. first+count-1."""
        if self.running or self.traced is not None:
            return
        if first + count - 1 >= self.start and first <= self.stop:
            import tensorflow as tf

            tf.profiler.experimental.start(str(self.logdir))
            self.running, self._first = True, first

    def after_call(self, last: int) -> None:
        if self.running and last >= self.stop:
            self.finish(last)

    def finish(self, last: int) -> None:
        if not self.running:
            return
        import tensorflow as tf

        tf.profiler.experimental.stop()
        self.running = False
        self.traced = (self._first, last)


def read(path: Path, warn: Any = None, required: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Records of a JSON-lines file; lines that do not parse (a crash mid-write), that are not
    JSON objects or that lack a `required` key are skipped, with one warning that says why."""
    records = []
    bad: list[str] = []  # "line N <why>"
    text = storage.as_path(path).read_text(errors="replace")
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad.append(f"line {number} is not a complete JSON record")
            continue
        if not isinstance(record, dict):
            bad.append(f"line {number} is not a JSON object")
        elif missing := [key for key in required if key not in record]:
            bad.append(f"line {number} has no {missing[0]!r}")
        else:
            records.append(record)
    if bad:
        which = bad[0] if len(bad) == 1 else f"{len(bad)} lines (the first: {bad[0]})"
        message = f"warning: {path}: {which}; skipped"
        (warn or (lambda m: print(m, file=sys.stderr)))(message)
    return records


def truncate_after(path: Path, step: int) -> None:
    """Drop records past `step` (resuming from an earlier checkpoint replays those epochs)."""
    path = storage.as_path(path)
    if not path.exists():
        return
    kept = [r for r in read(path) if isinstance(r.get("step"), int) and r["step"] <= step]
    storage.write_atomic(path, "".join(json.dumps(r) + "\n" for r in kept))
