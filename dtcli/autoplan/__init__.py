"""`dtcli plan RECIPE --auto`: the mesh and layout to train a recipe with on these devices.

    candidates.py  the meshes a device count allows times the layout presets (pure)
    search.py      each candidate checked as `train` checks it, its memory against the budget
    workload.py    a step's FLOPs, collectives and ops by arithmetic (pure)
    cost.py        the cost model: a step's predicted time from a workload and rates (pure)
    calibrate.py   the rates, probed on the devices and cached per device kind
    measure.py     --measure K: each candidate trained K steps in a fresh `dtcli train`
    report.py      the table, the JSON, Spearman's rank correlation, the recipe --write writes
    figure.py      --plot: the ranking as a PNG

A command at the layer of `plan` (docs/architecture.md): it imports the engine's arithmetic
(memory, models, layout) and the recipe, never another command.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtcli import devices as devices_lib
from dtcli import mesh as mesh_lib
from dtcli import progress as progress_lib
from dtcli import recipe as recipe_lib
from dtcli import rundir
from dtcli.autoplan import report as report_lib
from dtcli.autoplan import search
from dtcli.errors import UsageError

DEFAULT_TOP = 5


@dataclass(frozen=True)
class AutoOptions:
    """--auto's options, checked before any work (`options`)."""

    top: int = DEFAULT_TOP  # the candidates shown and measured, best predicted first
    measure: int | None = None  # steps per candidate, or None: predict only
    repeats: int = 1  # runs of each measured candidate
    write: Path | None = None
    plot: Path | None = None
    as_json: bool = False
    recalibrate: bool = False
    progress: bool = True  # what it does as it goes, on stderr (--no-progress: nothing)


def options(
    auto: bool,
    mesh: str | None,
    top: int | None,
    measure: int | None,
    write: str | None,
    plot: str | None,
    as_json: bool,
    recalibrate: bool,
    repeats: int | None = None,
    progress: bool = True,
) -> AutoOptions | None:
    """The command line's --auto options, each refused in one line naming it; None without
    --auto (then none of its options may be given)."""
    given = {
        "--top": top is not None,
        "--measure": measure is not None,
        "--repeats": repeats is not None,
        "--write": write is not None,
        "--plot": plot is not None,
        "--recalibrate": recalibrate,
    }
    if not auto:
        for name, there in given.items():
            if there:
                raise UsageError(f"{name}: only with --auto (the search of meshes and layouts)")
        return None
    if mesh is not None:
        raise UsageError(
            "--mesh: --auto searches the meshes itself; give --mesh or --auto, not both "
            "(--devices sets the device count)"
        )
    if top is not None and top < 1:
        raise UsageError(f"--top {top}: expected at least 1 candidate")
    if measure is not None and measure < 2:
        raise UsageError(f"--measure {measure}: expected at least 2 steps per candidate")
    if repeats is not None and measure is None:
        raise UsageError("--repeats: only with --measure (the runs of each measured candidate)")
    if repeats is not None and repeats < 1:
        raise UsageError(f"--repeats {repeats}: expected at least 1 run per candidate")
    return AutoOptions(
        top if top is not None else DEFAULT_TOP,
        measure,
        repeats if repeats is not None else 1,
        _new_file(write, "--write", (".yaml", ".yml")),
        _new_file(plot, "--plot", (".png",)),
        as_json,
        recalibrate,
        progress,
    )


def _new_file(text: str | None, option: str, suffixes: tuple[str, ...]) -> Path | None:
    """A file to create: refused where something is there already, its folder is missing or
    its name does not end in one of `suffixes`."""
    if text is None:
        return None
    path = Path(text)
    if path.is_dir():
        raise UsageError(f"{option} {text!r}: is a folder; give a file name")
    if path.exists():
        raise UsageError(f"{option} {text!r}: exists already; give a new file name")
    if not path.parent.is_dir():
        raise UsageError(f"{option} {text!r}: no such folder {str(path.parent)!r}")
    if path.suffix.lower() not in suffixes:
        raise UsageError(f"{option} {text!r}: expected a file name ending in {suffixes[0]}")
    try:  # now, not after a search of minutes: a folder this process cannot write in
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as exc:
        raise UsageError(
            f"{option} {text!r}: cannot write in {str(path.parent)!r} ({exc.strerror})"
        ) from None
    return path


