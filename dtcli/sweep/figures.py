"""The sweep's plots: the metric against each swept key, one PNG per key
(SWEEP_DIR/plots/METRIC-vs-KEY.png), drawn with matplotlib from summary.json's trials; never
TensorFlow."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from dtcli import storage


def file_name(metric: str, key: str) -> str:
    return f"{metric}-vs-{key}.png".replace("/", "_")


def _numbers(values: list[Any]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)


def _log_axis(values: list[Any], drawn_on_log: bool) -> bool:
    """A log x axis for a loguniform key, or positive numbers spanning more than a decade."""
    if not _numbers(values) or not values:
        return False
    return drawn_on_log or (min(values) > 0 and max(values) / min(values) > 10)


def plot(
    out: Path, metric: str, keys: list[str], trials: list[dict[str, Any]], log_keys: set[str]
) -> list[Path]:
    """One figure per swept key: each trial with a value, a point at its key's value (text
    values as categories, in trial order)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_value = [t for t in trials if t["value"] is not None]
    if not with_value:
        return []
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for key in keys:
        xs = [t["overrides"][key] for t in with_value]
        ys = [t["value"] for t in with_value]
        fig, ax = plt.subplots(figsize=(7, 4.5))
        try:
            if _numbers(xs):
                ax.scatter(xs, ys)
                if _log_axis(xs, key in log_keys):
                    ax.set_xscale("log")
            else:
                names = list(dict.fromkeys(map(str, xs)))
                ax.scatter([names.index(str(x)) for x in xs], ys)
                ax.set_xticks(range(len(names)), names)
            ax.set_xlabel(key)
            ax.set_ylabel(metric)
            ax.set_title(f"{metric} vs {key} ({len(with_value)} trials)")
            ax.grid(True, alpha=0.3)
            fig.tight_layout()
            image = io.BytesIO()
            fig.savefig(image, dpi=100, format="png")
            path = out / file_name(metric, key)
            storage.write_atomic(path, image.getvalue())  # a reader never sees half a PNG
            written.append(path)
        finally:
            plt.close(fig)
    return written
