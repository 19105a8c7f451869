"""The search of `dtcli plan --auto`: each candidate (a mesh and a layout) made into the recipe
`dtcli train` would run, and checked by the same functions `train` and `plan` call (recipe
checks, the batch against the data axis, the rules against each weight, FSDP against the model's
layers, the memory plan against the budget), so that a candidate is refused exactly when
`train` would refuse it, with `train`'s own words. The rest are predicted by the cost model.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from dtcli import layout as layout_lib
from dtcli import memory as memory_lib
from dtcli import mesh as mesh_lib
from dtcli import models
from dtcli import recipe as recipe_lib
from dtcli.autoplan import candidates as cands
from dtcli.autoplan import cost as cost_lib
from dtcli.autoplan.workload import workload
from dtcli.errors import UsageError
from dtcli.recipe import Recipe

MODEL_AXIS = "model"


@dataclass
class Checked:
    """A candidate after the checks: its recipe and memory, or why it was refused; then its
    predicted and (with --measure) measured step time."""

    candidate: cands.Candidate
    raw: dict  # the raw recipe of this candidate (what --write writes over the base)
    recipe: Recipe | None = None
    memory: memory_lib.Memory | None = None
    rejected: str | None = None
    over_budget: bool = False
    prediction: cost_lib.Prediction | None = None
    measured_ms: float | None = None  # the median of the runs
    measured_runs_ms: list[float] = field(default_factory=list)
    measure_error: str | None = None
    workload: cost_lib.Workload | None = None
    specs: tuple | None = None  # every weight's sharding, for telling equal layouts apart

    @property
    def fits(self) -> bool:
        return self.rejected is None

    @property
    def xla(self) -> bool:
        return self.workload is not None and self.workload.xla

    @property
    def predicted_ms(self) -> float | None:
        return None if self.prediction is None else self.prediction.seconds * 1e3


@dataclass(frozen=True)
class Model:
    """What the search needs of the model, read once: the data's shapes and the weights."""

    input_shape: tuple[int, ...]
    num_classes: int
    weights: list[layout_lib.WeightInfo]


def describe_model(recipe: Recipe) -> Model:
    """The data's shapes (headers only) and the model's weights (arithmetic for dtcli's GPT and
    Core MLP; a tf-keras model is built once on the host, as `dtcli plan` does)."""
    from dtcli import data as data_lib

    input_shape, num_classes = data_lib.describe(recipe.data, vocab_size=recipe.model.real_vocab)
    axes = {a: 1 for a in recipe.mesh}
    plain = recipe_lib.replace(
        recipe,
        mesh=axes,
        layouts=recipe_lib.LayoutConfig(data_axis=recipe.layouts.data_axis),
    )
    plans, _ = models.weight_plans(plain, input_shape, num_classes, axes, values=False)
    return Model(input_shape, num_classes, [p.weight for p in plans])


def enumerate_for(
    recipe: Recipe, model: Model, count: int, device_type: str = "CPU"
) -> list[cands.Candidate]:
    """The meshes of each divisor of `count` devices times the presets that apply to the
    recipe's model (a TPU's device count cannot be chosen: all of its devices only)."""
    data_axis = recipe.layouts.data_axis
    if data_axis == mesh_lib.UNSHARDED:
        raise UsageError(
            "recipe key 'layouts.data_axis': --auto splits the batch along a data axis; "
            "'unsharded' names none"
        )
    names = cands.axis_names(data_axis, tuple(recipe.mesh), MODEL_AXIS)
    tp = cands.tensor_parallel_rules(model.weights, recipe.model.transformer is not None, names[1])
    presets = cands.layouts(tp, recipe.layouts.rules, recipe.layouts.fsdp)
    heads = cands.attention_heads(model.weights)
    found = cands.enumerate_candidates(count, names, data_axis, presets, heads)
    if device_type == "TPU":
        found = [c for c in found if c.devices == count]
    if not any(cands.RECIPE in c.layout.name for c in found):
        # the recipe's rules name other axes: its own mesh, as written, is its one candidate
        own = mesh_lib.resolve_axes(dict(recipe.mesh), count)
        found.append(cands.Candidate(own, presets[-1]))
    return found


