"""Finding a run's checkpoints: the complete ones, the newest that verifies (a damaged newer one
named in a warning), or one error saying why there is none."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from dtcli import checkpoint as ckpt_lib
from dtcli import storage
from dtcli.errors import UsageError
from dtcli.rundir.files import CHECKPOINTS, Warn, reachable, stderr

# How often a read that a run in training outpaced (it removed the checkpoint) is tried anew.
ATTEMPTS = 20

T = TypeVar("T")


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Checkpoint folders of a run that were completed (renamed into place), oldest first.

    A listing races a run that is training: the checkpoints it lists may be removed before they
    are looked at, and the one saved meanwhile missed; such a listing is taken again."""
    folder = storage.as_path(run_dir) / CHECKPOINTS
    for _ in range(ATTEMPTS):
        found = ckpt_lib.complete(folder)
        if found or not folder.is_dir() or not any(folder.glob("ckpt-*")):
            return found
    return found


def _scan(
    run_dir: Path, keep: contextlib.ExitStack | None = None
) -> tuple[Path | None, list[ckpt_lib.DamagedCheckpoint], Path | None]:
    """The newest checkpoint that verifies (or None), the damaged ones newer than it, and the
    private folder it was verified through (`checkpoint.held`), held on `keep` when one is given.

    A run that is training removes its oldest checkpoints (train.keep) as it saves, perhaps
    the one being verified: each is verified held open, and one that is removed before it could
    be held was removed, not damaged: the scan starts again from the newest."""
    for _ in range(ATTEMPTS):
        damaged: list[ckpt_lib.DamagedCheckpoint] = []
        for checkpoint in reversed(complete_checkpoints(run_dir)):
            hold = contextlib.ExitStack()
            try:
                held = hold.enter_context(ckpt_lib.held(checkpoint))
                ckpt_lib.verify(held)
            except (ckpt_lib.DamagedCheckpoint, OSError) as exc:
                hold.close()
                if ckpt_lib.removed(checkpoint):
                    break
                if not isinstance(exc, ckpt_lib.DamagedCheckpoint):
                    raise
                damaged.append(exc)
                continue
            if keep is None:
                hold.close()
            else:
                keep.enter_context(hold)
            return checkpoint, damaged, held
        else:
            return None, damaged, None
    return None, damaged, None


def _warn_damaged(damaged: list[ckpt_lib.DamagedCheckpoint], using: Path, warn: Warn) -> None:
    if len(damaged) == 1:
        warn(f"warning: {damaged[0]}; using the one before it, {using.name}")
    elif damaged:
        warn(
            f"warning: {damaged[0]}; {len(damaged) - 1} older one(s) are damaged too; "
            f"using {using.name}"
        )


def latest_intact(run_dir: Path, warn: Warn = stderr) -> Path | None:
    """The newest checkpoint that verifies, or None. When it is not the newest, one warning
    names the damaged newer ones."""
    checkpoint, damaged, _ = _scan(run_dir)
    if checkpoint is not None:
        _warn_damaged(damaged, checkpoint, warn)
    return checkpoint


def require_intact(run_dir: Path, arg: str, wanted: str, warn: Warn = stderr) -> Path:
    """`latest_intact`, or one error saying why there is none: no checkpoint was completed, or
    every one is damaged (naming what is wrong with the newest)."""
    return _require_intact(run_dir, arg, wanted, warn)[0]


def _require_intact(
    run_dir: Path, arg: str, wanted: str, warn: Warn, keep: contextlib.ExitStack | None = None
) -> tuple[Path, Path]:
    """`require_intact`'s checkpoint and the folder it was verified through (held on `keep`)."""
    checkpoint, damaged, held = _scan(run_dir, keep)
    if checkpoint is not None:
        _warn_damaged(damaged, checkpoint, warn)
        return checkpoint, held
    where = f"{arg} {str(run_dir)!r}"
    if not damaged:
        raise UsageError(f"{where}: no complete checkpoint {wanted}".rstrip())
    raise UsageError(
        f"{where}: all {len(damaged)} checkpoints are damaged (the newest: {damaged[0].reason})"
    )


def find_checkpoint(path: Path, arg: str = "CHECKPOINT", warn: Warn = stderr) -> Path:
    """A checkpoint folder (verified), or the newest intact checkpoint of a run directory."""
    with contextlib.ExitStack() as keep:
        return _find_held(path, arg, warn, keep)[0]


def read_checkpoint(
    path: Path, read: Callable[[Path, Path], T], arg: str = "CHECKPOINT", warn: Warn = stderr
) -> T:
    """`read(checkpoint, held)` of find_checkpoint's checkpoint, its files held open
    (`checkpoint.held`; read them through `held`) from its verification to the read's end.

    A run in training removes its older checkpoints as it saves (train.keep), maybe this one:
    held, it stays whole, so a read that fails failed on its own and is raised as it is. Where
    files cannot be held (remote storage) and it goes during the read, a run directory's newest
    is found again, up to ATTEMPTS times (never after the user's own error); a checkpoint folder
    given that goes is one error."""
    for _ in range(ATTEMPTS):
        with contextlib.ExitStack() as keep:
            checkpoint, held = _find_held(path, arg, warn, keep)
            given = checkpoint == storage.as_path(path)  # a checkpoint folder, not a run
            try:
                return read(checkpoint, held)
            except Exception as exc:  # TensorFlow's NotFoundError too: whether it is gone matters
                if held != checkpoint:
                    raise  # its files held, removing it took nothing: the read's own failure
                if isinstance(exc, UsageError) and not isinstance(exc, ckpt_lib.DamagedCheckpoint):
                    raise  # the user's input (a mesh that does not fit, say), whatever the run did
                if not ckpt_lib.removed(checkpoint):
                    raise  # really damaged, or another model's
                if given:
                    raise _removed_while_read(arg, checkpoint) from None
    raise UsageError(
        f"{arg} {str(path)!r}: the run removed {ATTEMPTS} checkpoints in a row before one could "
        "be read (it saves faster than they can be read, keeping only train.keep); evaluate a "
        "copy of one, or give it a larger train.keep"
    )


def _removed_while_read(arg: str, checkpoint: Path) -> UsageError:
    return UsageError(
        f"{arg} {str(checkpoint)!r}: removed while it was read (a run in training keeps only its "
        "newest train.keep checkpoints); give the run directory to read its newest"
    )


def _find_held(path: Path, arg: str, warn: Warn, keep: contextlib.ExitStack) -> tuple[Path, Path]:
    """find_checkpoint's checkpoint and the private folder it was verified through, held open
    on `keep`."""
    with reachable(arg, path):
        path = storage.as_path(path)
        if not path.exists():
            raise UsageError(f"{arg} {str(path)!r}: no such file or folder")
        if ckpt_lib.looks_like_checkpoint(path):
            try:
                held = keep.enter_context(ckpt_lib.held(path))
                ckpt_lib.verify(held)
            except (ckpt_lib.DamagedCheckpoint, OSError):
                if ckpt_lib.removed(path):
                    raise _removed_while_read(arg, path) from None
                raise
            return path, held
        if not path.is_dir():
            raise UsageError(f"{arg} {str(path)!r}: neither a checkpoint nor a run directory")
        if not complete_checkpoints(path):
            raise UsageError(
                f"{arg} {str(path)!r}: neither a checkpoint nor a run directory "
                "with a complete checkpoint"
            )
        return _require_intact(path, arg, "", warn, keep)
