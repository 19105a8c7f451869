"""Evaluating a checkpoint on any mesh.

A run directory describes itself: each checkpoint's meta.json holds the resolved recipe, so eval
needs nothing but the path. The model is built on the target mesh first and the checkpoint then
restored into it: TensorFlow relays each saved shard out onto the new layouts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtcli import checkpoint as ckpt_lib
from dtcli import recipe as recipe_lib
from dtcli import rundir
from dtcli.errors import UsageError
from dtcli.recipe import Recipe

SPLITS = ("eval", "train")


def find_checkpoint(path: Path, warn: Any = None) -> Path:
    """A checkpoint folder (verified), or the newest intact checkpoint of a run directory."""
    if warn is None:
        return rundir.find_checkpoint(path, "CHECKPOINT")
    return rundir.find_checkpoint(path, "CHECKPOINT", warn)


def checkpoint_recipe(
    checkpoint: Path,
    sets: list[str] | tuple[str, ...] = (),
    mesh: str | None = None,
    devices: str | None = None,
    batch_size: int | None = None,
) -> Recipe:
    """The recipe stored with a checkpoint, with command-line overrides."""
    raw = ckpt_lib.read_meta(checkpoint)["recipe"]
    if not isinstance(raw, dict):
        raise ckpt_lib.DamagedCheckpoint(checkpoint, "its recipe is not a mapping")
    sets = list(sets)
    if batch_size is not None:
        if batch_size < 1:
            raise UsageError(f"--batch-size {batch_size}: expected a positive integer")
        sets.append(f"data.eval_batch_size={batch_size}")
    try:
        return recipe_lib.load(raw, sets, mesh=mesh, devices=devices)
    except UsageError as exc:
        raise UsageError(f"{exc} (recipe stored with {checkpoint})") from None


def evaluate_checkpoint(checkpoint: Path, recipe: Recipe, split: str = "eval") -> dict[str, Any]:
    """Restore `checkpoint` onto `recipe`'s mesh and evaluate it on every example of `split`."""
    from dtcli import session as session_lib
    from dtcli.mesh import mesh_text

    if split not in SPLITS:
        raise UsageError(f"--split {split!r}: expected eval or train")
    meta = ckpt_lib.read_meta(checkpoint)
    session = session_lib.prepare(recipe, splits=(split,) if split == "train" else ("eval",))
    ckpt = ckpt_lib.Checkpointer(checkpoint.parent, {"model": session.model.module}, keep=1)
    ckpt.restore(checkpoint, session.model.weights, partial=True)
    _, eval_step = session_lib.make_steps(session)
    feed = session.train_feed if split == "train" else session.eval_feed
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
