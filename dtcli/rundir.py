"""The run directory: its layout, its rules, and the lock that gives a run one writer.

This module alone knows what a run directory holds and where:

    recipe.yaml        the resolved recipe (rewritten on resume only once a step has trained)
    metrics.jsonl      one JSON object per epoch          (dtcli.metrics writes and reads it)
    steps.jsonl        the per-step training loss
    resumes.jsonl      one JSON object per resume: from which checkpoint, what the command changed
    train.log          every line `dtcli train` printed, each session headed by its command
    tensorboard/       event files
    checkpoints/       ckpt-STEP/ folders, each complete and self-verifying (dtcli.checkpoint),
                       and `checkpoint`, TensorFlow's pointer to the latest
    plots/             PNG curves
    .dtcli.lock        held (flock) by the one process writing the run

Commands open a run through it: `create` for a new run, `open_for_resume` to continue one,
`find_checkpoint` to read one (eval, export), `metrics_file` to plot one. A run's folder is
created and locked before any TensorFlow work, so a second writer fails at once; a run that fails
before it has a complete checkpoint is removed again, and a failed resume leaves every file as it
was.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from dtcli import checkpoint as ckpt_lib
from dtcli import storage
from dtcli.errors import UsageError

RECIPE = "recipe.yaml"
METRICS = "metrics.jsonl"
STEPS = "steps.jsonl"
RESUMES = "resumes.jsonl"
TRAIN_LOG = "train.log"
TENSORBOARD = "tensorboard"
CHECKPOINTS = "checkpoints"
PLOTS = "plots"
LOCK = ".dtcli.lock"

Warn = Callable[[str], None]


def _stderr(message: str) -> None:
    print(message, file=sys.stderr)


def os_reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


@contextlib.contextmanager
def _reachable(arg: str, path: Any) -> Any:
    """A file system that cannot be reached (a bucket without network or credentials, a scheme
    TensorFlow has no plug-in for) is bad input naming the argument, not a crash."""
    try:
        yield
    except OSError as exc:
        if not storage.is_remote(path):
            raise
        reason = os_reason(exc)
        if "not implemented" in reason:
            reason += (
                "; TensorFlow has no file system for it here (a plug-in such as tensorflow-io)"
            )
        raise UsageError(f"{arg} {str(path)!r}: cannot use it ({reason})") from None


def default_path(name: str) -> Path:
    return Path("runs") / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


# --------------------------------------------------------------------------- the lock


def _holder_text(info: dict[str, Any]) -> str:
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


def _held_error(arg: str, run_dir: Path, info: dict[str, Any]) -> UsageError:
    return UsageError(
        f"{arg} {str(run_dir)!r}: the run is being written by another dtcli process "
        f"({_holder_text(info)}); wait for it or choose another folder"
    )


class Lock:
    """An exclusive flock on RUN_DIR/.dtcli.lock naming its holder (pid, host, since when).

    flock is released by the kernel when its holder dies, so a lock left by a killed process is
    free to take; the file then still names the dead holder, and taking it over says so.
    """

    def __init__(self, run_dir: Path, arg: str, warn: Warn = _stderr):
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None
        self.created = False
        while True:
            existed = self.path.exists()
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            except OSError as exc:
                raise UsageError(
                    f"{arg} {str(run_dir)!r}: cannot write there ({os_reason(exc)})"
                ) from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                os.close(fd)
                if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                    raise _held_error(arg, run_dir, _read_lock(self.path)) from None
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
                f"warning: {run_dir}: took over the lock of {_holder_text(previous)}, "
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


# --------------------------------------------------------------------------- runs


@dataclass
class RunDir:
    """One run directory. `created`: this process made the folder (and removes it again if the
    run fails before it has a complete checkpoint)."""

    path: Path
    created: bool = False
    lock: Lock | None = None
    # Parent folders this process made for the run (removed with it, if still empty).
    made_parents: list[Path] = field(default_factory=list)

    @property
    def recipe(self) -> Path:
        return self.path / RECIPE

    @property
    def metrics(self) -> Path:
        return self.path / METRICS

    @property
    def steps(self) -> Path:
        return self.path / STEPS

    @property
    def resumes(self) -> Path:
        return self.path / RESUMES

    @property
    def train_log(self) -> Path:
        return self.path / TRAIN_LOG

    @property
    def tensorboard(self) -> Path:
        return self.path / TENSORBOARD

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def plots(self) -> Path:
        return self.path / PLOTS

    def complete_checkpoints(self) -> list[Path]:
        return complete_checkpoints(self.path)

    def latest_checkpoint(self, arg: str, wanted: str, warn: Warn = _stderr) -> Path:
        return require_intact(self.path, arg, wanted, warn)

    def write_text(self, path: Path, text: str) -> None:
        """Write a whole file so that readers see the old or the new content, never a part."""
        storage.write_atomic(path, text)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    def abandon(self) -> None:
        """The run failed. Remove it if it holds nothing resumable and this process made it;
        otherwise leave it as it is (releasing the lock)."""
        resumable = bool(self.complete_checkpoints())
        self.release()
        if self.created and not resumable:
            storage.rmtree(self.path, ignore_errors=True)
            for parent in self.made_parents:  # innermost first
                with contextlib.suppress(OSError):
                    parent.rmdir()  # only if empty


def _blocking_parent(path: Path) -> Path | None:
    """The first ancestor of `path` that exists but is not a folder."""
    for parent in reversed(path.parents):
        if parent.exists() and not parent.is_dir():
            return parent
    return None


def check_new(path: Path, arg: str = "--out") -> None:
    """A new run may be written at `path` (checked without creating anything)."""
    with _reachable(arg, path):
        path = storage.as_path(path)
        if isinstance(path, storage.RemotePath):
            if not path.name or ".." in str(path).split("/"):
                raise UsageError(
                    f"{arg} {str(path)!r}: expected a folder under the file system's root, "
                    "without '..' (like gs://bucket/runs/name)"
                )
        if path.is_dir():
            info = held_by(path)
            if info is not None:
                raise _held_error(arg, path, info)
            if _holds_more_than_a_start(path):
                raise _not_empty(arg, path)
            return
        if path.exists() or path.is_symlink():
            raise UsageError(f"{arg} {str(path)!r}: is a file, expected a folder for the run")
        blocking = _blocking_parent(path)
        if blocking is not None:
            raise UsageError(f"{arg} {str(path)!r}: {str(blocking)!r} is a file, not a folder")


def create(path: Path, arg: str = "--out", warn: Warn = _stderr) -> RunDir:
    """Make (or take, when empty) the folder of a new run and lock it (a local one: remote run
    directories have no lock)."""
    path = storage.as_path(path)
    check_new(path, arg)
    created = False
    made = [p for p in path.parents if not p.exists()]  # innermost first
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir()
        created = True
    except FileExistsError:
        pass  # an empty folder given as --out (or one that appeared just now: the lock decides)
    except OSError as exc:
        for parent in made:
            with contextlib.suppress(OSError):
                parent.rmdir()
        raise UsageError(f"{arg} {str(path)!r}: cannot create it ({os_reason(exc)})") from None
    run = RunDir(path, created=created, made_parents=made)
    # If this fails, another writer took the folder between our mkdir and our lock: it is
    # theirs now, and nothing of it is ours to remove.
    if storage.is_remote(path):
        _clear_start(path, warn)
        return run
    run.lock = Lock(path, arg, warn)
    try:
        check_new_locked(path, arg)
        _clear_start(path, warn)
    except BaseException:
        run.release()
        raise
    return run


# What a run writes before its first checkpoint (no run directory holds anything else of ours).
_RUN_FILES = (LOCK, TRAIN_LOG, RECIPE, METRICS, STEPS, RESUMES, TENSORBOARD, CHECKPOINTS, PLOTS)


def _not_empty(arg: str, path: Path) -> UsageError:
    return UsageError(
        f"{arg} {str(path)!r}: the folder exists and is not empty "
        "(use --resume to continue a run, or choose another folder)"
    )


def _holds_more_than_a_start(path: Path) -> bool:
    """Whether the folder holds more than a new run leaves that was killed (SIGKILL, or its
    grace period ran out) before its first complete checkpoint: only dtcli's own files and no
    checkpoint. Such a run could never be resumed (a run that fails on its own is removed), so
    `--out` takes it anew, as a requeued job needs."""
    entries = list(path.iterdir())
    if any(p.name not in _RUN_FILES for p in entries):
        return True
    return bool(complete_checkpoints(path))


def _clear_start(path: Path, warn: Warn) -> None:
    """Remove what a killed run without a checkpoint left (its log is kept and continued)."""
    left = [p for p in path.iterdir() if p.name not in (LOCK, TRAIN_LOG)]
    if not left:
        return
    warn(
        f"warning: {path}: an earlier run here stopped before its first checkpoint; "
        f"starting over (removed its {', '.join(sorted(p.name for p in left))})"
    )
    for p in left:
        if p.is_dir():
            storage.rmtree(p)
        else:
            p.unlink()


def check_new_locked(path: Path, arg: str) -> None:
    """Under the lock: the folder must still hold nothing but it (another writer may have
    begun and finished between the first check and the lock)."""
    if _holds_more_than_a_start(path):
        raise _not_empty(arg, path)


def check_resumable(path: Path, arg: str = "--resume", check_lock: bool = True) -> None:
    with _reachable(arg, path):
        path = storage.as_path(path)
        if not path.is_dir():
            what = "no such folder" if not path.exists() else "not a folder"
            raise UsageError(f"{arg} {str(path)!r}: {what}")
        # First: a new run holds its folder before it writes recipe.yaml.
        info = held_by(path) if check_lock else None
        if info is not None:
            raise _held_error(arg, path, info)
        if not (path / RECIPE).is_file():
            raise UsageError(f"{arg} {str(path)!r}: not a run directory (no {RECIPE})")


def open_for_resume(path: Path, arg: str = "--resume", warn: Warn = _stderr) -> RunDir:
    """Lock an existing run to continue it."""
    path = storage.as_path(path)
    check_resumable(path, arg)
    lock = None if storage.is_remote(path) else Lock(path, arg, warn)
    return RunDir(path, created=False, lock=lock)


def read_recipe_text(path: Path, arg: str = "--resume", check_lock: bool = True) -> Path:
    """The run's recipe file, checked to be there (what `--resume` loads). `check_lock=False`:
    for clients 1.. of a multi-client run, whose client 0 holds the lock."""
    check_resumable(path, arg, check_lock)
    return storage.as_path(path) / RECIPE


def unlocked(path: Path) -> RunDir:
    """A run written by several clients: only client 0 holds the lock and creates the folder."""
    return RunDir(storage.as_path(path))


# --------------------------------------------------------------------------- checkpoints


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders of a run that were completed (renamed into place), oldest first."""
    return ckpt_lib.complete(storage.as_path(run_dir) / CHECKPOINTS)


