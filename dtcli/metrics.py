"""Metrics: one JSON object per epoch in metrics.jsonl, and TensorBoard scalars beside it.

Reading never imports TensorFlow (plotting uses it); writing TensorBoard events does, lazily.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
# Per-step training loss every `train.log_every` steps: {"step": N, "loss": x} per line.
STEPS_FILE = "steps.jsonl"


class MetricsWriter:
    """Appends epoch records to metrics.jsonl and scalars to TensorBoard event files."""

    def __init__(self, run_dir: Path, tensorboard: bool = True):
        self.path = Path(run_dir) / METRICS_FILE
        self._tb = None
        if tensorboard:
            import tensorflow as tf

            with tf.device("/CPU:0"):
                self._tb = tf.summary.create_file_writer(str(Path(run_dir) / "tensorboard"))

    def epoch(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        self.scalars(
            record["step"],
            {
                k: v
                for k, v in record.items()
                if k not in ("epoch", "step") and isinstance(v, (int, float))
            },
        )

    def step_loss(self, step: int, loss: float) -> None:
        with (self.path.parent / STEPS_FILE).open("a") as f:
            f.write(json.dumps({"step": step, "loss": loss}) + "\n")
        self.scalars(step, {"step_loss": loss})

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self._tb is None:
            return
        import tensorflow as tf

        with tf.device("/CPU:0"), self._tb.as_default():
            for name, value in values.items():
                tf.summary.scalar(name, value, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.flush()
            self._tb.close()


def read(path: Path, warn: Any = None) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl; a line that does not parse (a crash mid-write) is skipped."""
    records = []
    lines = Path(path).read_text().splitlines()
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            message = f"warning: {path}: line {number} is not complete JSON; skipped"
            (warn or (lambda m: print(m, file=sys.stderr)))(message)
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def truncate_after(path: Path, step: int) -> None:
    """Drop records past `step` (resuming from an earlier checkpoint replays those epochs)."""
    if not path.exists():
        return
    kept = [r for r in read(path) if r.get("step", 0) <= step]
    path.write_text("".join(json.dumps(r) + "\n" for r in kept))


def finite(value: float) -> bool:
    return math.isfinite(value)
