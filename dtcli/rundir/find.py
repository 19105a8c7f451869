"""Finding a run's checkpoints: the complete ones, the newest that verifies (a damaged newer one
named in a warning), or one error saying why there is none."""

from __future__ import annotations

from pathlib import Path

from dtcli import checkpoint as ckpt_lib
from dtcli import storage
from dtcli.errors import UsageError
from dtcli.rundir.files import CHECKPOINTS, Warn, reachable, stderr

# How often a read that a run in training outpaced (it removed the checkpoint) is tried anew.
ATTEMPTS = 20


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


def _scan(run_dir: Path) -> tuple[Path | None, list[ckpt_lib.DamagedCheckpoint]]:
    """The newest checkpoint that verifies (or None) and the damaged ones newer than it.

    A run that is training removes its oldest checkpoints (train.keep) as it saves, perhaps
    the one being verified: each is verified held open (`checkpoint.held`), and one that is
    removed before it could be held was removed, not damaged: the scan starts again from the
    newest."""
    for _ in range(ATTEMPTS):
        damaged: list[ckpt_lib.DamagedCheckpoint] = []
        for checkpoint in reversed(complete_checkpoints(run_dir)):
            try:
                with ckpt_lib.held(checkpoint) as held:
                    ckpt_lib.verify(held)
            except (ckpt_lib.DamagedCheckpoint, OSError) as exc:
                if ckpt_lib.removed(checkpoint):
                    break
                if not isinstance(exc, ckpt_lib.DamagedCheckpoint):
                    raise
                damaged.append(exc)
                continue
            return checkpoint, damaged
        else:
            return None, damaged
    return None, damaged


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
    checkpoint, damaged = _scan(run_dir)
    if checkpoint is not None:
        _warn_damaged(damaged, checkpoint, warn)
    return checkpoint


def require_intact(run_dir: Path, arg: str, wanted: str, warn: Warn = stderr) -> Path:
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


def find_checkpoint(path: Path, arg: str = "CHECKPOINT", warn: Warn = stderr) -> Path:
    """A checkpoint folder (verified), or the newest intact checkpoint of a run directory."""
    with reachable(arg, path):
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