def run(
    recipe_path: str, overrides: recipe_lib.Overrides, opts: AutoOptions, budget: Any, console: Any
) -> None:
    """Search, predict, (measure), then print, and write what was asked for. What takes long
    (the first calibration, the measurements) says so on stderr as it goes."""
    from dtcli.autoplan import calibrate

    err = progress_lib.stderr_console()
    raw = recipe_lib.read_with_overrides(recipe_path, overrides, rundir.resolve_from_run)
    base = recipe_lib.from_mapping(raw)
    devices = devices_lib.configure(
        base.devices, mesh_lib.device_count_for(base.mesh), devices_lib.key_for(overrides.devices)
    )
    model = search.describe_model(base)
    checked = _checked(raw, base, model, devices, budget)
    rates, fresh = calibrate.rates_for(
        devices.device_type, devices.count, err, opts.recalibrate, opts.progress
    )
    rows = _predicted(checked, rates)
    sets = _sets_mapping(overrides)
    if opts.measure is not None:
        _measure(rows, opts, recipe_path, sets, err)
    chosen = report_lib.chosen_index(rows)
    extra = {
        "recipe": base.name,
        "devices": devices.text,
        "device_kind": calibrate.device_kind(devices.device_type, devices.count),
        "rates": rates.to_json(),
        "calibrated_now": fresh,
        "calibration_cache": str(calibrate.cache_path()),
        "repeats": opts.repeats if opts.measure is not None else None,
    }
    _give_back(rows, chosen, opts, base, model, devices, extra, budget, console)
    if opts.write is not None and chosen is not None:
        pick = rows[chosen]
        text = report_lib.recipe_text(
            pick, Path(recipe_path), opts.write.parent, sets, pick.raw["devices"]
        )
        opts.write.write_text(text)
        if not opts.as_json:
            console.print(f"wrote {opts.write}: dtcli train {opts.write}", highlight=False)


def run_published(
    folder: str, overrides: recipe_lib.Overrides, opts: AutoOptions, budget: Any, console: Any
) -> None:
    """`dtcli plan HF_DIR --auto`: a published model's candidates (dtcli.published: one
    sequence per device, the same batch for all), priced by the devices' calibration where this
    machine has them, else by the kind's nominal rates (autoplan.nominal), which the output
    states; predicted only (--measure and --write need a recipe with data)."""
    from dtcli import published as published_lib
    from dtcli.autoplan import calibrate, nominal

    for option, given in (("--measure", opts.measure), ("--write", opts.write)):
        if given is not None:
            raise UsageError(
                f"{option}: dtcli plan HF_DIR --auto predicts only (nothing to train on: the "
                "weights are not loaded and there is no data); use it with a recipe"
            )
    key = devices_lib.key_for(overrides.devices)
    published = published_lib.read(folder)
    raw, base, assumed = published_lib.recipe_for(published, overrides, "devices", key)
    planned = published_lib.planned_devices(raw, key)
    model = search.describe_model(base, published_lib.shapes(base, published))
    sheet = None if _present(planned) else nominal.NOMINAL.get(planned.device_type)
    if sheet is None:
        devices = devices_lib.configure(base.devices, planned.count, key)
    else:
        devices = planned
        if budget.bytes is None:
            budget = dataclasses.replace(budget, bytes=sheet.memory, source=sheet.name)
    checked = _checked(raw, base, model, devices, budget)
    if sheet is None:
        err = progress_lib.stderr_console()
        rates, fresh = calibrate.rates_for(
            devices.device_type, devices.count, err, opts.recalibrate, opts.progress
        )
        kind = calibrate.device_kind(devices.device_type, devices.count)
    else:
        rates, fresh = sheet.calibration(devices.count, base.train.precision), False
        kind = f"{devices.text} {sheet.name} (not on this machine)"
        assumed.append(
            f"rates: {sheet.text(base.train.precision)}; {devices.text} is not on "
            "this machine, so the ranking is by these, never measured"
        )
    rows = _predicted(checked, rates)
    extra = {
        "recipe": base.name,
        "devices": devices.text,
        "device_kind": kind,
        "nominal": sheet is not None,
        "rates": rates.to_json(),
        "calibrated_now": fresh,
        "published": {**published.to_json(), "assumed": assumed},
        "repeats": None,
    }
    if not opts.as_json:
        for line in [f"assumed: {line}" for line in assumed]:
            console.print(line, markup=False, highlight=False, soft_wrap=not console.is_terminal)
    chosen = report_lib.chosen_index(rows)
    _give_back(rows, chosen, opts, base, model, devices, extra, budget, console)


