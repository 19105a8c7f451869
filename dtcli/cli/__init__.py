"""The command line: each command loads its input and calls one library function.

TensorFlow is imported only inside commands that need it, so `dtcli --help` and `dtcli plot`
answer at once. Every failure ends in one `error:` line: bad input exits 2, a fault after training
started 1, Ctrl-C 130, SIGTERM (a scheduler's preemption: checkpoint written) 143; `--debug` (or
DTCLI_DEBUG=1) adds the full traceback.

This module imports nothing of the command line itself until it runs: the console script's
`main` must be in place before typer, rich and the commands import (~0.3 s), so that a Ctrl-C
during that import is one line and 130 too, not Python's traceback. (The Typer application is
dtcli.cli.app.app.)
"""

from __future__ import annotations

import sys

from dtcli.errors import INTERRUPTED_EXIT, printed

__all__ = ["main", "run"]


def main() -> None:
    """The console script (entry.main, imported here so that Ctrl-C meets a handler)."""
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
