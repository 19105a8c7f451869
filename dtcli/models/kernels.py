"""The GPT's matmul layers (models/gpt_layers.py): Dense and EinsumDense, as tf-keras computes
them, with their weights read through a `Compute` (models/compute.py), and LoRA's adapters
beside a kernel (models/lora.py: lora_a, lora_b, their output added to the layer's). Imports
TensorFlow (as gpt_layers.py)."""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf
import tf_keras

from dtcli.models.compute import FLOAT32, Compute


def normal(stddev: float) -> Any:
    return tf_keras.initializers.RandomNormal(stddev=stddev)


class Kernel(tf_keras.layers.Layer):
    """What Dense and EinsumDense share: a kernel (+ a bias), and LoRA's adapters beside the
    kernel where `adapter` (models.lora.Adapter) says: lora_a, lora_b (trainable, float32),
    their output alpha / rank * ((dropout(x) . A) . B) added to the layer's."""

    def __init__(self, name: str, compute: Compute, adapter: Any):
        super().__init__(name=name)
        self.compute = compute
        self.adapter = adapter
        if adapter is not None and adapter.dropout:
            self.lora_dropout = tf_keras.layers.Dropout(adapter.dropout)

    def build_weights(
        self, kernel: tuple[int, ...], bias: tuple[int, ...] | None, stddev: float
    ) -> None:
        c = self.compute
        self.kernel = c.add(self, "kernel", kernel, normal(stddev))
        self.bias = None if bias is None else c.add(self, "bias", bias, "zeros")
        a = self.adapter
        if a is not None:
            bound = 1.0 / math.sqrt(a.fan_in)  # peft's kaiming_uniform(a=sqrt(5))
            uniform = tf_keras.initializers.RandomUniform(-bound, bound)
            self.lora_a = self.add_weight("lora_a", a.a_shape, initializer=uniform)
            self.lora_b = self.add_weight("lora_b", a.b_shape, initializer="zeros")

    def finish(self, y: Any, x: Any, training: Any) -> Any:
        """The base's product `y` with the bias, then the adapters' output, added."""
        c = self.compute
        if self.bias is not None:
            y = y + c.weight(self.bias, matmul=False)
        a = self.adapter
        if a is None:
            return y
        if a.dropout:
            x = self.lora_dropout(x, training=training)
        h = c.result(_contract(c.activation(x), c.weight(self.lora_a), a.inputs))
        delta = c.result(_contract(c.activation(h), c.weight(self.lora_b), 1))
        return y + a.scale * delta


def _contract(x: Any, w: Any, dims: int) -> Any:
    """x's last `dims` dims contracted with w's first (a tensordot, as Dense's matmul)."""
    rank = len(x.shape)
    return tf.tensordot(x, w, [list(range(rank - dims, rank)), list(range(dims))])


class Dense(Kernel):
    """x [..., d_in] @ kernel [d_in, units] (+ bias), as tf-keras' Dense computes it."""

    def __init__(
        self,
        units: int,
        bias: bool,
        stddev: float,
        name: str,
        compute: Compute = FLOAT32,
        adapter: Any = None,
    ):
        super().__init__(name, compute, adapter)
        self.units, self.use_bias, self.stddev = units, bias, stddev

    def build(self, input_shape: Any) -> None:
        bias = (self.units,) if self.use_bias else None
        self.build_weights((int(input_shape[-1]), self.units), bias, self.stddev)

    def call(self, x: Any, training: Any = False) -> Any:
        c = self.compute
        y = c.result(
            tf.tensordot(c.activation(x), c.weight(self.kernel), [[len(x.shape) - 1], [0]])
        )
        return self.finish(y, x, training)


class EinsumDense(Kernel):
    """tf-keras' EinsumDense for the attention projections: `equation` over the input and a
    kernel of `kernel_shape` (+ a bias of `bias_shape`)."""

    def __init__(
        self,
        equation: str,
        kernel_shape: tuple[int, ...],
        bias_shape: tuple[int, ...] | None,
        stddev: float,
        name: str,
        compute: Compute = FLOAT32,
        adapter: Any = None,
    ):
        super().__init__(name, compute, adapter)
        self.equation = equation
        self.kernel_shape, self.bias_shape, self.stddev = kernel_shape, bias_shape, stddev

    def build(self, input_shape: Any) -> None:
        self.build_weights(self.kernel_shape, self.bias_shape, self.stddev)

    def call(self, x: Any, training: Any = False) -> Any:
        c = self.compute
        kernel = c.weight(self.kernel)
        if c.bf16:
            y = c.result(_as_matmul(self.equation, c.activation(x), kernel))
        else:
            y = tf.einsum(self.equation, x, kernel)
        return self.finish(y, x, training)


def _as_matmul(equation: str, x: Any, kernel: Any) -> Any:
    """The attention projections' einsums as one 2-D-kernel matmul (a tensordot over merged
    dims): a bfloat16 einsum runs on a generic CPU kernel, measured 7x slower than float32 on an
    AVX2 CPU, where a bfloat16 matmul runs at float32's speed. (float32 keeps the einsum: its
    numbers stay bit-identical to tf-keras' EinsumDense.) Merging a sharded dim with the dims
    after it keeps its sharding, so tensor-parallel heads stay split."""
    shape = kernel.shape
    if equation == "btd,dhk->bthk":
        flat = tf.reshape(kernel, [shape[0], shape[1] * shape[2]])
        y = tf.tensordot(x, flat, [[2], [0]])
        return tf.reshape(y, [-1, x.shape[1], shape[1], shape[2]])
    if equation == "bthk,hkd->btd":
        flat = tf.reshape(kernel, [shape[0] * shape[1], shape[2]])
        merged = tf.reshape(x, [-1, x.shape[1], shape[0] * shape[1]])
        return tf.tensordot(merged, flat, [[2], [0]])
    return tf.einsum(equation, x, kernel)
