"""`track`: the experiment trackers a run writes to beside metrics.jsonl (docs/tracking.md).

Each item is a tracker's name or a one-key mapping {NAME: {options}}; both load as a
TrackerConfig with that one field set. Paths and defaults are filled in at load, so that the
resolved recipe in a run directory (and a resume started from another folder) names the same
store: a relative `sqlite:///` path or artifact folder is taken from the recipe file's folder.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from dtcli.errors import UsageError

# The sinks `track` may name; TensorBoard needs no extra package.
TRACKERS = ("tensorboard", "mlflow", "wandb")
SQLITE = "sqlite:///"
# A sqlite store's default file, and its experiments' artifacts beside it.
MLFLOW_DB = "mlflow.db"
MLFLOW_ARTIFACTS = "mlartifacts"
# The URI schemes MLflow's tracking serves (a database's may name a driver: postgresql+psycopg2).
STORE_SCHEMES = ("sqlite", "postgresql", "mysql", "mssql", "http", "https", "file", "databricks")


@dataclass(frozen=True)
class TensorboardConfig:
    """track: tensorboard: scalars and the recipe's hyperparameters in RUN_DIR/tensorboard."""


@dataclass(frozen=True)
class MlflowConfig:
    """track: mlflow (the mlflow extra)."""

    # null: MLFLOW_TRACKING_URI, else sqlite:///mlflow.db; a relative sqlite:/// path is taken
    # from the recipe file's folder.
    tracking_uri: str | None = None
    # null: the recipe's name.
    experiment: str | None = None
    # Where an experiment dtcli creates keeps its runs' artifacts (null: mlartifacts/ beside a
    # sqlite store's file, else the tracking server's default); relative: from the recipe's
    # folder.
    artifact_location: str | None = None


@dataclass(frozen=True)
class WandbConfig:
    """track: wandb (the wandb extra); its files go into RUN_DIR/wandb."""

    # null: the recipe's name.
    project: str | None = None
    entity: str | None = None
    # null: WANDB_MODE where it is offline or online, else online.
    mode: Literal["offline", "online"] | None = None


@dataclass(frozen=True)
class TrackerConfig:
    """One item of `track`: exactly one field is set."""

    tensorboard: TensorboardConfig | None = None
    mlflow: MlflowConfig | None = None
    wandb: WandbConfig | None = None

    @property
    def name(self) -> str:
        return next(n for n in TRACKERS if getattr(self, n) is not None)

    @property
    def options(self) -> Any:
        return getattr(self, self.name)


def normalized(raw: Any) -> Any:
    """`track`'s raw items as one-key mappings {NAME: {options}} (a name alone: its defaults;
    `track: mlflow` is `[mlflow]`); an item that names no tracker, or one named twice, refused
    naming track[i]; any other value refused with the list form to write."""
    if isinstance(raw, str) and raw in TRACKERS:
        raw = [raw]
    if not isinstance(raw, (list, tuple)):
        # A dotted --set (track.mlflow.experiment=foo) or an index (track[0]=mlflow) arrives as
        # a mapping: the list form is the only way to write it.
        close = difflib.get_close_matches(raw, TRACKERS, n=1) if isinstance(raw, str) else []
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        if isinstance(raw, str) and "," in raw:  # --set track=mlflow,tensorboard
            hint = f" (did you mean [{', '.join(n.strip() for n in raw.split(','))}]?)"
        raise UsageError(
            "recipe key 'track': expected a list of trackers, like [mlflow] or "
            f"[{{mlflow: {{experiment: foo}}}}], got {_shown(raw)}{hint}"
        )
    out: list[dict[str, Any]] = []
    for i, item in enumerate(raw):
        name = item if isinstance(item, str) else None
        if isinstance(item, dict) and len(item) == 1:
            name = next(iter(item))
        if name not in TRACKERS:
            close = difflib.get_close_matches(str(name), TRACKERS, n=1) if name else []
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(
                f"recipe key 'track[{i}]': expected a tracker, one of {', '.join(TRACKERS)}, "
                f"or a one-key mapping {{NAME: {{options}}}}, got {_shown(item)}{hint}"
            )
        if any(name in seen for seen in out):
            raise UsageError(f"recipe key 'track[{i}]': {name} is listed twice; list it once")
        options = item[name] if isinstance(item, dict) else None
        out.append({name: {} if options is None else options})
    return out


def with_paths(raw: Any, folder: Path) -> Any:
    """`track`'s raw items (normalized), an mlflow item's store and artifact folder filled in
    and made absolute from `folder` (the recipe file's); a value of the wrong type is left for
    the type check."""
    items = normalized(raw)
    if not isinstance(items, list):
        return items
    for item in items:
        options = item.get("mlflow")
        if isinstance(options, dict):
            item["mlflow"] = {**options, **_mlflow_paths(options, folder)}
    return items


