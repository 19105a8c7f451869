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
from dtcli.recipe import Recipe

FLOAT32 = 4  # bytes: dtcli trains in float32 (a LoRA base may be stored in bfloat16)


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
        """Bytes on one device, sharded as planned and fully replicated: the parameters (each
        in its own dtype), of them the trainable and the frozen (a LoRA run's base), the
        optimizer's slots (float32, of the trainable ones)."""

        def total(replicated: bool, which: Any) -> int:
            return sum(
                (math.prod(p.weight.shape) * p.weight.itemsize)
                if replicated
                else p.bytes_per_device(self.axes)
                for p in self.plans
                if which(p.weight)
            )

        def both(which: Any) -> dict[str, int]:
            return {"per_device": total(False, which), "replicated": total(True, which)}

        params = both(lambda w: True)
        slots = {k: v * self.slots for k, v in both(lambda w: w.trainable).items()}
        return {
            "parameters": params,
            "trainable_parameters": both(lambda w: w.trainable),
            "frozen_parameters": both(lambda w: not w.trainable),
            "optimizer_slots": slots,
            "total": {k: params[k] + slots[k] for k in params},
        }

    def batch(self) -> dict[str, Any]:
        shards = mesh_lib.data_shards(self.axes, self.data_axis)
        per_device = self.batch_size // shards
        inputs = (per_device, *self.input_shape)
        return {
            "global_shape": [self.batch_size, *self.input_shape],
            "per_device_shape": list(inputs),
            "input_bytes_per_device": math.prod(inputs) * FLOAT32,
            "logits_per_device_shape": [per_device, *self.input_shape[:1], self.num_classes]
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
            out[part] += p.bytes_per_device(self.axes)
        return out

    def to_json(self) -> dict[str, Any]:
        lm, memory = {}, {}
        if self.transformer is not None:
            lm = {"parts_bytes_per_device": self.parts()}
        if self.memory is not None:
            acts = self.memory.activations
            memory = {
                "memory_bytes": self.memory.to_json(),
                # Of memory_bytes' weights: what trains, what is frozen (a LoRA run's base).
                "weights_bytes": {"trainable": self.memory.trainable, "frozen": self.memory.frozen},
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
                    "bytes_per_device": p.bytes_per_device(self.axes),
                    "trainable": p.weight.trainable,
                    "dtype": p.weight.dtype,
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


from dtcli.plan.show import WEIGHT_COLUMNS, fsdp_notes, render  # noqa: E402 (the tables)

__all__ = [
    "WEIGHT_COLUMNS",
    "Report",
    "fsdp_notes",
    "make_report",
    "published_report",
    "refuse_over_budget",
    "render",
]
