"""Layout rules -> per-weight sharding specs (pure), and DTensor Layout objects (lazy TF)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any

from dtcli.errors import UsageError
from dtcli.mesh import UNSHARDED, mesh_text


@dataclass(frozen=True)
class WeightInfo:
    """A weight as the model declares it, before any device is involved."""

    path: str  # "dense_0.kernel" (Sequential/Functional), "encoder.kernel" (subclassed)
    shape: tuple[int, ...]
    layer: str = ""  # the layer class that owns it ("Dense", "Conv2D"), for rule checks
    trainable: bool = True
    # How it is stored: float32, or bfloat16 (a LoRA run's frozen base, lora.base_precision).
    dtype: str = "float32"

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self.dtype]


_ITEMSIZE = {"float32": 4, "bfloat16": 2}


@dataclass(frozen=True)
class WeightPlan:
    """Where one weight lives on the mesh."""

    weight: WeightInfo
    rule: str | None  # the rule that matched, None for "replicated: no rule"
    spec: tuple[str, ...]  # one entry per dim: a mesh axis or "unsharded"
    fsdp: bool = False  # layouts.fsdp sharded one more dim on the data axis
    # The shape the weight is stored in on the mesh where layouts.fsdp pads it (its FSDP dim
    # rounded up to a multiple of the data axis, as PyTorch's FSDP2 pads a shard; the layer
    # slices the padding off after the gather); None: its own shape.
    padded: tuple[int, ...] | None = None
    # Why layouts.fsdp left the weight as the rules put it ("": it did not, or fsdp is off).
    fsdp_kept: str = ""

    @property
    def stored_shape(self) -> tuple[int, ...]:
        """The weight's shape on the mesh: its own, or padded (see `padded`)."""
        return self.padded or self.weight.shape

    def shard_shape(self, axes: dict[str, int]) -> tuple[int, ...]:
        return tuple(
            d if s == UNSHARDED else d // axes[s] for d, s in zip(self.stored_shape, self.spec)
        )

    def bytes_per_device(self, axes: dict[str, int], itemsize: int | None = None) -> int:
        """The bytes of its shard on one device, in its own dtype (or `itemsize` bytes each)."""
        return math.prod(self.shard_shape(axes)) * (itemsize or self.weight.itemsize)


def match_rule(rules: dict[str, list[str]], path: str) -> str | None:
    """The first rule matching `path`, with tf-keras LayoutMap's semantics (exact key, re.match)."""
    if path in rules:
        return path
    for pattern in rules:
        if re.match(pattern, path):
            return pattern
    return None


# Layers whose kernels DTensor cannot shard ("Filter for convolution must have fully
# replicated layout").
_CONV_LAYERS = re.compile(r"(Depthwise|Separable)?Conv[123]D(Transpose)?$")


def plan_weights(
    rules: dict[str, list[str]], weights: list[WeightInfo], axes: dict[str, int]
) -> list[WeightPlan]:
    """Apply the rules to every weight and check that each resulting layout can work."""
    plans = []
    for w in weights:
        rule = match_rule(rules, w.path)
        if rule is None:
            plans.append(WeightPlan(w, None, (UNSHARDED,) * len(w.shape)))
            continue
        spec = tuple(rules[rule])
        key = f"layouts.rules.{rule}"
        if len(spec) != len(w.shape):
            raise UsageError(
                f"recipe key '{key}': gives {len(spec)} dims but weight '{w.path}' has rank "
                f"{len(w.shape)} (shape {list(w.shape)})"
            )
        for axis in spec:
            if axis != UNSHARDED and axis not in axes:
                raise UsageError(
                    f"recipe key '{key}': axis '{axis}' is not in the mesh {mesh_text(axes)} "
                    f"(add {axis}=1 to the mesh to keep the rule without sharding)"
                )
        if _is_conv_kernel(w) and any(s != UNSHARDED for s in spec):
            raise UsageError(
                f"recipe key '{key}': shards convolution kernel '{w.path}', but DTensor needs "
                "convolution filters fully replicated; shard the Dense layers and the batch instead"
            )
        for dim, (size, axis) in enumerate(zip(w.shape, spec)):
            if axis != UNSHARDED and size % axes[axis]:
                why = _heads_hint(w.path, dim, size, axis, axes[axis])
                raise UsageError(
                    f"recipe key '{key}': dim {dim} of weight '{w.path}' has size {size}, "
                    f"which does not divide by mesh axis '{axis}' of size {axes[axis]}{why}"
                )
        plans.append(WeightPlan(w, rule, spec))
    return plans


