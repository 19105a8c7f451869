"""`dtcli plan`: where every weight of a recipe lives on its mesh, and what each device holds.

Built from shapes alone: the data set is described (headers, static info), never loaded, and no
variable is placed on a device. The same `models.weight_plans` is what `train` builds its layouts
from, so the table is the layout training will use, checked by the same rules. The memory a
device needs to train (dtcli.memory: weights, gradients, optimizer state, activations) is
checked against a budget: --memory, or the device's own memory where TensorFlow reports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dtcli import layout as layout_lib
from dtcli import memory as memory_lib
from dtcli import mesh as mesh_lib
from dtcli import optimizers
from dtcli import recipe as recipe_lib
from dtcli.mesh import UNSHARDED
from dtcli.recipe import Recipe
from dtcli.tables import Column, print_table

FLOAT32 = 4  # bytes: dtcli trains in float32


@dataclass(frozen=True)
class Report:
    name: str
    axes: dict[str, int]
    devices: str
    data_axis: str
    plans: list[layout_lib.WeightPlan]
    rules: dict[str, list[str]]  # the recipe's layout rules, in order
    slots: int  # optimizer slots per trainable weight
    batch_size: int
    input_shape: tuple[int, ...]
    num_classes: int
    # dtcli's transformer (task language_model), or None: then the per-part table is shown.
    transformer: Any = None
    memory: memory_lib.Memory | None = None  # what a device holds to train (make_report)
    budget: memory_lib.Budget = memory_lib.NO_BUDGET
    # A published model (`dtcli plan HF_DIR`): what its folder holds (published.Published's
    # JSON) and the lines that say what the plan assumed of it; None for a recipe.
    published: dict[str, Any] | None = None
    assumed: tuple[str, ...] = ()

    @property
    def unused_rules(self) -> list[str]:
        return layout_lib.unused_rules(self.rules, self.plans)

    def totals(self) -> dict[str, dict[str, int]]:
        """Bytes on one device, sharded as planned and fully replicated."""

        def total(replicated: bool, trainable_only: bool) -> int:
            return sum(
                (math.prod(p.weight.shape) * FLOAT32)
                if replicated
                else p.bytes_per_device(self.axes, FLOAT32)
                for p in self.plans
                if p.weight.trainable or not trainable_only
            )

        params = {"per_device": total(False, False), "replicated": total(True, False)}
        slots = {
            "per_device": total(False, True) * self.slots,
            "replicated": total(True, True) * self.slots,
        }
        both = {k: params[k] + slots[k] for k in params}
        return {"parameters": params, "optimizer_slots": slots, "total": both}

    def batch(self) -> dict[str, Any]:
        shards = mesh_lib.data_shards(self.axes, self.data_axis)
        per_device = self.batch_size // shards
        inputs = (per_device, *self.input_shape)
        return {
            "global_shape": [self.batch_size, *self.input_shape],
            "per_device_shape": list(inputs),
            "input_bytes_per_device": math.prod(inputs) * FLOAT32,
            # A language model's logits: one row per position (a packed window is [3, context]).
            "logits_per_device_shape": [per_device, *self.input_shape[-1:], self.num_classes]
            if self.transformer is not None
            else [per_device, self.num_classes],
        }

    def parts(self) -> dict[str, int]:
        """A transformer's parameter bytes on one device by part (embeddings, attention, MLP,
        LayerNorms, head)."""
        out = {"embeddings": 0, "attention": 0, "mlp": 0, "layer_norms": 0, "head": 0}
        for p in self.plans:
            path = p.weight.path
            part = (
                "embeddings"
                if "_embedding." in path
                else "attention"
                if ".attention." in path
                else "mlp"
                if ".mlp." in path
                else "layer_norms"
                if ".ln_" in path or path.startswith("ln_f.")
                else "head"
            )
            out[part] += p.bytes_per_device(self.axes, FLOAT32)
        return out

    def to_json(self) -> dict[str, Any]:
        lm, memory = {}, {}
        if self.transformer is not None:
            lm = {"parts_bytes_per_device": self.parts()}
        if self.memory is not None:
            acts = self.memory.activations
            memory = {
                "memory_bytes": self.memory.to_json(),
                "budget_bytes": self.budget.bytes,
                "fits": memory_lib.fits(self.memory, self.budget),
                "activations_estimate": {
                    "bytes": {**acts.parts, "total": acts.total},
                    **acts.details,
                    "estimated": acts.estimated,
                    "note": acts.note,
                },
            }
        if self.published is not None:
            memory["published"] = {**self.published, "assumed": list(self.assumed)}
        return {
            "recipe": self.name,
            "mesh": dict(self.axes),
            "devices": self.devices,
            "data_axis": self.data_axis,
            "weights": [
                {
                    "path": p.weight.path,
                    "layer": p.weight.layer,
                    "rule": p.rule,
                    "fsdp": p.fsdp,
                    "fsdp_kept": p.fsdp_kept or None,
                    "shape": list(p.weight.shape),
                    "padded_shape": list(p.padded) if p.padded else None,
                    "sharding": list(p.spec),
                    "shard_shape": list(p.shard_shape(self.axes)),
                    "bytes_per_device": p.bytes_per_device(self.axes, FLOAT32),
                    "trainable": p.weight.trainable,
                }
                for p in self.plans
            ],
            "unused_rules": self.unused_rules,
            "optimizer_slots_per_weight": self.slots,
            "totals_bytes": self.totals(),
            "batch": self.batch(),
            **lm,
            **memory,
        }


def make_report(
    recipe: Recipe,
    budget: memory_lib.Budget = memory_lib.NO_BUDGET,
    devices_key: str | None = None,
    planned: tuple[Any, tuple[int, ...], int] | None = None,
) -> Report:
    """Resolve the mesh against the devices and plan every weight (errors as `train` gives),
    and the memory each device needs against `budget` (none given: the device's own memory,
    where TensorFlow reports it). `devices_key`: how errors name the devices
    (devices.key_for: --devices where the command line gave them). `planned`: (devices,
    input shape, vocabulary) of a model planned before anything is loaded (`published_report`):
    the devices are not configured nor the data described."""
    from dtcli import devices as devices_lib
    from dtcli import models

    if planned is None:
        from dtcli import data as data_lib

        devices = devices_lib.configure(
            recipe.devices,
            mesh_lib.device_count_for(recipe.mesh),
            devices_key or devices_lib.RECIPE_KEY,
        )
        input_shape, num_classes = data_lib.describe(
            recipe.data, vocab_size=recipe.model.real_vocab
        )
    else:
        devices, input_shape, num_classes = planned
    axes = mesh_lib.resolve_axes(recipe.mesh, devices.count)
    data_axis = recipe.layouts.data_axis
    mesh_lib.check_batch(axes, data_axis, recipe.data.batch_size, "data.batch_size")
    recipe_lib.check_micro_batch(recipe, axes)
    plans, _ = models.weight_plans(recipe, input_shape, num_classes, axes, values=False)
    if budget.bytes is None and planned is None:
        limit = devices_lib.memory_limit(devices)
        if limit is not None:
            budget = memory_lib.Budget(limit, source=f"{devices.device_type} memory")
    return Report(
        recipe.name,
        axes,
        devices.text,
        data_axis,
        plans,
        recipe.layouts.rules,
        optimizers.slots(recipe.optimizer),
        recipe.data.batch_size,
        input_shape,
        num_classes,
        recipe.model.transformer if recipe.task == "language_model" else None,
        memory_lib.estimate(recipe, plans, axes, input_shape, num_classes),
        budget,
    )


def published_report(
    folder: str,
    overrides: recipe_lib.Overrides,
    budget: memory_lib.Budget = memory_lib.NO_BUDGET,
    devices_key: str | None = None,
) -> Report:
    """`dtcli plan HF_DIR`: a published model's plan from its config.json and safetensors
    headers alone (dtcli.published: the recipe it makes and what it assumes), for the devices
    named, which need not be on this machine; no TensorFlow."""
    import dataclasses

    from dtcli import devices as devices_lib
    from dtcli import published as published_lib

    key = devices_key or devices_lib.RECIPE_KEY
    model = published_lib.read(folder)
    raw, recipe, assumed = published_lib.recipe_for(model, overrides, "data_axis", key)
    devices = published_lib.planned_devices(raw, key)
    report = make_report(recipe, budget, key, (devices, *published_lib.shapes(recipe, model)))
    return dataclasses.replace(report, published=model.to_json(), assumed=tuple(assumed))


def refuse_over_budget(report: Report) -> None:
    """A plan that does not fit its budget: one line (exit 2), after the plan is shown."""
    if report.memory is not None:
        memory_lib.refuse(report.memory, report.budget, report.transformer is not None)


_size = memory_lib.size_text


def render(report: Report, console: Any) -> None:
    """The plan as tables: every weight, memory per device, a language model's parts, the batch,
    then the layout warnings."""
    from rich.markup import escape

    from dtcli.published import header_lines

    for line in header_lines(report.published, report.assumed):
        console.print(escape(line), highlight=False, soft_wrap=not console.is_terminal)
    _weights_table(report, console)
    for line in fsdp_notes(report.plans):
        console.print(escape(line), highlight=False, soft_wrap=not console.is_terminal)
    _memory_table(report, console)
    if report.transformer is not None:
        _language_model_table(report, console)
    if report.memory is not None:
        _training_table(report, console)
    b = report.batch()
    console.print(
        f"batch: global {_shape(b['global_shape'])} sharded along '{report.data_axis}' -> "
        f"{_shape(b['per_device_shape'])} per device ({_size(b['input_bytes_per_device'])}); "
        f"logits {_shape(b['logits_per_device_shape'])} per device",
        highlight=False,
        soft_wrap=not console.is_terminal,  # a terminal wraps it at words; a pipe gets one line
    )
    axes = report.axes
    for warning in layout_lib.layout_warnings(report.rules, report.plans, axes, report.data_axis):
        console.print(
            f"[yellow]warning:[/] {escape(warning)}",
            highlight=False,
            soft_wrap=not console.is_terminal,
        )


# Weight paths and rules are what a user greps the recipe for: never cut. At a narrow terminal
# the rule goes first, then the shard shape (the sharding and shape give it).
WEIGHT_COLUMNS = (
    Column("weight", "name"),
    Column("rule", "name", drop=2),
    Column("shape", right=True),
    Column("sharding"),
    Column("shard", right=True, drop=1),
    Column("bytes", right=True),
)


def _weights_table(report: Report, console: Any) -> None:
    axes = report.axes
    rows = [
        (
            p.weight.path,
            _rule_text(p),
            _shape(p.weight.shape),
            "(" + ", ".join("-" if a == UNSHARDED else a for a in p.spec) + ")",
            _shape(p.shard_shape(axes)),
            f"{p.bytes_per_device(axes, FLOAT32):,}",
        )
        for p in report.plans
    ]
    print_table(
        console,
        WEIGHT_COLUMNS,
        rows,
        title=f"{report.name}: mesh {mesh_lib.mesh_text(axes)} over {report.devices}",
        caption="sharding: per dim, the mesh axis it is split along ('-': unsharded); "
        "shard and bytes: on each device",
    )


def _rule_text(p: layout_lib.WeightPlan) -> str:
    if p.fsdp:
        text = "layouts.fsdp" if p.rule is None else f"{p.rule} + layouts.fsdp"
        if p.padded:
            dim = next(d for d, (a, b) in enumerate(zip(p.weight.shape, p.padded)) if a != b)
            text += f" (padded {p.weight.shape[dim]} -> {p.padded[dim]})"
        return text
    return p.rule if p.rule is not None else "replicated: no rule"


def fsdp_notes(plans: list[layout_lib.WeightPlan], names: int = 4) -> list[str]:
    """Why layouts.fsdp left weights as the rules put them: a line per reason, naming up to
    `names` of its weights; none where it left none."""
    by_reason: dict[str, list[str]] = {}
    for p in plans:
        if p.fsdp_kept:
            by_reason.setdefault(p.fsdp_kept, []).append(p.weight.path)
    if not by_reason:
        return []
    lines = ["layouts.fsdp leaves weights as the rules put them:"]
    for reason, paths in by_reason.items():
        more = f" and {len(paths) - names} more" if len(paths) > names else ""
        lines.append(f"  {', '.join(paths[:names])}{more}: {reason}")
    return lines


def _memory_table(report: Report, console: Any) -> None:
    totals = report.totals()
    labels = {
        "parameters": "parameters",
        "optimizer_slots": f"optimizer slots ({report.slots} per weight)",
        "total": "total",
    }
    rows = []
    for key, label in labels.items():
        row = totals[key]
        ratio = row["per_device"] / row["replicated"] if row["replicated"] else 1.0
        rows.append((label, _size(row["per_device"]), _size(row["replicated"]), f"{ratio:.3f}"))
    columns = [Column("", "name")] + [
        Column(h, right=True) for h in ("planned", "all replicated", "ratio")
    ]
    print_table(console, columns, rows, title="memory per device (float32)")


def _language_model_table(report: Report, console: Any) -> None:
    parts = report.parts()
    rows = [(f"parameters: {key.replace('_', ' ')}", _size(value)) for key, value in parts.items()]
    if report.memory is not None:
        act = report.memory.activations
        heads = act.details.get("heads_per_device", report.transformer.heads)
        rows.append(
            (
                f"activations, estimate ({report.transformer.layers} blocks, "
                f"{heads} heads per device)",
                _size(act.parts.get("blocks", 0)),
            )
        )
        rows.append(("logits and their gradient", _size(act.parts.get("logits", 0))))
    columns = (Column("", "prose"), Column("bytes", right=True))
    print_table(console, columns, rows, title="language model per device (float32)")


def _training_table(report: Report, console: Any) -> None:
    """What one device holds to train, its sum, the budget and whether it fits."""
    memory, budget = report.memory, report.budget
    acts = memory.activations
    labels = {
        "weights": "weights (float32)",
        "gradients": "gradients (float32)",
        "optimizer": f"optimizer state ({report.slots} slots per weight, step counters)",
        "activations": f"activations ({acts.note})",
    }
    gathered = acts.parts.get("gathered_weights")
    if gathered:
        labels["activations"] = f"activations ({acts.note}; {_size(gathered)} of them FSDP-"
        labels["activations"] += "gathered weights)"
    rows = [(labels[key], _size(value)) for key, value in memory.items().items()]
    rows.append(("total", _size(memory.total)))
    fits = memory_lib.fits(memory, budget)
    if fits is None:
        rows.append(("budget", "none (give --memory)"))
    else:
        rows.append((f"budget ({budget.name})", _size(budget.bytes)))
        rows.append(("fits", "yes" if fits else "NO"))
    columns = (Column("", "prose"), Column("bytes", right=True))
    print_table(console, columns, rows, title="training memory per device")


def _shape(shape: Any) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ")"
