"""Metrics: one JSON object per epoch in metrics.jsonl, per-step losses in steps.jsonl, and
TensorBoard scalars beside them. Where those files live is dtcli.rundir's business.

Reading never imports TensorFlow (plotting uses it); writing TensorBoard events does, lazily, on
the first record, so a run that fails before it trains a step leaves no event file.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from dtcli.errors import TrainingError


def append_line(path: Path, line: str) -> None:
    """Append one line whole or not at all: a failed write (a full disk) is cut back off."""
    path = Path(path)
    data = (line + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(28, "No space left on device")
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


class MetricsWriter:
    """Appends epoch records and per-step losses, and the same scalars to TensorBoard."""

    def __init__(self, metrics: Path, steps: Path, tensorboard: Path | None = None):
        self.metrics = Path(metrics)
        self.steps = Path(steps)
        self.tensorboard = tensorboard
        self._tb = None

    def _append(self, path: Path, record: dict[str, Any]) -> None:
        try:
            append_line(path, json.dumps(record))
        except OSError as exc:
            raise TrainingError(
                f"writing {path} failed ({exc.strerror or exc}); the run stopped; its "
                "checkpoints are intact"
            ) from None

    def epoch(self, record: dict[str, Any]) -> None:
        self._append(self.metrics, record)
        self.scalars(
            record["step"],
            {
                k: v
                for k, v in record.items()
                if k not in ("epoch", "step") and isinstance(v, (int, float))
            },
        )

    def step_loss(self, step: int, loss: float, **more: float) -> None:
        """One step's loss, and what else the step reports (grad_norm, learning_rate)."""
        self._append(self.steps, {"step": step, "loss": loss, **more})
        self.scalars(step, {"step_loss": loss, **more})

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.tensorboard is None:
            return
        import tensorflow as tf

        with tf.device("/CPU:0"):
            if self._tb is None:
                self._tb = tf.summary.create_file_writer(str(self.tensorboard))
            with self._tb.as_default():
                for name, value in values.items():
                    tf.summary.scalar(name, value, step=step)

    def close(self) -> None:
        if self._tb is not None:
            try:
                self._tb.flush()
                self._tb.close()
            except Exception:  # noqa: BLE001 - event files are a convenience; metrics.jsonl counts
                pass
            self._tb = None


def read(path: Path, warn: Any = None) -> list[dict[str, Any]]:
    """Records of a JSON-lines file; lines that do not parse (a crash mid-write) are skipped,
    with one warning that counts them."""
    records = []
    bad = []
    for number, line in enumerate(Path(path).read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            bad.append(number)
            continue
        if isinstance(record, dict):
            records.append(record)
        else:
            bad.append(number)
    if bad:
        if len(bad) == 1:
            which = f"line {bad[0]} is not a complete JSON record"
        else:
            which = f"{len(bad)} lines (the first: {bad[0]}) are not complete JSON records"
        message = f"warning: {path}: {which}; skipped"
        (warn or (lambda m: print(m, file=sys.stderr)))(message)
    return records


def truncate_after(path: Path, step: int) -> None:
    """Drop records past `step` (resuming from an earlier checkpoint replays those epochs)."""
    path = Path(path)
    if not path.exists():
        return
    kept = [r for r in read(path) if isinstance(r.get("step"), int) and r["step"] <= step]
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    os.replace(tmp, path)
