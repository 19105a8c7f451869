"""Metric curves from metrics.jsonl files, drawn with matplotlib. Never imports TensorFlow."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtcli.errors import UsageError
from dtcli.metrics import METRICS_FILE, STEPS_FILE, read

# metric -> the record keys drawn in its figure (train and eval side by side, as in the seeds).
FIGURES = {
    "loss": ("train_loss", "eval_loss"),
    "accuracy": ("train_accuracy", "eval_accuracy"),
    "examples_per_sec": ("examples_per_sec",),
    "step_loss": ("loss",),  # from steps.jsonl, against the step
}
TITLES = {
    "loss": "Cross-entropy loss",
    "accuracy": "Accuracy",
    "examples_per_sec": "Training throughput (examples/s)",
    "step_loss": "Training loss per step",
}


def load_steps(run_dirs: list[Path], names: list[str], warn: Any = None) -> dict[str, list]:
    """Per-step loss records of the runs that recorded them, under the same run names."""
    steps = {}
    for name, run_dir in zip(names, run_dirs):
        path = Path(run_dir) / STEPS_FILE
        if path.is_file():
            records = read(path, warn)
            if records:
                steps[name] = records
    return steps


def load_runs(run_dirs: list[Path], warn: Any = None) -> dict[str, list[dict[str, Any]]]:
    runs = {}
    for run_dir in run_dirs:
        path = Path(run_dir) / METRICS_FILE
        if not Path(run_dir).is_dir():
            raise UsageError(f"RUN_DIR {str(run_dir)!r}: no such folder")
        if not path.is_file():
            raise UsageError(
                f"RUN_DIR {str(run_dir)!r}: no {METRICS_FILE} (has this run finished an epoch?)"
            )
        records = read(path, warn)
        if not records:
            raise UsageError(f"RUN_DIR {str(run_dir)!r}: {METRICS_FILE} holds no complete records")
        name = Path(run_dir).resolve().name
        while name in runs:
            name += "'"
        runs[name] = records
    return runs


def plot_runs(
    run_dirs: list[Path], out_dir: Path, metrics: list[str] | None = None, warn: Any = None
) -> list[Path]:
    """Write one PNG per metric; with several runs, their curves overlay in each figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    runs = load_runs(run_dirs, warn)
    steps = load_steps(run_dirs, list(runs), warn)
    wanted = metrics or ["loss", "accuracy"] + (["step_loss"] if steps else [])
    for metric in wanted:
        if metric not in FIGURES:
            raise UsageError(f"--metric {metric!r}: expected one of {', '.join(FIGURES)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    several = len(runs) > 1
    for metric in wanted:
        fig, ax = plt.subplots(figsize=(8, 5))
        x_key = "step" if metric == "step_loss" else "epoch"
        series = steps if metric == "step_loss" else runs
        if not series:
            plt.close(fig)
            raise UsageError(f"--metric {metric}: no run here recorded it ({STEPS_FILE})")
        for name, records in series.items():
            color = f"C{list(runs).index(name)}"
            for key in FIGURES[metric]:
                points = [(r[x_key], r[key]) for r in records if key in r and x_key in r]
                if not points:
                    continue
                xs, ys = zip(*points)
                split = key.split("_")[0] if len(FIGURES[metric]) > 1 else ""
                label = " ".join(s for s in (name if several else "", split) if s) or key
                style = "--" if split == "eval" else "-"
                ax.plot(
                    xs,
                    ys,
                    style,
                    color=color if several else None,
                    marker="o" if x_key == "epoch" else None,
                    markersize=3,
                    label=label,
                )
        ax.set_xlabel(x_key)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # epochs and steps are whole
        ax.set_ylabel(metric.replace("_", " "))
        title = TITLES[metric] + (" vs training epochs" if metric in ("loss", "accuracy") else "")
        if not several:
            title += f": {next(iter(runs))}"
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
        path = out_dir / f"{metric}.png"
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
