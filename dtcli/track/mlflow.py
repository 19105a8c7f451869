"""track: mlflow: a run's parameters, metrics, tags and artifacts in an MLflow tracking store,
and a sweep's parent run (`start_parent`, `end_parent`). mlflow (an optional extra) is imported
inside the functions only.

MLflow cannot delete a metric point, so the run's metrics reach it only once the checkpoint
covering them is committed (track.fanout): after a crash and a resume it holds each step once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dtcli.errors import one_line
from dtcli.recipe import MlflowConfig
from dtcli.track.base import Batch, RunInfo, cause, root_cause

# A sweep's trial process is started with its parent run's id here: the MLflow run the trial
# creates (not one it resumes) is nested under it (the mlflow.parentRunId tag).
PARENT_ENV = "DTCLI_MLFLOW_PARENT_RUN_ID"
PARENT_TAG = "mlflow.parentRunId"
# A tracking server that does not answer fails the sink fast (MLflow's own defaults: 120 s and
# 7 retries with backoff, minutes per call); a user's own setting is kept.
HTTP_ENV = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "5", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0"}
# MLflow's limits per log_batch call and on a parameter's value.
METRICS_PER_CALL = 1000
PARAMS_PER_CALL = 100
PARAM_LENGTH = 6000
# The run's final numbers (its last evaluation), as an artifact.
SUMMARY = "summary.json"


class StoreError(Exception):
    """A tracking store that failed a sweep's parent run: its cause in one short line
    (`failure`)."""


def start_parent(cfg: MlflowConfig, name: str, run_id: str | None = None) -> str:
    """A sweep's parent run in cfg's store and experiment, named `name` (`run_id`: reopen that
    one); its id, for the trials' PARENT_ENV. Fails as the sink does (HTTP_ENV: seconds, no
    retries), raising StoreError."""
    import dtcli

    with _failing_briefly(cfg):
        client = _client(cfg)
        if run_id is not None:
            client.update_run(run_id, status="RUNNING")
            return run_id
        tags = {"dtcli.version": dtcli.__version__, "dtcli.sweep": "true"}
        experiment = _experiment_id(client, cfg)
        return client.create_run(experiment, run_name=name, tags=tags).info.run_id


def end_parent(cfg: MlflowConfig, run_id: str, status: str) -> None:
    """End a sweep's parent run: FINISHED, FAILED or KILLED (raises StoreError)."""
    with _failing_briefly(cfg):
        _client(cfg).set_terminated(run_id, status)


def failure(exc: BaseException, uri: str | None) -> str:
    """What went wrong with the store at `uri`, in a short line: a server not reached is
    "cannot reach URI (connection refused)", not MLflow's page of urllib3's retries."""
    root = root_cause(exc)
    if type(exc).__name__ == "UnsupportedModelRegistryStoreURIException":
        # MLflow's tracking reuses its registry's exception for a scheme it cannot serve.
        return f"MLflow has no tracking store for {uri}"
    if root is not exc and isinstance(root, OSError) and str(uri).startswith("http"):
        return f"cannot reach {uri} ({cause(exc)})"
    return cause(exc) if root is not exc else one_line(exc, named=True)


def metric_name(name: str) -> str:
    """A name as MLflow accepts it (letters, digits, _ - . / : and spaces): any other character
    (a layout rule's regex, an lm-eval metric's comma) becomes '_'."""
    return re.sub(r"[^/\w.\- :]", "_", name)


