"""A fine-tuning run's base model: its weights loaded into a session's model (model.from_hf,
model.from_run), and for LoRA the base its checkpoints' adapters belong to.

A LoRA checkpoint holds the adapters (and the optimizer's state and the counters), never the
base: its meta.json names the base as `base: {from, path, digests}`, the SHA-256 of the base's
files (model.from_hf: each *.safetensors file and config.json; model.from_run: the files of the
base checkpoint, as its meta.json records them: rundir.base). Every restore of a LoRA checkpoint
(a resume, eval, generate, score, export) loads the base the recipe names first and refuses, in
one line, a base whose digests are not the checkpoint's: adapters trained on one base mean
nothing on another, and nothing else would notice (the shapes agree)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from dtcli import models
from dtcli.errors import UsageError
from dtcli.models import lora
from dtcli.recipe import Recipe
from dtcli.rundir import base as base_lib

FROM_HF = "model.from_hf"
FROM_RUN = "model.from_run"


def base_record(recipe: Recipe) -> dict[str, Any] | None:
    """The base of a LoRA recipe as its checkpoints' meta.json names it; None without LoRA."""
    if recipe.lora is None:
        return None
    m = recipe.model
    if m.from_run:
        return _run_record(m.from_run, base_lib.base_digests(m.from_run))
    from dtcli.hf import config as hf_config

    hf_config.read(m.from_hf, f"recipe key '{FROM_HF}'")  # one line where it is no model folder
    return {"from": FROM_HF, "path": m.from_hf, "digests": base_lib.hf_digests(m.from_hf)}


def check_base(record: dict[str, Any], meta: dict[str, Any], checkpoint: Path) -> None:
    """A LoRA checkpoint's base (its meta.json's) against the recipe's `record`, one line where
    they differ."""
    from dtcli import checkpoint as ckpt_lib

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
    """The recipe's base weights (model.from_hf, model.from_run) into `session.model`, on its
    mesh; nothing without a base. LoRA: the base's record kept in `session.base` (each
    checkpoint's meta.json holds it), first compared with `meta`'s, the checkpoint about to be
    restored (none: a new run)."""
    recipe = session.recipe
    if not (recipe.model.from_hf or recipe.model.from_run):
        return
    shape = (session.data.input_shape, session.data.num_classes)
    session.base = load_checked(recipe, session.model, session.mesh, shape, meta, checkpoint)


def load_checked(
    recipe: Recipe,
    built: models.Built,
    mesh: Any,
    data_shape: tuple[tuple[int, ...], int],
    meta: dict[str, Any] | None = None,
    checkpoint: Path | None = None,
) -> dict[str, Any] | None:
    """load_weights, and for LoRA the base's record (base_record), compared with `meta`'s (the
    checkpoint about to be restored) before any base weight is read. A model.from_run base's
    record comes from the verification that reads its weights: its files are hashed once."""
    if recipe.lora is None:
        load_weights(recipe, built, mesh, data_shape)
        return None
    named: list[dict[str, Any]] = []

    def check(record: dict[str, Any]) -> None:
        if meta is not None:
            check_base(record, meta, checkpoint)
        named.append(record)

    if recipe.model.from_hf:
        check(base_record(recipe))
        load_weights(recipe, built, mesh, data_shape)
    else:
        run = recipe.model.from_run
        load_weights(recipe, built, mesh, data_shape, lambda d: check(_run_record(run, d)))
    return named[0]


def _run_record(path: str, digests: dict[str, str]) -> dict[str, Any]:
    return {"from": FROM_RUN, "path": path, "digests": digests}


def load_weights(
    recipe: Recipe,
    built: models.Built,
    mesh: Any,
    data_shape: tuple[tuple[int, ...], int],
    check: Any = None,
) -> None:
    """The base's weights into `built` (on `mesh`; None: plain variables), a LoRA model's
    adapters left as they are. model.from_hf: tensor by tensor, cast to a bfloat16 base's
    dtype. model.from_run: the checkpoint restored onto the model's own variables (each relaid
    out onto its layout), or, for a base stored in bfloat16 (a checkpoint holds float32), into
    a float32 model on the host first, then cast and placed weight by weight. `data_shape`: the
    model's input shape and classes; `check`: rundir.base.restore_weights' (model.from_run)."""
    from dtcli.models import hf_weights

    def place(value: Any, var: Any) -> Any:
        return models.place(value, var, mesh)

    if recipe.model.from_hf:
        hf_weights.load_folder(built, recipe.model.from_hf, place)
        return
    base = [w for w in built.weights if not lora.is_adapter(w.path)]
    if all(w.dtype == "float32" for w in base):
        base_lib.restore_weights(built.module, base, recipe.model.from_run, check)
        return
    plain = dataclasses.replace(recipe, lora=None)
    host = models.build_plain(plain, *data_shape)
    from dtcli.models.keras import keras_variables

    found = {path: var for path, var, _ in keras_variables(host)}
    weights = [dataclasses.replace(w, dtype="float32") for w in base]
    base_lib.restore_weights(host, weights, recipe.model.from_run, check)
    for path, var in found.items():
        live = built.variables[path]
        live.assign(place(var.numpy(), live))
