"""The run's log: every line `dtcli train` prints, as plain text, in the run directory's train.log.

The console that prints to the terminal records each line too. Until the run's files may change
(a new run at once; a resume only once its first step trained, since a resume that fails before
leaves every file as it was) the lines wait in memory; from then on each is appended as it is
printed. The progress bar is not logged (it redraws; the epoch lines say the same). A log that
cannot be written (a full disk) is dropped with one warning: the terminal, the metrics and the
checkpoints are the run's record, the log a copy of what the terminal showed.
"""

from __future__ import annotations

import io
import os
import sys
import threading
from pathlib import Path
from typing import Any

from rich.console import Console

from dtcli import storage


def to_devnull(stream: Any) -> None:
    """A stream whose reader went away (a closed pipe): what is still written to it goes
    nowhere, so that no later write, nor Python's flush at exit, fails on it once more."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's StringIO)
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)


class LoggedConsole(Console):
    """A rich Console (stderr) whose printed lines are also kept for the run's train.log."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._pending = io.StringIO()
        # Plain text, one line per message, whatever the terminal's width.
        self._plain = Console(
            file=self._pending, no_color=True, highlight=False, soft_wrap=True, width=240
        )
        self._path: Any = None
        # A heartbeat prints from its own thread: a line reaches the terminal and the log
        # whole, and in the same order in both.
        self._printing = threading.RLock()

    def print(self, *objects: Any, **kwargs: Any) -> None:
        with self._printing:
            super().print(*objects, **kwargs)
            self._plain.print(*objects, **kwargs)
            self._flush()

    def on_broken_pipe(self) -> None:
        """stderr's reader went away (`dtcli train ... 2>&1 | head -2`): the run goes on, and
        its lines still reach train.log; what it prints from now on goes nowhere. (rich's own
        handler exits 1, and a new run that fails is removed.)"""
        self.quiet = True
        to_devnull(self.file)

    def log_only(self, line: str) -> None:
        """A line for the log only (the terminal got it another way, e.g. the final error)."""
        with self._printing:
            self._pending.write(line.rstrip("\n") + "\n")
            self._flush()

    def commit(self, path: Any, header: str) -> None:
        """From now on lines go to `path` (appended: a resumed run continues its log)."""
        with self._printing:
            self._path = storage.as_path(path)
            text = self._pending.getvalue()
            self._pending.seek(0)
            self._pending.truncate()
            self._pending.write(header.rstrip("\n") + "\n" + text)
            self._flush()

    def _flush(self) -> None:
        if self._path is None:
            return
        text = self._pending.getvalue()
        if not text:
            return
        self._pending.seek(0)
        self._pending.truncate()
        try:
            storage.append_line(self._path, text.rstrip("\n"))
        except OSError as exc:
            path, self._path = self._path, None
            print(
                f"warning: writing {path} failed ({exc.strerror or exc}); the rest of this run "
                "is not logged there (metrics and checkpoints are unaffected)",
                file=sys.stderr,
            )


def header(argv: list[str] | None = None) -> str:
    """The first line of each session of a run in its log: when, where, what command."""
    import shlex
    import socket
    from datetime import datetime

    from dtcli import __version__

    args = sys.argv if argv is None else argv
    when = datetime.now().isoformat(timespec="seconds")
    line = f"# {when} on {socket.gethostname()} (pid {os.getpid()}, dtcli {__version__})"
    if args and Path(args[0]).name in ("dtcli", "__main__.py", "cli.py"):  # not a test runner
        line += ": " + " ".join(shlex.quote(a) for a in ["dtcli", *args[1:]])
    return line
