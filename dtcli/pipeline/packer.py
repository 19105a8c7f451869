"""Host batches on the mesh: `Packer` shards a batch's rows along the data axis with
`dtensor.pack` (and checks once that DTensor reads them back row for row); `PlainPacker` gives an
XLA run's one device plain tensors."""

from __future__ import annotations

from typing import Any

import numpy as np

from dtcli.errors import UsageError
from dtcli.mesh import UNSHARDED
from dtcli.pipeline.feed import Batch, Picks, Share, batch_arrays


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
        stacked = [np.stack(arrays) for arrays in zip(*map(batch_arrays, batches), strict=True)]
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