def _scan(run_dir: Path) -> tuple[Path | None, list[ckpt_lib.DamagedCheckpoint]]:
    """The newest checkpoint that verifies (or None) and the damaged ones newer than it.

    A run that is training removes its oldest checkpoints (train.keep) as it saves, perhaps
    the one being verified: a checkpoint that fails and is gone a moment later was removed,
    not damaged, and the scan starts again from the newest."""
    for _ in range(5):
        damaged: list[ckpt_lib.DamagedCheckpoint] = []
        for checkpoint in reversed(complete_checkpoints(run_dir)):
            try:
                ckpt_lib.verify(checkpoint)
            except (ckpt_lib.DamagedCheckpoint, OSError) as exc:
                if _removed(checkpoint):
                    break
                if not isinstance(exc, ckpt_lib.DamagedCheckpoint):
                    raise
                damaged.append(exc)
                continue
            return checkpoint, damaged
        else:
            return None, damaged
    return None, damaged


def _removed(checkpoint: Path, wait: float = 0.2) -> bool:
    """Whether a checkpoint that failed to verify is being removed (it is gone shortly)."""
    deadline = time.monotonic() + wait
    while storage.as_path(checkpoint).exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def _warn_damaged(damaged: list[ckpt_lib.DamagedCheckpoint], using: Path, warn: Warn) -> None:
    if len(damaged) == 1:
        warn(f"warning: {damaged[0]}; using the one before it, {using.name}")
    elif damaged:
        warn(
            f"warning: {damaged[0]}; {len(damaged) - 1} older one(s) are damaged too; "
            f"using {using.name}"
        )


