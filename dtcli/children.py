"""The dtcli processes a command starts and watches (launch's clients, sweep's trials): each
dies with its parent, its output pumped line by line into one queue, its exit said in words."""

from __future__ import annotations

import contextlib
import queue
import signal
from typing import Any


def die_with_parent() -> None:
    """In the child, before exec: get SIGKILL when the parent dies (Linux only), so that even a
    killed launcher or sweep leaves no orphans."""
    with contextlib.suppress(Exception):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def pump(child: int, stream: Any, lines: queue.Queue) -> None:
    """Put each line of `stream` into `lines` as (child, text); (child, None) once it ends."""
    for raw in iter(stream.readline, b""):
        lines.put((child, raw.decode(errors="replace").rstrip("\r\n")))
    stream.close()
    lines.put((child, None))  # this stream is done


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
