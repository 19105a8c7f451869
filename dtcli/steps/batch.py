"""A step's batch inside the compiled call: taken from a block of K batches on the mesh, or
gathered from a split placed on the devices, with the step's batch layout."""

from __future__ import annotations

from typing import Any

from dtcli import pipeline as pipeline_lib


def _pick(packer: pipeline_lib.Packer, block: Any, i: Any) -> Any:
    """Batch `i` of a block [K, batch, ...] on the mesh, with the step's batch layout."""
    import tensorflow as tf

    # tf.gather, not block[i]: DTensor gives a strided slice with a dynamic index the
    # layout of its input shifted by one dim (measured: a rank-5 block trains on scrambled
    # rows with no error; MaxPool refuses "unsharded,batch,..."). The relayout states the
    # step's batch layout (a no-op when it is already right).
    return _on_batch_layout(packer, tf.gather(block, i))


def _on_batch_layout(packer: pipeline_lib.Packer, tensor: Any) -> Any:
    """`tensor` with the batch layout of its rank (as it is in an XLA run: no mesh)."""
    from tensorflow.experimental import dtensor

    if packer.mesh is None:
        return tensor
    return dtensor.relayout(tensor, packer.layout(len(tensor.shape)))


def batch_at(
    packer: pipeline_lib.Packer, placed: Any, inputs: tuple, masks: Any, i: Any
) -> tuple[Any, Any, Any]:
    """(x, y, mask) of step `i` of a block: from the block's batches, or gathered from the
    split placed on the devices (`placed`) at the block's positions."""
    import tensorflow as tf

    if placed is None:
        xs, ys = inputs
        return _pick(packer, xs, i), _pick(packer, ys, i), _pick(packer, masks, i)
    # The split is on every device; each device gathers its own rows of the batch.
    (index,) = inputs
    rows = _pick(packer, index, i)
    x, y = (tf.gather(t, rows) for t in placed)
    return _on_batch_layout(packer, x), _on_batch_layout(packer, y), _pick(packer, masks, i)
