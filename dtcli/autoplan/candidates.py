"""What `dtcli plan --auto` searches (pure: no TensorFlow, no devices): the meshes over a data
axis and a model axis of every divisor of the device count (one device among them: fewer devices
can be faster, a single one compiles with XLA), and the layout presets that apply to a model.

A candidate is a mesh and a layout (rules, layouts.fsdp). Whether it can run is decided
elsewhere (autoplan.search), by the same checks `dtcli train` runs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from dtcli.layout import WeightInfo
from dtcli.mesh import UNSHARDED

U = UNSHARDED

# The presets, in the order a table lists them on a tie.
DATA_PARALLEL = "data parallel"
FSDP = "fsdp"
TENSOR_PARALLEL = "tp"
FSDP_TP = "fsdp x tp"
RECIPE = "recipe"
ONE_DEVICE = "one device"  # the mesh of one device: no layout splits anything there


@dataclass(frozen=True)
class Layout:
    """A layout preset: layout rules and layouts.fsdp, named."""

    name: str
    rules: dict[str, list[str]]
    fsdp: bool

    def key(self) -> tuple:
        return (tuple((k, tuple(v)) for k, v in self.rules.items()), self.fsdp)


@dataclass(frozen=True)
class Candidate:
    """One mesh with one layout: what the search checks, predicts and measures."""

    axes: dict[str, int]
    layout: Layout

    def key(self) -> tuple:
        return (tuple(self.axes.items()), self.layout.key())

    @property
    def devices(self) -> int:
        return math.prod(self.axes.values())


def divisors(count: int) -> list[int]:
    """The device counts a search of `count` devices weighs, most first: 8, 4, 2, 1 for 8."""
    return [d for d in range(count, 0, -1) if count % d == 0]


def factorizations(count: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered way to write `count` as a product of `parts` positive sizes, the first
    size largest first: (8, 1), (4, 2), (2, 4), (1, 8) for 8 over 2 axes."""
    if parts == 1:
        return [(count,)]
    out = []
    for first in sorted((d for d in range(1, count + 1) if count % d == 0), reverse=True):
        out += [(first, *rest) for rest in factorizations(count // first, parts - 1)]
    return out


QKV_RULE = r"block_\d+\.attention\.(query|key|value)\.kernel"
QUERY_RULE = r"block_\d+\.attention\.query\.kernel"
GATE_RULE = r"block_\d+\.mlp\.gate\.kernel"


def gpt_tensor_parallel(model_axis: str, gate: bool = False) -> dict[str, list[str]]:
    """Megatron rules for dtcli's GPT (recipes/tiny_gpt_tensor_parallel.yaml): heads, the MLP's
    hidden units and the embeddings' features split along the model axis (`gate`: swiglu's
    gate matrix too, split as fc is)."""
    m = model_axis
    rules = {
        r"(token|position)_embedding\.embeddings": [U, m],
        QKV_RULE: [U, m, U],
        r"block_\d+\.attention\.proj\.kernel": [m, U, U],
        r"block_\d+\.mlp\.fc\.kernel": [U, m],
        r"block_\d+\.mlp\.proj\.kernel": [m, U],
    }
    if gate:
        rules[GATE_RULE] = [U, m]
    return rules


def key_value_replicated(rules: dict[str, list[str]]) -> dict[str, list[str]]:
    """`rules` with the query kernels alone split where they split query, key and value: for
    a model axis that does not divide the key/value heads (grouped-query attention), which then
    stay whole on every device."""
    if QKV_RULE not in rules:
        return rules
    return {(QUERY_RULE if k == QKV_RULE else k): v for k, v in rules.items()}


def attention_heads(weights: list[WeightInfo]) -> tuple[int, int] | None:
    """dtcli's GPT's query and key/value heads (dim 1 of its query and key kernels); None for
    another model."""
    shapes = {w.path: w.shape for w in weights}
    query, key = (shapes.get(f"block_0.attention.{p}.kernel") for p in ("query", "key"))
    return None if query is None or key is None else (query[1], key[1])


def fitted(layout: Layout, axes: dict[str, int], heads: tuple[int, int] | None) -> Layout:
    """A preset on a mesh whose model axis divides the query heads but not the key/value heads
    (grouped-query attention): its tensor-parallel rules keep key and value replicated there
    (the queries still split), named so. The recipe's own layout stays as written."""
    spec = layout.rules.get(QKV_RULE)
    if heads is None or layout.name == RECIPE or spec is None or spec[1] == U:
        return layout
    size = axes.get(spec[1], 1)
    if heads[0] % size or heads[1] % size == 0:
        return layout
    rules = key_value_replicated(layout.rules)
    return Layout(f"{layout.name} (k/v replicated)", rules, layout.fsdp)


def dense_tensor_parallel(weights: list[WeightInfo], model_axis: str) -> dict[str, list[str]]:
    """Megatron rules for a stack of Dense layers (recipes/mnist_mlp_2d.yaml): in each pair of
    consecutive Dense layers the first is split on its outputs (kernel and bias), the second on
    its inputs, so that the pair needs one all-reduce; an unpaired last layer stays replicated.
    Empty where the model has fewer than two Dense layers with matrix kernels."""
    layers = [
        w.path[: -len(".kernel")]
        for w in weights
        if w.layer == "Dense" and w.path.endswith(".kernel") and len(w.shape) == 2
    ]
    has_bias = {w.path[: -len(".bias")] for w in weights if w.path.endswith(".bias")}
    rules: dict[str, list[str]] = {}
    for first, second in zip(layers[0::2], layers[1::2]):
        rules[re.escape(f"{first}.kernel")] = [U, model_axis]
        if first in has_bias:
            rules[re.escape(f"{first}.bias")] = [model_axis]
        rules[re.escape(f"{second}.kernel")] = [model_axis, U]
    return rules


def tensor_parallel_rules(
    weights: list[WeightInfo], transformer: bool, model_axis: str
) -> dict[str, list[str]]:
    """The model's tensor-parallel rules: dtcli's GPT's, or a Dense stack's (empty: none)."""
    if transformer:
        gate = any(w.path.endswith(".mlp.gate.kernel") for w in weights)
        return gpt_tensor_parallel(model_axis, gate)
    return dense_tensor_parallel(weights, model_axis)


def layouts(
    tp_rules: dict[str, list[str]], recipe_rules: dict[str, list[str]], recipe_fsdp: bool
) -> list[Layout]:
    """The presets that apply: data parallel and FSDP always, tensor parallel and FSDP x TP
    where the model has tensor-parallel rules, and the recipe's own layout."""
    out = [Layout(DATA_PARALLEL, {}, False), Layout(FSDP, {}, True)]
    if tp_rules:
        out += [Layout(TENSOR_PARALLEL, tp_rules, False), Layout(FSDP_TP, tp_rules, True)]
    out.append(Layout(RECIPE, dict(recipe_rules), recipe_fsdp))
    return out


def rule_axes(rules: dict[str, list[str]]) -> set[str]:
    return {a for spec in rules.values() for a in spec if a != U}


def applies(layout: Layout, axes: dict[str, int], data_axis: str) -> bool:
    """Whether a preset belongs on a mesh: its rules' axes are in the mesh and each has more
    than one device (on one device a rule splits nothing: that layout is another preset's),
    every other axis of size > 1 is the data axis (no idle devices), and FSDP only where the
    data axis has more than one device."""
    used = rule_axes(layout.rules) - {data_axis}
    if not used <= set(axes) or any(axes[a] == 1 for a in used):
        return False
    idle = [a for a, n in axes.items() if n > 1 and a != data_axis and a not in used]
    return not idle and (not layout.fsdp or axes.get(data_axis, 1) > 1)


def enumerate_candidates(
    count: int,
    axis_names: tuple[str, ...],
    data_axis: str,
    presets: list[Layout],
    heads: tuple[int, int] | None = None,
) -> list[Candidate]:
    """Every mesh of each divisor of `count` devices over `axis_names` times every preset that
    belongs on it (`fitted` to the GPT's query and key/value `heads`), and the one-device mesh once
    (`ONE_DEVICE`: no rule splits anything there); a preset equal to one already listed on the
    same mesh (the recipe's own layout is often one of the presets) is listed once, named after
    both."""
    found: dict[tuple, Candidate] = {}
    for devices in divisors(count):
        if devices == 1:
            one = Candidate({a: 1 for a in axis_names}, Layout(ONE_DEVICE, {}, False))
            found[one.key()] = one
            continue
        for sizes in factorizations(devices, len(axis_names)):
            axes = dict(zip(axis_names, sizes))
            for layout in (fitted(p, axes, heads) for p in presets):
                if applies(layout, axes, data_axis):
                    _add(found, Candidate(axes, layout))
    return list(found.values())


def _add(found: dict[tuple, Candidate], candidate: Candidate) -> None:
    seen = found.get(candidate.key())
    if seen is None:
        found[candidate.key()] = candidate
    elif candidate.layout.name not in seen.layout.name:
        layout = candidate.layout
        named = Layout(f"{seen.layout.name} = {layout.name}", layout.rules, layout.fsdp)
        found[candidate.key()] = Candidate(candidate.axes, named)


def axis_names(data_axis: str, recipe_axes: tuple[str, ...], model_axis: str) -> tuple[str, ...]:
    """The search's mesh axes: the data axis, then the model axis, in the recipe's order where
    the recipe names both."""
    if data_axis in recipe_axes and model_axis in recipe_axes:
        return tuple(a for a in recipe_axes if a in (data_axis, model_axis))
    return (data_axis, model_axis)
