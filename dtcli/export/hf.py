"""`dtcli export RUN --format hf --out DIR`: a language model as a Hugging Face model folder.

config.json (model type gpt2 or llama: hf.config.to_config, refused naming the recipe key the
two cannot express), model.safetensors (shards and an index above --max-shard-size) in the
source's dtype by default (an import's; float32 for a run dtcli trained from scratch), the
vocabulary's padded rows sliced off, and the tokenizer files (hf.tokenizer_files).
`transformers.AutoModelForCausalLM.from_pretrained(DIR)` and `AutoTokenizer` load it as it is.

The model is rebuilt with plain variables on one device and the checkpoint restored into it,
then each Hugging Face tensor is made from its weights and written in turn. A LoRA run's
(`--merge`) has its base loaded and its adapters restored (export/plain.py), and each adapted
kernel is written with its adapter folded in (kernel + alpha / rank * A @ B, hf.peft_files), in
the base's dtype by default.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dtcli import checkpoint as ckpt_lib
from dtcli import rundir
from dtcli.errors import UsageError
from dtcli.export import plain
from dtcli.hf import config as hf_config
from dtcli.hf import peft_files, safetensors_io, tokenizer_files
from dtcli.recipe import Recipe

DEFAULT_SHARD_BYTES = safetensors_io.DEFAULT_SHARD_BYTES
# Token ids an import's config.json held, given back to the export's.
CARRIED_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
DTYPE_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}


def export_hf(
    checkpoint: Path,
    held: Path,
    recipe: Recipe,
    out: Path,
    dtype: str | None = None,
    max_shard_bytes: int = safetensors_io.DEFAULT_SHARD_BYTES,
    merge: bool = False,
) -> Path:
    """`checkpoint` (read through `held`) as a Hugging Face folder at `out`; `merge`: a LoRA
    run's adapters folded into their kernels."""
    from dtcli import tfruntime
    from dtcli.models import hf_weights

    t = recipe.model.transformer
    if recipe.task != "language_model" or t is None:
        raise UsageError("--format hf: the run's model is no model.transformer (a language model)")
    kind = hf_config.model_type_of(t)
    if dtype is not None and dtype not in safetensors_io.WRITE_DTYPES:
        raise UsageError(
            f"--dtype {dtype!r}: expected one of {', '.join(safetensors_io.WRITE_DTYPES)}"
        )
    out = rundir.check_new_local_folder(Path(out), "export")
    meta = ckpt_lib.read_meta(held)
    run = rundir.tokenizer_file(checkpoint).parent
    vocab_size = getattr(t, "vocab_size", None) or int(meta["num_classes"])
    source = tokenizer_files.source_config(run)
    stored = safetensors_io.WRITE_DTYPES[dtype] if dtype else _source_dtype(meta, source)
    extra = _token_ids(source, _tokenizer_text(run))
    config = hf_config.to_config(t, vocab_size, {**extra, "dtype": DTYPE_NAMES[stored]})
    tf = tfruntime.import_tensorflow()
    with tf.device("/CPU:0"):
        weights = _restored(tf, recipe, meta, checkpoint, held)
        read = _reader(weights, recipe.lora if merge else None)
        order, produce = hf_weights.hf_tensors(kind, t, vocab_size, read, weights.__contains__)
        with rundir.written_whole(out, "the model") as tmp:
            (tmp / hf_config.CONFIG).write_text(json.dumps(config, indent=2) + "\n")
            safetensors_io.write_model(tmp, order, produce, stored, max_shard_bytes)
            tokenizer_files.copy_out(run, _tokenizer_text(run), tmp)
    return out


def _restored(tf: Any, recipe: Recipe, meta: dict, checkpoint: Path, held: Path) -> dict:
    """The model with plain variables on the host's first CPU, the checkpoint restored into it:
    its weights by path."""
    from dtcli.models.keras import keras_variables

    shape = tuple(meta["input_shape"])
    model = plain.restored_model(tf, recipe, checkpoint, held, shape, meta["num_classes"])
    return {path: var for path, var, _ in keras_variables(model)}


def _reader(weights: dict, lora: Any) -> Callable[[str], np.ndarray]:
    """Each weight on the host as float32 (a LoRA base stored in bfloat16 too); with `lora`,
    each adapted kernel with its adapter folded in, as peft's merge_and_unload folds it."""

    def read(path: str) -> np.ndarray:
        value = np.asarray(weights[path].numpy(), np.float32)
        path_a, path_b = peft_files.adapter_paths(path)
        if lora is None or path_a not in weights:
            return value
        return peft_files.merged(value, read(path_a), read(path_b), lora.alpha / lora.rank)

    return read


def _source_dtype(meta: dict, source: dict) -> str:
    """The dtype an export keeps by default: the imported files' (an import's checkpoint
    records it), else the source config.json's (a run fine-tuned with model.from_hf keeps that
    config), else float32."""
    if "hf_dtype" in meta:
        return meta["hf_dtype"]
    named = source.get("dtype") or source.get("torch_dtype")
    return safetensors_io.WRITE_DTYPES.get(str(named), "F32")


def _token_ids(source: dict, tokenizer_text: str) -> dict:
    """config.json's special token ids: an import's own; for a run dtcli trained, its
    tokenizer's end-of-document token or none (left out, transformers' GPT-2 would take 50256,
    past a small vocabulary)."""
    if any(k in source for k in CARRIED_KEYS):
        return {k: source[k] for k in CARRIED_KEYS if k in source}
    from dtcli.data import tokenizer as tokenizer_lib

    added = json.loads(tokenizer_text).get("added_tokens") or []
    ends = [a["id"] for a in added if a.get("content") in tokenizer_lib.EOT_NAMES]
    eot = ends[0] if ends else None
    return {"bos_token_id": eot, "eos_token_id": eot}


def _tokenizer_text(run: Path) -> str:
    """The run's tokenizer.json as it is (an import's, byte for byte), or dtcli's byte
    tokenizer's for a run from before tokenizers."""
    from dtcli.data import tokenizer as tokenizer_lib

    path = run / rundir.TOKENIZER
    if path.is_file():
        return path.read_text(encoding="utf-8")
    return tokenizer_lib.ByteTokenizer().to_json()


def parse_size(text: str) -> int:
    """--max-shard-size: bytes, or with a unit as transformers writes them (5GB, 500MB, 2GiB)."""
    units = {
        "": 1,
        "B": 1,
        "KB": 10**3,
        "MB": 10**6,
        "GB": 10**9,
        "KIB": 2**10,
        "MIB": 2**20,
        "GIB": 2**30,
    }
    number = text.strip().upper().rstrip("BKMGI") or "x"
    unit = text.strip().upper()[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or value <= 0:
        raise UsageError(f"--max-shard-size {text!r}: expected a size like 5GB, 500MB or 2GiB")
    return int(value * units[unit])
