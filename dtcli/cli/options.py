"""What the commands share: their common options (`--set`, `--mesh`, `--devices`, `--out`...),
the checks of those options' values, the recipe overrides they make and the console the tables
print on."""

from __future__ import annotations

from typing import Any

import typer

from dtcli.errors import UsageError

SetOption = typer.Option(
    None, "--set", help="Override a recipe key: --set optimizer.learning_rate=3e-4 (repeatable)."
)
MeshOption = typer.Option(None, "--mesh", help="Mesh axes, like batch=4,model=2 (one may be -1).")
DevicesOption = typer.Option(None, "--devices", help="cpu, cpu:N, gpu, gpu:N, tpu or auto.")
EpochsOption = typer.Option(
    None, "--epochs", help="Override train.epochs (the total, also with --resume)."
)
OutOption = typer.Option(None, "--out", help="Run directory (default runs/NAME-TIME).")
NoProgressOption = typer.Option(
    False,
    "--no-progress",
    help="No live progress bar; into a pipe or a file, no progress line and no line every 10 s "
    "while the run is blocked (compiling).",
)
# plan --auto, doctor and generate: no bar to drop, only what they say as they go.
NoStatusOption = typer.Option(
    False,
    "--no-progress",
    help="Say nothing on stderr as it goes: no line naming what it does, none every 10 s "
    "while it blocks (into a pipe or a file).",
)
ConnectTimeoutOption = typer.Option(
    60.0,
    "--connect-timeout",
    help="Seconds a client waits for the others to answer before it gives up.",
)


MemoryOption = typer.Option(
    None,
    "--memory",
    help="Memory budget per device, like 16GiB, 512MiB, 1.5GB or bytes (default: the device's "
    "own, where TensorFlow reports it); a plan over it is refused (exit 2), by train before "
    "anything is allocated.",
)
NoMemoryCheckOption = typer.Option(
    False, "--no-memory-check", help="Train even where the memory plan does not fit."
)


GraceOption = typer.Option(
    30.0,
    "--grace-period",
    help="Seconds from a SIGTERM (a scheduler's preemption notice) to exit: the run saves "
    "at the end of the current call and exits 143; if that takes longer, it exits 143 then "
    "and the last complete checkpoint stands.",
)


ProfileOption = typer.Option(
    None,
    "--profile",
    help="START:STOP: write a TensorBoard profiler trace of optimizer steps START to STOP "
    "into RUN_DIR/tensorboard (at call boundaries: K steps a call; client 0's in a launch).",
)


def check_grace(seconds: float) -> None:
    if not 1 <= seconds <= 86400:
        raise UsageError(
            f"--grace-period {seconds:g}: expected seconds, at least 1 and at most 86400 (a day)"
        )


def overrides(
    sets: list[str] | None, mesh: str | None, devices: str | None, epochs: int | None = None
) -> Any:
    """The command line's recipe overrides, as one recipe.Overrides."""
    from dtcli.recipe import Overrides

    return Overrides(tuple(sets or ()), mesh, devices, epochs)


def user_recipe(path: str, given: Any) -> Any:
    """A recipe file the user gives (not a run's own), with the overrides `given`, loaded as
    `train` loads it: model.from_run filled in from its run's checkpoint."""
    from dtcli import recipe as recipe_lib
    from dtcli.rundir import resolve_from_run

    return recipe_lib.load(path, given, from_run=resolve_from_run)


def console() -> Any:
    """A rich console on stdout that leaves a closed pipe (`dtcli plan ... | head -3`) to run()
    as a BrokenPipeError: rich's own answer is exit 1."""
    from rich.console import Console

    class PipedConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return PipedConsole(soft_wrap=True)


def check_folders(**given: str | None) -> None:
    """An empty --out/--resume would silently mean the default (or the current folder)."""
    for name, value in given.items():
        if value is not None and not value.strip():
            raise UsageError(f"--{name} {value!r}: expected a folder")


def check_timeout(seconds: float) -> None:
    if not seconds > 0:
        raise UsageError(f"--connect-timeout {seconds:g}: expected a positive number of seconds")


def profile_steps(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    import re

    found = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if found is None or not 1 <= int(found.group(1)) <= int(found.group(2)):
        raise UsageError(
            f"--profile {text!r}: expected START:STOP, optimizer steps with 1 <= START <= STOP "
            "(like 10:20)"
        )
    return int(found.group(1)), int(found.group(2))


def checked_run_options(
    out: str | None, resume: str | None, connect_timeout: float, grace: float, profile: str | None
) -> tuple[int, int] | None:
    """The checks of the options `train` and `launch` share; returns --profile's steps."""
    check_folders(out=out, resume=resume)
    check_timeout(connect_timeout)
    check_grace(grace)
    return profile_steps(profile)
