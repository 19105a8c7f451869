"""LoRA (`lora:`): low-rank adapters beside the GPT's kernels, the base weights frozen.

For each kernel at PATH.kernel whose path `lora.targets` finds (re.search) two weights join the
model, in the kernel's layer (so after the kernel in the weight list): PATH.lora_a of shape
[the kernel's input dims..., rank] and PATH.lora_b of shape [rank, the kernel's output dims...].
A Dense kernel [in, out] has A [in, r] and B [r, out]; the attention's query/key/value kernels
[d_model, heads, head_dim] have A [d_model, r] and B [r, heads, head_dim]; attention.proj
[heads, head_dim, d_model] has A [heads, head_dim, r] and B [r, d_model]. The layer computes
base(x) + alpha / rank * ((dropout(x) . A) . B), contracting x's last input dims with A's first.
B starts at zero (the step-0 model is the base, bit for bit); A as peft's kaiming-uniform:
uniform(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in the product of the input dims.

Only kernels of Dense and EinsumDense layers are adapted: biases, norm scales and embeddings
never (a regex that finds only those is refused, as one that finds nothing, naming the kernels).
Every other weight is frozen (not trainable: no gradient, no optimizer slot) and, with
`lora.base_precision: bf16`, stored in bfloat16.

Layouts follow the base kernel's plan (`adapter_plan`): A's input dims take the kernel's input
dims' sharding and r is unsharded; B's output dims take the kernel's output dims' sharding. A
column-parallel kernel ([-, model] or [-, model, -]) so has A replicated and B split like its
output; a row-parallel one ([model, -], [model, -, -]) A split like its input and B replicated.
Layout rules never match an adapter themselves; layouts.fsdp then shards adapters as any
trainable weight (their largest dim the data axis divides; r only where nothing else does).

This module needs no TensorFlow but where it says so (`tracker`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dtcli.errors import UsageError
from dtcli.layout import WeightInfo, WeightPlan
from dtcli.mesh import UNSHARDED
from dtcli.recipe import LoraConfig

# The layer classes whose kernels LoRA adapts (dtcli's GPT's matmul layers).
KERNEL_LAYERS = ("Dense", "EinsumDense")
ADAPTERS = ("lora_a", "lora_b")
# The attention's output projection reads two input dims (heads, head_dim).
_TWO_INPUT_DIMS = re.compile(r"(^|\.)attention\.proj\.kernel$")
# The dtype names of lora.base_precision.
BASE_DTYPES = {"float32": "float32", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Adapter:
    """The two adapters of one kernel."""

    kernel: str  # the kernel's path (PATH.kernel)
    shape: tuple[int, ...]  # the kernel's shape
    inputs: int  # how many of the kernel's leading dims are its input dims
    rank: int
    scale: float  # alpha / rank
    dropout: float

    @property
    def prefix(self) -> str:
        return self.kernel[: -len(".kernel")]

    @property
    def a_path(self) -> str:
        return f"{self.prefix}.lora_a"

    @property
    def b_path(self) -> str:
        return f"{self.prefix}.lora_b"

    @property
    def a_shape(self) -> tuple[int, ...]:
        return (*self.shape[: self.inputs], self.rank)

    @property
    def b_shape(self) -> tuple[int, ...]:
        return (self.rank, *self.shape[self.inputs :])

    @property
    def fan_in(self) -> int:
        return math.prod(self.shape[: self.inputs])


def is_kernel(w: WeightInfo) -> bool:
    """Whether LoRA can adapt the weight: a kernel of a Dense or EinsumDense layer."""
    return w.layer in KERNEL_LAYERS and w.path.endswith(".kernel")


def is_adapter(path: str) -> bool:
    return path.rsplit(".", 1)[-1] in ADAPTERS


def kernel_of(path: str) -> str:
    """The kernel an adapter's path belongs to."""
    return f"{path.rsplit('.', 1)[0]}.kernel"


def input_dims(path: str) -> int:
    """How many leading dims of the kernel at `path` its input contracts with."""
    return 2 if _TWO_INPUT_DIMS.search(path) else 1


