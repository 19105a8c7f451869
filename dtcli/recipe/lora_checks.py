"""The checks of the `lora` section against the rest of the recipe: its own values, the base it
adapts (model.from_hf or model.from_run), dropout with remat. Which kernels its regex finds and
whether the rank fits them is models.lora's (it needs the model's weight list)."""

from __future__ import annotations

import re

from dtcli.errors import UsageError
from dtcli.recipe.configs import LoraConfig, Recipe

KEY = "recipe key 'lora"


def check_lora(recipe: Recipe) -> None:
    """Refuse a `lora` section that cannot work, naming its key; nothing without one."""
    lora = recipe.lora
    if lora is None:
        return
    _check_values(lora)
    m = recipe.model
    if not (m.from_hf or m.from_run):
        raise UsageError(
            f"{KEY}': LoRA trains adapters on a base model, and this recipe has none; start "
            "from one with model.from_hf: HF_DIR (a Hugging Face folder) or model.from_run: "
            "RUN_DIR (a dtcli run)"
        )
    t = m.transformer
    if t is None:
        raise UsageError(
            f"{KEY}': LoRA adapts dtcli's GPT (model.transformer), and this recipe's base is a "
            f"{'Core-API MLP' if m.api == 'core' else 'tf-keras model'}; train it whole instead"
        )
    if t.remat and lora.dropout:
        # As model.transformer.dropout: the recompute would draw other masks.
        raise UsageError(
            f"{KEY}.dropout': recomputing a block (model.transformer.remat) would draw new "
            f"dropout masks; set lora.dropout to 0 (got {lora.dropout}) or remat to false"
        )


def _check_values(lora: LoraConfig) -> None:
    try:
        re.compile(lora.targets)
    except re.error as exc:
        raise UsageError(f"{KEY}.targets': not a valid regex ({exc})") from None
    rules = (
        ("rank", lora.rank >= 1, "an integer >= 1"),
        ("alpha", lora.alpha > 0, "a positive number"),
        ("dropout", 0 <= lora.dropout < 1, "a number in [0, 1)"),
    )
    for key, ok, expected in rules:
        if not ok:
            raise UsageError(f"{KEY}.{key}': expected {expected}, got {getattr(lora, key)!r}")