def _present(devices: devices_lib.Devices) -> bool:
    """Whether this machine has the devices a published model is planned for: virtual CPUs
    always; GPUs where TensorFlow sees as many; TPUs and `auto` as their runtime finds them."""
    if devices.device_type != "GPU":
        return True
    from dtcli.tfruntime import import_tensorflow

    return len(import_tensorflow().config.list_physical_devices("GPU")) >= devices.count


def _checked(
    raw: dict, base: recipe_lib.Recipe, model: search.Model, devices: Any, budget: Any
) -> list[search.Checked]:
    """Every candidate of the devices, checked as `train` checks it; none fitting refused."""
    found = search.enumerate_for(base, model, devices.count, devices.device_type)
    checked = search.merge_equal(
        [search.check(raw, c, model, budget, devices.device_type) for c in found]
    )
    search.refuse_if_none_fits(checked, budget)
    return checked


def _predicted(checked: list[search.Checked], rates: Any) -> list[search.Checked]:
    """The candidates with their predicted step times, ranked."""
    from dtcli.autoplan.cost import predict

    for c in checked:
        if c.workload is not None:
            c.prediction = predict(c.workload, rates.rates_for(c.workload))
    return report_lib.ranked(checked)


def _give_back(
    rows: list[search.Checked],
    chosen: int | None,
    opts: AutoOptions,
    base: recipe_lib.Recipe,
    model: search.Model,
    devices: devices_lib.Devices,
    extra: dict,
    budget: Any,
    console: Any,
) -> None:
    """The JSON, or the table, the rank correlation and the devices the pick leaves idle; the
    PNG."""
    title = f"{base.name}: {devices.text}, best predicted first"
    if opts.as_json:
        import json

        print(json.dumps(report_lib.to_json(rows, chosen, extra, budget, devices.count)))
    else:
        per_step = report_lib.items_per_step(base, model.input_shape)
        report_lib.render(rows, chosen, console, title, per_step, budget, opts.top)
        spearman = report_lib.correlation(rows)
        if spearman is not None:
            console.print(f"Spearman rank correlation, predicted vs measured: {spearman:.2f}")
        idle = report_lib.idle_note(rows, chosen, devices.count)
        if idle is not None:
            console.print(idle, markup=False, highlight=False)
    if opts.plot is not None:
        from dtcli.autoplan import figure

        figure.plot(rows, chosen, opts.plot, title)
        if not opts.as_json:
            console.print(f"wrote {opts.plot}", highlight=False)


def _measure(
    rows: list[search.Checked],
    opts: AutoOptions,
    recipe_path: str,
    sets: dict,
    console: Any,
) -> None:
    """The best `opts.top` fitting candidates, each trained `opts.measure` steps
    `opts.repeats` times."""
    from dtcli.autoplan import measure

    todo = [r for r in rows if r.fits][: opts.top]
    jobs = []
    for r in todo:
        # measure writes it into a temporary folder: the base's path is absolute
        text = report_lib.recipe_text(r, Path(recipe_path), None, sets, r.raw["devices"])
        warmup = r.recipe.optimizer.warmup_steps if r.recipe is not None else 0
        jobs.append((search.label(r.candidate), text, warmup or 0))
    timeout = float(os.environ.get(measure.TIMEOUT_ENV, "1800"))
    timings = measure.measure_all(
        jobs, opts.measure, opts.repeats, console, timeout, progress=opts.progress
    )
    for r, timing in zip(todo, timings):
        r.measured_runs_ms, r.measure_error = timing.runs_ms, timing.error
        r.measured_ms = timing.median_ms


def _sets_mapping(overrides: recipe_lib.Overrides) -> dict:
    """The command line's --set values as a nested mapping (written into --write's recipe)."""
    out: dict = {}
    for assignment in overrides.sets:
        recipe_lib.apply_set(out, assignment)
    return out