def adapters(cfg: LoraConfig, weights: list[WeightInfo]) -> dict[str, Adapter]:
    """The adapters of the kernels `cfg.targets` finds among `weights` (the base model's), by
    kernel path; refused in one line where it finds no kernel or the rank does not fit one."""
    found = re.compile(cfg.targets)
    kernels = [w for w in weights if is_kernel(w)]
    matched = [w for w in kernels if found.search(w.path)]
    if not matched:
        others = [w.path for w in weights if found.search(w.path)]
        what = (
            f"finds only {_names(others)}, which LoRA does not adapt (it adapts kernels, never "
            "biases, norm scales or embeddings)"
            if others
            else "finds none of the model's weights"
        )
        raise UsageError(
            f"recipe key 'lora.targets': {cfg.targets!r} {what}; the kernels are "
            f"{_names([w.path for w in kernels])}"
        )
    out = {}
    for w in matched:
        n = input_dims(w.path)
        adapter = Adapter(w.path, tuple(w.shape), n, cfg.rank, cfg.alpha / cfg.rank, cfg.dropout)
        for side, dims in (("input", w.shape[:n]), ("output", w.shape[n:])):
            if cfg.rank > math.prod(dims):
                raise UsageError(
                    f"recipe key 'lora.rank': {cfg.rank} is larger than the {side} size "
                    f"{math.prod(dims)} (dims {list(dims)}) of weight '{w.path}'; use a rank "
                    f"of at most {_smallest(matched)} or leave that kernel out of lora.targets"
                )
        out[w.path] = adapter
    return out


def _smallest(kernels: list[WeightInfo]) -> int:
    """The largest rank every kernel in `kernels` takes."""
    n = [input_dims(w.path) for w in kernels]
    return min(min(math.prod(w.shape[:k]), math.prod(w.shape[k:])) for w, k in zip(kernels, n))


def _names(paths: list[str]) -> str:
    """Weight paths for a message: those of block_0 stand for every block's."""
    blocks = {m.group(1) for p in paths if (m := re.match(r"block_(\d+)\.", p))}
    shown = [p for p in paths if not re.match(r"block_(?!0\.)\d+\.", p)]
    text = ", ".join(shown)
    if len(blocks) > 1:
        text += f" (block_0's as in each of the {len(blocks)} blocks)"
    return text


def with_adapters(
    weights: list[WeightInfo], found: Mapping[str, Adapter], base_precision: str
) -> list[WeightInfo]:
    """The model's weights with LoRA: every base weight frozen (in the dtype of
    `base_precision`), each adapted kernel followed by its adapters (trainable, float32), in the
    order the built model lists them (the layer's attributes sorted: kernel, lora_a, lora_b)."""
    dtype = BASE_DTYPES[base_precision]
    out = []
    for w in weights:
        out.append(replace(w, trainable=False, dtype=dtype))
        adapter = found.get(w.path)
        if adapter is not None:
            out.append(WeightInfo(adapter.a_path, adapter.a_shape, w.layer))
            out.append(WeightInfo(adapter.b_path, adapter.b_shape, w.layer))
    return out


def adapter_plan(w: WeightInfo, kernel: WeightPlan) -> WeightPlan:
    """Where an adapter lives: its dims as the base kernel's plan shards them, r unsharded
    (see the module's docstring); the kernel's rule stands for it."""
    n = input_dims(kernel.weight.path)
    if w.path.endswith(".lora_a"):
        spec = (*kernel.spec[:n], UNSHARDED)
    else:
        spec = (UNSHARDED, *kernel.spec[n:])
    return WeightPlan(w, kernel.rule, spec)


def with_adapter_plans(weights: list[WeightInfo], plan_base: Any) -> list[WeightPlan]:
    """`plan_base(base weights) -> plans` (the layout rules) applied to the base weights, each
    adapter planned from its kernel's plan; the plans in `weights`' order."""
    base = [w for w in weights if not is_adapter(w.path)]
    planned = {p.weight.path: p for p in plan_base(base)}
    return [
        adapter_plan(w, planned[kernel_of(w.path)]) if is_adapter(w.path) else planned[w.path]
        for w in weights
    ]


def tracker(variables: Mapping[str, Any]) -> Any:
    """What a LoRA checkpoint holds of the model: a tf.Module tracking the adapters by path
    (checkpoint keys lora/adapters/PATH), never the base."""
    import tensorflow as tf

    module = tf.Module(name="lora")
    module.adapters = {p: v for p, v in variables.items() if is_adapter(p)}
    return module
