"""FSDP's padded weights (layout.WeightPlan.padded): a weight whose dims the data axis divides
none of is stored on the mesh with its FSDP dim rounded up to a multiple of the data axis, as
PyTorch's FSDP2 pads a shard, so that it is split like any other; checkpoints hold it at its
own shape.

The padding never trains: the layers gather the weight and slice the padding off before using
it (models/compute.py), so its gradient is 0; a weight whose gradient and optimizer state are 0
does not move under SGD, momentum, Adam or AdamW (whose decay multiplies it, 0), and it adds 0
to clipping's global norm. It starts at 0 and stays 0, and so do its optimizer slots.

A checkpoint holds the weight gathered off the data axis with the padding sliced off, and a
restore pads it again: a checkpoint restores on any mesh, on one device and into plain
variables, and a padded weight restores from any checkpoint. Both go through a scratch variable
of the weight's own shape, whole on the padded dim (DTensor's save reads a variable; its
restore learns the shape and layout it reads from the variable it assigns to,
tensorflow/dtensor/mlir/checkpoint_shape_inference.cc), so each device holds the weight whole
for the moment of a save or restore.

This module imports TensorFlow: only models/core.py and optimizers/ import it, inside the
functions that build variables.
"""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf
from tensorflow.dtensor.python import d_variable
from tensorflow.experimental import dtensor
from tensorflow.python.trackable import base as trackable
from tensorflow.python.training.saving import saveable_object

from dtcli.mesh import UNSHARDED


class PaddedVariable(dtensor.DVariable):
    """A DVariable stored padded on one dim (`padded_dim`), saved and restored at
    `unpadded_shape`."""

    # (Keyword-only: tf.Variable's metaclass reads a second positional argument as `trainable`.)
    def __init__(self, initial_value: Any, *, unpadded_shape: tuple[int, ...], **kwargs: Any):
        super().__init__(initial_value, **kwargs)
        self.unpadded_shape = tuple(unpadded_shape)
        differs = [d for d, (a, b) in enumerate(zip(self.shape, unpadded_shape)) if a != b]
        self.padded_dim = differs[0]

    def whole_layout(self) -> Any:
        """The variable's layout with the padded dim unsplit: a layout its own shape takes (the
        data axis does not divide that dim)."""
        specs = list(self.layout.sharding_specs)
        specs[self.padded_dim] = UNSHARDED
        return dtensor.Layout(specs, self.layout.mesh)

    def unpadded(self) -> Any:
        """The value at its own shape, in `whole_layout`."""
        return unpad(dtensor.relayout(self.read_value(), self.whole_layout()), self.unpadded_shape)

    def assign_unpadded(self, value: Any) -> Any:
        """Assign a value of the own shape in `whole_layout`, padded with zeros."""
        whole = self.whole_layout()
        pads = [[0, n - m] for n, m in zip(self.shape, self.unpadded_shape)]
        # Each step pinned to a layout: DTensor would carry the variable's split on the data
        # axis back through the pad to the unpadded value, which it does not divide.
        value = dtensor.relayout(tf.pad(dtensor.relayout(value, whole), pads), whole)
        return self.assign(dtensor.relayout(value, self.layout))

    def _gather_saveables_for_checkpoint(self) -> dict[str, Any]:
        return {trackable.VARIABLE_VALUE_KEY: functools.partial(_UnpaddedSaveable, self)}


def unpad(value: Any, shape: tuple[int, ...]) -> Any:
    """The first `shape` of a padded value (the padding is at the end of its dim)."""
    return tf.slice(value, [0] * len(shape), list(shape))


class _UnpaddedSaveable(saveable_object.SaveableObject):
    """A padded variable as checkpoints see it: its own shape, through a scratch DVariable
    that DTensor's own saveable saves and restores (its host-mesh copies on GPUs included)."""

    def __init__(self, variable: PaddedVariable, name: str):
        self._variable = variable
        layout = variable.whole_layout()
        zeros = dtensor.call_with_layout(
            tf.zeros, layout, shape=variable.unpadded_shape, dtype=variable.dtype
        )
        self._scratch = dtensor.DVariable(zeros, trainable=False)
        self._inner = d_variable._DVariableSaveable(self._scratch, name)
        spec = self._inner.specs[0]

        def tensor() -> Any:
            # Filled when the save reads it, not before: the value at the time of the save.
            self._scratch.assign(variable.unpadded())
            return spec.tensor

        saved = d_variable.DSaveSpec(
            tensor,
            spec.slice_spec,
            spec.name,
            spec.global_shape,
            spec.layout,
            dtype=spec.dtype,
            device=spec.device,
        )
        super().__init__(None, [saved], name)

    def restore(self, restored_tensors: Any, restored_shapes: Any) -> Any:
        self._inner.restore(restored_tensors, restored_shapes)
        return self._variable.assign_unpadded(self._scratch.read_value())


def on_mesh(value: Any, layout: Any, stored_shape: tuple[int, ...], name: str) -> Any:
    """A weight's DVariable from `value` (its own shape, replicated): padded with zeros to
    `stored_shape` where that differs (a PaddedVariable), laid out as `layout`."""
    shape = tuple(value.shape)
    if shape == tuple(stored_shape):
        return dtensor.DVariable(dtensor.relayout(value, layout), name=name)
    pads = [[0, n - m] for n, m in zip(stored_shape, shape)]
    value = dtensor.relayout(tf.pad(value, pads), layout)
    return PaddedVariable(value, unpadded_shape=shape, name=name)


def zeros_like(variable: Any, name: str) -> Any:
    """An optimizer slot for `variable`: zeros of its (stored) shape and layout, saved at the
    variable's own shape where it is padded."""
    zeros = dtensor.call_with_layout(tf.zeros, variable.layout, shape=variable.shape)
    if isinstance(variable, PaddedVariable):
        return PaddedVariable(
            zeros, unpadded_shape=variable.unpadded_shape, name=name, trainable=False
        )
    return dtensor.DVariable(zeros, name=name, trainable=False)
