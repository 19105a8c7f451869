"""Real MNIST (the IDX test set in ../shared): the accuracy each recipe promises, and the same
accuracy whatever the placement (data-parallel, tensor-parallel, 2-D)."""

from __future__ import annotations

import pytest
from conftest import RECIPES, run_cli

from dtcli import metrics


def train_on_idx(recipe: str, mnist, out) -> dict:
    """Train in this process: the shipped recipes run on 8 virtual CPUs, as the session does."""
    proc = run_cli(
        "train",
        RECIPES / recipe,
        "--set",
        "data.source=idx",
        "--set",
        f"data.path={mnist}",
        "--out",
        out,
        "--no-progress",
    )
    assert proc.returncode == 0, proc.stderr
    return metrics.read(out / "metrics.jsonl")[-1]


@pytest.mark.slow
def test_core_mlp_reaches_092_after_3_epochs(shared_mnist, tmp_path, cpu8):
    final = train_on_idx("mnist_core_mlp.yaml", shared_mnist, tmp_path / "core")
    assert final["epoch"] == 3 and final["eval_examples"] == 5000
    assert final["eval_accuracy"] >= 0.92


@pytest.mark.slow
def test_tensor_parallel_and_2d_match_data_parallel(shared_mnist, tmp_path, cpu8):
    finals = {
        name: train_on_idx(f"{name}.yaml", shared_mnist, tmp_path / name)
        for name in ("mnist_keras_dp", "mnist_mlp_tensor_parallel", "mnist_mlp_2d")
    }
    dp = finals["mnist_keras_dp"]["eval_accuracy"]
    assert dp >= 0.88
    for name in ("mnist_mlp_tensor_parallel", "mnist_mlp_2d"):
        assert abs(finals[name]["eval_accuracy"] - dp) <= 0.005, name
        assert finals[name]["eval_loss"] == pytest.approx(
            finals["mnist_keras_dp"]["eval_loss"], rel=1e-3
        )
