"""Metric curves from metrics.jsonl files, drawn with matplotlib. Never imports TensorFlow."""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any

from dtcli import rundir, storage
from dtcli.errors import UsageError
from dtcli.metrics import read

# metric -> the record keys drawn in its figure (train and eval side by side, as in the seeds).
FIGURES = {
    "loss": ("train_loss", "eval_loss"),
    "accuracy": ("train_accuracy", "eval_accuracy"),
    "examples_per_sec": ("examples_per_sec",),
    "perplexity": ("eval_perplexity",),  # language models
    "bpb": ("eval_bpb",),
    "tokens_per_sec": ("tokens_per_sec",),
    "step_loss": ("loss",),  # from steps.jsonl, against the step
    "learning_rate": ("learning_rate",),
    "grad_norm": ("grad_norm",),
}
# Figures drawn from steps.jsonl (per logged step) rather than metrics.jsonl (per evaluation).
STEP_METRICS = ("step_loss", "learning_rate", "grad_norm")
TITLES = {
    "loss": "Cross-entropy loss",
    "accuracy": "Accuracy",
    "examples_per_sec": "Training throughput (examples/s)",
    "perplexity": "Evaluation perplexity",
    "bpb": "Evaluation bits per byte of text",
    "tokens_per_sec": "Training throughput (tokens/s)",
    "step_loss": "Training loss per step",
    "learning_rate": "Learning rate per step",
    "grad_norm": "Gradient global norm per step",
}


def load_steps(run_dirs: list[Path], names: list[str], warn: Any = None) -> dict[str, list]:
    """Per-step loss records of the runs that recorded them, under the same run names."""
    steps = {}
    for name, run_dir in zip(names, run_dirs):
        path = rundir.steps_file(run_dir)
        if path.is_file():
            records = read(path, warn, required=("step",))
            if records:
                steps[name] = records
    return steps


def load_runs(run_dirs: list[Path], warn: Any = None) -> dict[str, list[dict[str, Any]]]:
    runs = {}
    for run_dir in run_dirs:
        path = rundir.metrics_file(run_dir)
        try:
            records = read(path, warn, required=("epoch", "step"))
        except OSError as exc:
            raise UsageError(
                f"RUN_DIR {str(run_dir)!r}: cannot read {path.name} ({rundir.os_reason(exc)})"
            ) from None
        if not records:
            raise UsageError(f"RUN_DIR {str(run_dir)!r}: {path.name} holds no complete records")
        name = storage.as_path(run_dir).resolve().name
        while name in runs:
            name += "'"
        runs[name] = records
    return runs


def plot_runs(
    run_dirs: list[Path],
    out_dir: Path,
    metrics: list[str] | None = None,
    warn: Any = None,
    out_arg: str = "--out",
) -> list[Path]:
    """Write one PNG per metric; with several runs, their curves overlay in each figure.
    `out_arg`: how messages name `out_dir` (the user may not have given --out)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for metric in metrics or []:
        if metric not in FIGURES and not _is_task_metric(metric):
            raise UsageError(
                f"--metric {metric!r}: expected one of {', '.join(FIGURES)}, or an lm-eval "
                "task's TASK/METRIC that train.eval_tasks recorded"
            )
    out_dir = storage.as_path(out_dir)
    runs = load_runs(run_dirs, warn)  # first: a wrong RUN_DIR also makes its default --out wrong
    rundir.check_output_folder(out_dir, out_arg, refuse_held=False)
    steps = load_steps(run_dirs, list(runs), warn)
    # A language model (train.steps runs) is drawn against the step, and has more to show.
    language = any("eval_perplexity" in r for records in runs.values() for r in records)
    defaults = _default_metrics(language, bool(steps))
    recorded = [m for m in defaults if _recorded(m, runs, steps)] + _task_metrics(runs)
    wanted = metrics or recorded or defaults[:1]
    _check_recorded(wanted, runs, steps)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"{out_arg} {str(out_dir)!r}: cannot create it ({rundir.os_reason(exc)})"
        ) from None
    written = []
    for metric in wanted:
        fig = _figure(plt, metric, runs, steps, language)
        try:
            written.append(_save(fig, out_dir / _file_name(metric), out_dir, out_arg))
        finally:
            plt.close(fig)
    return written


def _is_task_metric(metric: str) -> bool:
    """An lm-eval task's metric as train.eval_tasks records it: TASK/METRIC[/FILTER]."""
    return "/" in metric and all(metric.split("/"))


