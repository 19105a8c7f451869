"""The GPT's norms (model.transformer.norm): LayerNorm as tf-keras computes it and Llama's RMSNorm,
both in float32 with their weights read through a `Compute` (models/compute.py). Imports
TensorFlow (as gpt_layers.py)."""

from __future__ import annotations

from typing import Any

import tensorflow as tf
import tf_keras

from dtcli.models.compute import FLOAT32, Compute
from dtcli.recipe import TransformerConfig


class LayerNormalization(tf_keras.layers.Layer):
    """tf-keras' LayerNormalization over the last dim (its unfused arithmetic, as tf-keras runs
    it), always in float32, with gamma/beta read through `compute`."""

    def __init__(self, cfg: TransformerConfig, name: str, compute: Compute = FLOAT32):
        super().__init__(name=name)
        self.center = cfg.bias
        self.epsilon = cfg.norm_eps
        self.compute = compute

    def build(self, input_shape: Any) -> None:
        dim = (int(input_shape[-1]),)
        self.gamma = self.compute.add(self, "gamma", dim, "ones")
        self.beta = self.compute.add(self, "beta", dim, "zeros") if self.center else None

    def call(self, x: Any) -> Any:
        mean, variance = tf.nn.moments(x, [len(x.shape) - 1], keepdims=True)
        offset = None if self.beta is None else self.compute.weight(self.beta, matmul=False)
        return tf.nn.batch_normalization(
            x,
            mean,
            variance,
            offset=offset,
            scale=self.compute.weight(self.gamma, matmul=False),
            variance_epsilon=self.epsilon,
        )


class RMSNormalization(tf_keras.layers.Layer):
    """x * rsqrt(mean(x^2) + eps) * gamma over the last dim, in float32 (Hugging Face's Llama
    RMSNorm); no beta whatever model.transformer.bias says."""

    def __init__(self, cfg: TransformerConfig, name: str, compute: Compute = FLOAT32):
        super().__init__(name=name)
        self.epsilon = cfg.norm_eps
        self.compute = compute

    def build(self, input_shape: Any) -> None:
        self.gamma = self.compute.add(self, "gamma", (int(input_shape[-1]),), "ones")

    def call(self, x: Any) -> Any:
        mean_square = tf.reduce_mean(tf.square(x), axis=-1, keepdims=True)
        gamma = self.compute.weight(self.gamma, matmul=False)
        return gamma * (x * tf.math.rsqrt(mean_square + self.epsilon))


def norm_layer(cfg: TransformerConfig, name: str, compute: Compute = FLOAT32) -> Any:
    """model.transformer.norm's layer. (Not tf-keras' fused kernels: DTensor has no layout
    propagation for them.)"""
    if cfg.norm == "rmsnorm":
        return RMSNormalization(cfg, name, compute)
    return LayerNormalization(cfg, name, compute)
