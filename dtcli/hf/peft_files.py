"""PEFT LoRA adapter folders (adapter_config.json + adapter_model.safetensors) and dtcli's
adapters, each way, and an adapter folded into its kernel.

dtcli's adapter of a kernel PATH.kernel is PATH.lora_a [the kernel's input dims..., r] and
PATH.lora_b [r, the kernel's output dims...], scale alpha / r. peft's of a transformers module M
is `base_model.model.M.lora_A.weight` [r, in] and `.lora_B.weight` [out, r] whatever M is (a
Linear [out, in], or GPT-2's Conv1D [in, out]: fan_in_fan_out says how the base weight lies, not
the adapter). So each is the other flattened and transposed; the input and output dims flatten
in the order the kernel's own do to and from the Hugging Face weight (hf.names). The head's
output is the config's vocabulary: the model's padded columns are sliced off on the way out and
added as zeros on the way in.

GPT-2's query, key and value are one module, c_attn. An export writes, for the k of q/k/v a
block adapts, one c_attn adapter of rank k*r: A stacked [k*r, d], B block diagonal [3d, k*r]
(the rows of a projection not adapted are zero), with rank_pattern k*r and alpha_pattern
k*alpha so that its scale stays alpha/r. A c_attn adapter read back splits where it is either
of: rank r, A shared by q/k/v (what peft trains with target_modules ["c_attn"]): each adapted
projection gets a copy of A and its own rows of B, the same product exactly (the copies train
apart from then on); or rank k*r with B block diagonal: each projection its block. Anything else
is refused in one line, and so are nonzero rows of B for a projection lora.targets leaves alone.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dtcli.errors import UsageError
from dtcli.hf import names, safetensors_io

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"
# peft saves a PeftModel's tensors under its wrapper's attribute path, the adapter's name left out.
PREFIX = "base_model.model."
# peft's default lora_alpha, for a config without one.
DEFAULT_ALPHA = 8


@dataclass(frozen=True)
class Module:
    """A transformers module LoRA can adapt, and the dtcli kernels it holds."""

    name: str  # e.g. transformer.h.0.attn.c_attn
    kernels: tuple[str, ...]  # in the order of the module's output (c_attn: query, key, value)
    in_size: int
    out_size: int  # the config's vocabulary for the head


def modules(model_type: str, transformer: Any) -> list[Module]:
    """Every kernel-holding module of a Hugging Face model of these keys (hf.names.mappings'
    keys: vocab_size the config's), in transformers' order."""
    out = []
    for m in names.mappings(model_type, transformer):
        if not m.paths[0].endswith(".kernel"):
            continue
        name = m.hf.removesuffix(".weight")
        conv1d = model_type == "gpt2" and name != "lm_head"  # [in, out], not Linear's [out, in]
        in_size, out_size = m.hf_shape if conv1d else m.hf_shape[::-1]
        out.append(Module(name, m.paths, in_size, out_size))
    return out


def adapter_paths(kernel: str) -> tuple[str, str]:
    """The dtcli paths of a kernel's adapters: PATH.lora_a, PATH.lora_b."""
    stem = kernel.removesuffix("kernel")
    return f"{stem}lora_a", f"{stem}lora_b"


def tensor_names(module: str) -> tuple[str, str]:
    """peft's names of a module's A and B in adapter_model.safetensors."""
    return f"{PREFIX}{module}.lora_A.weight", f"{PREFIX}{module}.lora_B.weight"


def merged(kernel: np.ndarray, a: np.ndarray, b: np.ndarray, scale: float) -> np.ndarray:
    """The kernel with its adapter folded in: kernel + scale * A @ B over the rank, float32 as
    peft merges."""
    delta = np.tensordot(a.astype(np.float32), b.astype(np.float32), axes=1)
    return (kernel + np.float32(scale) * delta).astype(np.float32)


def to_peft(
    model_type: str,
    transformer: Any,
    adapters: Mapping[str, np.ndarray],
    lora: Any,
    base: str | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """dtcli's adapters (by path) as peft's tensors (by name, in the model's order) and
    adapter_config.json's content; `lora` holds rank, alpha and dropout, `base` is the base
    model's folder (base_model_name_or_path)."""
    rank, alpha = lora.rank, float(lora.alpha)
    tensors: dict[str, np.ndarray] = {}
    targets: list[str] = []
    rank_pattern: dict[str, int] = {}
    alpha_pattern: dict[str, float] = {}
    for module in modules(model_type, transformer):
        adapted = [k for k in module.kernels if adapter_paths(k)[0] in adapters]
        if not adapted:
            continue
        part_out = module.out_size // len(module.kernels)
        a_rows = []
        b = np.zeros((module.out_size, len(adapted) * rank), np.float32)
        for i, kernel in enumerate(adapted):
            path_a, path_b = adapter_paths(kernel)
            a_rows.append(adapters[path_a].reshape(-1, rank).T)
            j = module.kernels.index(kernel)
            block = adapters[path_b].reshape(rank, -1).T[:part_out]  # the head's padding off
            b[j * part_out : (j + 1) * part_out, i * rank : (i + 1) * rank] = block
        name_a, name_b = tensor_names(module.name)
        tensors[name_a] = np.concatenate(a_rows).astype(np.float32)
        tensors[name_b] = b
        targets.append(module.name)
        if len(adapted) > 1:
            rank_pattern[module.name] = len(adapted) * rank
            alpha_pattern[module.name] = len(adapted) * alpha
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": float(lora.dropout),
        "target_modules": targets,
        "fan_in_fan_out": model_type == "gpt2",
        "rank_pattern": rank_pattern,
        "alpha_pattern": alpha_pattern,
        "bias": "none",
        "use_rslora": False,
        "use_dora": False,
        "init_lora_weights": True,
        "modules_to_save": None,
        "inference_mode": True,
    }
    return tensors, config


def write(folder: Path, tensors: Mapping[str, np.ndarray], config: Mapping[str, Any]) -> None:
    """adapter_config.json and adapter_model.safetensors (float32) into `folder`."""
    folder = Path(folder)
    (folder / CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    order = [(n, tuple(a.shape), int(a.size) * 4) for n, a in tensors.items()]
    safetensors_io.write_file(folder / WEIGHTS, order, tensors.__getitem__, "F32")


def read(folder: Path, arg: str = "lora.from_peft") -> tuple[dict[str, np.ndarray], dict]:
    """A peft adapter folder's tensors (float32) and adapter_config.json; one line naming `arg`
    where it is no such folder."""
    folder = Path(folder)
    where = f"{arg} {str(folder)!r}"
    if not folder.is_dir():
        raise UsageError(
            f"{where}: no such folder (expected a peft adapter folder: {CONFIG}, {WEIGHTS})"
        )
    if not (folder / CONFIG).is_file():
        raise UsageError(f"{where}: has no {CONFIG} (expected a peft adapter folder)")
    if not (folder / WEIGHTS).is_file():
        raise UsageError(f"{where}: has no {WEIGHTS} (dtcli reads safetensors adapters only)")
    try:
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        raise UsageError(f"{where}: its {CONFIG} is no JSON") from None
    if not isinstance(config, dict):
        raise UsageError(f"{where}: its {CONFIG} is no JSON object")
    entries = safetensors_io.read_header(folder / WEIGHTS)
    return {n: safetensors_io.read_tensor(e, n) for n, e in entries.items()}, config


def from_peft(
    model_type: str,
    transformer: Any,
    tensors: Mapping[str, np.ndarray],
    config: Mapping[str, Any],
    shapes: Mapping[str, tuple[int, ...]],
    lora: Any,
    where: str = "lora.from_peft",
) -> dict[str, np.ndarray]:
    """A peft adapter (`read`'s tensors and config) as dtcli's adapters of the shapes given
    (`shapes`: each adapter path the model has, lora.targets' kernels'); `lora` holds the
    recipe's rank and alpha. One line naming `where` for what cannot map: other adapted
    modules, another rank or scale, a kind of adapter dtcli has not (DoRA, rsLoRA, biases)."""
    _check_kind(config, where)
    found = _by_module(model_type, transformer, tensors, where)
    out: dict[str, np.ndarray] = {}
    for module in modules(model_type, transformer):
        adapted = [k for k in module.kernels if adapter_paths(k)[0] in shapes]
        if module.name not in found and not adapted:
            continue
        if module.name not in found:
            raise UsageError(
                f"{where}: has no adapter of {module.name} (dtcli's {adapted[0]}), which "
                "lora.targets adapts"
            )
        if not adapted:
            raise UsageError(
                f"{where}: adapts {module.name}, whose kernels lora.targets does not match "
                f"({', '.join(module.kernels)})"
            )
        a, b = found[module.name]
        _check_shapes(module, a, b, where)
        _check_scale(module.name, a.shape[0], _alpha(config, module.name), lora, where)
        out.update(_split(module, adapted, a, b, shapes, lora.rank, where))
    return out


def _check_kind(config: Mapping[str, Any], where: str) -> None:
    if config.get("peft_type") != "LORA":
        raise UsageError(
            f"{where}: its {CONFIG} has peft_type {config.get('peft_type')!r}; dtcli reads LORA"
        )
    for key in ("use_dora", "use_rslora", "lora_bias"):
        if config.get(key):
            raise UsageError(f"{where}: its {CONFIG} sets {key}, which dtcli's LoRA has not")
    if config.get("bias", "none") != "none":
        raise UsageError(
            f"{where}: its {CONFIG} has bias {config.get('bias')!r} (trained biases); dtcli's "
            "LoRA adapts kernels only (bias 'none')"
        )


def _by_module(
    model_type: str, transformer: Any, tensors: Mapping[str, np.ndarray], where: str
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The file's A and B by module name; a tensor that is neither, or of no kernel, refused."""
    known = {m.name for m in modules(model_type, transformer)}
    halves: dict[str, dict[str, np.ndarray]] = {}
    for name, array in tensors.items():
        match = re.fullmatch(rf"{re.escape(PREFIX)}(.+)\.lora_([AB])\.weight", name)
        if not match:
            raise UsageError(
                f"{where}: tensor {name!r} is no LoRA A or B of a module (dtcli's LoRA adapts "
                "kernels only)"
            )
        module, half = match.groups()
        if module not in known:
            raise UsageError(
                f"{where}: tensor {name!r} adapts {module}, which is no kernel of a "
                f"{model_type} model of this config"
            )
        halves.setdefault(module, {})[half] = array
    for module, pair in halves.items():
        if len(pair) != 2:
            missing = "B" if "A" in pair else "A"
            raise UsageError(f"{where}: has no lora_{missing} of {module}")
    return {module: (pair["A"], pair["B"]) for module, pair in halves.items()}


def _check_shapes(module: Module, a: np.ndarray, b: np.ndarray, where: str) -> None:
    r = a.shape[0]
    if a.shape != (r, module.in_size) or b.shape != (module.out_size, r):
        raise UsageError(
            f"{where}: {module.name}'s lora_A {list(a.shape)} and lora_B {list(b.shape)} do "
            f"not fit the base, expected [r, {module.in_size}] and [{module.out_size}, r]"
        )


def _alpha(config: Mapping[str, Any], module: str) -> float:
    """A module's lora_alpha as peft finds it: the first alpha_pattern key that ends its name
    (peft's get_pattern_key), else lora_alpha."""
    for key, value in (config.get("alpha_pattern") or {}).items():
        if re.match(rf"(.*\.)?({key})$", module):
            return float(value)
    return float(config.get("lora_alpha", DEFAULT_ALPHA))


def _check_scale(module: str, r: int, alpha: float, lora: Any, where: str) -> None:
    want = float(lora.alpha) / lora.rank
    if not math.isclose(alpha / r, want, rel_tol=1e-6):
        raise UsageError(
            f"{where}: {module}'s scale is lora_alpha/r = {alpha:g}/{r} = {alpha / r:g}; the "
            f"recipe's lora.alpha/lora.rank is {lora.alpha:g}/{lora.rank} = {want:g}"
        )


def _split(
    module: Module,
    adapted: list[str],
    a: np.ndarray,
    b: np.ndarray,
    shapes: Mapping[str, tuple[int, ...]],
    rank: int,
    where: str,
) -> dict[str, np.ndarray]:
    """One module's A [R, in] and B [out, R] as the adapters of its adapted kernels: A shared
    (R == rank) or one block each (R == rank * len(adapted)); what B holds outside the blocks
    used must be zero."""
    r = a.shape[0]
    if r == rank:
        columns = [slice(0, rank)] * len(adapted)
    elif r == rank * len(adapted):
        columns = [slice(i * rank, (i + 1) * rank) for i in range(len(adapted))]
    else:
        expected = f"{rank}" + (f" or {rank * len(adapted)}" if len(adapted) > 1 else "")
        raise UsageError(f"{where}: {module.name}'s rank is {r}; lora.rank makes it {expected}")
    part_out = module.out_size // len(module.kernels)
    used = np.zeros(b.shape, bool)
    out = {}
    for kernel, cols in zip(adapted, columns):
        j = module.kernels.index(kernel)
        rows = slice(j * part_out, (j + 1) * part_out)
        used[rows, cols] = True
        path_a, path_b = adapter_paths(kernel)
        out[path_a] = a[cols].T.reshape(shapes[path_a]).astype(np.float32)
        flat = np.zeros((rank, math.prod(shapes[path_b][1:])), np.float32)
        flat[:, :part_out] = b[rows, cols].T  # the head's padded columns stay zero
        out[path_b] = flat.reshape(shapes[path_b])
    if np.any(b[~used]):
        raise UsageError(
            f"{where}: {module.name}'s lora_B changes outputs of projections lora.targets does "
            f"not adapt, or is not block diagonal ({len(adapted)} of {len(module.kernels)} "
            "adapted)"
        )
    return out
