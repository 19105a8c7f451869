"""The recipe a run continues with: the one it was written with, with command-line overrides
that may not change what its checkpoints depend on; and the recipe stored with a checkpoint."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtcli import checkpoint as ckpt_lib
from dtcli import optimizers, storage
from dtcli import recipe as recipe_lib
from dtcli.errors import UsageError
from dtcli.recipe import NO_OVERRIDES, Overrides, Recipe
from dtcli.rundir.base import resolve as resolve_from_run
from dtcli.rundir.files import CHECKPOINTS, RECIPE, check_plots, check_records, reachable
from dtcli.rundir.lock import held_by, held_error

# What a checkpoint's state depends on: a resume may not change it. The mesh, devices, layouts,
# data, optimizer hyperparameters and schedule may change and take effect from the resumed step.
FIXED_ON_RESUME: dict[str, Callable[[Recipe], Any]] = {
    "seed": lambda r: r.seed,
    # Activation checkpointing changes no state: a run may resume with or without it.
    "model": lambda r: _without_remat(r.model),
    "optimizer.name": lambda r: r.optimizer.name,
    # Checked after the name: with the same optimizer, only SGD's momentum changes the slots.
    "optimizer.momentum": lambda r: optimizers.slots(r.optimizer),
    "data.batch_size": lambda r: r.data.batch_size,
    # The run's token ids mean what its saved tokenizer says (RUN_DIR/tokenizer.json).
    "data.tokenizer": lambda r: r.data.tokenizer,
    # A LoRA run's checkpoints hold adapters of these kernels, shapes and scale (None: no LoRA;
    # its dropout and base_precision may change).
    "lora.targets": lambda r: r.lora and r.lora.targets,
    "lora.rank": lambda r: r.lora and r.lora.rank,
    "lora.alpha": lambda r: r.lora and r.lora.alpha,
}


def _without_remat(model: recipe_lib.ModelConfig) -> recipe_lib.ModelConfig:
    if model.transformer is None:
        return model
    return dataclasses.replace(
        model, transformer=dataclasses.replace(model.transformer, remat=False)
    )


def command_recipe(
    recipe: str | Path | None,
    out: str | Path | None,
    resume: str | Path | None,
    overrides: Overrides = NO_OVERRIDES,
    chief: bool = True,
) -> Recipe:
    """The recipe `dtcli train` and `dtcli launch` run: RECIPE's, or with `--resume RUN_DIR` the
    run's own (which takes its recipe and folder from the run), with command-line overrides."""
    if resume is not None:
        if recipe is not None or out is not None:
            raise UsageError(
                "--resume RUN_DIR takes its recipe and folder from the run: "
                "give no RECIPE and no --out"
            )
        return resume_recipe(resume, overrides, chief=chief)
    if recipe is None:
        raise UsageError("RECIPE: give a recipe file (or --resume RUN_DIR)")
    return recipe_lib.load(recipe, overrides, from_run=resolve_from_run)


def check_resumable(path: Path, arg: str = "--resume", check_lock: bool = True) -> None:
    with reachable(arg, path):
        path = storage.as_path(path)
        if not path.is_dir():
            what = "no such folder" if not path.exists() else "not a folder"
            raise UsageError(f"{arg} {str(path)!r}: {what}")
        # First: a new run holds its folder before it writes recipe.yaml.
        info = held_by(path) if check_lock else None
        if info is not None:
            raise held_error(arg, path, info)
        if not (path / RECIPE).is_file():
            raise _not_a_run(path, arg)
        check_plots(path, arg)  # refused before training, not after it
        check_records(path, arg)


def _not_a_run(path: Path, arg: str) -> UsageError:
    """A folder without recipe.yaml; a run's checkpoint (or checkpoints folder) names its run:
    a resume takes the run directory and always goes on from its newest intact checkpoint."""
    run, what = None, ""
    if path.name == CHECKPOINTS:
        run, what = path.parent, "a run's checkpoints folder"
    elif path.parent.name == CHECKPOINTS and ckpt_lib.looks_like_checkpoint(path):
        run, what = path.parent.parent, "a checkpoint"
    if run is None or not (run / RECIPE).is_file():
        return UsageError(f"{arg} {str(path)!r}: not a run directory (no {RECIPE})")
    return UsageError(
        f"{arg} {str(path)!r}: {what}, not a run directory; give its run: {arg} {run} (a "
        "resume always goes on from the run's newest intact checkpoint; resuming from an older "
        "one is not supported)"
    )


def read_recipe_text(path: Path, arg: str = "--resume", check_lock: bool = True) -> Path:
    """The run's recipe file, checked to be there (what `--resume` loads). `check_lock=False`:
    for clients 1.. of a multi-client run, whose client 0 holds the lock."""
    check_resumable(path, arg, check_lock)
    return storage.as_path(path) / RECIPE


def resume_recipe(
    run_dir: str | Path, overrides: Overrides = NO_OVERRIDES, chief: bool = True
) -> Recipe:
    """The recipe a run was written with, with command-line overrides (for --resume).

    `chief`: False for clients 1.. of a multi-client run, which read the run client 0 holds."""
    path = read_recipe_text(run_dir, check_lock=chief)
    before = recipe_lib.load(path)
    after = recipe_lib.load(path, overrides)
    fixed = FIXED_ON_RESUME
    if _imported(path.parent):
        _check_imported_data(after, run_dir)
        fixed = {k: FIXED_ON_RESUME[k] for k in FIXED_IN_AN_IMPORT}
    for key, value in fixed.items():
        if value(before) != value(after):
            raise UsageError(
                f"--set {key}: a run resumes with the {key} it was trained with; train a new "
                "run (--out) to change it"
            )
    return after


