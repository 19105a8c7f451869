"""A task YAML's local data files found beside the YAML, wherever dtcli runs.

lm-eval's documented way to run a task over local files is `dataset_path: json` (or csv,
parquet, ...) with `dataset_kwargs: {data_files: ...}`; it hands them to datasets.load_dataset,
which resolves a relative path against the working directory, so such a task runs only from its
own folder. Here a relative data file (or a relative data_dir) of a file-format task is made
absolute against the folder of the YAML that names it, before lm-eval builds the task.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# datasets' builders that read files (a hub repository's data_files are the repository's)
FILE_FORMATS = frozenset({"json", "csv", "parquet", "text", "arrow", "pandas", "xml"})


def resolve_beside_yaml(manager: Any) -> Any:
    """`manager` (lm-eval's TaskManager) building its tasks with their relative data files
    resolved against their YAML's folder -> the manager.

    lm-eval 0.4.13 (pinned) gives no hook between a task's YAML and its building: its
    TaskFactory._load_full_config, which reads an entry's YAML into the config every task and
    group member is built from, is wrapped on this manager's factory alone.
    tests/test_eval_tasks.py pins it (a task run from another working directory)."""
    factory = manager._factory
    load = factory._load_full_config

    def load_resolved(entry: Any, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        cfg = load(entry, overrides)
        if entry.yaml_path is not None:
            # absolute: a relative include path gives relative YAML paths, and a task's own
            # custom_dataset (the test fixtures') joins data files to its folder itself
            resolve_data_files(cfg, Path(entry.yaml_path).resolve().parent)
        return cfg

    factory._load_full_config = load_resolved
    return manager


def resolve_data_files(cfg: dict[str, Any], folder: Path) -> None:
    """A file-format task's relative `dataset_kwargs.data_dir`, else its relative data_files
    (a string, a list, or a dict of either), made absolute against `folder`, in place. datasets
    reads data_files relative to data_dir where there is one."""
    kwargs = cfg.get("dataset_kwargs")
    if cfg.get("dataset_path") not in FILE_FORMATS or not isinstance(kwargs, dict):
        return
    if isinstance(kwargs.get("data_dir"), str):
        kwargs["data_dir"] = _beside(kwargs["data_dir"], folder)
    elif "data_files" in kwargs:
        kwargs["data_files"] = _resolved(kwargs["data_files"], folder)


def _resolved(files: Any, folder: Path) -> Any:
    if isinstance(files, str):
        return _beside(files, folder)
    if isinstance(files, list):
        return [_resolved(f, folder) for f in files]
    if isinstance(files, dict):
        return {split: _resolved(f, folder) for split, f in files.items()}
    return files


def _beside(path: str, folder: Path) -> str:
    # a URL or hf:// path, an absolute or home-relative path: as written
    if "://" in path or path.startswith("~") or os.path.isabs(path):
        return path
    return str(folder / path)
