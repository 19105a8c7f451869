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

    feed.py    host batches: the epoch's order, fixed-shape padded batches, each process's share
    packer.py  `Packer` puts host batches on the mesh (`dtensor.pack`); `PlainPacker` the plain
               tensors of an XLA run
"""

from dtcli.pipeline.feed import (
    Batch,
    Feed,
    Picks,
    Share,
    batches,
    empty_like,
    epoch_order,
    positions,
    steps_per_epoch,
)
from dtcli.pipeline.packer import Packer, PlainPacker

__all__ = [
    "Batch",
    "Feed",
    "Packer",
    "Picks",
    "PlainPacker",
    "Share",
    "batches",
    "empty_like",
    "epoch_order",
    "positions",
    "steps_per_epoch",
]
