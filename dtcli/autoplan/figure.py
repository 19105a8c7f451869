"""The picture of `dtcli plan --auto --plot FILE.png`: the candidates best first, predicted and
measured step time side by side (matplotlib, Agg; never imports TensorFlow)."""

from __future__ import annotations

import io
from pathlib import Path

from dtcli import mesh as mesh_lib
from dtcli import storage
from dtcli.autoplan.search import Checked
from dtcli.errors import UsageError


def plot(rows: list[Checked], chosen: int | None, path: Path, title: str) -> Path:
    """Horizontal bars per fitting candidate, best predicted at the top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fitting = [c for c in rows if c.fits]
    labels = [
        f"{'* ' if i == chosen else ''}{c.candidate.layout.name}\n"
        f"{mesh_lib.mesh_text(c.candidate.axes)}"
        for i, c in enumerate(fitting)
    ]
    ys = list(range(len(fitting)))
    fig, ax = plt.subplots(figsize=(8, 1.0 + 0.55 * max(len(fitting), 1)))
    height = 0.38
    ax.barh(
        [y - height / 2 for y in ys],
        [c.predicted_ms or 0 for c in fitting],
        height,
        label="predicted",
        color="C0",
    )
    measured = [c.measured_ms for c in fitting]
    if any(m is not None for m in measured):
        ax.barh(
            [y + height / 2 for y in ys],
            [m or 0 for m in measured],
            height,
            label="measured",
            color="C1",
        )
    ax.set_yticks(ys, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("ms per training step (ranked by prediction; *: chosen)")
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, dpi=100, format="png")
    plt.close(fig)
    try:
        storage.write_atomic(path, image.getvalue())
    except OSError as exc:
        raise UsageError(f"--plot {str(path)!r}: cannot write it ({exc.strerror})") from None
    return path
