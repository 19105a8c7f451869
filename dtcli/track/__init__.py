"""Experiment trackers (the recipe's `track`): one writer for the training loop that writes
metrics.jsonl and steps.jsonl and tells every tracker (docs/tracking.md).

base        the Sink interface, what a sink is told of the run, a remote sink's thread
fanout      the writer: the JSON lines, then the trackers (remote ones at each checkpoint)
tensorboard, mlflow, wandb
            the sinks; mlflow and wandb are optional extras, imported where a recipe names them
"""

from __future__ import annotations

import importlib.util
import sys
from typing import Any

from dtcli import metrics as metrics_lib
from dtcli import recipe as recipe_lib
from dtcli import rundir
from dtcli.errors import UsageError
from dtcli.recipe import Recipe, TrackerConfig
from dtcli.track.base import FAILED, FINISHED, KILLED, Batch, RunInfo, Sink
from dtcli.track.fanout import TrackedWriter, epoch_values, read_ids, step_values

__all__ = [
    "FAILED",
    "FINISHED",
    "KILLED",
    "RunInfo",
    "TrackedWriter",
    "check_installed",
    "open_writer",
    "trackers_of",
]

# The trackers that need a package dtcli does not depend on: the pip extra that brings each.
EXTRAS = {"mlflow": "mlflow", "wandb": "wandb"}


def trackers_of(recipe: Recipe) -> tuple[TrackerConfig, ...]:
    """The recipe's trackers: `track` omitted means TensorBoard, as before trackers."""
    if recipe.track is None:
        return (TrackerConfig(tensorboard=recipe_lib.TensorboardConfig()),)
    return recipe.track


def check_installed(recipe: Recipe) -> None:
    """Each tracker the recipe names has its package, before anything is made: one line naming
    the recipe key and the extra to install. (Looked up, not imported: importing is the
    tracker's own thread's work.)"""
    for i, item in enumerate(recipe.track or ()):
        package = EXTRAS.get(item.name)
        if package is not None and not _installed(package):
            raise UsageError(
                f"recipe key 'track[{i}]': {item.name} is not installed; "
                f"pip install 'dtensor-cli[{package}]'"
            )


def open_writer(
    recipe: Recipe,
    folder: rundir.RunDir,
    tags: dict[str, str],
    resume_step: int | None,
    warn: Any,
) -> TrackedWriter:
    """The loop's writer for client 0, its trackers' runs opened (`resume_step`: a resume's
    checkpoint step: the tracker runs kept in the run directory go on)."""
    live: list[Sink] = []
    remote: list[Sink] = []
    for item in trackers_of(recipe):
        if item.name == "tensorboard":
            from dtcli.track.tensorboard import TensorboardSink

            live.append(TensorboardSink(folder.tensorboard))
        elif item.name == "mlflow":
            from dtcli.track.mlflow import MlflowSink

            remote.append(MlflowSink(item.mlflow))
        else:
            from dtcli.track.wandb import WandbSink

            remote.append(WandbSink(item.wandb))
    files = metrics_lib.MetricsWriter(folder.metrics, folder.steps)
    writer = TrackedWriter(files, live, remote, folder.tracker_ids, warn)
    params = metrics_lib.hparams_of(recipe_lib.to_mapping(recipe))
    resumed = resume_step is not None
    run = RunInfo(
        folder.path.resolve(),
        folder.path.resolve().name,
        params,
        tags,
        changes=_changes(folder, recipe) if resumed and remote else {},
    )
    kept = read_ids(folder.tracker_ids) if resumed else {}
    history = _history(folder, resume_step) if resumed and remote else []
    writer.start(run, kept, history)
    return writer


def _installed(package: str) -> bool:
    if package in sys.modules:
        return sys.modules[package] is not None  # None: an import that must fail
    return importlib.util.find_spec(package) is not None


def _changes(folder: rundir.RunDir, recipe: Recipe) -> dict[str, list[Any]]:
    """A resume's recipe keys that changed (recipe.yaml still holds the run's last recipe)."""
    try:
        before = recipe_lib.load(folder.recipe)
    except (OSError, UsageError):
        return {}
    return rundir.recipe_changes(before, recipe)


def _history(folder: rundir.RunDir, step: int) -> Batch:
    """The records up to a resume's checkpoint, for a tracker run this resume opens anew: steps
    before the evaluation of the same step."""
    out: list[tuple[int, int, dict[str, float]]] = []
    for order, path, values in ((1, folder.metrics, epoch_values), (0, folder.steps, step_values)):
        if path.is_file():
            for record in metrics_lib.read(path, warn=lambda _: None, required=("step",)):
                if isinstance(record["step"], int) and record["step"] <= step:
                    out.append((record["step"], order, values(record)))
    return [(s, v) for s, _, v in sorted(out, key=lambda r: r[:2])]
