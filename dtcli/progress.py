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


# A language model's run with no bar to draw (its output is a file or a pipe, not a terminal)
# prints a plain progress line at most this often (seconds): a log shows it is alive.
PLAIN_EVERY = 10.0


def launched() -> bool:
    """This process is a client `dtcli launch` started."""
    return os.environ.get(LAUNCHED_ENV) == "1"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Bar:
    """A rich progress bar for one epoch: loss, accuracy and examples/s as it goes.

    `total_steps`: a train.steps run's total; the bar then counts the run's optimizer steps
    ("step") rather than one epoch's batches. `plain`: where no bar can be drawn (not a
    terminal, no launcher to draw it), a plain line every PLAIN_EVERY seconds instead."""

    def __init__(
        self,
        console: Any,
        enabled: bool,
        unit: str = "ex/s",
        total_steps: int | None = None,
        plain: bool = False,
    ):
        self.console = console
        self.unit = unit
        self.total_steps = total_steps
        # A live bar only on a terminal: piped to a file it would leave a blank line per epoch.
        self.enabled = enabled and console.is_terminal
        self.progress = None
        self.events = enabled and os.environ.get(PROGRESS_EVENTS_ENV) == "1"
        self.plain = plain and enabled and not self.enabled and not self.events
        self._last = 0.0
        self._first = 0  # optimizer steps before this epoch (a train.steps run's bar)
        self._title, self._total = "", 0
        self._since: tuple[float, int] | None = None  # (time, steps) the eta counts from
        self._calls = 0  # updates so far: one per train call

    def _event(self, kind: str, **fields: Any) -> None:
        sys.stderr.write(PROGRESS_EVENT + json.dumps({"event": kind, **fields}) + "\n")
        sys.stderr.flush()

    def start(self, epoch: int, epochs: int, steps: int, done: int = 0, first: int = 0) -> None:
        """An epoch of `steps` batches, `done` of them done; `first`: the optimizer steps of
        the epochs before it."""
        self._first = first
        if self.total_steps:
            self._title, self._total, completed = "step", self.total_steps, first + done
        else:
            self._title, self._total, completed = f"epoch {epoch}/{epochs}", steps, done
        if self.events:
            self._event("start", title=self._title, total=self._total, done=completed)
            return
        if self.plain:
            now = time.monotonic()
            if self._since is None or not self.total_steps:  # the eta of the run or the epoch
                self._since = (now, completed)
                self._last = now
        if not self.enabled:
            return
        self.progress = _progress(self.console, self._title)
        self.task = self.progress.add_task(
            "train", total=self._total, completed=completed, stats=""
        )

    def update(self, done: int, loss: float, acc: float, rate: float) -> None:
        completed = self._first + done if self.total_steps else done
        stats = f"loss {loss:.4f} acc {acc:.4f} {rate:,.0f} {self.unit}"
        if self.events:
            now = time.monotonic()
            if now - self._last >= 0.1:  # a few lines a second are plenty for a bar
                self._last = now
                self._event("update", done=completed, stats=stats)
            return
        self._calls += 1
        if self.plain:
            if self._calls == 1:
                # The process's first call compiles the step (seconds to minutes, then one
                # step): an eta counted from it would be hours for a run of minutes.
                self._since = (time.monotonic(), completed)
            self._plain_line(completed, loss, rate)
        if self.progress is not None:
            self.progress.update(self.task, completed=completed, stats=stats)

    def _plain_line(self, completed: int, loss: float, rate: float) -> None:
        now = time.monotonic()
        if now - self._last < PLAIN_EVERY or self._since is None:
            return
        self._last = now
        since, at = self._since
        eta = ""  # none until a call after the first has been timed
        if completed > at:
            left = (self._total - completed) * (now - since) / (completed - at)
            eta = f" | eta {_duration(left)}"
        where = "step" if self.total_steps else f"{self._title} step"
        self.console.print(
            f"{where} {completed}/{self._total} loss {loss:.4f} | {rate:,.0f} {self.unit}{eta}",
            highlight=False,
            markup=False,
        )

    def stop(self) -> None:
        if self.events:
            self._event("stop")
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class LaunchBar:
    """Client 0's epoch progress, drawn by the launcher from the events client 0 sends; where
    the launcher's output is no terminal, a plain line every PLAIN_EVERY seconds instead."""

    def __init__(self, console: Any):
        self.console = console
        self.progress = None
        self.plain = not console.is_terminal
        self._title, self._total, self._last = "", 0, 0.0

    def event(self, e: dict[str, Any]) -> None:
        kind = e.get("event")
        if kind == "start":
            self.stop()
            self._title, self._total, self._last = e["title"], e["total"], time.monotonic()
            if self.plain:
                return
            self.progress = _progress(self.console, f"{e['title']} (client 0)")
            self.task = self.progress.add_task(
                "train", total=e["total"], completed=e.get("done", 0), stats=""
            )
        elif kind == "update" and self.plain:
            now = time.monotonic()
            if now - self._last >= PLAIN_EVERY:
                self._last = now
                self.console.print(
                    f"[client 0] {self._title} {e['done']}/{self._total} {e['stats']}",
                    highlight=False,
                    markup=False,
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
