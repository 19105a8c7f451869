"""The tasks' `custom_dataset`: their JSON files read from this folder, wherever it is copied.

lm-eval hands `dataset_kwargs` to datasets.load_dataset, which resolves a relative data file
against the working directory; lm-eval imports `!function` modules from the YAML's own folder,
so the paths are made absolute here."""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).resolve().parent


def load(data_files: dict[str, str], **_metadata):
    import datasets

    files = {split: str(HERE / name) for split, name in data_files.items()}
    return datasets.load_dataset("json", data_files=files)
