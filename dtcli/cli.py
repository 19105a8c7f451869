"""The command line: each command loads its input and calls one library function.

TensorFlow is imported only inside commands that need it, so `dtcli --help` and `dtcli plot`
answer at once.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from typing import Any, Callable, Optional

import typer

from dtcli.errors import TrainingError, UsageError

app = typer.Typer(
    help="Train neural networks on TensorFlow DTensor meshes from a YAML recipe.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


def _handled(fn: Callable) -> Callable:
    """Bad input -> `error: ...` on one line and exit 2; training failures exit 1."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (UsageError, TrainingError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise typer.Exit(exc.exit_code) from None

    return wrapper


SetOption = typer.Option(
    None, "--set", help="Override a recipe key: --set optimizer.learning_rate=3e-4 (repeatable)."
)
MeshOption = typer.Option(None, "--mesh", help="Mesh axes, like batch=4,model=2 (one may be -1).")
DevicesOption = typer.Option(None, "--devices", help="cpu, cpu:N, gpu, gpu:N, tpu or auto.")


@app.command()
@_handled
def train(
    recipe: Path = typer.Argument(..., help="The recipe YAML file."),
    sets: Optional[list[str]] = SetOption,
    mesh: Optional[str] = MeshOption,
    devices: Optional[str] = DevicesOption,
    epochs: Optional[int] = typer.Option(None, "--epochs", help="Override train.epochs."),
    out: Optional[Path] = typer.Option(None, "--out", help="Run directory (default runs/NAME-TIME)."),
    no_progress: bool = typer.Option(False, "--no-progress", help="No live progress bar."),
) -> None:
    """Train a recipe on a DTensor mesh and write a run directory."""
    from dtcli import recipe as recipe_lib

    loaded = recipe_lib.load(recipe, sets or [], mesh=mesh, devices=devices, epochs=epochs)
    from dtcli.train import train as run_training

    result = run_training(loaded, out=out, progress=not no_progress)
    print(result.run_dir)


@app.command()
@_handled
def plot(
    run_dirs: list[Path] = typer.Argument(..., help="One or more run directories."),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder for the PNGs "
                                       "(default RUN_DIR/plots for one run, ./plots for several)."),
    metric: Optional[list[str]] = typer.Option(None, "--metric",
                                               help="loss, accuracy or examples_per_sec (repeatable)."),
) -> None:
    """Draw the metric curves of one or more runs (overlaid when several)."""
    from dtcli.plot import plot_runs

    target = out or (run_dirs[0] / "plots" if len(run_dirs) == 1 else Path("plots"))
    for path in plot_runs(run_dirs, target, metric or None):
        print(path)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
