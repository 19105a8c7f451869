"""source embedded: the UCI 8x8 handwritten digits that ship inside dtcli, the quick start's
data."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dtcli.data.base import Dataset, Split, ranges, shaped
from dtcli.errors import UsageError
from dtcli.recipe import DataConfig


def _path(cfg: DataConfig) -> Path:
    if cfg.name != "digits":
        raise UsageError(
            f"recipe key 'data.name': the embedded data set is 'digits', got {cfg.name!r}"
        )
    # The UCI "Optical Recognition of Handwritten Digits" test set (1797 examples, 8x8 values
    # 0..16, CC BY 4.0; Alpaydin & Kaynak 1998) ships inside dtcli, as scikit-learn ships it.
    return Path(__file__).parent.parent / "assets" / "digits.csv.gz"


def describe(cfg: DataConfig) -> tuple[tuple[int, ...], int]:
    _path(cfg)
    return (8, 8), 10


def load(cfg: DataConfig, split_names: tuple[str, ...]) -> Dataset:
    table = np.loadtxt(_path(cfg), delimiter=",", dtype=np.float32)
    x = table[:, :-1].reshape(-1, 8, 8) / 16.0
    y = table[:, -1].astype(np.int32)
    # The file is ordered by writer; a fixed permutation makes both halves alike.
    order = np.random.default_rng(1797).permutation(len(y))
    x, y = x[order], y[order]
    cut = len(y) * 4 // 5
    if cfg.train_range is None and cfg.eval_range is None:
        train, evaluate = (0, cut), (cut, len(y))
    else:
        train, evaluate = ranges(len(y), cfg, "the embedded digits")
    return Dataset(
        shaped(Split(x[slice(*train)], y[slice(*train)]), cfg),
        shaped(Split(x[slice(*evaluate)], y[slice(*evaluate)]), cfg),
        10,
        f"embedded digits 8x8 ({train[1] - train[0]} train, {evaluate[1] - evaluate[0]} eval)",
    )