def latest_intact(run_dir: Path, warn: Warn = _stderr) -> Path | None:
    """The newest checkpoint that verifies, or None. When it is not the newest, one warning
    names the damaged newer ones."""
    checkpoint, damaged = _scan(run_dir)
    if checkpoint is not None:
        _warn_damaged(damaged, checkpoint, warn)
    return checkpoint


def require_intact(run_dir: Path, arg: str, wanted: str, warn: Warn = _stderr) -> Path:
    """`latest_intact`, or one error saying why there is none: no checkpoint was completed, or
    every one is damaged (naming what is wrong with the newest)."""
    checkpoint, damaged = _scan(run_dir)
    if checkpoint is not None:
        _warn_damaged(damaged, checkpoint, warn)
        return checkpoint
    where = f"{arg} {str(run_dir)!r}"
    if not damaged:
        raise UsageError(f"{where}: no complete checkpoint {wanted}".rstrip())
    raise UsageError(
        f"{where}: all {len(damaged)} checkpoints are damaged (the newest: {damaged[0].reason})"
    )


def find_checkpoint(path: Path, arg: str = "CHECKPOINT", warn: Warn = _stderr) -> Path:
    """A checkpoint folder (verified), or the newest intact checkpoint of a run directory."""
    with _reachable(arg, path):
        path = storage.as_path(path)
        if not path.exists():
            raise UsageError(f"{arg} {str(path)!r}: no such file or folder")
        if ckpt_lib.looks_like_checkpoint(path):
            ckpt_lib.verify(path)
            return path
        if not path.is_dir():
            raise UsageError(f"{arg} {str(path)!r}: neither a checkpoint nor a run directory")
        if not complete_checkpoints(path):
            raise UsageError(
                f"{arg} {str(path)!r}: neither a checkpoint nor a run directory "
                "with a complete checkpoint"
            )
        return require_intact(path, arg, "", warn)


