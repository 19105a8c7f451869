"""Both ends of the epoch progress bar: the bar `dtcli train` draws, and the event wire through
which a launched client 0 sends its progress to `dtcli launch`, which draws the one bar (a bar
drawn into a pipe shows nothing)."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

# dtcli launch sets this for client 0: its progress goes to the launcher as event lines (which
# draws the one bar), since a bar drawn into a pipe shows nothing.
PROGRESS_EVENTS_ENV = "DTCLI_PROGRESS_EVENTS"
# Set by `dtcli launch` for its clients: the run directory is printed once (by the launcher),
# and a stopped client names `dtcli launch --resume` as the way on.
LAUNCHED_ENV = "DTCLI_LAUNCHED"
PROGRESS_EVENT = "\x1edtcli-progress "


def launched() -> bool:
    """This process is a client `dtcli launch` started."""
    return os.environ.get(LAUNCHED_ENV) == "1"


class Bar:
    """A rich progress bar for one epoch: loss, accuracy and examples/s as it goes."""

    def __init__(self, console: Any, enabled: bool, unit: str = "ex/s"):
        self.console = console
        self.unit = unit
        # A live bar only on a terminal: piped to a file it would leave a blank line per epoch.
        self.enabled = enabled and console.is_terminal
        self.progress = None
        self.events = enabled and os.environ.get(PROGRESS_EVENTS_ENV) == "1"
        self._last = 0.0

    def _event(self, kind: str, **fields: Any) -> None:
        sys.stderr.write(PROGRESS_EVENT + json.dumps({"event": kind, **fields}) + "\n")
        sys.stderr.flush()

    def start(self, epoch: int, epochs: int, steps: int, done: int = 0) -> None:
        if self.events:
            self._event("start", epoch=epoch, epochs=epochs, steps=steps, done=done)
            return
        if not self.enabled:
            return
        self.progress = _progress(self.console, f"epoch {epoch}/{epochs}")
        self.task = self.progress.add_task("train", total=steps, completed=done, stats="")

    def update(self, done: int, loss: float, acc: float, rate: float) -> None:
        stats = f"loss {loss:.4f} acc {acc:.4f} {rate:,.0f} {self.unit}"
        if self.events:
            now = time.monotonic()
            if now - self._last >= 0.1:  # a few lines a second are plenty for a bar
                self._last = now
                self._event("update", done=done, stats=stats)
            return
        if self.progress is not None:
            self.progress.update(self.task, completed=done, stats=stats)

    def stop(self) -> None:
        if self.events:
            self._event("stop")
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class LaunchBar:
    """Client 0's epoch progress, drawn by the launcher from the events client 0 sends."""

    def __init__(self, console: Any):
        self.console = console
        self.progress = None

    def event(self, e: dict[str, Any]) -> None:
        kind = e.get("event")
        if kind == "start":
            self.stop()
            self.progress = _progress(self.console, f"epoch {e['epoch']}/{e['epochs']} (client 0)")
            self.task = self.progress.add_task(
                "train", total=e["steps"], completed=e.get("done", 0), stats=""
            )
        elif kind == "update" and self.progress is not None:
            self.progress.update(self.task, completed=e["done"], stats=e["stats"])
        elif kind == "stop":
            self.stop()

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def _progress(console: Any, title: str) -> Any:
    """A started, transient rich Progress with the epoch bar's columns."""
    from rich.progress import Progress

    progress = Progress(*progress_columns(title), console=console, transient=True)
    progress.start()
    return progress


def progress_columns(title: str) -> list[Any]:
    """The columns of the epoch bar (the same in `train` and in `launch`)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    return [
        TextColumn(title),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
    ]
