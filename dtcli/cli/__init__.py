"""The command line: each command loads its input and calls one library function.

TensorFlow is imported only inside commands that need it, so `dtcli --help` and `dtcli plot`
answer at once. Every failure ends in one `error:` line: bad input exits 2, a fault after training
started 1, Ctrl-C 130, SIGTERM (a scheduler's preemption: checkpoint written) 143; `--debug` (or
DTCLI_DEBUG=1) adds the full traceback.
"""

from dtcli.cli.app import app
from dtcli.cli.entry import DEBUG_ENV, main, run

__all__ = ["DEBUG_ENV", "app", "main", "run"]
