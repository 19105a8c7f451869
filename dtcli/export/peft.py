"""`dtcli export RUN --format peft --out DIR`: a LoRA run's adapters as a peft adapter folder.

adapter_config.json and adapter_model.safetensors (hf.peft_files: GPT-2's query/key/value
adapters fused into one c_attn adapter per block, Llama's one to one), float32 as the adapters
train, and nothing of the base: `peft.PeftModel.from_pretrained(base, DIR)` loads it onto
transformers' model of the base, the model.from_hf folder (base_model_name_or_path names it)
or `export --format hf` of a model.from_run base. The base is checked to be the checkpoint's
first (its digests), as every restore of a LoRA checkpoint does.
"""

from __future__ import annotations

from pathlib import Path

from dtcli import checkpoint as ckpt_lib
from dtcli import rundir
from dtcli.export import plain
from dtcli.hf import config as hf_config
from dtcli.hf import peft_files
from dtcli.recipe import Recipe


def export_peft(checkpoint: Path, held: Path, recipe: Recipe, out: Path) -> Path:
    """The adapters of the LoRA checkpoint `checkpoint` (read through `held`) as a peft
    adapter folder at `out`."""
    from dtcli.models import hf_weights

    kind = hf_config.model_type_of(recipe.model.transformer)
    out = rundir.check_new_local_folder(Path(out), "export")
    found = plain.lora_adapters(recipe, held)
    t = found.transformer
    vocab_size = getattr(t, "vocab_size", None) or int(ckpt_lib.read_meta(held)["num_classes"])
    keys = hf_weights.with_vocab(t, vocab_size)
    base = recipe.model.from_hf  # a model.from_run base has no Hugging Face folder of its own
    tensors, config = peft_files.to_peft(kind, keys, found.arrays, found.lora, base)
    with rundir.written_whole(out, "the adapters") as tmp:
        peft_files.write(tmp, tensors, config)
    return out
