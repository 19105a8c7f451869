"""The commands that read a recipe and train nothing: `dtcli plan` and `dtcli config`."""

from __future__ import annotations

import sys

import typer

from dtcli.cli.options import (
    DevicesOption,
    MemoryOption,
    MeshOption,
    NoStatusOption,
    SetOption,
    console,
    overrides,
    user_recipe,
)
from dtcli.errors import UsageError


def plan(
    recipe: str = typer.Argument(
        ...,
        help="The recipe YAML file, or a Hugging Face model folder (config.json, safetensors "
        "headers: nothing loaded).",
    ),
    sets: list[str] | None = SetOption,
    mesh: str | None = MeshOption,
    devices: str | None = DevicesOption,
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON object."),
    memory: str | None = MemoryOption,
    auto: bool = typer.Option(
        False, "--auto", help="Search meshes x layouts under --memory, best predicted first."
    ),
    top: int | None = typer.Option(None, "--top", help="--auto: show and measure the best N."),
    measure: int | None = typer.Option(
        None, "--measure", help="--auto: train each shown candidate K steps and time them."
    ),
    repeats: int | None = typer.Option(
        None, "--repeats", help="--measure: runs of each candidate (default 1); their spread."
    ),
    write: str | None = typer.Option(None, "--write", help="--auto: the chosen as a recipe."),
    plot_file: str | None = typer.Option(None, "--plot", help="--auto: the ranking as a PNG."),
    recalibrate: bool = typer.Option(
        False, "--recalibrate", help="--auto: probe the devices again, not the cached rates."
    ),
    no_progress: bool = NoStatusOption,
) -> None:
    """Show where every weight lives on the mesh and what each device holds; trains nothing.
    With --auto: the meshes and layouts that fit, ranked by a calibrated cost model. A Hugging
    Face model folder: planned from its config.json, for devices that need not be here."""
    from dtcli import autoplan
    from dtcli import devices as devices_lib
    from dtcli import memory as memory_lib
    from dtcli import plan as plan_lib
    from dtcli.published import is_model_folder

    budget = memory_lib.budget_from_args(memory)
    opts = autoplan.options(
        auto, mesh, top, measure, write, plot_file, as_json, recalibrate, repeats, not no_progress
    )
    published = is_model_folder(recipe)
    if opts is not None:
        search = autoplan.run_published if published else autoplan.run
        search(recipe, overrides(sets, None, devices), opts, budget, console())
        return
    if published:
        given = overrides(sets, mesh, devices)
        report = plan_lib.published_report(recipe, given, budget, devices_lib.key_for(devices))
    else:
        loaded = user_recipe(recipe, overrides(sets, mesh, devices))
        report = plan_lib.make_report(loaded, budget, devices_lib.key_for(devices))
    if as_json:
        import json

        print(json.dumps(report.to_json()))
    else:
        plan_lib.render(report, console())
    plan_lib.refuse_over_budget(report)  # after the plan: it shows what does not fit


def config(
    recipe: str | None = typer.Argument(None, help="The recipe YAML file."),
    sets: list[str] | None = SetOption,
    mesh: str | None = MeshOption,
    devices: str | None = DevicesOption,
    schema: bool = typer.Option(
        False,
        "--schema",
        help="Print the recipes' JSON schema instead (a RECIPE given is checked first).",
    ),
) -> None:
    """Print the resolved recipe (bases merged, ${VAR}s filled, overrides and defaults applied)."""
    from dtcli import recipe as recipe_lib

    if recipe is None and not schema:
        raise UsageError("RECIPE: give a recipe file (or --schema)")
    if recipe is not None:  # with --schema too: the recipe is checked against it first
        loaded = user_recipe(recipe, overrides(sets, mesh, devices))
        recipe_lib.check_mesh_on_devices(loaded)  # as train does, before any device exists
    elif sets or mesh or devices:
        raise UsageError("--set, --mesh and --devices need a RECIPE")
    if schema:
        import json

        print(json.dumps(recipe_lib.schema(), indent=2))
        return
    sys.stdout.write(recipe_lib.dump(loaded))
