"""The global gradient norm of a step, with one sum over the mesh for every gradient."""

from __future__ import annotations

from typing import Any


def global_norm(grads: list, variables: list) -> Any:
    """sqrt of the sum of squares of every gradient, as tf.linalg.global_norm, with one sum
    over the mesh for all gradients: each device first sums the squares of its own part of
    each gradient (no collective), and these per-device sums, laid out alike whatever each
    gradient's split, are added on each device and summed over the mesh once: one all-reduce
    a step. (Summed once per kind of split, as before 2026-11-27, gpt_fsdp_tp at 2 layers
    paid 2 more all-reduces and 50 more op executions a step per device, among them gathers
    of the like-split kernels it stacked.)"""
    import tensorflow as tf

    layouts = [getattr(variable, "layout", None) for variable in variables]
    if any(layout is None for layout in layouts):  # plain variables: sum(g^2) / 2 as one kernel
        # each (without XLA, the GPT-2-small shape's 85 M: 21 ms a step against 27)
        return tf.sqrt(2 * tf.reduce_sum(tf.stack([tf.nn.l2_loss(g) for g in grads])))
    parts = [_device_sums(tf.square(g), layout) for g, layout in zip(grads, layouts)]
    return tf.sqrt(tf.reduce_sum(tf.add_n(parts)))


def _device_sums(square: Any, layout: Any) -> Any:
    """The sum of each device's part of `square` (laid out by `layout`), as a tensor of one dim
    per mesh axis, that axis's size, split on it (each device holds its own sum): computed
    on each device with no collective. Where the tensor is not split on an axis, the devices
    along it hold the same part: it counts once, at that axis's index 0 (0 elsewhere)."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    mesh = layout.mesh
    axes = list(mesh.dim_names)
    # Each split dim of size n on an axis of size k as [k, n / k]: the k slices are the
    # devices' parts (DTensor keeps the outer dim split, so the reshape moves nothing).
    shape, outer, split = [], [], []
    for size, spec in zip(square.shape, layout.sharding_specs):
        if spec in axes:
            k = mesh.dim_size(spec)
            outer.append(len(shape))
            split.append(spec)
            shape += [k, size // k]
        else:
            shape.append(size)
    sums = tf.reduce_sum(
        tf.reshape(square, shape), axis=[d for d in range(len(shape)) if d not in outer]
    )
    if split != sorted(split, key=axes.index):
        sums = tf.transpose(sums, sorted(range(len(split)), key=lambda i: axes.index(split[i])))
    sizes = [mesh.dim_size(axis) if axis in split else 1 for axis in axes]
    sums = tf.reshape(sums, sizes)
    if len(split) < len(axes):
        once = np.zeros([mesh.dim_size(axis) for axis in axes], np.float32)
        once[tuple(slice(None) if axis in split else 0 for axis in axes)] = 1.0
        sums = sums * tf.constant(once)
    return dtensor.relayout(sums, dtensor.Layout(axes, mesh))
