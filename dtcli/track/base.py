"""The one interface every experiment tracker (a sink) implements, what it is told of the run,
and the thread a remote sink works on. Levanter's Tracker is the model: start, log batches of
metrics, artifacts, finish."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dtcli.errors import one_line

# How a tracker run ends (MLflow's words): the run completed, failed, or was stopped by Ctrl-C
# or SIGTERM (a resume continues it).
FINISHED, FAILED, KILLED = "FINISHED", "FAILED", "KILLED"

# (step, {metric name: value}), in step order.
Batch = list[tuple[int, dict[str, float]]]


@dataclass(frozen=True)
class RunInfo:
    """What a sink is told of the run when it starts."""

    run_dir: Path
    # The tracker run's name: the run directory's folder name.
    name: str
    # The recipe flattened (metrics.hparams_of): a new tracker run's parameters.
    params: dict[str, bool | int | float | str]
    # mesh, devices, dtcli's version.
    tags: dict[str, str]
    # This sink's tracker run id kept in the run directory (trackers.json): a resume reopens it.
    run_id: str | None = None
    # A resume: the recipe keys that changed since the run started ({key: [old, new]}).
    changes: dict[str, list[Any]] = field(default_factory=dict)


class Sink(Protocol):
    """An experiment tracker. Every method may raise: the caller drops the sink, once."""

    name: str
    # A remote tracker's store (and experiment or project): a kept run id is its own only there.
    where: str

    def start(self, run: RunInfo) -> str | None:
        """Open the tracker run (run.run_id: reopen that one); the id to keep for a resume."""
        ...

    def log(self, batch: Batch) -> None: ...

    def artifacts(self, files: list[Path], summary: dict[str, Any]) -> None:
        """Files of the run (recipe.yaml, the plots) and its final numbers."""
        ...

    def finish(self, status: str) -> None: ...

    def failure(self, exc: BaseException) -> str:
        """What went wrong, briefly, for the one warning (`cause` says it for most sinks)."""
        ...


def root_cause(exc: BaseException) -> BaseException:
    """The exception at the bottom of `exc`'s chain (raised from, or while handling)."""
    root, seen = exc, {id(exc)}
    while (below := root.__cause__ or root.__context__) is not None and id(below) not in seen:
        seen.add(id(below))
        root = below
    return root


def cause(exc: BaseException) -> str:
    """An exception's cause, briefly: a network or file error at the bottom of the chain (a
    client library wraps it in pages of text: "Max retries exceeded ... Connection refused")
    in its own words, lower case; otherwise the exception's own line."""
    root = root_cause(exc)
    if root is not exc and isinstance(root, OSError) and (root.strerror or str(root)):
        return (root.strerror or str(root)).lower()
    return one_line(exc, named=True)


class Background:
    """A remote sink's calls, in order, on a thread of its own: a server that is down or slow
    never stalls a training step. Its first failure is one warning; the sink is dropped.
    `started`: told the run id a start returned; `logged`: the last step of each batch the
    tracker took."""

    def __init__(
        self,
        sink: Sink,
        warn: Callable[[str], None],
        started: Callable[[Sink, str | None], None],
        logged: Callable[[Sink, int], None],
    ):
        self.sink, self.warn, self.started, self.logged = sink, warn, started, logged
        self.failed = False
        self._queue: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._work, name=f"dtcli-{sink.name}", daemon=True)
        self._thread.start()

    def submit(self, method: str, *args: Any) -> None:
        if not self.failed:
            self._queue.put((method, args))

    def close(self, timeout: float) -> None:
        """Wait up to `timeout` seconds for the calls submitted, then leave the thread (a
        daemon: it does not hold the process) with one warning."""
        self._queue.put(None)
        self._thread.join(timeout)
        if self._thread.is_alive() and not self.failed:
            self.failed = True
            self.warn(
                f"warning: track: {self.sink.name} did not finish within {timeout:.0f} s; "
                "left behind (metrics.jsonl is complete)"
            )

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            if self.failed:
                continue
            method, args = item
            try:
                result = getattr(self.sink, method)(*args)
                if method == "start":
                    self.started(self.sink, result)
                elif method == "log" and args[0]:
                    self.logged(self.sink, max(step for step, _ in args[0]))
            except BaseException as exc:  # noqa: BLE001 - any failure of a sink drops it alone
                if self.failed:  # given up on by close() meanwhile, which said so
                    return
                self.failed = True
                self.warn(
                    f"warning: track: {self.sink.name} failed ({self.sink.failure(exc)}); "
                    "training goes on without it"
                )
