"""The sweep's folder: its default name, sweep.json (the command's trials, so that a re-run of
the same command finds its sweep and one of other trials is refused), summary.json, and each
trial's folder read back: done, resumable, or to start."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dtcli import checkpoint as ckpt_lib
from dtcli import rundir, storage
from dtcli.errors import UsageError
from dtcli.recipe import Recipe
from dtcli.stretches import finished
from dtcli.sweep.trials import Trial, digest

SWEEP = "sweep.json"
SUMMARY = "summary.json"
PLOTS = "plots"


def identity(recipe_path: str, sets: list[str], trials: list[Trial]) -> dict[str, Any]:
    """What makes two commands the same sweep: the recipe, the common --set and the trials."""
    return {
        "recipe": recipe_path,
        "sets": list(sets),
        "trials": [{"folder": t.folder, "overrides": t.values, "sets": t.sets} for t in trials],
    }


def default_out(name: str, ident: dict[str, Any]) -> Path:
    """runs/sweep-NAME-DIGEST: the same command finds the same folder."""
    return Path("runs") / f"sweep-{name}-{digest(ident)}"


def read_sweep(out: Path) -> dict[str, Any] | None:
    path = out / SWEEP
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"--out {str(out)!r}: its {SWEEP} cannot be read ({exc})") from None


def check_out(out: Path, ident: dict[str, Any]) -> dict[str, Any] | None:
    """--out is a new folder, or this very sweep's (sweep.json as written by the same command).
    Returns its sweep.json, if any."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {str(out)!r}: is a file, expected a folder for the sweep")
    recorded = read_sweep(out)
    if recorded is None:
        if out.is_dir() and any(out.iterdir()):
            raise UsageError(
                f"--out {str(out)!r}: the folder exists, is not empty and holds no {SWEEP}; "
                "choose another folder"
            )
        return None
    if {k: recorded.get(k) for k in ident} != ident:
        raise UsageError(
            f"--out {str(out)!r}: holds another sweep (its {SWEEP} names another recipe, --set or "
            "trials); to start a new sweep name a new --out, or leave --out out (the default "
            "folder is this command's own)"
        )
    return recorded


def write_sweep(out: Path, ident: dict[str, Any], extra: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(out / SWEEP, json.dumps({**ident, **extra}, indent=2) + "\n")


def write_summary(out: Path, summary: dict[str, Any]) -> None:
    """summary.json, whole or not at all (a reader never sees half of it)."""
    storage.write_atomic(out / SUMMARY, json.dumps(summary, indent=2) + "\n")


def trial_state(folder: Path, recipe: Recipe) -> str:
    """`new` (nothing there, or only what a start without a checkpoint left: `train --out` takes
    it anew), `done` (its newest checkpoint ends the run) or `resume`."""
    if not folder.is_dir():
        return "new"
    checkpoints = rundir.complete_checkpoints(folder)
    if not checkpoints:
        return "new"
    try:
        meta = ckpt_lib.read_meta(checkpoints[-1])
    except ckpt_lib.DamagedCheckpoint:
        return "resume"  # train's resume falls back to the newest intact one, and says so
    return (
        "done" if finished(recipe.train, meta["step"], meta["epoch_state"]["epoch"]) else "resume"
    )


def metric_records(folder: Path) -> list[dict[str, Any]]:
    from dtcli import metrics

    path = folder / rundir.METRICS
    if not path.is_file():
        return []
    return metrics.read(path, warn=lambda _: None, required=("step",))
