"""`model.from_hf: DIR`: a recipe that starts from a Hugging Face model folder.

The folder's config.json gives `model.transformer` (dtcli.hf.config) and its tokenizer.json
`data.tokenizer`; the recipe gives the rest (data, optimizer, batch, schedule, and of the model
only its context, dropout and remat). A model key or tokenizer the recipe sets otherwise than
the folder says is refused, naming both. The step-0 weights are read by `train` (a new run
only). Resolved on the raw recipe as it loads, so the run's recipe.yaml holds every key; such a
recipe loads without the folder once it is gone (a run moved, a download cache cleared).
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from dtcli.errors import UsageError
from dtcli.hf import config as hf_config
from dtcli.recipe.configs import TransformerConfig

KEY = "model.from_hf"
# The model.transformer keys a recipe may choose beside model.from_hf.
OWN_KEYS = ("context", "dropout", "remat")


def resolve(raw: dict) -> dict:
    """The raw recipe with model.transformer and data.tokenizer filled in from model.from_hf
    (unchanged without it). `raw` is not changed."""
    model = raw.get("model")
    if not isinstance(model, dict) or model.get("from_hf") is None:
        return raw
    if model.get("from_run") is not None:
        raise UsageError(
            f"recipe key 'model.from_run': the model starts from a dtcli run's checkpoint, and "
            f"{KEY} from a Hugging Face folder; give one of them"
        )
    folder = model["from_hf"]
    if not isinstance(folder, str):
        raise UsageError(f"recipe key '{KEY}': expected a folder (a string), got {folder!r}")
    own = model.get("transformer") or {}
    if not isinstance(own, dict):
        raise UsageError(f"recipe key 'model.transformer': expected a mapping beside {KEY}")
    if not Path(folder).is_dir() and _written_out(own):
        # A run's own recipe (recipe.yaml, a checkpoint's): the folder gave its first step;
        # eval, generate, score, export and a resume read the run's weights and tokenizer.
        return raw
    context = own.get("context")
    named = f"recipe key '{KEY}'"
    hf = hf_config.read(folder, named, context, "recipe key 'model.transformer.context':")
    for key, value in hf.transformer.items():
        if key in own and key not in OWN_KEYS and own[key] != value:
            raise UsageError(
                f"recipe key 'model.transformer.{key}': {own[key]!r} contradicts {KEY} "
                f"{folder!r}, whose config.json makes it {value!r}"
            )
    absolute = str(Path(folder).resolve())
    data = dict(raw.get("data") or {})
    data["tokenizer"] = _tokenizer(data.get("tokenizer"), absolute)
    transformer = {**hf.transformer, **{k: v for k, v in own.items() if k in OWN_KEYS}}
    return {
        **raw,
        "model": {**model, "from_hf": absolute, "transformer": transformer},
        "data": data,
    }


def _written_out(transformer: dict) -> bool:
    """Whether model.transformer holds every key, as a run's resolved recipe does."""
    return {f.name for f in fields(TransformerConfig)} <= set(transformer)


def _tokenizer(given: Any, folder: str) -> str:
    """data.tokenizer: the folder's own (it holds tokenizer.json); another is refused."""
    if given is None:
        return folder
    mine = {folder, str(Path(folder) / "tokenizer.json")}
    if not isinstance(given, str) or str(Path(given).resolve()) not in mine:
        raise UsageError(
            f"recipe key 'data.tokenizer': {given!r} contradicts {KEY} {folder!r}, whose "
            "tokenizer.json the model's ids mean (leave data.tokenizer out)"
        )
    return folder
