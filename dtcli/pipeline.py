"""The input pipeline: a split as fixed-shape host batches, in an order that is a pure function of
(seed, epoch), each process's share of them, and the packer that puts them on the mesh.

Two kinds of split feed it (dtcli.data): in-memory splits (embedded, IDX, synthetic) are batched
from numpy by a permutation of the whole split; streamed splits (TFRecord, image folders, TFDS,
token shards) come through tf.data, never held whole in memory, shuffled by file order and a
seeded buffer. Either way the last batch of an epoch is padded and masked (no example dropped,
every example counted once), and a resume restarts an epoch at the batch it stopped at, in the
same order.

In a multi-client run each client reads only its share. In-memory: the rows of each global batch
its devices hold, so the numbers are those of one process. Streamed: the clients whose devices
hold the same shards of the data axis form a group; each group reads its own files (or, where
there are fewer files than groups, every n-th example) and all groups run the same number of
steps, the short ones padding with masked batches.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

from dtcli import data as data_lib
from dtcli.errors import UsageError
from dtcli.mesh import UNSHARDED


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


def _arrays(batch: Batch | Picks) -> list[np.ndarray]:
    """A batch's arrays in field order (Batch: x, y, mask; Picks: index, mask)."""
    return [getattr(batch, f.name) for f in fields(batch)]


def empty_like(batch: Batch | Picks) -> Batch | Picks:
    """A batch of the same shapes holding no example (mask all zero): pads a block of steps."""
    return type(batch)(*(np.zeros_like(a) for a in _arrays(batch)))


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