# An imported run's checkpoint holds the model alone (checkpoint.weights_only): nothing trained
# with a seed, an optimizer or a batch size yet, so only these are its own.
FIXED_IN_AN_IMPORT = ("model", "data.tokenizer")


def _imported(run: Path) -> bool:
    """Whether the run's newest checkpoint is an import's step 0 (train then starts from its
    weights with a new optimizer: train.resume.restore)."""
    found = ckpt_lib.complete(run / CHECKPOINTS)
    if not found:
        return False
    try:
        return ckpt_lib.weights_only(ckpt_lib.read_meta(found[-1]))
    except ckpt_lib.DamagedCheckpoint:
        return False  # said where the checkpoint is read to resume


def _check_imported_data(recipe: Recipe, run_dir: str | Path) -> None:
    """An import's recipe names no training data: its text source would default to the Python
    standard library's sources, which nobody fine-tunes a published model on."""
    d = recipe.data
    if d.source == "text" and d.path is None and d.name == "digits":
        raise UsageError(
            f"--resume {str(run_dir)!r}: an imported run has no training data; give it with "
            "--set data.path=FILE (text, read with the run's tokenizer), or train a recipe "
            "with model.from_hf"
        )


def recipe_changes(before: Recipe, after: Recipe) -> dict[str, list[Any]]:
    """{dotted key: [old, new]} for every recipe value that differs."""

    def flat(recipe: Recipe) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in recipe_lib.to_mapping(recipe).items():
            if isinstance(value, dict) and key != "mesh":  # a section: one entry per key
                out.update({f"{key}.{k}": v for k, v in value.items()})
            else:
                out[key] = value
        return out

    a, b = flat(before), flat(after)
    return {k: [a.get(k), b.get(k)] for k in {**a, **b} if a.get(k) != b.get(k)}


# What eval, generate, score and export may change of a checkpoint's model (--set): none changes a
# weight or what the trained model computes at inference (dropout is the identity there, remat
# recomputes only a backward pass; build_path says where model.build's module lives now; a LoRA
# base stored in bf16 holds the same float32 base's weights, rounded).
FREE_IN_A_CHECKPOINT = (
    "model.transformer.dropout",
    "model.transformer.remat",
    "model.build_path",
    "lora.dropout",
    "lora.base_precision",
)


def checkpoint_recipe(
    checkpoint: Path,
    command: str,
    overrides: Overrides = NO_OVERRIDES,
    batch_size: int | None = None,
) -> Recipe:
    """The recipe stored with a checkpoint, with command-line overrides, checked for `command`
    (eval, generate, score or export: recipe.COMMANDS), which keeps the checkpoint's model.

    `train.compile: xla` (or `graph`) says how that run trained (on one device); read onto
    another mesh (`--mesh`, `--devices`) it is `auto`, plain variables where that mesh is one
    device, so a checkpoint of such a run evaluates and generates on any mesh, as every other
    checkpoint does. (A
    `--set train.compile=xla` is the user's own: it is checked against the mesh.)"""
    raw = ckpt_lib.read_meta(checkpoint)["recipe"]
    if not isinstance(raw, dict):
        raise ckpt_lib.DamagedCheckpoint(checkpoint, "its recipe is not a mapping")
    train = raw.get("train")
    moved = overrides.mesh is not None or overrides.devices is not None
    if moved and isinstance(train, dict) and train.get("compile") in ("xla", "graph"):
        raw = {**raw, "train": {**train, "compile": "auto"}}
    if batch_size is not None:
        if batch_size < 1:
            raise UsageError(f"--batch-size {batch_size}: expected a positive integer")
        overrides = dataclasses.replace(overrides, eval_batch_size=batch_size)
    try:
        recipe = recipe_lib.load(raw, overrides, command=command)
        stored = recipe_lib.load(raw, command=command)
    except UsageError as exc:
        raise UsageError(f"{exc} (recipe stored with {ckpt_lib.shown(checkpoint)})") from None
    _check_same_model(stored, recipe, command)
    return recipe


def _check_same_model(stored: Recipe, recipe: Recipe, command: str) -> None:
    """A --set that changes the checkpoint's model is refused before any weight is read: the
    weights hold the model that was trained."""
    before = {"model": dataclasses.asdict(stored.model), "lora": _asdict(stored.lora)}
    after = {"model": dataclasses.asdict(recipe.model), "lora": _asdict(recipe.lora)}
    for key, old, new in _differences(before, after, ""):
        if key not in FREE_IN_A_CHECKPOINT:
            free = ", ".join(FREE_IN_A_CHECKPOINT[:-1]) + f" and {FREE_IN_A_CHECKPOINT[-1]}"
            raise UsageError(
                f"--set {key}: {command} keeps the checkpoint's model, whose {key} is {old!r} "
                f"(not {new!r}); only {free} may change (train a new run for another model)"
            )


def _asdict(section: Any) -> Any:
    return None if section is None else dataclasses.asdict(section)


def _differences(a: Any, b: Any, key: str) -> list[tuple[str, Any, Any]]:
    """(dotted key, a's value, b's value) wherever two nested mappings differ, in a's order."""
    if isinstance(a, dict) and isinstance(b, dict):
        prefix = f"{key}." if key else ""
        return [d for k in {**a, **b} for d in _differences(a.get(k), b.get(k), prefix + k)]
    return [] if a == b else [(key, a, b)]
