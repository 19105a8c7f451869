"""What `dtcli plan --auto` gives back: the candidates best first as a table and as JSON, the
rank correlation of predicted and measured times, and the chosen candidate as a recipe file."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from dtcli import memory as memory_lib
from dtcli import mesh as mesh_lib
from dtcli.autoplan.search import Checked
from dtcli.tables import Column, print_table


def ranked(checked: list[Checked]) -> list[Checked]:
    """Fitting candidates by predicted time (fastest first), then the refused ones."""
    fitting = [c for c in checked if c.fits]
    fitting.sort(key=lambda c: c.predicted_ms if c.predicted_ms is not None else float("inf"))
    return fitting + [c for c in checked if not c.fits]


def chosen_index(rows: list[Checked]) -> int | None:
    """The candidate to use: the fastest measured where any was measured, else the fastest
    predicted (rows are ranked: the first that fits)."""
    measured = [i for i, c in enumerate(rows) if c.measured_ms is not None]
    if measured:
        return min(measured, key=lambda i: rows[i].measured_ms)
    return 0 if rows and rows[0].fits else None


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Spearman's rank correlation (ties get their mean rank); None for fewer than 3 pairs."""
    if len(xs) < 3:
        return None

    def ranks(values: list[float]) -> list[float]:
        order = sorted(range(len(values)), key=lambda i: values[i])
        out = [0.0] * len(values)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx = sum((a - mx) ** 2 for a in rx) ** 0.5
    vy = sum((b - my) ** 2 for b in ry) ** 0.5
    return cov / (vx * vy) if vx and vy else None


def correlation(rows: list[Checked]) -> float | None:
    pairs = [(c.predicted_ms, c.measured_ms) for c in rows if c.measured_ms is not None]
    return spearman([p for p, _ in pairs], [m for _, m in pairs])


def items_per_step(recipe: Any, input_shape: tuple[int, ...]) -> tuple[int, str]:
    """Tokens (a language model) or examples one step trains on, and their name."""
    if recipe.task == "language_model":
        return recipe.data.batch_size * input_shape[-1], "tokens"
    return recipe.data.batch_size, "examples"


def idle_devices(rows: list[Checked], chosen: int | None, count: int) -> int | None:
    """The devices of the `count` searched that the chosen candidate leaves idle."""
    return None if chosen is None else count - rows[chosen].candidate.devices


def idle_note(rows: list[Checked], chosen: int | None, count: int) -> str | None:
    """One line where the chosen candidate trains on fewer devices than were searched."""
    idle = idle_devices(rows, chosen, count)
    if not idle:
        return None
    used = rows[chosen].candidate.devices
    return (
        f"note: the chosen candidate trains on {used} of the {count} devices "
        f"({rows[chosen].raw['devices']}); {idle} stay idle: fewer devices "
        + ("measured" if rows[chosen].measured_ms is not None else "are predicted")
        + " faster here"
    )


def compiled(c: Checked) -> str:
    return "xla" if c.xla else "dtensor"


def to_json(
    rows: list[Checked], chosen: int | None, extra: dict[str, Any], budget: Any, count: int
) -> dict[str, Any]:
    out = []
    for c in rows:
        entry = {
            "mesh": dict(c.candidate.axes),
            "devices": c.raw.get("devices"),
            "compile": compiled(c) if c.workload is not None else None,
            "preset": c.candidate.layout.name,
            "rules": c.candidate.layout.rules,
            "fsdp": c.candidate.layout.fsdp,
            "fits": c.fits,
            "bytes_per_device": None if c.memory is None else c.memory.total,
            "predicted_ms": c.predicted_ms,
            "measured_ms": c.measured_ms,
            "measured_runs_ms": c.measured_runs_ms,
            "rejected": c.rejected,
        }
        if c.prediction is not None:
            entry["predicted"] = c.prediction.to_json()
        if c.measure_error is not None:
            entry["measure_error"] = c.measure_error
        out.append(entry)
    predicted_best = 0 if rows and rows[0].fits else None
    return {
        "candidates": out,
        "chosen": chosen,
        "predicted_best": predicted_best,
        "idle_devices": idle_devices(rows, chosen, count),
        "budget_bytes": budget.bytes,
        "spearman": correlation(rows),
        **extra,
    }


COLUMNS = (
    Column("#", right=True),
    Column("devices", "name", drop=2),  # the mesh's sizes say it too
    Column("mesh", "name"),
    Column("preset", "name"),
    Column("bytes/device", right=True),
    Column("predicted ms", right=True),
    Column("measured ms", right=True),
    Column("rate", right=True, drop=1),
)