class Packer:
    """Packs host batches onto the mesh: the batch dim sharded along the data axis.

    Each local device gets the shard of its own coordinate on the data axis, not its position in
    the device list: on a 2-D mesh (batch=4, model=2) the two devices of one batch row share a
    shard. (Splitting by device count silently trains on the wrong rows.)

    In a multi-client run a client's devices hold only some shards of each global batch: the
    client reads just those rows (`rows`) and packs them; DTensor assembles the global batch.
    """

    def __init__(self, mesh: Any, data_axis: str):
        self.mesh = mesh
        self.data_axis = data_axis
        self.shards = 1 if data_axis == UNSHARDED else mesh.dim_size(data_axis)
        locations = mesh.local_device_locations()
        self.shard_of_device = [
            0 if data_axis == UNSHARDED else loc[data_axis] for loc in locations
        ]
        # The shards this process holds, in the order its host batches carry them.
        self.local_shards = sorted(set(self.shard_of_device))
        self._position = {shard: i for i, shard in enumerate(self.local_shards)}
        self._layouts: dict[int, Any] = {}
        self._notice_layout: Any = None
        self._verified = False

    def rows(self, batch_size: int) -> np.ndarray | None:
        """Positions in a global batch of `batch_size` this process's devices hold (None: all)."""
        if len(self.local_shards) == self.shards:
            return None
        if batch_size % self.shards:
            raise UsageError(
                f"a batch of {batch_size} does not divide by the data axis size {self.shards}"
            )
        per = batch_size // self.shards
        return np.concatenate([np.arange(s * per, (s + 1) * per) for s in self.local_shards])

    def share(self, batch_size: int) -> Share:
        """What this process feeds of each global batch of `batch_size`."""
        held = len(self.local_shards)
        group = self.local_shards[0] // held
        if self.local_shards != list(range(group * held, (group + 1) * held)):
            raise UsageError(
                f"the data axis {self.data_axis!r}: this process holds its shards "
                f"{self.local_shards}, not one contiguous range; put the data axis first in "
                "the mesh"
            )
        return Share(self.rows(batch_size), group, self.shards // held)

    def layout(self, rank: int, batch_dim: int = 0) -> Any:
        if (rank, batch_dim) not in self._layouts:
            from dtcli.layout import to_layout

            spec = [UNSHARDED] * rank
            spec[batch_dim] = self.data_axis
            self._layouts[rank, batch_dim] = to_layout(tuple(spec), self.mesh)
        return self._layouts[rank, batch_dim]

    def pack(self, array: np.ndarray, batch_dim: int = 0) -> Any:
        """`array`: the rows `rows()` names along `batch_dim`, i.e. the local shards back to
        back (in one process: the whole global batch)."""
        from tensorflow.experimental import dtensor

        held = len(self.local_shards)
        if array.shape[batch_dim] % held:
            raise UsageError(
                f"a batch of {array.shape[batch_dim]} does not divide by the data axis size "
                f"{self.shards}"
            )
        parts = np.split(array, held, axis=batch_dim)
        return dtensor.pack(
            [parts[self._position[s]] for s in self.shard_of_device],
            self.layout(array.ndim, batch_dim),
        )

    def flags(self, values: list[bool]) -> Any:
        """A bool vector on the mesh (replicated): a call's argument that changes from call to
        call without retracing or re-lowering it.

        Not an int or float: DTensor folds a replicated int/float input of under 20 elements
        into the lowered program as a constant and lowers the function again, once, the first
        time its value changes; that second lowering's functions can take the names of the
        first's ("Cannot add function 'while5_body' because a different function with the
        same name already exists"). Bools are never folded."""
        from tensorflow.experimental import dtensor

        from dtcli.layout import replicated

        return dtensor.copy_to_mesh(np.asarray(values, bool), replicated(self.mesh, 1))

    def notices(self, flag: bool) -> Any:
        """This client's flag on each of its devices: a float per device (one dim per mesh
        axis, each split along its axis). The train call's max over it is one all-reduce, so
        every client of a multi-client run reads the same answer after the same call: how
        they agree to stop at one step when any of them got a preemption notice."""
        from tensorflow.experimental import dtensor

        from dtcli.layout import to_layout

        if self._notice_layout is None:
            self._notice_layout = to_layout(tuple(self.mesh.dim_names), self.mesh)
        rank = len(self.mesh.dim_names)
        one = np.full((1,) * rank, float(flag), np.float32)
        return dtensor.pack([one] * len(self.shard_of_device), self._notice_layout)

    def pack_batch(self, batch: Batch) -> tuple[Any, Any, Any]:
        packed = self.pack(batch.x), self.pack(batch.y), self.pack(batch.mask)
        self._verify_once(batch.x, packed[0])
        return packed

    def pack_block(self, batches: list[Batch] | list[Picks], micro: int = 1) -> tuple[Any, ...]:
        """K batches as one block [K, batch, ...] per array (Batch: xs, ys, masks; Picks:
        positions, masks): the batch dim (1) sharded, K replicated. `micro` N > 1 (gradient
        accumulation): each batch as N micro-batches, a block [K*N, batch/N, ...] (see
        micro_batches)."""
        stacked = [np.stack(arrays) for arrays in zip(*map(_arrays, batches), strict=True)]
        if micro > 1:
            stacked = [self.micro_batches(a, micro) for a in stacked]
        packed = tuple(self.pack(a, 1) for a in stacked)
        self._verify_once(stacked[0], packed[0])
        return packed

    def micro_batches(self, block: np.ndarray, n: int) -> np.ndarray:
        """A block of host batches [K, rows, ...] as [K*n, rows/n, ...]: micro-batch j of a
        batch holds the j-th n-th of each of its data shards, so each micro-batch is sharded
        along the data axis like a batch (every device works on every micro-batch, on rows its
        shard of the whole batch holds) and a client of a multi-client run splits only the
        rows it reads. Taking contiguous rows instead would put a micro-batch on a subset of
        the data axis' devices (and, across clients, on rows another client holds)."""
        held = len(self.local_shards)
        k, rows, rest = block.shape[0], block.shape[1], block.shape[2:]
        if rows % (held * n):
            raise UsageError(
                f"a batch of {rows} rows on {held} data shards does not divide into {n} "
                "micro-batches"
            )
        shards = block.reshape(k, held, n, rows // (held * n), *rest)
        return shards.swapaxes(1, 2).reshape(k * n, rows // n, *rest)

    def place(self, array: np.ndarray) -> Any:
        """A whole array on every device of the mesh (replicated): a split placed once."""
        from tensorflow.experimental import dtensor

        from dtcli.layout import replicated

        return dtensor.pack([array] * len(self.shard_of_device), replicated(self.mesh, array.ndim))

    def _verify_once(self, array: np.ndarray, packed: Any) -> None:
        if not self._verified:
            self._verified = True
            self.verify(array, packed)

    def verify(self, array: np.ndarray, packed: Any) -> None:
        """Check once that DTensor reads the packed batch as the host batch, row for row.

        A wrong packing raises nothing in DTensor and trains on the wrong rows (DTENSOR_NOTES
        trap 3); gathering the first batch back is the guard. In a multi-client run a client
        cannot gather the others' rows alone, so only one process checks.
        """
        from tensorflow.experimental import dtensor

        from dtcli.layout import replicated

        if len(self.local_shards) != self.shards:
            return
        whole = dtensor.unpack(dtensor.relayout(packed, replicated(self.mesh, array.ndim)))[0]
        if not np.array_equal(whole.numpy(), array, equal_nan=True):
            raise RuntimeError(
                f"packing bug: the batch on mesh {self.mesh} is not the host batch "
                f"(data axis {self.data_axis!r})"
            )


class PlainPacker(Packer):
    """The Packer of an XLA run (train.compile): one device of one process, no mesh. Batches
    go to the device as plain tensors; there is one data shard and nothing to lay out."""

    def __init__(self) -> None:
        self.mesh = None
        self.data_axis = UNSHARDED
        self.shards = 1
        self.shard_of_device = [0]
        self.local_shards = [0]
        self._position = {0: 0}
        self._verified = True  # a plain tensor is the host array; nothing to check

    def layout(self, rank: int, batch_dim: int = 0) -> Any:
        return None

    def pack(self, array: np.ndarray, batch_dim: int = 0) -> Any:
        import tensorflow as tf

        return tf.convert_to_tensor(array)

    def flags(self, values: list[bool]) -> Any:
        import tensorflow as tf

        return tf.convert_to_tensor(np.asarray(values, bool))

    def notices(self, flag: bool) -> Any:
        raise RuntimeError("an XLA run has one client: there are no notices to agree on")

    def place(self, array: np.ndarray) -> Any:
        return self.pack(array)
