"""The one writer the training loop writes to: metrics.jsonl and steps.jsonl lines (as
metrics.MetricsWriter always wrote them), then every tracker of the recipe's `track`.

TensorBoard hears each record as it comes. A remote tracker (MLflow, W&B) hears a stretch of
records only once the checkpoint covering it is committed (`committed`), in one batch on its own
thread: after a crash and a resume it holds each step once, as metrics.jsonl does.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

from dtcli import storage
from dtcli.metrics import MetricsWriter
from dtcli.track.base import FINISHED, KILLED, Background, Batch, RunInfo, Sink

# steps.jsonl's keys reach the trackers as step/KEY (step/loss, step/grad_norm...).
STEP_PREFIX = "step/"
# How long closing waits for the remote trackers' threads, all together (seconds); after a
# Ctrl-C or SIGTERM less (a scheduler's grace period is short: the checkpoint comes first).
CLOSE_WAIT = 30.0
STOP_WAIT = 5.0


def epoch_values(record: dict[str, Any]) -> dict[str, float]:
    """A metrics.jsonl record's numbers as the trackers name them: each key but `step`."""
    return {
        k: v
        for k, v in record.items()
        if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)
    }


def step_values(record: dict[str, Any]) -> dict[str, float]:
    """A steps.jsonl record's numbers as the trackers name them: step/KEY."""
    return {STEP_PREFIX + k: v for k, v in epoch_values(record).items()}


class TrackedWriter:
    """metrics.jsonl and steps.jsonl, then the trackers (`live`: told at once; `remote`: at
    each committed checkpoint, on their threads). `ids`: where the remote trackers' run ids are
    kept (RUN_DIR/trackers.json), each written before its tracker hears a record."""

    def __init__(
        self,
        files: MetricsWriter,
        live: list[Sink],
        remote: list[Sink],
        ids: Path,
        warn: Any,
    ):
        self.files, self.live, self.ids, self.warn = files, live, ids, warn
        self.remote = [Background(s, warn, self._keep_id, self._confirm) for s in remote]
        self.pending: Batch = []
        self._ids_lock = threading.Lock()
        self._run_ids: dict[str, str] = {}  # each remote tracker's open run
        self.closed = False

    def start(self, run: RunInfo, kept: dict[str, dict[str, Any]], history: Batch) -> None:
        """Open each tracker's run: the one `kept` names for it (a resume), else a new one.
        Each first hears the records of `history` (a resume's, up to its checkpoint) it has not
        confirmed: a new run all, a kept one those after its last confirmed step (a stretch
        whose batch never reached it: a resume without it, a process ended first)."""
        for sink in self.live:
            sink.start(run)
        for worker in self.remote:
            found = kept.get(worker.sink.name, {})
            # The same store (and experiment or project) only: another one has no such run.
            run_id = found.get("run_id") if found.get("where") == worker.sink.where else None
            worker.submit("start", _with_id(run, run_id))
            after = found.get("step") if run_id is not None else 0
            # A kept run without a confirmed step (kept before steps were): nothing resent.
            missed = [r for r in history if r[0] > after] if isinstance(after, int) else []
            if missed:
                worker.submit("log", missed)

    def epoch(self, record: dict[str, Any]) -> None:
        self.files.epoch(record)
        self._record(record["step"], epoch_values(record))

    def step_loss(self, step: int, loss: float, **more: float) -> None:
        """One step's loss, and what else the step reports (grad_norm, learning_rate)."""
        self.files.step_loss(step, loss, **more)
        self._record(step, step_values({"loss": loss, **more}))

    def committed(self, step: int) -> None:
        """The checkpoint of `step` is complete: the records up to it go to the remote
        trackers, one batch each."""
        batch = [r for r in self.pending if r[0] <= step]
        self.pending = [r for r in self.pending if r[0] > step]
        if batch:
            for worker in self.remote:
                worker.submit("log", batch)

    def close(
        self,
        status: str = FINISHED,
        files: list[Path] | None = None,
        summary: dict[str, Any] | None = None,
    ) -> None:
        """End every tracker's run with `status` (FINISHED, FAILED, KILLED) after the run's
        `files` and `summary` as artifacts; the remote ones within CLOSE_WAIT seconds (KILLED:
        STOP_WAIT)."""
        if self.closed:
            return
        self.closed = True
        for sink in self.live:
            sink.finish(status)
        for worker in self.remote:
            worker.submit("artifacts", list(files or []), dict(summary or {}))
            worker.submit("finish", status)
        deadline = time.monotonic() + (STOP_WAIT if status == KILLED else CLOSE_WAIT)
        for worker in self.remote:
            worker.close(max(0.0, deadline - time.monotonic()))

    def _record(self, step: int, values: dict[str, float]) -> None:
        for sink in self.live:
            sink.log([(step, values)])
        if self.remote:
            self.pending.append((step, values))

    def _keep_id(self, sink: Sink, run_id: str | None) -> None:
        """Called on a tracker's thread once its run is open, before it hears a record: a
        reopened run keeps its confirmed step, a new one has none (0)."""
        if run_id is None:
            return
        with self._ids_lock:
            kept = read_ids(self.ids)
            before = kept.get(sink.name, {})
            step = before.get("step") if before.get("run_id") == run_id else 0
            kept[sink.name] = {"run_id": run_id, "where": sink.where, "step": step}
            self._run_ids[sink.name] = run_id
            storage.write_atomic(self.ids, json.dumps(kept, indent=1) + "\n")

    def _confirm(self, sink: Sink, step: int) -> None:
        """Called on a tracker's thread once it took a batch: the batch's last step is kept as
        confirmed, for a resume to send what comes after it."""
        with self._ids_lock:
            kept = read_ids(self.ids)
            entry = kept.get(sink.name)
            if isinstance(entry, dict) and entry.get("run_id") == self._run_ids.get(sink.name):
                entry["step"] = max(step, entry.get("step") or 0)
                storage.write_atomic(self.ids, json.dumps(kept, indent=1) + "\n")


def read_ids(path: Path) -> dict[str, dict[str, Any]]:
    """trackers.json: {tracker: {"run_id": ID, "where": its store, "step": the last step it
    confirmed taking}} (missing or unreadable: none)."""
    try:
        kept = json.loads(storage.as_path(path).read_text())
    except (OSError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def _with_id(run: RunInfo, run_id: str | None) -> RunInfo:
    from dataclasses import replace

    return replace(run, run_id=run_id, changes=run.changes if run_id else {})