def _task_metrics(runs: dict[str, list]) -> list[str]:
    """The task metrics the runs recorded, in their order, standard errors left out (each is
    its own figure on request: --metric TASK/METRIC_stderr)."""
    seen = dict.fromkeys(
        key
        for records in runs.values()
        for r in records
        for key in r
        if _is_task_metric(key) and "_stderr" not in key
    )
    return list(seen)


def _keys(metric: str) -> tuple[str, ...]:
    """The record keys a metric's figure draws (a task metric: its own)."""
    return FIGURES.get(metric, (metric,))


def _file_name(metric: str) -> str:
    """The PNG of a metric: in a task metric's name each '/' (and anything else a file name
    should not hold) becomes '-' (tiny_mc/acc: tiny_mc-acc.png)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "-", metric) + ".png"


def _recorded(metric: str, runs: dict[str, list], steps: dict[str, list]) -> bool:
    series = steps if metric in STEP_METRICS else runs
    return any(key in r for records in series.values() for r in records for key in _keys(metric))


def _check_recorded(wanted: list[str], runs: dict[str, list], steps: dict[str, list]) -> None:
    """Every metric asked for is in some run's records, before anything is written."""
    for metric in wanted:
        if not _recorded(metric, runs, steps):
            have = [m for m in FIGURES if _recorded(m, runs, steps)] + _task_metrics(runs)
            raise UsageError(
                f"--metric {metric}: no run here recorded it; they have {', '.join(have) or 'none'}"
            )


def _default_metrics(language: bool, steps: bool) -> list[str]:
    """The figures drawn without --metric: a language model has perplexity and, with per-step
    records, the step curves; others loss, accuracy and the step loss."""
    if language:
        return ["loss", "accuracy", "perplexity", "bpb"] + (
            ["step_loss", "learning_rate", "grad_norm"] if steps else []
        )
    return ["loss", "accuracy"] + (["step_loss"] if steps else [])


def _figure(
    plt: Any,
    metric: str,
    runs: dict[str, list[dict[str, Any]]],
    steps: dict[str, list],
    language: bool,
) -> Any:
    """One metric's figure: every run's curves of its record keys, titled and labelled."""
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(8, 5))
    by_step = metric in STEP_METRICS
    x_key = "step" if by_step or language else "epoch"
    series = steps if by_step else runs
    several = len(runs) > 1
    for name, records in series.items():
        color = f"C{list(runs).index(name)}" if several else None
        _curves(ax, metric, name if several else "", records, x_key, color)
    ax.set_xlabel(x_key)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and steps are whole
    ax.set_ylabel(metric.replace("_", " "))
    versus = " vs training steps" if language else " vs training epochs"
    title = TITLES.get(metric, f"lm-eval {metric}") + (
        versus if metric in ("loss", "accuracy") else ""
    )
    if not several:
        title += f": {next(iter(runs))}"
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    return fig


def _curves(
    ax: Any, metric: str, name: str, records: list[dict[str, Any]], x_key: str, color: str | None
) -> None:
    """One run's curves in a figure, one per record key of the metric (train solid, eval
    dashed); `name` labels them when several runs overlay."""
    for key in _keys(metric):
        points = [(r[x_key], r[key]) for r in records if key in r and x_key in r]
        if not points:
            continue
        xs, ys = zip(*points)
        split = key.split("_")[0] if len(_keys(metric)) > 1 else ""
        label = " ".join(s for s in (name, split) if s) or key
        style = "--" if split == "eval" else "-"
        ax.plot(
            xs,
            ys,
            style,
            color=color,
            marker="o" if x_key == "epoch" else None,
            markersize=3,
            label=label,
        )


def _save(fig: Any, path: Path, out_dir: Path, out_arg: str) -> Path:
    try:
        # Replaced whole: a reader (or a plot of a running run) never sees half a PNG.
        image = io.BytesIO()
        fig.savefig(image, dpi=100, format="png")
        storage.write_atomic(path, image.getvalue())
    except OSError as exc:
        raise UsageError(
            f"{out_arg} {str(out_dir)!r}: cannot write {path.name} ({rundir.os_reason(exc)})"
        ) from None
    return path
