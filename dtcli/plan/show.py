"""`dtcli plan`'s tables: every weight, memory per device (trainable, frozen and optimizer
bytes apart), a language model's parts, what a device holds to train, the batch, the warnings."""

from __future__ import annotations

from typing import Any

from dtcli import layout as layout_lib
from dtcli import memory as memory_lib
from dtcli import mesh as mesh_lib
from dtcli.mesh import UNSHARDED
from dtcli.tables import Column, print_table

_size = memory_lib.size_text


def render(report: Any, console: Any) -> None:
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


def _weights_table(report: Any, console: Any) -> None:
    axes = report.axes
    rows = [
        (
            p.weight.path,
            _rule_text(p),
            _shape(p.weight.shape),
            "(" + ", ".join("-" if a == UNSHARDED else a for a in p.spec) + ")",
            _shape(p.shard_shape(axes)),
            f"{p.bytes_per_device(axes):,}",
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


def _memory_table(report: Any, console: Any) -> None:
    totals = report.totals()
    labels = {"parameters": "parameters"}
    if totals["frozen_parameters"]["replicated"]:  # LoRA: the adapters train, the base not
        labels["trainable_parameters"] = "  trainable (float32)"
        labels["frozen_parameters"] = f"  frozen ({_frozen_dtype(report.plans)})"
    labels["optimizer_slots"] = f"optimizer slots ({report.slots} per trainable weight)"
    labels["total"] = "total"
    rows = []
    for key, label in labels.items():
        row = totals[key]
        ratio = row["per_device"] / row["replicated"] if row["replicated"] else 1.0
        rows.append((label, _size(row["per_device"]), _size(row["replicated"]), f"{ratio:.3f}"))
    columns = [Column("", "name")] + [
        Column(h, right=True) for h in ("planned", "all replicated", "ratio")
    ]
    print_table(console, columns, rows, title="memory per device")


def _frozen_dtype(plans: list[layout_lib.WeightPlan]) -> str:
    return "/".join(sorted({p.weight.dtype for p in plans if not p.weight.trainable}))


def _language_model_table(report: Any, console: Any) -> None:
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
    print_table(console, columns, rows, title="language model per device")


def _training_table(report: Any, console: Any) -> None:
    """What one device holds to train, its sum, the budget and whether it fits."""
    memory, budget = report.memory, report.budget
    acts = memory.activations
    labels = {
        "weights": "weights (float32)",
        "gradients": "gradients (float32)",
        "optimizer": f"optimizer state ({report.slots} slots per trainable weight, step counters)",
        "activations": f"activations ({acts.note})",
    }
    gathered = acts.parts.get("gathered_weights")
    if gathered:
        labels["activations"] = f"activations ({acts.note}; {_size(gathered)} of them FSDP-"
        labels["activations"] += "gathered weights)"
    rows = [(labels[key], _size(value)) for key, value in memory.items().items()]
    if memory.frozen:  # LoRA: what trains and what is frozen, apart
        rows[:1] = [
            ("weights: trainable (float32)", _size(memory.trainable)),
            (f"weights: frozen ({_frozen_dtype(report.plans)})", _size(memory.frozen)),
        ]
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
