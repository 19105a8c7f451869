"""Evaluating a checkpoint on any mesh.

A run directory describes itself: each checkpoint's meta.json holds the resolved recipe, so eval
needs nothing but the path. The model is built on the target mesh first and the checkpoint then
restored into it: TensorFlow relays each saved shard out onto the new layouts.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from dtcli import checkpoint as ckpt_lib
from dtcli import devices as devices_lib
from dtcli import progress as progress_lib
from dtcli import recipe as recipe_lib
from dtcli.errors import UsageError
from dtcli.recipe import NO_OVERRIDES, Overrides, Recipe
from dtcli.rundir import checkpoint_recipe, find_checkpoint, read_checkpoint, tokenizer_file
from dtcli.tables import Column, print_table

__all__ = [
    "SPLITS",
    "checkpoint_recipe",
    "evaluate_checkpoint",
    "evaluate_path",
    "find_checkpoint",
    "render",
]

SPLITS = ("eval", "train")
# What `dtcli eval` prints, in this order (examples for classifiers, tokens and perplexity for
# language models).
SHOWN = (
    "split",
    "examples",
    "tokens",
    "loss",
    "bpb",
    "perplexity",
    "accuracy",
    "mesh",
    "devices",
    "trained_on_mesh",
    "step",
)


def evaluate_path(
    path: Path,
    split: str = "eval",
    overrides: Overrides = NO_OVERRIDES,
    batch_size: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """`dtcli eval`: a checkpoint folder, or a run directory's newest intact checkpoint, on the
    mesh it was trained on or another one. Its files are held open from their verification to
    the restore (rundir.read_checkpoint): a run in training that removes it meanwhile (train.keep)
    takes nothing from under the read, and recipe and weights are one checkpoint's. `progress`:
    where stderr is no terminal, a line every BEAT_EVERY seconds of the work (--no-progress:
    none)."""
    if split not in SPLITS:
        raise UsageError(f"--split {split!r}: expected eval or train")
    devices_key = devices_lib.key_for(overrides.devices)
    what = f"eval: restoring the checkpoint, compiling the step, evaluating the {split} split"
    beat = progress_lib.Heartbeat(progress_lib.stderr_console(), what, on=progress)

    def read(checkpoint: Path, held: Path) -> dict[str, Any]:
        recipe = checkpoint_recipe(held, "eval", overrides, batch_size)
        return evaluate_checkpoint(checkpoint, held, recipe, split, devices_key)

    with beat:
        return read_checkpoint(path, read)


def evaluate_checkpoint(
    checkpoint: Path,
    held: Path,
    recipe: Recipe,
    split: str = "eval",
    devices_key: str = devices_lib.RECIPE_KEY,
    use_devices: int | None = None,
) -> dict[str, Any]:
    """Restore `checkpoint`, read through `held` (the folder checkpoint.held gives, or the
    checkpoint itself), onto `recipe`'s mesh and evaluate it on every example of `split`.
    `use_devices`: the mesh over only the first N devices (session.prepare)."""
    from dtcli import session as session_lib
    from dtcli import steps as steps_lib
    from dtcli.mesh import mesh_text

    if split == "train":  # read as an eval split is: from the host, each example once
        data = dataclasses.replace(recipe.data, placement="host")
        recipe = recipe_lib.replace(recipe, command="eval", data=data)
    splits = (split,) if split == "train" else ("eval",)
    session = session_lib.prepare(
        recipe,
        splits=splits,
        use_devices=use_devices,
        devices_key=devices_key,
        tokenizer_file=tokenizer_file(checkpoint),
        command="eval",
    )
    session_lib.restore_model(session, held)
    meta = ckpt_lib.read_meta(held)
    _, eval_step = steps_lib.make_steps(session)
    feed = session.eval_feed
    if split == "train":
        feed = session_lib.eval_feed(recipe, session.data.train, session.packer)
    result = session_lib.evaluate(session, eval_step, feed)
    return {
        **result,
        "split": split,
        "checkpoint": str(checkpoint),
        "step": meta["step"],
        "mesh": mesh_text(session.axes),
        "devices": session.devices.text,
        "trained_on_mesh": mesh_text(meta["mesh"]),
    }


def render(result: dict[str, Any], console: Any) -> None:
    """The checkpoint's path on a line of its own (a path is never broken), then one row per
    figure (dtcli.tables: at a terminal a table that fits, in a pipe plain rows)."""
    console.print(result["checkpoint"], markup=False, highlight=False, soft_wrap=True)
    rows = [
        (key, f"{result[key]:.6f}" if isinstance(result[key], float) else str(result[key]))
        for key in SHOWN
        if key in result
    ]
    print_table(console, (Column("figure", kind="name"), Column("value")), rows)
