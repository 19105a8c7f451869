"""A fine-tuning run's base model: its weights loaded into a session's model (model.from_hf), and
for LoRA the base its checkpoints' adapters belong to.

A LoRA checkpoint holds the adapters (and the optimizer's state and the counters), never the
base: its meta.json names the base as `base: {from, path, digests}`, the SHA-256 of the base's
files (model.from_hf: each *.safetensors file and config.json). Every restore of a LoRA
checkpoint (a resume, eval, generate, score, export) loads the base the recipe names first and
refuses, in one line, a base whose digests are not the checkpoint's: adapters trained on one
base mean nothing on another, and nothing else would notice (the shapes agree)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtcli import checkpoint as ckpt_lib
from dtcli import models
from dtcli.errors import UsageError
from dtcli.recipe import Recipe

FROM_HF = "model.from_hf"


def base_record(recipe: Recipe) -> dict[str, Any] | None:
    """The base of a LoRA recipe as its checkpoints' meta.json names it; None without LoRA."""
    if recipe.lora is None:
        return None
    folder = recipe.model.from_hf
    return {"from": FROM_HF, "path": folder, "digests": hf_digests(folder)}


def hf_digests(folder: str | Path) -> dict[str, str]:
    """The SHA-256 of a Hugging Face folder's weights (each *.safetensors) and config.json, by
    file name; a folder that is no model folder refused in one line naming model.from_hf."""
    from dtcli.hf import config as hf_config

    hf_config.read(str(folder), f"recipe key '{FROM_HF}'")  # says what is missing
    folder = Path(folder)
    names = sorted(p.name for p in folder.glob("*.safetensors")) + [hf_config.CONFIG]
    try:
        return {name: ckpt_lib.file_sha256(folder / name) for name in names}
    except OSError as exc:
        raise UsageError(
            f"recipe key '{FROM_HF}': cannot read {exc.filename} ({exc.strerror})"
        ) from None


def check_base(record: dict[str, Any], meta: dict[str, Any], checkpoint: Path) -> None:
    """A LoRA checkpoint's base (its meta.json's) against the recipe's `record`, one line where
    they differ."""
    shown = ckpt_lib.shown(checkpoint)
    saved = meta.get("base")
    if not isinstance(saved, dict) or not isinstance(saved.get("digests"), dict):
        raise UsageError(
            f"checkpoint {shown}: its meta.json names no LoRA base (it was written by another "
            "recipe)"
        )
    theirs, ours = saved["digests"], record["digests"]
    if theirs == ours:
        return
    differ = sorted(n for n in {**theirs, **ours} if theirs.get(n) != ours.get(n))
    what = ", ".join(
        f"{n} {'missing' if n not in ours else 'new' if n not in theirs else 'differs'}"
        for n in differ[:3]
    )
    raise UsageError(
        f"checkpoint {shown} holds LoRA adapters of base {saved.get('path')} "
        f"({saved.get('from')}); {record['from']} {record['path']} is another base ({what})"
    )


def load_base(
    session: Any, meta: dict[str, Any] | None = None, checkpoint: Path | None = None
) -> None:
    """The recipe's base weights (model.from_hf) into `session.model`, on its mesh; nothing
    without a base. LoRA: the base's record kept in `session.base` (each checkpoint's meta.json
    holds it), and first compared with `meta`'s, the checkpoint about to be restored (none: a
    new run)."""
    recipe = session.recipe
    if not recipe.model.from_hf:
        return
    record = base_record(recipe)
    if record is not None and meta is not None:
        check_base(record, meta, checkpoint)
    load_weights(recipe, session.model, session.mesh)
    session.base = record


def load_weights(recipe: Recipe, built: models.Built, mesh: Any) -> None:
    """model.from_hf's weights into `built` (on `mesh`; None: plain variables), cast to a LoRA
    base's dtype where it is stored in bfloat16."""
    from dtcli.models import hf_weights

    place = lambda value, var: models.place(value, var, mesh)  # noqa: E731
    hf_weights.load_folder(built, recipe.model.from_hf, place)
