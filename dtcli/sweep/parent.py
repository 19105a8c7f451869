"""A sweep's parent MLflow run, when the trials' recipe lists an mlflow tracker: created once
(its id in sweep.json, so a re-run reopens it), passed to each trial in PARENT_ENV so that the
run the trial creates is nested under it, and ended with the sweep's outcome. A store that
fails is one short warning: the trials run on, each trying the store itself, unnested."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dtcli.recipe import Recipe

# sweep.json's key for the parent run's id.
PARENT_KEY = "mlflow_parent_run_id"


def mlflow_config(recipe: Recipe) -> Any:
    """The recipe's mlflow tracker's options, or None."""
    return next((t.mlflow for t in recipe.track or () if t.mlflow is not None), None)


def start(cfg: Any, name: str, recorded: str | None, warn: Callable[[str], None]) -> str | None:
    """The parent run's id (`recorded`: reopened), or None after one warning."""
    from dtcli.track import mlflow as mlflow_sink

    try:
        return mlflow_sink.start_parent(cfg, name, recorded)
    except mlflow_sink.StoreError as exc:  # a store down or refusing: no nesting, the sweep goes on
        warn(
            f"warning: sweep: no parent MLflow run ({exc}); each trial tries the store itself, "
            "unnested"
        )
        return None


def env(run_id: str | None) -> dict[str, str]:
    from dtcli.track import mlflow as mlflow_sink

    return {} if run_id is None else {mlflow_sink.PARENT_ENV: run_id}


def end(cfg: Any, run_id: str | None, status: str, warn: Callable[[str], None]) -> None:
    """End the parent run: FINISHED, FAILED or KILLED."""
    if run_id is None:
        return
    from dtcli.track import mlflow as mlflow_sink

    try:
        mlflow_sink.end_parent(cfg, run_id, status)
    except mlflow_sink.StoreError as exc:
        warn(f"warning: sweep: the parent MLflow run not ended ({exc})")
