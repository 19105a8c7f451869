"""Hugging Face weights into dtcli's GPT on a mesh, tensor by tensor, and out of it.

Import (`check_files`, then `assign`): every tensor of the model folder is checked against what
the config implies (names, shapes) before anything is built, then read one at a time, mapped
(dtcli.hf.names), its vocabulary rows padded with zeros to the model's, and each shard packed
onto its device: never the whole model on the host, never a full copy per device. Export
(`hf_tensors`): each Hugging Face tensor made from the dtcli weights it needs, gathered one at a
time, the padded vocabulary rows sliced off; a GPT-2 without biases gets zero biases.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from dtcli.errors import UsageError
from dtcli.hf import names as names_lib
from dtcli.hf.config import HfConfig
from dtcli.hf.safetensors_io import ModelFiles


def check_files(hf: HfConfig, files: ModelFiles) -> dict[str, str]:
    """The folder's tensors against the config (hf.names.check_tensors); the file's name of
    each mapped tensor."""
    return names_lib.check_tensors(hf.model_type, hf.transformer, files.entries, hf.folder)


def _padded(value: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """A weight with the vocabulary's padded rows (or head columns) added as zeros."""
    if tuple(value.shape) == tuple(shape):
        return value
    out = np.zeros(shape, np.float32)
    out[tuple(slice(0, n) for n in value.shape)] = value
    return out


def assign(
    built: Any,
    hf: HfConfig,
    files: ModelFiles,
    by_name: dict[str, str],
    place: Callable[[np.ndarray, Any], Any],
) -> None:
    """Every weight of `built` (models.Built) set from the folder's tensors, one tensor at a
    time; `place(value, variable)` puts a host value onto the variable's layout."""
    shapes = {w.path: tuple(w.shape) for w in built.weights}
    for m in names_lib.mappings(hf.model_type, hf.transformer):
        values = m.to_dtcli(files.read(by_name[m.hf]))
        for path, value in zip(m.paths, values):
            if path not in built.variables:
                raise UsageError(f"model.transformer: the model has no weight {path!r}")
            var = built.variables[path]
            var.assign(place(_padded(value, shapes[path]), var))
        del values


def load_folder(built: Any, folder: str, place: Callable[[np.ndarray, Any], Any]) -> None:
    """A Hugging Face model folder's weights into `built` (model.from_hf: a new run's step 0)."""
    from dtcli.hf import config as hf_config

    hf = hf_config.read(folder, "recipe key 'model.from_hf'")
    files = ModelFiles(hf.folder, "recipe key 'model.from_hf'")
    assign(built, hf, files, check_files(hf, files), place)


def hf_tensors(
    model_type: str,
    transformer: Any,
    vocab_size: int,
    read_weight: Callable[[str], np.ndarray],
    has_weight: Callable[[str], bool],
) -> tuple[list[tuple[str, tuple[int, ...]]], Callable[[str], np.ndarray]]:
    """The tensors of an export, (name, shape) in transformers' order, and a function that makes
    each from the dtcli weights (`read_weight(path)`: one weight on the host at its own shape).
    `vocab_size`: the exported vocabulary (the model's rows beyond it are sliced off)."""
    keys = with_vocab(transformer, vocab_size)
    maps = {m.hf: m for m in names_lib.mappings(model_type, keys)}

    def produce(name: str) -> np.ndarray:
        m = maps[name]
        if not all(has_weight(p) for p in m.paths):  # a GPT-2 without biases: zero biases
            return np.zeros(m.hf_shape, np.float32)
        parts = [_vocab_sliced(read_weight(p), p, vocab_size) for p in m.paths]
        return m.to_hf(parts)

    return [(m.hf, m.hf_shape) for m in maps.values()], produce


def with_vocab(transformer: Any, vocab_size: int) -> dict[str, Any]:
    """The model.transformer keys hf.names maps by, with the exported vocabulary's size."""
    keys = {
        k: getattr(transformer, k, None)
        for k in ("layers", "d_model", "heads", "kv_heads", "mlp_hidden", "mlp_ratio", "context")
    }
    keys.update(
        max_positions=getattr(transformer, "max_positions", None),
        tie_embeddings=transformer.tie_embeddings,
        vocab_size=vocab_size,
    )
    return keys


def _vocab_sliced(value: np.ndarray, path: str, vocab_size: int) -> np.ndarray:
    if path == "token_embedding.embeddings":
        return value[:vocab_size]
    if path == "head.kernel":
        return value[:, :vocab_size]
    return value
