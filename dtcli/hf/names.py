"""Hugging Face tensor names and dtcli's weight paths, with the transform each way.

`mappings(model_type, transformer)` lists, for a model of these model.transformer keys, every
tensor a Hugging Face checkpoint of it holds (its name as transformers writes it, its shape) and
the dtcli weights made from it: `to_dtcli(array) -> [arrays]` on import, `to_hf([arrays]) ->
array` on export, exact inverses (reshapes, transposes, a split and a concatenation: no
arithmetic, so an import then an export gives every tensor back bit for bit). The vocabulary is
the config's here: the caller pads the embedding and head rows to the model's vocabulary on
import and slices them off on export.

GPT-2 (`transformer.` prefix optional on import): Conv1D weights are [in, out] as dtcli's
kernels are; `attn.c_attn` holds query, key and value side by side ([d, 3d]); the head is the
token embedding's transpose unless tie_word_embeddings is false. Llama and Mistral (`model.`
prefix): Linear weights are [out, in], transposed; q/k/v/o reshape to dtcli's explicit heads
dim (the rotate_half RoPE layout is HF's own, so no permutation).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from dtcli.errors import UsageError

# Buffers a checkpoint may hold that are no weights (GPT-2's causal masks, old Llama's RoPE
# frequencies): ignored on import.
IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq")


@dataclass(frozen=True)
class Mapping:
    """One Hugging Face tensor and the dtcli weights it becomes."""

    hf: str
    hf_shape: tuple[int, ...]
    paths: tuple[str, ...]
    to_dtcli: Callable[[np.ndarray], list[np.ndarray]]
    to_hf: Callable[[list[np.ndarray]], np.ndarray]


def _get(t: Any, key: str) -> Any:
    return t[key] if isinstance(t, dict) else getattr(t, key)


def _same(path: str, hf: str, shape: tuple[int, ...]) -> Mapping:
    return Mapping(hf, shape, (path,), lambda a: [a], lambda arrays: arrays[0])


def _transposed(path: str, hf: str, shape: tuple[int, ...]) -> Mapping:
    return Mapping(hf, shape, (path,), lambda a: [a.T], lambda arrays: arrays[0].T)


def _reshaped(path: str, hf: str, shape: tuple[int, ...], to: tuple[int, ...], t: bool) -> Mapping:
    """A Linear ([out, in], `t`: transposed first) or Conv1D weight reshaped to `to`."""

    def to_dtcli(a: np.ndarray) -> list[np.ndarray]:
        return [(a.T if t else a).reshape(to)]

    def to_hf(arrays: list[np.ndarray]) -> np.ndarray:
        flat = arrays[0].reshape(shape[::-1] if t else shape)
        return flat.T if t else flat

    return Mapping(hf, shape, (path,), to_dtcli, to_hf)


def mappings(model_type: str, transformer: Any) -> list[Mapping]:
    """Every tensor of a Hugging Face checkpoint of this model, in transformers' order."""
    if model_type == "gpt2":
        return _gpt2(transformer)
    return _llama(transformer)


def _hidden(t: Any) -> int:
    return _get(t, "mlp_hidden") or _get(t, "mlp_ratio") * _get(t, "d_model")


def _gpt2(t: Any) -> list[Mapping]:
    d, heads, vocab = _get(t, "d_model"), _get(t, "heads"), _get(t, "vocab_size")
    head_dim, hidden = d // heads, _hidden(t)
    positions = _get(t, "max_positions") or _get(t, "context")
    out = [
        _same("token_embedding.embeddings", "transformer.wte.weight", (vocab, d)),
        _same("position_embedding.embeddings", "transformer.wpe.weight", (positions, d)),
    ]
    for i in range(_get(t, "layers")):
        h, b = f"transformer.h.{i}", f"block_{i}"
        qkv = tuple(f"{b}.attention.{part}" for part in ("query", "key", "value"))
        out += [
            _same(f"{b}.ln_1.gamma", f"{h}.ln_1.weight", (d,)),
            _same(f"{b}.ln_1.beta", f"{h}.ln_1.bias", (d,)),
            _fused(tuple(f"{p}.kernel" for p in qkv), f"{h}.attn.c_attn.weight", (d, 3 * d), heads),
            _fused(tuple(f"{p}.bias" for p in qkv), f"{h}.attn.c_attn.bias", (3 * d,), heads),
            _reshaped(
                f"{b}.attention.proj.kernel",
                f"{h}.attn.c_proj.weight",
                (d, d),
                (heads, head_dim, d),
                False,
            ),
            _same(f"{b}.attention.proj.bias", f"{h}.attn.c_proj.bias", (d,)),
            _same(f"{b}.ln_2.gamma", f"{h}.ln_2.weight", (d,)),
            _same(f"{b}.ln_2.beta", f"{h}.ln_2.bias", (d,)),
            _same(f"{b}.mlp.fc.kernel", f"{h}.mlp.c_fc.weight", (d, hidden)),
            _same(f"{b}.mlp.fc.bias", f"{h}.mlp.c_fc.bias", (hidden,)),
            _same(f"{b}.mlp.proj.kernel", f"{h}.mlp.c_proj.weight", (hidden, d)),
            _same(f"{b}.mlp.proj.bias", f"{h}.mlp.c_proj.bias", (d,)),
        ]
    out += [
        _same("ln_f.gamma", "transformer.ln_f.weight", (d,)),
        _same("ln_f.beta", "transformer.ln_f.bias", (d,)),
    ]
    if not _get(t, "tie_embeddings"):
        out.append(_transposed("head.kernel", "lm_head.weight", (vocab, d)))
    return out


