"""A sweep's parent MLflow run, when the trials' recipe lists an mlflow tracker: created once
(its id in sweep.json, so a re-run reopens it), passed to each trial in PARENT_ENV so that the
run the trial creates is nested under it, and ended with the sweep's outcome. A store that
fails is one short warning: the trials run on, each trying the store itself, unnested."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from dtcli.errors import one_line
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
    except Exception as exc:  # a store down or refusing: the sweep goes on without nesting
        warn(
            f"warning: sweep: no parent MLflow run ({short_cause(exc)}); each trial tries the "
            "store itself, unnested"
        )
        return None


# The reason a connection failed, inside an HTTP client's retry message.
_ERRNO = re.compile(r"\[Errno -?\d+\] ([^'\")\]]+)")
_CAUSE_LIMIT = 100


def short_cause(exc: BaseException) -> str:
    """Why the store failed, short: a connection's `[Errno N] reason` where the message holds
    one (an HTTP client's retry message runs to hundreds of characters), else the exception's
    first line cut to _CAUSE_LIMIT characters."""
    found = _ERRNO.search(str(exc))
    if found:
        return f"{type(exc).__name__}: {found.group(1).strip()}"
    text = one_line(exc, named=True)
    return text if len(text) <= _CAUSE_LIMIT else text[: _CAUSE_LIMIT - 3] + "..."


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
    except Exception as exc:
        warn(f"warning: sweep: the parent MLflow run not ended ({one_line(exc, named=True)})")