def resolved(track: tuple[TrackerConfig, ...] | None, name: str) -> Any:
    """The typed items with every default filled in: paths (a recipe given as a mapping: from
    the working directory), the experiment and project (the recipe's name), W&B's mode."""
    if track is None:
        return None
    out = []
    for i, item in enumerate(track):
        if item.mlflow is not None:
            cfg = item.mlflow
            paths = _mlflow_paths(dataclasses.asdict(cfg), Path.cwd())
            _check_store(paths["tracking_uri"], f"track[{i}].mlflow.tracking_uri")
            cfg = dataclasses.replace(cfg, **paths, experiment=cfg.experiment or name)
            item = dataclasses.replace(item, mlflow=cfg)
        elif item.wandb is not None:
            cfg = item.wandb
            env_mode = os.environ.get("WANDB_MODE")
            mode = cfg.mode or (env_mode if env_mode in ("offline", "online") else "online")
            cfg = dataclasses.replace(cfg, project=cfg.project or name, mode=mode)
            item = dataclasses.replace(item, wandb=cfg)
        out.append(item)
    return tuple(out)


def as_raw(track: tuple[TrackerConfig, ...]) -> list[dict[str, Any]]:
    """The items as the recipe writes them: {NAME: {options}}."""
    return [{item.name: dataclasses.asdict(item.options)} for item in track]


def _mlflow_paths(options: dict[str, Any], folder: Path) -> dict[str, Any]:
    """tracking_uri (default MLFLOW_TRACKING_URI, else sqlite:///mlflow.db) and
    artifact_location (default: mlartifacts/ beside a sqlite store's file), relative ones
    taken from `folder` (the environment's from the working directory)."""
    out: dict[str, Any] = {}
    uri = options.get("tracking_uri")
    if uri is None:
        env = os.environ.get("MLFLOW_TRACKING_URI")
        uri = _absolute_sqlite(env, Path.cwd()) if env else SQLITE + MLFLOW_DB
    if isinstance(uri, str):
        uri = _absolute_sqlite(uri, folder)
        out["tracking_uri"] = uri
    where = options.get("artifact_location")
    if isinstance(where, str) and "://" not in where and not os.path.isabs(where):
        out["artifact_location"] = str((folder / os.path.expanduser(where)).resolve())
    elif where is None and isinstance(uri, str) and uri.startswith(SQLITE):
        db = uri[len(SQLITE) :]
        if db and db != ":memory:":
            out["artifact_location"] = os.path.join(os.path.dirname(db), MLFLOW_ARTIFACTS)
    return out


def _check_store(uri: str, key: str) -> None:
    """A tracking URI whose scheme MLflow's tracking serves, refused at load otherwise (MLflow
    would fail in the sink's thread, with a message about its model registry)."""
    if not uri.strip():  # MLflow would take its own default, in the working folder
        raise UsageError(
            f"recipe key '{key}': expected a tracking store such as sqlite:///FILE or "
            "http(s)://SERVER, got an empty string (null takes MLFLOW_TRACKING_URI, else "
            "sqlite:///mlflow.db beside the recipe)"
        )
    scheme = urllib.parse.urlparse(uri).scheme.split("+")[0].lower()
    # A scheme of one letter is a Windows drive (C:/runs): a local folder.
    if len(scheme) > 1 and scheme not in STORE_SCHEMES:
        env = " (from MLFLOW_TRACKING_URI)" if os.environ.get("MLFLOW_TRACKING_URI") == uri else ""
        raise UsageError(
            f"recipe key '{key}': expected a tracking store: sqlite:///FILE, postgresql://, "
            f"mysql://, mssql://, http(s)://SERVER, file:///FOLDER, databricks or a local folder, "
            f"got {uri!r}{env}"
        )


def _absolute_sqlite(uri: str, folder: Path) -> str:
    """`sqlite:///REL` (three slashes and a relative path) made `sqlite:////ABS` from `folder`."""
    if not uri.startswith(SQLITE):
        return uri
    db = uri[len(SQLITE) :]
    if not db or db == ":memory:" or db.startswith("/"):
        return uri
    return SQLITE + str((folder / os.path.expanduser(db)).resolve())


def _shown(value: Any) -> str:
    """A value as YAML writes it (recipe.typed.shown's rule; that module imports this one)."""
    if isinstance(value, str):
        return repr(value)
    return (
        yaml.safe_dump(value, default_flow_style=True, width=1 << 30)
        .removesuffix("\n...\n")
        .strip()
    )
