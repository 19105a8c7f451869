"""The command line: each command loads its input and calls one library function.

TensorFlow is imported only inside commands that need it, so `dtcli --help` and `dtcli plot`
answer at once. Every failure ends in one `error:` line: bad input exits 2, a fault after training
started 1, Ctrl-C 130, SIGTERM (a scheduler's preemption: checkpoint written) 143; `--debug` (or
DTCLI_DEBUG=1) adds the full traceback.

This module imports nothing of the command line itself until it runs: the console script's
`main` must be in place before typer, rich and the commands import (~0.3 s), so that a Ctrl-C
during that import is one line and 130 too, not Python's traceback. (The Typer application is
dtcli.cli.app.app.)

Ctrl-C stops every command, however dtcli was started: a shell script starts its background
jobs with SIGINT ignored, and Python keeps it so, which left `generate`, `launch` and the others
running to their end (and exit 0) where `train`, with its own handler, stopped. The console
script takes SIGINT back as at a terminal (`_ctrl_c_stops`).
"""

from __future__ import annotations

import signal
import sys

from dtcli.errors import INTERRUPTED_EXIT, printed

__all__ = ["main", "run"]


def _ctrl_c_stops() -> None:
    """SIGINT inherited as ignored (`dtcli ... &` in a script) is Python's own again: a user who
    starts dtcli from a script and presses Ctrl-C (or sends `kill -INT`) expects it to stop."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> None:
    """The console script (entry.main, imported here so that Ctrl-C meets a handler)."""
    _ctrl_c_stops()
    try:
        from dtcli.cli.entry import main as entry_main
    except KeyboardInterrupt:
        print(printed(KeyboardInterrupt()), file=sys.stderr)
        sys.exit(INTERRUPTED_EXIT)
    entry_main()


def run(argv: list[str] | None = None) -> int:
    """One command line in this process: its exit code (entry.run)."""
    from dtcli.cli.entry import run as entry_run

    return entry_run(argv)
