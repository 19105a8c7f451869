"""The lock that gives a run one writer: an exclusive flock on RUN_DIR/.dtcli.lock, and who holds
it."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from dtcli import storage
from dtcli.errors import UsageError
from dtcli.rundir.files import LOCK, Warn, os_reason, stderr


def holder_text(info: dict[str, Any]) -> str:
    return f"pid {info.get('pid', '?')} on {info.get('host', '?')} since {info.get('since', '?')}"


def _read_lock(path: Path) -> dict[str, Any]:
    try:
        info = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def held_by(run_dir: Path) -> dict[str, Any] | None:
    """Who holds the run's lock now (None: nobody), without taking it. Remote run directories
    have no lock (object stores cannot lock)."""
    if storage.is_remote(run_dir):
        return None
    path = Path(run_dir) / LOCK
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError:
        return _read_lock(path) or {"pid": "?"}
    finally:
        os.close(fd)  # closing drops a lock taken just now
    return None


def held_error(arg: str, run_dir: Path, info: dict[str, Any]) -> UsageError:
    return UsageError(
        f"{arg} {str(run_dir)!r}: the run is being written by another dtcli process "
        f"({holder_text(info)}); wait for it or choose another folder"
    )


class Lock:
    """An exclusive flock on RUN_DIR/.dtcli.lock naming its holder (pid, host, since when).

    flock is released by the kernel when its holder dies, so a lock left by a killed process is
    free to take; the file then still names the dead holder, and taking it over says so.
    """

    def __init__(self, run_dir: Path, arg: str, warn: Warn = stderr):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None
        self.created = False
        while True:
            existed = self.path.exists()
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except IsADirectoryError:
                raise UsageError(
                    f"{arg} {str(run_dir)!r}: its {LOCK} is a folder, expected dtcli's lock "
                    "file; remove that folder"
                ) from None
            except OSError as exc:
                raise UsageError(
                    f"{arg} {str(run_dir)!r}: cannot write there ({os_reason(exc)})"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    raise held_error(arg, run_dir, _read_lock(self.path)) from None
                raise UsageError(
                    f"{arg} {str(run_dir)!r}: cannot lock the run ({os_reason(exc)})"
                ) from None
            # The holder may have removed the file between our open and flock: then we hold a
            # lock on a file nobody else will open. Try again on the file now at the path.
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except OSError:
                same = False
            if same:
                break
            os.close(fd)
        self.fd = fd
        self.created = not existed
        previous = _read_lock(self.path)
        if previous and previous.get("pid") != os.getpid():
            warn(
                f"warning: {run_dir}: took over the lock of {holder_text(previous)}, "
                "which is no longer running"
            )
        info = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": datetime.now().isoformat(timespec="seconds"),
            "command": " ".join(sys.argv[1:])[:500],
        }
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)

    def release(self) -> None:
        if self.fd is None:
            return
        # Unlink while still holding it: a process that opens the path afterwards gets a new file.
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self.fd)
        self.fd = None
