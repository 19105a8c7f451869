"""A split as fixed-shape host batches: the order of an epoch (a pure function of (seed, epoch)),
the last batch padded and masked, this process's share of each global batch, and a streamed
split read through tf.data."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from dtcli import data as data_lib


@dataclass(frozen=True)
class Batch:
    x: np.ndarray
    y: np.ndarray
    mask: np.ndarray  # 1.0 for real examples, 0.0 for padding


@dataclass(frozen=True)
class Picks:
    """A batch of a split placed on the devices, named by its examples' positions in it."""

    index: np.ndarray  # int32 positions in the split (padding: 0, masked out)
    mask: np.ndarray


def batch_arrays(batch: Batch | Picks) -> list[np.ndarray]:
    """A batch's arrays in field order (Batch: x, y, mask; Picks: index, mask)."""
    return [getattr(batch, f.name) for f in fields(batch)]


def empty_like(batch: Batch | Picks) -> Batch | Picks:
    """A batch of the same shapes holding no example (mask all zero): pads a block of steps."""
    return type(batch)(*(np.zeros_like(a) for a in batch_arrays(batch)))


def steps_per_epoch(n: int, batch_size: int) -> int:
    return -(-n // batch_size)


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The example order of one epoch: a pure function of (seed, epoch), so resuming is exact."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


def batches(
    split: data_lib.Split,
    batch_size: int,
    order: np.ndarray | None = None,
    rows: np.ndarray | None = None,
) -> Iterator[Batch]:
    """Fixed-shape batches; the last one padded with zeros and masked out.

    `rows`: only these positions of each global batch are read (a client of a multi-client run
    reads the shards its own devices hold, see Packer.rows); None reads the whole batch.
    """
    for picks in positions(len(split), batch_size, order, rows):
        real = picks.mask > 0
        take = picks.index[real]
        yield _padded(split.x[take], split.y[take], len(picks.mask))


def positions(
    n: int,
    batch_size: int,
    order: np.ndarray | None = None,
    rows: np.ndarray | None = None,
) -> Iterator[Picks]:
    """The batches of `batches` as positions in the split (for a split placed on the devices)."""
    idx = np.arange(n) if order is None else order
    for start in range(0, len(idx), batch_size):
        take = idx[start : start + batch_size]
        if rows is not None:
            real = rows < len(take)  # rows past the end of the last batch are padding
            take = take[rows[real]]
            width = len(rows)
        else:
            width = batch_size
        # Padding sits at the end of the global batch, hence at the end of any row subset.
        index = np.zeros(width, np.int32)
        index[: len(take)] = take
        mask = np.zeros(width, np.float32)
        mask[: len(take)] = 1.0
        yield Picks(index, mask)


@dataclass(frozen=True)
class Share:
    """The part of each global batch this process feeds."""

    rows: np.ndarray | None  # positions in the global batch its devices hold (None: all)
    group: int  # streamed splits: this process's group of clients holding the same shards
    groups: int


class Feed:
    """One split batched for this process: `epoch(e, start)` gives the batches of epoch `e` from
    batch `start` on, `steps` of them in all (fixed-shape, the last ones padded).

    `on_device`: the split is placed on the devices (an in-memory split only) and the epoch
    gives Picks, the positions of each batch's examples, instead of the examples."""

    def __init__(
        self,
        split: Any,
        batch_size: int,
        seed: int,
        shuffle: bool,
        share: Share,
        on_device: bool = False,
    ) -> None:
        self.split = split
        self.on_device = on_device
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.share = share
        self.in_memory = isinstance(split, data_lib.Split)
        if self.in_memory:
            self.local_batch = batch_size
            self.steps = steps_per_epoch(len(split), batch_size)
        else:
            rows = share.rows
            self.local_batch = batch_size if rows is None else len(rows)
            counts = data_lib.share_counts(split, share.groups)
            # Every group runs as many steps as the largest share needs: the collectives of a
            # step wait for every client.
            self.steps = max(steps_per_epoch(n, self.local_batch) for n in counts)

    def epoch(
        self, epoch: int, start: int = 0, stop: int | None = None
    ) -> Iterator[Batch] | Iterator[Picks]:
        stop = self.steps if stop is None else min(stop, self.steps)
        if start >= stop:
            return iter(())
        if self.in_memory:
            order = epoch_order(len(self.split), self.seed, epoch, self.shuffle)
            order = order[start * self.batch_size : stop * self.batch_size]
            if self.on_device:
                return positions(len(self.split), self.batch_size, order, self.share.rows)
            return batches(self.split, self.batch_size, order, self.share.rows)
        return self._stream(epoch, start, stop)

    def _stream(self, epoch: int, start: int, stop: int) -> Iterator[Batch]:
        import tensorflow as tf

        examples = data_lib.examples(
            self.split, self.seed, epoch, self.shuffle, self.share.group, self.share.groups
        )
        # Resuming mid-epoch skips what was trained: the order is the same, so the run goes on
        # at the same example (skipping reads those records again; it does not train on them).
        ds = (
            examples.skip(start * self.local_batch)
            .batch(self.local_batch)
            .take(stop - start)
            .prefetch(tf.data.AUTOTUNE)  # the host decodes the next batches while devices run
        )
        done = start
        with data_lib.reading(self.split):
            for x, y in ds.as_numpy_iterator():
                yield _padded(x, y, self.local_batch)
                done += 1
        empty = np.zeros((0, *self.split.example_shape), self.split.x_dtype)
        for _ in range(done, stop):  # this group's share ran out before the longest one's
            yield _padded(empty, np.zeros((0, *self.split.y_shape), np.int32), self.local_batch)


def _padded(x: np.ndarray, y: np.ndarray, width: int) -> Batch:
    """`width` rows: the examples given, then zeros masked out."""
    mask = np.ones(width, np.float32)
    if len(y) < width:
        pad = width - len(y)
        x = np.concatenate([x, np.zeros((pad, *x.shape[1:]), x.dtype)])
        y = np.concatenate([y, np.zeros((pad, *y.shape[1:]), y.dtype)])
        mask[width - pad :] = 0.0
    return Batch(x, y, mask)