def devices_text(device_type: str, count: int) -> str:
    """The recipe's `devices` of a candidate's mesh: `cpu:4`; a TPU's all (`tpu`)."""
    return "tpu" if device_type == "TPU" else f"{device_type.lower()}:{count}"


def check(
    raw: dict, candidate: cands.Candidate, model: Model, budget: Any, device_type: str = "CPU"
) -> Checked:
    """The candidate as `train` would load and check it; refused with the checks' own line."""
    from dtcli.session.build import bf16_cpu

    mine = copy.deepcopy(raw)
    mine["devices"] = devices_text(device_type, candidate.devices)
    mine["mesh"] = dict(candidate.axes)
    layouts = dict(mine.get("layouts") or {})
    layouts["rules"] = copy.deepcopy(candidate.layout.rules)
    layouts["fsdp"] = candidate.layout.fsdp
    mine["layouts"] = layouts
    out = Checked(candidate, mine)
    try:
        recipe = recipe_lib.from_mapping(mine)
        axes = dict(candidate.axes)
        mesh_lib.check_batch(
            axes, recipe.layouts.data_axis, recipe.data.batch_size, "data.batch_size"
        )
        if recipe.data.eval_batch_size:
            mesh_lib.check_batch(
                axes, recipe.layouts.data_axis, recipe.data.eval_batch_size, "data.eval_batch_size"
            )
        recipe_lib.check_micro_batch(recipe, axes)
        plans, _ = models.weight_plans(recipe, model.input_shape, model.num_classes, axes, False)
        xla = mesh_lib.compiles_with_xla(
            recipe.train.compile, axes, 1, bf16_cpu(recipe, device_type)
        )
    except UsageError as exc:
        out.rejected = str(exc)
        return out
    out.recipe = recipe
    out.specs = tuple(p.spec for p in plans)
    out.memory = memory_lib.estimate(recipe, plans, axes, model.input_shape, model.num_classes)
    if memory_lib.fits(out.memory, budget) is False:
        out.over_budget = True
        out.rejected = (
            f"needs {memory_lib.size_text(out.memory.total)} per device, over the budget "
            f"({budget.name})"
        )
        return out
    out.workload = workload(
        recipe,
        plans,
        axes,
        model.input_shape,
        model.num_classes,
        out.memory.activations.total,
        xla,
        out.memory.weights + out.memory.gradients + out.memory.optimizer,
    )
    return out


def merge_equal(checked: list[Checked]) -> list[Checked]:
    """Candidates whose weights end up laid out alike on the same mesh are one candidate,
    named after each (`fsdp x tp` is `tp` where the data axis divides no weight the rules
    leave unsharded)."""
    out: list[Checked] = []
    seen: dict[tuple, Checked] = {}
    for c in checked:
        key = (tuple(c.candidate.axes.items()), c.specs)
        first = seen.get(key) if c.specs is not None and c.fits else None
        if first is None:
            if c.specs is not None and c.fits:
                seen[key] = c
            out.append(c)
            continue
        layout = first.candidate.layout
        named = cands.Layout(
            f"{layout.name} = {c.candidate.layout.name}", layout.rules, layout.fsdp
        )
        first.candidate = cands.Candidate(first.candidate.axes, named)
    return out


def refuse_if_none_fits(checked: list[Checked], budget: Any) -> None:
    """No candidate fits the budget: one line naming the smallest candidate's bytes."""
    if any(c.fits for c in checked):
        return
    sized = [c for c in checked if c.memory is not None]
    if not sized:
        reasons = "; ".join(sorted({c.rejected or "" for c in checked}))
        raise UsageError(f"--auto: every candidate was refused: {reasons}")
    small = min(sized, key=lambda c: c.memory.total)
    raise UsageError(
        f"{budget.name}: no candidate fits; the smallest, {label(small.candidate)}, needs "
        f"{small.memory.total:,} B ({memory_lib.size_text(small.memory.total)}) per device"
    )


def label(candidate: cands.Candidate) -> str:
    return f"{candidate.layout.name} on {mesh_lib.mesh_text(candidate.axes)}"