def run_of_checkpoint(checkpoint: Path) -> Path:
    return storage.as_path(checkpoint).parent.parent


def metrics_file(run_dir: Path, arg: str = "RUN_DIR") -> Path:
    """The epoch metrics of a run, for reading (plot)."""
    with _reachable(arg, run_dir):
        run_dir = storage.as_path(run_dir)
        if not run_dir.is_dir():
            what = "not a folder" if run_dir.exists() else "no such folder"
            raise UsageError(f"{arg} {str(run_dir)!r}: {what}")
        path = run_dir / METRICS
        if not path.is_file():
            raise UsageError(
                f"{arg} {str(run_dir)!r}: no {METRICS} (has this run finished an epoch?)"
            )
        return path


def steps_file(run_dir: Path) -> Path:
    return storage.as_path(run_dir) / STEPS


def check_output_folder(path: Path, arg: str = "--out", refuse_held: bool = True) -> None:
    """An output folder for files that are not a run (export, plot): usable or one line why.

    `refuse_held`: not inside a run another process is writing (plot may draw into a running
    run's plots/, since it replaces each PNG whole)."""
    path = storage.as_path(path)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{arg} {str(path)!r}: is a file, expected a folder")
    blocking = _blocking_parent(path)
    if blocking is not None:
        raise UsageError(f"{arg} {str(path)!r}: {str(blocking)!r} is a file, not a folder")
    if not refuse_held:
        return
    for parent in [path, *path.parents]:
        if (parent / LOCK).exists():
            info = held_by(parent)
            if info is not None and parent != path:
                raise _held_error(arg, parent, info)
            break
