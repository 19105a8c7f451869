"""Where `dtcli eval --tasks` writes lm-eval's results files for a run, and the writing: into
RUN_DIR/lm_eval/, or, while another process holds the run's lock (a run in training, whose one
writer it is), into a folder beside the run directory, said so on stderr."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dtcli import storage
from dtcli.errors import UsageError
from dtcli.rundir.files import CHECKPOINTS, LM_EVAL, os_reason, reachable, run_of
from dtcli.rundir.lock import held_by, holder_text


def run_of_checkpoint(checkpoint: Any) -> Any | None:
    """The run directory a checkpoint folder belongs to (RUN_DIR/checkpoints/ckpt-STEP), or None
    for a checkpoint kept outside one."""
    checkpoint = storage.as_path(checkpoint)
    return run_of(checkpoint) if checkpoint.parent.name == CHECKPOINTS else None


def results_folder(run_dir: Any) -> tuple[Any, str | None]:
    """(the folder for a run's results, a note saying why it is not RUN_DIR/lm_eval or None)."""
    run_dir = storage.as_path(run_dir)
    info = held_by(run_dir)
    if info is None:
        return run_dir / LM_EVAL, None
    beside = run_dir.parent / f"{run_dir.name}-{LM_EVAL}"
    note = (
        f"note: {run_dir} is being written by another dtcli process ({holder_text(info)}), its "
        f"one writer: the results went beside it, into {beside}"
    )
    return beside, note


def write_files(folder: Any, files: Mapping[str, str], arg: str) -> list[Any]:
    """Each file written whole into `folder` (made if missing) -> their paths; an OSError is one
    line naming `arg`."""
    folder = storage.as_path(folder)
    written = []
    with reachable(arg, folder):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in files.items():
                storage.write_atomic(folder / name, text)
                written.append(folder / name)
        except OSError as exc:
            if storage.is_remote(folder):
                raise
            raise UsageError(
                f"{arg} {str(folder)!r}: cannot write the results there ({os_reason(exc)})"
            ) from None
    return written
