"""The recipe: one typed, frozen tree loaded from YAML and validated before any TensorFlow work.

Every key has a type; unknown keys are errors that name the full key path and suggest the
closest known key. `--set a.b=value` overrides go through the same type checks as the file.
This package never imports TensorFlow.

configs     the keys: the frozen dataclasses and their defaults
typed       YAML -> dataclasses, type by type, and the JSON schema
checks      checks between keys, one function per section (data_checks: the data section,
            lora_checks: the lora section)
batches     the batches a command steps through, against the mesh's data axis
files       reading a file: unique keys, `base:`, ${NAME}
overrides   the command line's --set/--mesh/--devices/--epochs
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from dtcli import storage
from dtcli.mesh import UNSHARDED
from dtcli.recipe import from_hf, trackers
from dtcli.recipe.batches import COMMANDS, check_batches, check_micro_batch
from dtcli.recipe.checks import check, check_mesh_on_devices
from dtcli.recipe.configs import (
    BYTE_VOCAB,
    STEPS_PER_CALL,
    STREAMED_SOURCES,
    TEXT_SOURCES,
    DataConfig,
    EvalTasksConfig,
    LayoutConfig,
    LoraConfig,
    ModelConfig,
    OptimizerConfig,
    Recipe,
    RopeScalingConfig,
    TrainConfig,
    TrainTokenizerConfig,
    TransformerConfig,
)
from dtcli.recipe.data_checks import bpe_size, tfds_installed
from dtcli.recipe.files import load_yaml, read_raw
from dtcli.recipe.overrides import NO_OVERRIDES, Overrides, apply_set, parse_mesh_arg
from dtcli.recipe.trackers import (
    TRACKERS,
    MlflowConfig,
    TensorboardConfig,
    TrackerConfig,
    WandbConfig,
)
from dtcli.recipe.typed import build, plain, schema

__all__ = [
    "BYTE_VOCAB",
    "COMMANDS",
    "STEPS_PER_CALL",
    "STREAMED_SOURCES",
    "TEXT_SOURCES",
    "UNSHARDED",
    "DataConfig",
    "EvalTasksConfig",
    "LayoutConfig",
    "LoraConfig",
    "MlflowConfig",
    "ModelConfig",
    "OptimizerConfig",
    "NO_OVERRIDES",
    "Overrides",
    "Recipe",
    "RopeScalingConfig",
    "TRACKERS",
    "TensorboardConfig",
    "TrackerConfig",
    "TrainConfig",
    "TrainTokenizerConfig",
    "TransformerConfig",
    "WandbConfig",
    "apply_set",
    "bpe_size",
    "check_batches",
    "check_mesh_on_devices",
    "check_micro_batch",
    "dump",
    "fingerprint",
    "from_mapping",
    "load",
    "load_yaml",
    "parse_mesh_arg",
    "read_raw",
    "read_with_overrides",
    "replace",
    "schema",
    "tfds_installed",
    "to_mapping",
]


# Fills a raw recipe's model in from model.from_run's checkpoint (dtcli.rundir.base.resolve:
# reading a run's checkpoints is the run directory's business, a layer above this one).
FromRun = Callable[[dict], dict]


def load(
    path: str | Path | dict,
    overrides: Overrides | Sequence[str] | None = None,
    *,
    command: str = "train",
    from_run: FromRun | None = None,
) -> Recipe:
    """Load a recipe (a file, or a raw mapping), apply command-line overrides (an Overrides, or
    just --set assignments), validate it all for `command` (COMMANDS: which batches it runs).
    A mistake in a key a command-line option set names the option (Overrides.named). The raw
    mapping given is not changed. `from_run`: a user's recipe, whose model.from_run it
    resolves; None: a run's own recipe (recipe.yaml, a checkpoint's), written out already."""
    if not isinstance(overrides, Overrides):
        overrides = Overrides(tuple(overrides or ()))
    with overrides.naming():  # `--epochs 0`, not `recipe key 'train.epochs'`
        if isinstance(path, dict):
            raw = from_hf.resolve(overrides.apply(path))
            return from_mapping(from_run(raw) if from_run else raw, command=command)
        return from_mapping(read_with_overrides(path, overrides, from_run), command=command)


def read_with_overrides(
    path: str | Path, overrides: Overrides = NO_OVERRIDES, from_run: FromRun | None = None
) -> dict:
    """A recipe file as the raw mapping `load` validates: its bases merged, the command line's
    overrides applied, model.from_hf (and with `from_run`, model.from_run) resolved, and a
    `model.build` that --set names looked up beside the recipe given (`model.build_path`), as
    one written in the file is. Whatever makes recipes of its own from a recipe file (`plan
    --auto`'s candidates) starts here, so that each loads as `train` loads the file."""
    raw = from_hf.resolve(overrides.apply(read_raw(path)))
    folder = storage.as_path(path).resolve().parent
    model = raw.get("model")
    if isinstance(model, dict) and model.get("build"):
        model.setdefault("build_path", str(folder))
    if raw.get("track") is not None:
        raw["track"] = trackers.with_paths(raw["track"], folder)
    return from_run(raw) if from_run else raw


def from_mapping(raw: dict | None, *, command: str = "train") -> Recipe:
    """Validate a raw mapping into a Recipe for `command` (raises UsageError naming the key at
    fault)."""
    if isinstance(raw, dict) and raw.get("track") is not None:
        raw = {**raw, "track": trackers.normalized(raw["track"])}
    return check(_resolve(build(Recipe, raw, "")), command)


def _resolve(recipe: Recipe) -> Recipe:
    """Fill in values other keys imply (the resolved recipe in a run directory records them)."""
    d, t, m = recipe.data, recipe.train, recipe.model
    if d.source in TEXT_SOURCES and d.context is None and m.transformer is not None:
        d = dataclasses.replace(d, context=m.transformer.context)
    if isinstance(d.tokenizer, str):  # `bpe:N`, {train: bpe, vocab_size: N} for short
        size = bpe_size(d.tokenizer, "recipe key 'data.tokenizer'")
        if size is not None:
            d = dataclasses.replace(d, tokenizer=TrainTokenizerConfig(vocab_size=size))
    if t.steps is not None and t.steps >= 1:
        # train.steps replaces epochs: the run is stretches of eval_every steps, each a
        # (possibly partial) epoch of its own permutation. A value out of its key's range is
        # left as given, for `check` to refuse (eval_every 0 is no "null").
        every = min(t.steps if t.eval_every is None else t.eval_every, t.steps)
        counts = (t.epochs, 1 if t.steps_per_epoch is None else t.steps_per_epoch)
        if every >= 1 and min(counts) >= 1:
            t = dataclasses.replace(
                t, eval_every=every, epochs=-(-t.steps // every), steps_per_epoch=every
            )
    tasks = t.eval_tasks
    if tasks is not None and tasks.include_path and "://" not in tasks.include_path:
        # Taken from the working directory, as data.path is; recorded absolute so that a
        # resume (or another client) started elsewhere finds the same folder.
        where = os.path.abspath(os.path.expanduser(tasks.include_path))
        t = dataclasses.replace(t, eval_tasks=dataclasses.replace(tasks, include_path=where))
    track = trackers.resolved(recipe.track, recipe.name)
    return dataclasses.replace(recipe, data=d, train=t, track=track)


def replace(recipe: Recipe, *, command: str = "train", **changes: Any) -> Recipe:
    """A copy of the recipe with top-level fields changed, re-validated for `command`."""
    return check(dataclasses.replace(recipe, **changes), command)


def to_mapping(recipe: Recipe) -> dict:
    """The recipe as plain YAML-ready data (tuples become lists; `track`'s items as written:
    {NAME: {options}})."""
    mapping = plain(dataclasses.asdict(recipe))
    if recipe.track is not None:
        mapping["track"] = trackers.as_raw(recipe.track)
    return mapping


# Keys only a classifier reads: a language model's recipe.yaml leaves them out while they hold
# their defaults (a value given stays, so that the file still loads back to the same recipe).
CLASSIFIER_ONLY = {
    "data": (
        "image_key",
        "label_key",
        "encoding",
        "dtype",
        "shuffle_buffer",
        "train_range",
        "eval_range",
        "shape",
        "classes",
        "count",
        "eval_count",
        "flatten",
    ),
    "model": ("layers", "hidden", "activation"),
}


def _without_classifier_keys(mapping: dict) -> dict:
    defaults = to_mapping(Recipe())
    for section, keys in CLASSIFIER_ONLY.items():
        for key in keys:
            if mapping[section].get(key) == defaults[section][key]:
                del mapping[section][key]
    return mapping


def dump(recipe: Recipe) -> str:
    """The recipe as YAML that loads back to the same recipe (a literal ${ is written $${); a
    language model's without the keys only classifiers read (CLASSIFIER_ONLY)."""

    def escape(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: escape(v) for k, v in value.items()}
        if isinstance(value, list):
            return [escape(v) for v in value]
        return value.replace("${", "$${") if isinstance(value, str) else value

    mapping = to_mapping(recipe)
    if recipe.task == "language_model":
        mapping = _without_classifier_keys(mapping)
    return yaml.safe_dump(escape(mapping), sort_keys=False)


def fingerprint(recipe: Recipe) -> str:
    """A hash of the validated recipe (after overrides): clients of one run must agree on it."""
    return hashlib.sha256(dump(recipe).encode()).hexdigest()
