"""Evaluating a checkpoint on any mesh, and exporting it as a plain SavedModel.

A run directory describes itself: each checkpoint's meta.json holds the resolved recipe, so both
need nothing but the path. The model is built on the target mesh first and the checkpoint then
restored into it: TensorFlow relays each saved shard out onto the new layouts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtcli import checkpoint as ckpt_lib
from dtcli import recipe as recipe_lib
from dtcli.errors import UsageError
from dtcli.recipe import Recipe


def find_checkpoint(path: Path) -> Path:
    """A checkpoint folder, or the latest complete checkpoint of a run directory."""
    path = Path(path)
    if (path / ckpt_lib.META).is_file():
        return path
    if not path.exists():
        raise UsageError(f"CHECKPOINT {str(path)!r}: no such file or folder")
    latest = ckpt_lib.latest(path)
    if latest is None:
        raise UsageError(
            f"CHECKPOINT {str(path)!r}: neither a checkpoint nor a run directory "
            "with a complete checkpoint"
        )
    return latest


def checkpoint_recipe(
    checkpoint: Path,
    sets: list[str] | tuple[str, ...] = (),
    mesh: str | None = None,
    devices: str | None = None,
    batch_size: int | None = None,
) -> Recipe:
    """The recipe stored with a checkpoint, with command-line overrides."""
    raw = ckpt_lib.read_meta(checkpoint)["recipe"]
    sets = list(sets)
    if batch_size is not None:
        sets.append(f"data.eval_batch_size={batch_size}")
    try:
        return recipe_lib.load(raw, sets, mesh=mesh, devices=devices)
    except UsageError as exc:
        raise UsageError(f"{exc} (recipe stored with {checkpoint})") from None


def evaluate_checkpoint(checkpoint: Path, recipe: Recipe, split: str = "eval") -> dict[str, Any]:
    """Restore `checkpoint` onto `recipe`'s mesh and evaluate it on every example of `split`."""
    from dtcli import train as train_lib
    from dtcli.mesh import mesh_text

    if split not in ("train", "eval"):
        raise UsageError(f"--split {split!r}: expected train or eval")
    session = train_lib.prepare(recipe, splits=(split,) if split == "train" else ("eval",))
    ckpt = ckpt_lib.Checkpointer(checkpoint.parent.parent, {"model": session.model.module}, keep=1)
    ckpt.restore(checkpoint, session.model.weights, partial=True)
    _, eval_step = train_lib.make_steps(session)
    data = session.data.train if split == "train" else session.data.eval
    result = train_lib.evaluate(session, eval_step, data)
    meta = ckpt_lib.read_meta(checkpoint)
    return {
        **result,
        "split": split,
        "checkpoint": str(checkpoint),
        "step": meta["step"],
        "mesh": mesh_text(session.axes),
        "devices": session.devices.text,
        "trained_on_mesh": mesh_text(meta["mesh"]),
    }
