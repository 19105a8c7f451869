"""track: tensorboard: the run's scalars as they come (live, on the training thread, as before
trackers) and the recipe as its HParams, in RUN_DIR/tensorboard. TensorFlow writes the events;
the writer is made at the first scalar, so a run that fails before it trains leaves no event
file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtcli.metrics import tensorboard_tag
from dtcli.track.base import Batch, RunInfo, cause


class TensorboardSink:
    name = "tensorboard"
    where = ""

    def __init__(self, folder: Path):
        self.folder = folder
        self.hparams: dict[str, Any] = {}
        self._writer: Any = None

    def start(self, run: RunInfo) -> None:
        self.hparams = run.params

    def log(self, batch: Batch) -> None:
        for step, values in batch:
            self._scalars(step, {tensorboard_tag(k): v for k, v in values.items() if k != "epoch"})

    def artifacts(self, files: list[Path], summary: dict[str, Any]) -> None:
        pass  # the plots and the summary lie beside the events already

    def finish(self, status: str) -> None:
        if self._writer is not None:
            try:
                self._writer.flush()
                self._writer.close()
            except Exception:  # noqa: BLE001 - event files are a convenience; metrics.jsonl counts
                pass
            self._writer = None

    def failure(self, exc: BaseException) -> str:
        return cause(exc)

    def _scalars(self, step: int, values: dict[str, float]) -> None:
        import tensorflow as tf

        with tf.device("/CPU:0"):
            if self._writer is None:
                self._writer = tf.summary.create_file_writer(str(self.folder))
                if self.hparams:
                    from tensorboard.plugins.hparams import api as hp

                    with self._writer.as_default():
                        hp.hparams(self.hparams)
            with self._writer.as_default():
                for name, value in values.items():
                    tf.summary.scalar(name, value, step=step)
