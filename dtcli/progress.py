"""Both ends of the epoch progress bar: the bar `dtcli train` draws, and the event wire through
which a launched client 0 sends its progress to `dtcli launch`, which draws the one bar (a bar
drawn into a pipe shows nothing); and the heartbeat of a process blocked in long work whose
output is no terminal (a log, a pipe): a plain line at least every 10 seconds."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# dtcli launch sets this for client 0: its progress goes to the launcher as event lines (which
# draws the one bar), since a bar drawn into a pipe shows nothing.
PROGRESS_EVENTS_ENV = "DTCLI_PROGRESS_EVENTS"
# Set by `dtcli launch` for its clients: the run directory is printed once (by the launcher),
# and a stopped client names `dtcli launch --resume` as the way on.
LAUNCHED_ENV = "DTCLI_LAUNCHED"
PROGRESS_EVENT = "\x1edtcli-progress "


# A run with no bar to draw (its output is a file or a pipe, not a terminal) prints a plain
# progress line at most this often (seconds): a log shows it is alive.
PLAIN_EVERY = 10.0
# A process blocked where it cannot print (a compile inside TensorFlow, a restore, a probe) says
# what it is doing once this many seconds passed without a line, where its output is no
# terminal, and again as long as it lasts (Heartbeat): its lines are never more than 10 s apart,
# the thread's wake-up on a loaded machine included (10.1 s seen at a load of 25 on 2 cores).
BEAT_EVERY = 9.0


def launched() -> bool:
    """This process is a client `dtcli launch` started."""
    return os.environ.get(LAUNCHED_ENV) == "1"


def _event(kind: str, **fields: Any) -> None:
    """One line of the event wire (PROGRESS_EVENT, then JSON) on stderr."""
    sys.stderr.write(PROGRESS_EVENT + json.dumps({"event": kind, **fields}) + "\n")
    sys.stderr.flush()


class Heartbeat:
    """While the main thread is blocked in long work it cannot interrupt to print (a compile
    inside TensorFlow), a thread prints what it is doing and for how long, once `every` seconds
    (BEAT_EVERY) passed without a line, and again every `every` seconds as long as it lasts; the
    first after `every / 2` (the process may have been silent a while before: its start, its
    imports):

        with Heartbeat(console, "compiling the training step") as beat:
            ...                      # "compiling the training step... 4s", "... 13s"
            beat.now("evaluating")   # from here on: what, and its clock anew
            beat.heard()             # the caller printed a line: the next beat waits for it

    Only where `console` is no terminal (a log, a pipe, a scheduler's file), and `on`: at a
    terminal a live bar keeps its own clock, or the user sees the process is there; --no-progress
    turns it off. Each line is printed whole by rich under the console's lock, so it never lands
    inside another line of that console; stop() (leaving the block) returns once the thread is
    gone, so nothing follows an error line. `say`: where a line goes instead of the console (a
    launched client 0's event wire)."""

    def __init__(
        self,
        console: Any,
        what: str,
        every: float | None = None,
        on: bool = True,
        say: Callable[[str], None] | None = None,
    ):
        self.console = console
        self.every = max(BEAT_EVERY if every is None else every, 0.001)
        self.on = on and not console.is_terminal and not console.quiet
        self._say = say or (lambda line: console.print(line, markup=False, highlight=False))
        self._lock = threading.Lock()
        self._what, self._since, self._last = what, time.monotonic(), time.monotonic()
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def now(self, what: str) -> None:
        """From here on the process is doing `what` (its seconds count from now)."""
        with self._lock:
            self._what, self._since = what, time.monotonic()

    def heard(self) -> None:
        """A line was printed: the next beat comes `every` seconds after it."""
        with self._lock:
            self._last = time.monotonic()

    def start(self) -> Heartbeat:
        if self.on and self._thread is None:
            self._since = time.monotonic()
            self._last = self._since - self.every / 2
            self._thread = threading.Thread(target=self._beat, name="dtcli-heartbeat", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Heartbeat:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _beat(self) -> None:
        while True:
            with self._lock:
                due = self._last + self.every
            if self._done.wait(max(due - time.monotonic(), 0.0)):
                return
            with self._lock:
                now = time.monotonic()
                if now < self._last + self.every:  # a line came meanwhile
                    continue
                self._last = now
                line = f"{self._what}... {_duration(now - self._since)}"
            self._say(line)


def stderr_console(file: Any = None) -> Any:
    """A rich console on stderr (or `file`) for what a command says as it goes (a heartbeat):
    a reader that went away only silences it (rich's own answer sends stdout to /dev/null and
    exits, which would lose the command's output)."""
    from rich.console import Console

    class SayingConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True

    return SayingConsole(file=file, stderr=file is None, soft_wrap=True)


def run_heartbeat(console: Any, what: str, on: bool) -> Heartbeat:
    """A training run's heartbeat: plain lines on `console`, or, for a client 0 that `dtcli
    launch` draws the progress of, events the launcher prints where it draws no live bar."""
    if os.environ.get(PROGRESS_EVENTS_ENV) == "1":
        return Heartbeat(console, what, on=on, say=lambda line: _event("beat", line=line))
    return Heartbeat(console, what, on=on)


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"


class Bar:
    """A rich progress bar for one epoch: loss, accuracy and examples/s as it goes.

    `total_steps`: a train.steps run's total; the bar then counts the run's optimizer steps
    ("step") rather than one epoch's batches. `plain`: where no bar can be drawn (not a
    terminal, no launcher to draw it), a plain line every PLAIN_EVERY seconds instead. `beat`:
    the run's Heartbeat, told what the loop does (the process's first call compiles the step)
    and of each plain line."""

    def __init__(
        self,
        console: Any,
        enabled: bool,
        unit: str = "ex/s",
        total_steps: int | None = None,
        plain: bool = False,
        beat: Heartbeat | None = None,
    ):
        self.console = console
        self.beat = beat
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
        _event(kind, **fields)

    def start(self, epoch: int, epochs: int, steps: int, done: int = 0, first: int = 0) -> None:
        """An epoch of `steps` batches, `done` of them done; `first`: the optimizer steps of
        the epochs before it."""
        self._first = first
        if self.total_steps:
            self._title, self._total, completed = "step", self.total_steps, first + done
        else:
            self._title, self._total, completed = f"epoch {epoch}/{epochs}", steps, done
        self._now(completed)
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
        self._now(completed)
        if self.plain:
            if self._calls == 1:
                # The process's first call compiles the step (seconds to minutes, then one
                # step): an eta counted from it would be hours for a run of minutes.
                self._since = (time.monotonic(), completed)
            self._plain_line(completed, loss, rate)
        if self.progress is not None:
            self.progress.update(self.task, completed=completed, stats=stats)

    def _now(self, completed: int) -> None:
        """What the heartbeat says the loop is doing until the next call returns."""
        if self.beat is None:
            return
        if not self._calls:  # the process's first call: tracing and compiling, then a step
            self.beat.now("compiling the training step")
        else:
            where = "step" if self.total_steps else f"{self._title} step"
            self.beat.now(f"training after {where} {completed}/{self._total}")

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
        if self.beat is not None:
            self.beat.heard()

    def stop(self) -> None:
        if self.events:
            self._event("stop")
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


class LaunchBar:
    """Client 0's epoch progress, drawn by the launcher from the events client 0 sends; where
    the launcher's output is no terminal, a plain line every PLAIN_EVERY seconds instead. Client
    0's heartbeat (a "beat" event) is printed where no bar is live: a live bar keeps its clock."""

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
        elif kind == "beat" and self.progress is None:
            self.console.print(f"[client 0] {e['line']}", highlight=False, markup=False)

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
