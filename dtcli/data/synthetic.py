"""source synthetic: random examples of data.shape whose label is a fixed linear function of
them (a learnable task of any size, with no files)."""

from __future__ import annotations

import numpy as np

from dtcli.data.base import Dataset, Split, shaped
from dtcli.recipe import DataConfig


def describe(cfg: DataConfig) -> tuple[tuple[int, ...], int]:
    return tuple(cfg.shape), cfg.classes


def load(cfg: DataConfig, split_names: tuple[str, ...]) -> Dataset:
    rng = np.random.default_rng(12345)
    dim = int(np.prod(cfg.shape))
    # Labels are a fixed linear function of the inputs, so the task is learnable.
    w = rng.standard_normal((dim, cfg.classes)).astype(np.float32)

    def make(n: int) -> Split:
        x = rng.random((n, *cfg.shape), dtype=np.float32)
        y = np.argmax(x.reshape(n, dim) @ w, axis=1).astype(np.int32)
        return shaped(Split(x, y), cfg)

    return Dataset(
        make(cfg.count),
        make(cfg.eval_count),
        cfg.classes,
        f"synthetic {list(cfg.shape)} x {cfg.classes} classes "
        f"({cfg.count} train, {cfg.eval_count} eval)",
    )