def apply_fsdp(
    plans: list[WeightPlan],
    data_axis: str,
    axes: dict[str, int],
    gathers: bool = True,
    pads: bool = False,
) -> list[WeightPlan]:
    """layouts.fsdp: each weight's largest dim that the rules leave unsharded and the data axis
    divides is sharded on the data axis too (the first such dim on a tie); a weight a rule put
    on the data axis already stays as it is, and one FSDP cannot shard says why (`fsdp_kept`).

    `gathers`: the model's layers gather each weight to its compute layout themselves
    (dtcli's GPT and Core MLP, models/compute.py) and so take any weight on any mix of axes.
    tf-keras layers read their variables as they are, and DTensor's matmul and einsum
    expanders gather a kernel split on one axis only: there FSDP shards only the matmul
    weights (kernels, and embedding tables off their rows) that the rules leave unsplit.
    `pads`: where no free dim divides, the largest is padded up to a multiple of the data axis
    (`WeightPlan.padded`; the layers slice the padding off after the gather: the Core MLP)."""
    size = axes.get(data_axis, 1)
    if size <= 1:
        return plans
    return [
        p if data_axis in p.spec else _fsdp_weight(p, data_axis, axes, gathers, pads) for p in plans
    ]


def _fsdp_weight(
    p: WeightPlan, data_axis: str, axes: dict[str, int], gathers: bool, pads: bool
) -> WeightPlan:
    """One weight under layouts.fsdp: sharded on the data axis (padded if `pads` needs to), or
    as the rules put it with the reason."""
    shape, size = p.weight.shape, axes[data_axis]
    kept = _fsdp_refusal(p, axes, gathers)
    if kept:
        return replace(p, fsdp_kept=kept)
    # A resource gather refuses a table split on its rows (DTENSOR_NOTES.md).
    rows_refused = not gathers and p.weight.layer == "Embedding"
    free = [d for d, a in enumerate(p.spec) if a == UNSHARDED and not (rows_refused and d == 0)]
    if not free:
        kept = "the rules split every dim" if shape else "a scalar"
        if rows_refused and p.spec[0] == UNSHARDED:
            kept = "a tf-keras embedding table (DTensor cannot gather from one split on its rows)"
        return replace(p, fsdp_kept=kept)
    dividing = [d for d in free if shape[d] % size == 0]
    dim = max(dividing or free, key=lambda d: (shape[d], -d))
    spec = tuple(data_axis if d == dim else a for d, a in enumerate(p.spec))
    if dividing:
        return replace(p, spec=spec, fsdp=True)
    if pads:
        stored = tuple(-(-n // size) * size if d == dim else n for d, n in enumerate(shape))
        return replace(p, spec=spec, fsdp=True, padded=stored)
    why = "a tf-keras layer cannot slice padding off" if not gathers else "dtcli's GPT pads none"
    return replace(p, fsdp_kept=f"no dim divides by {data_axis}={size} ({why})")


# The last part of the paths of the tf-keras weights a matmul, einsum or gather reads (DTensor's
# expanders gather them off the data axis); the others (biases, scales, statistics) are
# applied elementwise to activations that are split on the data axis by the batch.
_MATMUL_WEIGHT = re.compile(r"(^|\.)(\w*kernel|embeddings)$")
KERAS_ELEMENTWISE = (
    "a tf-keras bias or scale (applied elementwise to activations split on the data axis by "
    "the batch, DTensor can take the weight's split for them and fail)"
)


def _fsdp_refusal(p: WeightPlan, axes: dict[str, int], gathers: bool) -> str:
    """Why layouts.fsdp cannot shard this weight on the data axis at all ("": it can)."""
    if _is_conv_kernel(p.weight):
        return "a convolution kernel (DTensor needs convolution filters replicated)"
    if gathers:
        return ""
    if not _MATMUL_WEIGHT.search(p.weight.path):
        return KERAS_ELEMENTWISE
    others = [a for a in p.spec if a != UNSHARDED and axes[a] > 1]
    if others:
        return (
            f"split on '{others[0]}' by the rules (a tf-keras layer takes a weight split on one "
            "axis only)"
        )
    return ""


def _is_conv_kernel(w: WeightInfo) -> bool:
    return bool(_CONV_LAYERS.match(w.layer)) and w.path.endswith("kernel")


def check_fsdp_layers(plans: list[WeightPlan], data_axis: str, axes: dict[str, int]) -> None:
    """For models whose layers read their variables themselves (tf-keras layers, a user's
    model): a weight sharded on the data axis and on another axis at once fails inside DTensor
    (its matmul expanders refuse the mixed sharding), and so may a bias or scale on the data
    axis (mnist_cnn_2d's logits took the output bias's split and the accuracy's ArgMax failed);
    refused here, naming the rule. dtcli's own GPT and Core MLP gather such weights to their
    compute layout and take any mix."""
    for p in plans:
        if data_axis not in p.spec or axes[data_axis] <= 1:
            continue
        others = [a for a in p.spec if a not in (UNSHARDED, data_axis) and axes[a] > 1]
        if others:
            raise UsageError(
                f"recipe key 'layouts.rules.{p.rule}': shards weight '{p.weight.path}' on the "
                f"data axis '{data_axis}' and on '{others[0]}' at once, which DTensor runs only "
                "in dtcli's own models (model.transformer, model.api core); shard it on one of "
                "the two"
            )
        if not _MATMUL_WEIGHT.search(p.weight.path):
            raise UsageError(
                f"recipe key 'layouts.rules.{p.rule}': puts weight '{p.weight.path}' on the "
                f"data axis '{data_axis}', but it is {KERAS_ELEMENTWISE}; keep it replicated "
                "or split it on another axis"
            )


# dtcli.transformer's attention kernels: the dim that counts heads, by projection.
_HEADS_DIM = re.compile(r"\.attention\.(query|key|value|proj)\.kernel$")
_HEADS_DIM_INDEX = {"query": 1, "key": 1, "value": 1, "proj": 0}


def _heads_hint(path: str, dim: int, size: int, axis: str, devices: int) -> str:
    """Why a dim that counts attention heads cannot split: a head is never split (the
    key/value kernels count model.transformer.kv_heads)."""
    part = path.split(".")[-2]
    if not _HEADS_DIM.search(path) or dim != _HEADS_DIM_INDEX[part]:
        return ""
    if part in ("key", "value"):
        return (
            f" (it is the attention heads: {size} heads cannot be split over {devices} devices "
            f"without splitting a head; use a '{axis}' axis that divides "
            "model.transformer.kv_heads (default: heads), or, with fewer key/value heads than "
            "heads, split query alone and keep key and value replicated)"
        )
    return (
        f" (it is the attention heads: {size} heads cannot be split over {devices} devices "
        f"without splitting a head; use a '{axis}' axis that divides model.transformer.heads, "
        "or more heads)"
    )


def idle_axes(axes: dict[str, int], plans: list[WeightPlan], data_axis: str) -> list[str]:
    """Mesh axes of size > 1 that neither the batch nor any weight is split along: the devices
    along them all do the same work (most often a typo or a rule that matched nothing)."""
    used = {data_axis} | {a for p in plans for a in p.spec}
    return [a for a, size in axes.items() if size > 1 and a not in used]


def is_sharded(plan: WeightPlan, axes: dict[str, int]) -> bool:
    """Whether the weight is really split: along at least one axis of size > 1."""
    return any(a != UNSHARDED and axes[a] > 1 for a in plan.spec)


def unused_rules(rules: dict[str, list[str]], plans: list[WeightPlan]) -> list[str]:
    used = {p.rule for p in plans}
    return [r for r in rules if r not in used]


def layout_warnings(
    rules: dict[str, list[str]], plans: list[WeightPlan], axes: dict[str, int], data_axis: str
) -> list[str]:
    """What in a layout is legal but most likely not meant (`train` and `plan` both print it)."""
    unused = [
        f"recipe key 'layouts.rules.{rule}' matched no weight (`dtcli plan` lists the weight paths)"
        for rule in unused_rules(rules, plans)
    ]
    idle = [
        f"mesh axis '{axis}' (size {axes[axis]}) splits no weight and not the batch: its "
        "devices all do the same work"
        for axis in idle_axes(axes, plans, data_axis)
    ]
    return unused + idle + _fsdp_warnings(plans, data_axis)


def _fsdp_warnings(plans: list[WeightPlan], data_axis: str) -> list[str]:
    """layouts.fsdp on, and every weight left as the rules put it."""
    if any(p.fsdp for p in plans) or not any(p.fsdp_kept for p in plans):
        return []
    return [
        f"layouts.fsdp shards no weight on the data axis '{data_axis}' (`dtcli plan` says why "
        "for each)"
    ]


def to_layout(spec: tuple[str, ...] | list[str], mesh: Any) -> Any:
    from tensorflow.experimental import dtensor

    return dtensor.Layout([dtensor.UNSHARDED if s == UNSHARDED else s for s in spec], mesh)


def batch_layout(mesh: Any, data_axis: str, rank: int) -> Any:
    """Inputs: the batch dim sharded along the data axis, every other dim replicated."""
    return to_layout((data_axis,) + (UNSHARDED,) * (rank - 1), mesh)


def replicated(mesh: Any, rank: int) -> Any:
    from tensorflow.experimental import dtensor

    return dtensor.Layout.replicated(mesh, rank)