class MlflowSink:
    """One dtcli run as one MLflow run (a resume: the same one)."""

    name = "mlflow"

    def __init__(self, cfg: MlflowConfig):
        self.cfg = cfg
        self.where = f"{cfg.tracking_uri} {cfg.experiment}"
        self.client: Any = None
        self.run_id: str | None = None

    def start(self, run: RunInfo) -> str:
        self.client = _client(self.cfg)
        if run.run_id is not None:
            self.run_id = run.run_id
            self.client.update_run(run.run_id, status="RUNNING")
            # A changed parameter is refused by MLflow: a resume's changes are tags.
            changed = {f"dtcli.resumed.{k}": _text(v[1]) for k, v in run.changes.items()}
            self._log(tags=changed)
            return run.run_id
        tags = {**run.tags, "dtcli.run_dir": str(run.run_dir)}
        parent = os.environ.get(PARENT_ENV)
        if parent:
            tags[PARENT_TAG] = parent
        created = self.client.create_run(
            _experiment_id(self.client, self.cfg), run_name=run.name, tags=tags
        )
        self.run_id = created.info.run_id
        self._log(params={metric_name(k): _text(v) for k, v in run.params.items()})
        return self.run_id

    def log(self, batch: Batch) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [
            Metric(metric_name(k), float(v), now, step)  # float64: the value metrics.jsonl holds
            for step, values in batch
            for k, v in values.items()
        ]
        for i in range(0, len(metrics), METRICS_PER_CALL):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + METRICS_PER_CALL])

    def artifacts(self, files: list[Path], summary: dict[str, Any]) -> None:
        if summary:
            self.client.log_dict(self.run_id, summary, SUMMARY)
        for path in files:
            if path.is_dir():
                self.client.log_artifacts(self.run_id, str(path), artifact_path=path.name)
            elif path.is_file():
                self.client.log_artifact(self.run_id, str(path))

    def finish(self, status: str) -> None:
        self.client.set_terminated(self.run_id, status)

    def failure(self, exc: BaseException) -> str:
        return failure(exc, self.cfg.tracking_uri)

    def _log(self, params: dict[str, str] | None = None, tags: dict[str, str] | None = None):
        from mlflow.entities import Param, RunTag

        items = [Param(k, v) for k, v in (params or {}).items()]
        items += [RunTag(k, v) for k, v in (tags or {}).items()]
        for i in range(0, len(items), PARAMS_PER_CALL):
            chunk = items[i : i + PARAMS_PER_CALL]
            self.client.log_batch(
                self.run_id,
                params=[p for p in chunk if isinstance(p, Param)],
                tags=[t for t in chunk if isinstance(t, RunTag)],
            )


def _text(value: Any) -> str:
    return str(value)[:PARAM_LENGTH]


def _client(cfg: MlflowConfig) -> Any:
    """A client of cfg's store: quick to fail on a server that does not answer, quiet (MLflow's
    INFO lines, alembic's migrations), the root logger as dtcli left it (mlflow #19038)."""
    for key, value in HTTP_ENV.items():
        os.environ.setdefault(key, value)
    with _root_logger_kept():
        from mlflow import MlflowClient

        if "MLFLOW_LOGGING_LEVEL" not in os.environ:
            logging.getLogger("mlflow").setLevel(logging.WARNING)
        client = MlflowClient(tracking_uri=cfg.tracking_uri)
        client.search_experiments(max_results=1)  # the store is set up (and reached) here
    return client


def _experiment_id(client: Any, cfg: MlflowConfig) -> str:
    """cfg's experiment, created (with cfg.artifact_location) where the store lacks it."""
    from mlflow.exceptions import MlflowException

    found = client.get_experiment_by_name(cfg.experiment)
    if found is None:
        try:
            return client.create_experiment(cfg.experiment, artifact_location=cfg.artifact_location)
        except MlflowException:  # another run (a sweep's trial) created it meanwhile
            found = client.get_experiment_by_name(cfg.experiment)
            if found is None:
                raise
    if found.lifecycle_stage == "deleted":
        client.restore_experiment(found.experiment_id)
    return found.experiment_id


@contextlib.contextmanager
def _failing_briefly(cfg: MlflowConfig) -> Iterator[None]:
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - whatever the store raised, said briefly
        raise StoreError(failure(exc, cfg.tracking_uri)) from exc


@contextlib.contextmanager
def _root_logger_kept() -> Iterator[None]:
    """The root logger's handlers and level, and which loggers are disabled, as before: a
    store's set-up may configure logging for the whole process (alembic's fileConfig)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    loggers = logging.Logger.manager.loggerDict
    disabled = {n: lg.disabled for n, lg in list(loggers.items()) if isinstance(lg, logging.Logger)}
    try:
        yield
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, was in disabled.items():
            logger = loggers.get(name)
            if isinstance(logger, logging.Logger):
                logger.disabled = was
