"""Layout rules -> per-weight sharding specs (pure), and DTensor Layout objects (lazy TF)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
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


@dataclass(frozen=True)
class WeightPlan:
    """Where one weight lives on the mesh."""

    weight: WeightInfo
    rule: str | None  # the rule that matched, None for "replicated: no rule"
    spec: tuple[str, ...]  # one entry per dim: a mesh axis or "unsharded"
    fsdp: bool = False  # layouts.fsdp sharded one more dim on the data axis

    def shard_shape(self, axes: dict[str, int]) -> tuple[int, ...]:
        return tuple(
            d if s == UNSHARDED else d // axes[s] for d, s in zip(self.weight.shape, self.spec)
        )

    def bytes_per_device(self, axes: dict[str, int], itemsize: int = 4) -> int:
        return math.prod(self.shard_shape(axes)) * itemsize


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
        if (
            _CONV_LAYERS.match(w.layer)
            and w.path.endswith("kernel")
            and any(s != UNSHARDED for s in spec)
        ):
            raise UsageError(
                f"recipe key '{key}': shards convolution kernel '{w.path}', but DTensor needs "
                "convolution filters fully replicated; shard the Dense layers and the batch instead"
            )
        for dim, (size, axis) in enumerate(zip(w.shape, spec)):
            if axis != UNSHARDED and size % axes[axis]:
                why = ""
                if _HEADS_DIM.search(w.path) and dim == _HEADS_DIM_INDEX[w.path.split(".")[-2]]:
                    why = (
                        f" (it is the attention heads: {size} heads cannot be split over "
                        f"{axes[axis]} devices without splitting a head; use a '{axis}' axis "
                        f"that divides model.transformer.heads, or more heads)"
                    )
                raise UsageError(
                    f"recipe key '{key}': dim {dim} of weight '{w.path}' has size {size}, "
                    f"which does not divide by mesh axis '{axis}' of size {axes[axis]}{why}"
                )
        plans.append(WeightPlan(w, rule, spec))
    return plans


def apply_fsdp(
    plans: list[WeightPlan], data_axis: str, axes: dict[str, int], only_unsharded: bool = False
) -> list[WeightPlan]:
    """layouts.fsdp: each weight's largest dim that the rules leave unsharded and the data axis
    divides is sharded on the data axis too (the first such dim on a tie); a weight the data
    axis already shards, or with no such dim, stays as the rules put it. `only_unsharded`:
    leave every weight a rule shards as it is (models whose layers cannot gather a weight
    sharded on two axes, see `check_fsdp_layers`)."""
    size = axes.get(data_axis, 1)
    if size <= 1:
        return plans
    out = []
    for p in plans:
        sharded = any(a != UNSHARDED and axes[a] > 1 for a in p.spec)
        dims = [
            d
            for d, (n, a) in enumerate(zip(p.weight.shape, p.spec))
            if a == UNSHARDED and n % size == 0
        ]
        conv = _CONV_LAYERS.match(p.weight.layer) and p.weight.path.endswith("kernel")
        if data_axis in p.spec or not dims or (only_unsharded and sharded) or conv:
            out.append(p)
            continue
        dim = max(dims, key=lambda d: (p.weight.shape[d], -d))
        spec = tuple(data_axis if d == dim else a for d, a in enumerate(p.spec))
        out.append(WeightPlan(p.weight, p.rule, spec, fsdp=True))
    return out


def check_fsdp_layers(plans: list[WeightPlan], data_axis: str, axes: dict[str, int]) -> None:
    """For models whose layers read their variables themselves (tf-keras layers, a user's
    model): a weight sharded on the data axis and on another axis at once fails inside DTensor
    (its matmul expanders refuse the mixed sharding); refused here, naming the rule. dtcli's own
    GPT and Core MLP gather such weights to their compute layout and take any mix."""
    for p in plans:
        others = [a for a in p.spec if a not in (UNSHARDED, data_axis) and axes[a] > 1]
        if data_axis in p.spec and axes[data_axis] > 1 and others:
            raise UsageError(
                f"recipe key 'layouts.rules.{p.rule}': shards weight '{p.weight.path}' on the "
                f"data axis '{data_axis}' and on '{others[0]}' at once, which DTensor runs only "
                "in dtcli's own models (model.transformer, model.api core); shard it on one of "
                "the two"
            )


# dtcli.transformer's attention kernels: the dim that counts heads, by projection.
_HEADS_DIM = re.compile(r"\.attention\.(query|key|value|proj)\.kernel$")
_HEADS_DIM_INDEX = {"query": 1, "key": 1, "value": 1, "proj": 0}


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
    return [
        f"recipe key 'layouts.rules.{rule}' matched no weight (`dtcli plan` lists the weight paths)"
        for rule in unused_rules(rules, plans)
    ] + [
        f"mesh axis '{axis}' (size {axes[axis]}) splits no weight and not the batch: its "
        "devices all do the same work"
        for axis in idle_axes(axes, plans, data_axis)
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
