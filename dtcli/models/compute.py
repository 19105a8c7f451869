"""How dtcli's own layers (the GPT's, the Core MLP's) read their weights in the step: gathered
off the data axis where FSDP shards them, and in the compute dtype (`train.precision`).

FSDP: a weight sharded on the data axis lives as 1/N on each device between steps; where a layer
uses it, it is relaid out to its compute layout (the same spec without the data axis): an
all-gather in the forward pass, and the gradient comes back to the weight's own layout (the
gathered gradient is summed over the batch shards, then each device keeps its slice). DTensor's
matmul and einsum expanders refuse a weight sharded on the data axis and on a model axis at once
(DTENSOR_NOTES.md, "FSDP by layouts"); gathered first, the tensor-parallel layer sees the weight
it always saw.

bf16: weights and activations are cast to bfloat16 for the matmuls only (oneDNN runs them on
AMX where the CPU has it); each matmul's result comes back as float32, so the residual stream,
LayerNorm, softmax, the loss, the master weights and the optimizer state stay float32. The cast
comes before the gather (the all-gather then moves half the bytes), except on a CPU mesh,
whose collectives DTensor runs in float32 anyway (`_collectives_in_float32`).

LoRA (models/lora.py): the base weights are frozen (`frozen`: made not trainable) and may be
stored in bfloat16 (`stored`, lora.base_precision); such a weight is read back as float32 wherever
float32 computes with it. Adapters are float32 and trainable like any weight without LoRA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dtcli.mesh import UNSHARDED


@dataclass(frozen=True)
class Compute:
    # The mesh axis weights may be sharded on for FSDP (the data axis), or None.
    gather_axis: str | None = None
    bf16: bool = False
    # LoRA: the base weights (every weight `add` makes) are frozen, and stored in this dtype.
    frozen: bool = False
    stored: str = "float32"

    def add(self, layer: Any, name: str, shape: tuple[int, ...], initializer: Any) -> Any:
        """A base weight of `layer` (tf-keras' add_weight): trainable and float32, or under
        LoRA frozen and in the `stored` dtype."""
        return layer.add_weight(
            name, shape, initializer=initializer, dtype=self.stored, trainable=not self.frozen
        )

    def weight(self, variable: Any, matmul: bool = True) -> Any:
        """`variable`'s value in its compute layout; in bfloat16 where it feeds a bf16 matmul,
        else in float32 (a LoRA base stored in bfloat16 is read as float32)."""
        import tensorflow as tf

        value = tf.convert_to_tensor(variable)
        want = tf.bfloat16 if matmul and self.bf16 else tf.float32
        gathered = tf.float32 if _collectives_in_float32(variable) else want
        return tf.cast(self.gather(variable, tf.cast(value, gathered)), want)

    def gather(self, variable: Any, value: Any) -> Any:
        """`value` (read from `variable`) relaid out without the FSDP axis, and a padded
        weight's padding sliced off (models/padded.py); a no-op for a weight not sharded on it
        and for plain (host) variables."""
        layout = getattr(variable, "layout", None)
        if self.gather_axis is None or layout is None:
            return value
        specs = list(layout.sharding_specs)
        if self.gather_axis not in specs:
            return value
        from tensorflow.experimental import dtensor

        compute = dtensor.Layout(
            [UNSHARDED if s == self.gather_axis else s for s in specs], layout.mesh
        )
        value = dtensor.relayout(value, compute)
        shape = getattr(variable, "unpadded_shape", None)
        if shape is None:
            return value
        from dtcli.models.padded import unpad

        return unpad(value, shape)  # the slice's gradient gives the padding 0

    def activation(self, x: Any) -> Any:
        """A matmul's input activation in the compute dtype."""
        import tensorflow as tf

        return tf.cast(x, tf.bfloat16) if self.bf16 else x

    def result(self, y: Any) -> Any:
        """A matmul's result back in float32."""
        import tensorflow as tf

        return tf.cast(y, tf.float32) if self.bf16 else y


def _collectives_in_float32(variable: Any) -> bool:
    """Whether `variable` lives on a CPU mesh, where DTensor runs each collective in float32:
    a bfloat16 tensor is cast to float32 and back around its all-gather. There a weight is
    gathered in float32 and cast to the compute dtype after, which saves those two casts
    (gpt_fsdp_tp at 2 layers: 1,163.71 -> 1,151.71 op executions a step per device, the
    numbers equal to the bit). Elsewhere the cast comes first (half the bytes moved)."""
    layout = getattr(variable, "layout", None)
    return layout is not None and layout.mesh.device_type().upper() == "CPU"


FLOAT32 = Compute()
