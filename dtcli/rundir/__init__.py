"""The run directory: its layout, its rules, and the lock that gives a run one writer.

This module alone knows what a run directory holds and where:

    recipe.yaml        the resolved recipe (rewritten on resume only once a step has trained)
    metrics.jsonl      one JSON object per epoch          (dtcli.metrics writes and reads it)
    steps.jsonl        the per-step training loss
    resumes.jsonl      one JSON object per resume: from which checkpoint, what the command changed
    train.log          every line `dtcli train` printed, each session headed by its command
    tensorboard/       event files
    tokenizer.json     a language model's tokenizer (written before the first step)
    checkpoints/       ckpt-STEP/ folders, each complete and self-verifying (dtcli.checkpoint),
                       and `checkpoint`, TensorFlow's pointer to the latest
    plots/             PNG curves
    lm_eval/           lm-evaluation-harness's results (dtcli eval --tasks), as lm-eval names them
    .dtcli.lock        held (flock) by the one process writing the run

Commands open a run through it: `create` for a new run, `open_for_resume` to continue one,
`read_checkpoint` to read one held open (eval, export, generate), `metrics_file` to plot one. A
run's folder is created and locked before any TensorFlow work, so a second writer fails at once;
a run that fails before it has a complete checkpoint is removed again, and a failed resume leaves
every file as it was.

The lock is dtcli.rundir.lock, finding checkpoints dtcli.rundir.find, the recipe of a resumed run
or a checkpoint dtcli.rundir.resume.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from dtcli import storage
from dtcli.errors import UsageError
from dtcli.rundir.base import resolve as resolve_from_run
from dtcli.rundir.files import (
    CHECKPOINTS,
    LOCK,
    METRICS,
    PLOTS,
    RECIPE,
    RESUMES,
    RUN_FILES,
    STEPS,
    TENSORBOARD,
    TOKENIZER,
    TRACKER_IDS,
    TRAIN_LOG,
    WANDB,
    Warn,
    check_plots,
    os_reason,
    reachable,
    stderr,
    tokenizer_file,
    written_whole,
)
from dtcli.rundir.find import (
    ATTEMPTS,
    complete_checkpoints,
    find_checkpoint,
    latest_intact,
    read_checkpoint,
    require_intact,
)
from dtcli.rundir.lock import Lock, held_by, held_error
from dtcli.rundir.resume import (
    FIXED_ON_RESUME,
    check_resumable,
    checkpoint_recipe,
    command_recipe,
    read_recipe_text,
    recipe_changes,
    resume_recipe,
)

__all__ = [
    "ATTEMPTS",
    "CHECKPOINTS",
    "FIXED_ON_RESUME",
    "LOCK",
    "METRICS",
    "PLOTS",
    "RECIPE",
    "RESUMES",
    "STEPS",
    "TENSORBOARD",
    "TOKENIZER",
    "TRACKER_IDS",
    "TRAIN_LOG",
    "WANDB",
    "Lock",
    "RunDir",
    "Warn",
    "check_new",
    "check_new_locked",
    "check_output_folder",
    "check_plots",
    "check_resumable",
    "checkpoint_recipe",
    "command_recipe",
    "complete_checkpoints",
    "create",
    "default_path",
    "find_checkpoint",
    "held_by",
    "latest_intact",
    "read_checkpoint",
    "metrics_file",
    "open_for_resume",
    "os_reason",
    "written_whole",
    "read_recipe_text",
    "recipe_changes",
    "require_intact",
    "resolve_from_run",
    "resume_recipe",
    "steps_file",
    "tokenizer_file",
    "unlocked",
]


def default_path(name: str) -> Path:
    return Path("runs") / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


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
    def tracker_ids(self) -> Path:
        return self.path / TRACKER_IDS

    @property
    def checkpoints(self) -> Path:
        return self.path / CHECKPOINTS

    @property
    def plots(self) -> Path:
        return self.path / PLOTS

    @property
    def tokenizer(self) -> Path:
        return self.path / TOKENIZER

    def keep_tokenizer(self, text: str) -> None:
        """Save the tokenizer a new run uses (a run's saved one is never replaced: a resume,
        eval and generate read it)."""
        if not self.tokenizer.exists():
            storage.write_atomic(self.tokenizer, text)

    def complete_checkpoints(self) -> list[Path]:
        return complete_checkpoints(self.path)

    def latest_checkpoint(self, arg: str, wanted: str, warn: Warn = stderr) -> Path:
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
    with reachable(arg, path):
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
                raise held_error(arg, path, info)
            if _holds_more_than_a_start(path):
                raise _not_empty(arg, path)
            return
        if path.is_symlink() and not path.exists():
            raise UsageError(
                f"{arg} {str(path)!r}: is a symbolic link to nothing; expected a folder for the run"
            )
        if path.exists():
            raise UsageError(f"{arg} {str(path)!r}: is a file, expected a folder for the run")
        blocking = _blocking_parent(path)
        if blocking is not None:
            raise UsageError(f"{arg} {str(path)!r}: {str(blocking)!r} is a file, not a folder")


def create(path: Path, arg: str = "--out", warn: Warn = stderr) -> RunDir:
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
    if any(p.name not in RUN_FILES for p in entries):
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


def open_for_resume(path: Path, arg: str = "--resume", warn: Warn = stderr) -> RunDir:
    """Lock an existing run to continue it."""
    path = storage.as_path(path)
    check_resumable(path, arg)
    lock = None if storage.is_remote(path) else Lock(path, arg, warn)
    return RunDir(path, created=False, lock=lock)


def unlocked(path: Path) -> RunDir:
    """A run written by several clients: only client 0 holds the lock and creates the folder."""
    return RunDir(storage.as_path(path))


def metrics_file(run_dir: Path, arg: str = "RUN_DIR") -> Path:
    """The epoch metrics of a run, for reading (plot)."""
    with reachable(arg, run_dir):
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
    with reachable(arg, path):
        _check_output_folder(path, arg, refuse_held)


def check_new_local_folder(out: Path, command: str, arg: str = "--out") -> Path:
    """A folder a command writes whole (export, import-hf): local, and new or empty."""
    if storage.is_remote(out):
        raise UsageError(f"{arg} {str(out)!r}: {command} writes a local folder; copy it after")
    out = storage.as_path(out)  # local: refused above otherwise
    check_output_folder(out, arg)
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"{arg} {str(out)!r}: the folder exists and is not empty")
    return out


def _check_output_folder(path: Path, arg: str, refuse_held: bool) -> None:
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
                raise held_error(arg, parent, info)
            break