def _fused(paths: tuple[str, ...], hf: str, shape: tuple[int, ...], heads: int) -> Mapping:
    """GPT-2's c_attn: query, key and value side by side on the last dim, each split to heads."""
    d = shape[-1] // 3

    def to_dtcli(a: np.ndarray) -> list[np.ndarray]:
        return [part.reshape(*a.shape[:-1], heads, d // heads) for part in np.split(a, 3, axis=-1)]

    def to_hf(arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate([a.reshape(*a.shape[:-2], d) for a in arrays], axis=-1)

    return Mapping(hf, shape, paths, to_dtcli, to_hf)


def _llama(t: Any) -> list[Mapping]:
    d, heads, vocab = _get(t, "d_model"), _get(t, "heads"), _get(t, "vocab_size")
    kv, hidden = _get(t, "kv_heads") or heads, _hidden(t)
    head_dim = d // heads
    out = [_same("token_embedding.embeddings", "model.embed_tokens.weight", (vocab, d))]
    for i in range(_get(t, "layers")):
        h, b = f"model.layers.{i}", f"block_{i}"
        a = f"{b}.attention"
        out += [
            _same(f"{b}.ln_1.gamma", f"{h}.input_layernorm.weight", (d,)),
            _reshaped(
                f"{a}.query.kernel",
                f"{h}.self_attn.q_proj.weight",
                (heads * head_dim, d),
                (d, heads, head_dim),
                True,
            ),
            _reshaped(
                f"{a}.key.kernel",
                f"{h}.self_attn.k_proj.weight",
                (kv * head_dim, d),
                (d, kv, head_dim),
                True,
            ),
            _reshaped(
                f"{a}.value.kernel",
                f"{h}.self_attn.v_proj.weight",
                (kv * head_dim, d),
                (d, kv, head_dim),
                True,
            ),
            _reshaped(
                f"{a}.proj.kernel",
                f"{h}.self_attn.o_proj.weight",
                (d, heads * head_dim),
                (heads, head_dim, d),
                True,
            ),
            _same(f"{b}.ln_2.gamma", f"{h}.post_attention_layernorm.weight", (d,)),
            _transposed(f"{b}.mlp.gate.kernel", f"{h}.mlp.gate_proj.weight", (hidden, d)),
            _transposed(f"{b}.mlp.fc.kernel", f"{h}.mlp.up_proj.weight", (hidden, d)),
            _transposed(f"{b}.mlp.proj.kernel", f"{h}.mlp.down_proj.weight", (d, hidden)),
        ]
    out.append(_same("ln_f.gamma", "model.norm.weight", (d,)))
    if not _get(t, "tie_embeddings"):
        out.append(_transposed("head.kernel", "lm_head.weight", (vocab, d)))
    return out


def file_names(model_type: str, names: list[str]) -> dict[str, str]:
    """The checkpoint's tensor names by the canonical name `mappings` uses: GPT-2's without
    the `transformer.` prefix too (as the hub's gpt2 ships them). Buffers are left out."""
    found = {}
    for name in names:
        if name.endswith(IGNORED_SUFFIXES):
            continue
        canonical = name
        if model_type == "gpt2" and not name.startswith(("transformer.", "lm_head.")):
            canonical = f"transformer.{name}"
        found[canonical] = name
    return found


def check_tensors(
    model_type: str, transformer: Any, entries: dict[str, Any], folder: Any
) -> dict[str, str]:
    """A folder's tensors (`entries`: name -> safetensors_io.Entry, headers only) against those
    its config implies: each present with its shape, none left over (a tied head saved anyway,
    as some savers write it, is the embedding again and let be). One line naming the first
    that disagrees. Returns the file's name of each canonical name (file_names)."""
    found = file_names(model_type, list(entries))
    implied = {m.hf: m.hf_shape for m in mappings(model_type, transformer)}
    tied = (_get(transformer, "vocab_size"), _get(transformer, "d_model"))
    for canonical, name in found.items():  # in the files' order
        entry = entries[name]
        if canonical not in implied:
            if canonical == "lm_head.weight" and entry.shape == tied:
                continue
            raise UsageError(
                f"{entry.file}: tensor {name!r} is not part of a {model_type} model of its "
                "config.json"
            )
        if entry.shape != implied[canonical]:
            raise UsageError(
                f"{entry.file}: tensor {name!r} has shape {list(entry.shape)}; config.json "
                f"implies {list(implied[canonical])}"
            )
    missing = [name for name in implied if name not in found]
    if missing:
        raise UsageError(
            f"{folder}: has no tensor {missing[0]!r}, which its config.json implies "
            f"({len(missing)} missing)"
        )
    return found