def render(
    rows: list[Checked],
    chosen: int | None,
    console: Any,
    title: str,
    per_step: tuple[int, str],
    budget: Any,
    top: int,
) -> None:
    """The fitting candidates best first, the chosen one marked; then why each other was
    refused, one line each."""
    items, unit = per_step
    table = []
    for i, c in enumerate([r for r in rows if r.fits][:top]):
        ms = c.measured_ms if c.measured_ms is not None else c.predicted_ms
        rate = f"{items / (ms / 1e3):,.0f} {unit}/s" if ms else "-"
        if c.measured_ms is None and c.measure_error is None:
            rate += " (pred.)" if ms else ""
        table.append(
            (
                f"{'*' if i == chosen else ''}{i + 1}",
                c.raw.get("devices", ""),
                mesh_lib.mesh_text(c.candidate.axes),
                c.candidate.layout.name + (" (xla)" if c.xla else ""),
                memory_lib.size_text(c.memory.total) if c.memory else "-",
                f"{c.predicted_ms:,.1f}" if c.predicted_ms is not None else "-",
                _measured_text(c),
                rate,
            )
        )
    caption = "*: chosen (the fastest measured, else the fastest predicted)"
    repeats = max((len(c.measured_runs_ms) for c in rows), default=0)
    if repeats > 1:
        caption += f"; measured: the median of {repeats} runs (their range)"
    if budget.bytes is not None:
        caption += f"; budget {memory_lib.size_text(budget.bytes)} per device ({budget.name})"
    hidden = len([r for r in rows if r.fits]) - len(table)
    if hidden > 0:
        caption += f"; {hidden} more fit (--top)"
    print_table(console, COLUMNS, table, title=title, caption=caption)
    notes = [("refused", c, c.rejected) for c in rows if not c.fits]
    notes += [("not measured", c, c.measure_error) for c in rows if c.measure_error is not None]
    for label, c, why in notes:
        console.print(
            f"{label}: {c.candidate.layout.name} on {mesh_lib.mesh_text(c.candidate.axes)}: {why}",
            markup=False,
            highlight=False,
            soft_wrap=not console.is_terminal,
        )


def _measured_text(c: Checked) -> str:
    """The median of the runs; with several, their range: `512.3 (498.0-530.1)`."""
    if c.measured_ms is not None:
        runs = c.measured_runs_ms
        if len(runs) > 1:
            return f"{c.measured_ms:,.1f} ({min(runs):,.1f}-{max(runs):,.1f})"
        return f"{c.measured_ms:,.1f}"
    return "failed" if c.measure_error is not None else "-"


# Recipe keys that name local files or folders, relative to the folder a command runs in (the
# data sources open them as given): --write's recipe holds them absolute, valid from anywhere.
PATH_KEYS = ("path", "eval_path", "data_dir", "tokenizer")


def recipe_text(
    checked: Checked, base: Path, out_dir: Path | None, sets: dict[str, Any], devices: str
) -> str:
    """The candidate as a recipe over `base` (the recipe --auto searched, its path relative to
    `out_dir`, where the file will be, as `base:` is read; None: absolute): the command line's
    --set values, every relative data path made absolute, the folder a --set model.build is
    imported from, the candidate's devices, the mesh and the layouts. `mesh` and
    `layouts.rules` replace the base's whole (recipe.files), so none of the base's own rules
    is left over."""
    c = checked.candidate
    where = (
        str(base.resolve())
        if out_dir is None
        else os.path.relpath(base.resolve(), out_dir.resolve())
    )
    body: dict[str, Any] = {"base": where, **sets}
    paths = absolute_paths(checked.raw.get("data"))
    if paths:
        body["data"] = {**(body.get("data") or {}), **paths}
    model = sets.get("model")
    if isinstance(model, dict) and model.get("build") and "build_path" not in model:
        # A --set model.build is looked up beside the recipe searched (recipe.load): this
        # file, read elsewhere, would look beside itself.
        body["model"] = {**model, "build_path": checked.raw["model"]["build_path"]}
    body["devices"] = devices
    body["mesh"] = dict(c.axes)
    layouts = dict(sets.get("layouts") or {})
    layouts.update({"fsdp": c.layout.fsdp, "rules": c.layout.rules})
    body["layouts"] = layouts
    head = f"# {c.layout.name} on {mesh_lib.mesh_text(c.axes)}, from `dtcli plan --auto`"
    if checked.predicted_ms is not None:
        head += f" (predicted {checked.predicted_ms:,.1f} ms/step"
        if checked.measured_ms is not None:
            head += f", measured {checked.measured_ms:,.1f}"
        head += ")"
    return head + "\n" + yaml.safe_dump(body, sort_keys=False, default_flow_style=None)


def absolute_paths(data: Any) -> dict[str, str]:
    """The relative local paths among a raw recipe's `data` keys (PATH_KEYS), made absolute
    against this process's folder (where the command that searched would have opened them);
    a URL, an absolute path and a tokenizer's name (`bytes`, `bpe:N`) stay as they are."""
    if not isinstance(data, dict):
        return {}
    out = {}
    for key in PATH_KEYS:
        value = data.get(key)
        if not isinstance(value, str) or not value.strip() or "://" in value:
            continue
        if key == "tokenizer" and (value == "bytes" or value.startswith("bpe:")):
            continue
        if not os.path.isabs(value):
            out[key] = os.path.abspath(value)
    return out
