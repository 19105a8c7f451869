"""`lora.from_peft: DIR`: a peft adapter folder's weights as a new LoRA run's step-0 adapters.

The folder (adapter_config.json, adapter_model.safetensors) is mapped to dtcli's adapters by
hf.peft_files: the modules it adapts must be those whose kernels lora.targets adapts, its rank
lora.rank's (a GPT-2 c_attn: see hf.peft_files) and its scale lora.alpha / lora.rank, else one
line naming lora.from_peft. Each adapter is then packed onto its variable's layout.
"""

from __future__ import annotations

from typing import Any

from dtcli.hf import config as hf_config
from dtcli.hf import peft_files
from dtcli.models import hf_weights, lora
from dtcli.recipe import Recipe

KEY = "recipe key 'lora.from_peft'"


def load_adapters(built: Any, recipe: Recipe, mesh: Any) -> None:
    """The recipe's lora.from_peft folder into the adapters of `built` (models.Built), each
    packed onto its layout on `mesh` (None: plain variables)."""
    from dtcli import models

    t = recipe.model.transformer
    folder = recipe.lora.from_peft
    tensors, config = peft_files.read(folder, KEY)
    shapes = {w.path: tuple(w.shape) for w in built.weights if lora.is_adapter(w.path)}
    # The head's vocabulary is the base's config's (model.from_hf), else the model's own.
    vocab = t.vocab_size or shapes.get("head.lora_b", (0, 0))[-1]
    keys = hf_weights.with_vocab(t, vocab)
    kind = hf_config.model_type_of(t)
    where = f"{KEY} {folder!r}"
    arrays = peft_files.from_peft(kind, keys, tensors, config, shapes, recipe.lora, where)
    for path, value in arrays.items():
        var = built.variables[path]
        var.assign(models.place(value, var, mesh))
