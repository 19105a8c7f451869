"""`dtcli plot`: the metric curves of one or more run directories (no TensorFlow)."""

from __future__ import annotations

import typer


def plot(
    run_dirs: list[str] = typer.Argument(..., help="One or more run directories."),
    out: str | None = typer.Option(
        None,
        "--out",
        help="Folder for the PNGs (default RUN_DIR/plots for one run, ./plots for several).",
    ),
    metric: list[str] | None = typer.Option(
        None,
        "--metric",
        help="loss, accuracy, step_loss, examples_per_sec; language models also perplexity, "
        "bpb, tokens_per_sec, learning_rate, grad_norm; a run with train.eval_tasks its "
        "TASK/METRIC names, e.g. hellaswag/acc (repeatable).",
    ),
) -> None:
    """Draw the metric curves of one or more runs (overlaid when several)."""
    from dtcli import rundir, storage
    from dtcli.plot import plot_runs

    paths = [storage.as_path(r) for r in run_dirs]
    if out is None and len(paths) == 1:  # the default: name the run the user gave
        rundir.check_plots(run_dirs[0])
    target = storage.as_path(out) if out else (paths[0] / "plots" if len(paths) == 1 else "plots")
    out_arg = "--out" if out else "the default --out"
    for path in plot_runs(paths, target, metric or None, out_arg=out_arg):
        print(path)
