"""The GPT's layers (dtcli.models.transformer), as module-level tf-keras classes like nanoGPT's.

This module imports TensorFlow: only `transformer.build` imports it, when it builds the model, so
`dtcli plan`, `dtcli config` and `--help` stay free of TensorFlow. Each layer takes the
`TransformerConfig` (and keeps only the numbers it needs); the class names are the `layer` of
the weights they own (`dtcli plan`).
Initial weights follow nanoGPT: normal(0, STD), the residual projections scaled by
1/sqrt(2 * layers).
"""

from __future__ import annotations

import math
from typing import Any

import tensorflow as tf
import tf_keras

from dtcli.recipe import TransformerConfig

STD = 0.02  # of the normal initializer


def normal(stddev: float) -> Any:
    return tf_keras.initializers.RandomNormal(stddev=stddev)


def residual_std(cfg: TransformerConfig) -> float:
    """The initial stddev of the projections into the residual stream."""
    return STD / math.sqrt(2 * cfg.layers)


def layer_norm(cfg: TransformerConfig, name: str) -> Any:
    # Not fused: DTensor has no layout propagation for the fused kernels.
    return tf_keras.layers.LayerNormalization(epsilon=1e-5, center=cfg.bias, name=name)


class Embedding(tf_keras.layers.Layer):
    def __init__(self, cfg: TransformerConfig, rows: int, name: str):
        super().__init__(name=name)
        self.rows = rows
        self.d_model = cfg.d_model

    def build(self, input_shape: Any) -> None:
        self.embeddings = self.add_weight(
            "embeddings", (self.rows, self.d_model), initializer=normal(STD)
        )

    def call(self, ids: Any) -> Any:
        ids = tf.cast(ids, tf.int32)
        # A dense gradient (a gather from the variable itself gives IndexedSlices, whose
        # scatter update DTensor cannot lay out).
        return tf.gather(tf.convert_to_tensor(self.embeddings), ids)


class PositionEmbedding(tf_keras.layers.Layer):
    """Adds a learned vector per position to its input [batch, time, d_model]."""

    def __init__(self, cfg: TransformerConfig, name: str):
        super().__init__(name=name)
        self.context = cfg.context
        self.d_model = cfg.d_model

    def build(self, input_shape: Any) -> None:
        self.embeddings = self.add_weight(
            "embeddings", (self.context, self.d_model), initializer=normal(STD)
        )

    def call(self, x: Any) -> Any:
        table = tf.convert_to_tensor(self.embeddings)
        time = x.shape[1]
        return x + (table if time == self.context else table[:time])


class Attention(tf_keras.layers.Layer):
    def __init__(self, cfg: TransformerConfig, name: str):
        super().__init__(name=name)
        self.head_dim = cfg.d_model // cfg.heads
        einsum = tf_keras.layers.EinsumDense
        bias = "hk" if cfg.bias else None
        for part in ("query", "key", "value"):
            setattr(
                self,
                part,
                einsum(
                    "btd,dhk->bthk",
                    (None, cfg.heads, self.head_dim),
                    bias_axes=bias,
                    kernel_initializer=normal(STD),
                    name=part,
                ),
            )
        self.proj = einsum(
            "bthk,hkd->btd",
            (None, cfg.d_model),
            bias_axes="d" if cfg.bias else None,
            kernel_initializer=normal(residual_std(cfg)),
            name="proj",
        )
        self.dropout = tf_keras.layers.Dropout(cfg.dropout)

    def call(self, x: Any, training: bool = False) -> Any:
        # [batch, heads, time, head_dim]: batched matmuls (an einsum over these dims
        # measured 3x slower on CPU).
        q, k, v = (tf.transpose(f(x), [0, 2, 1, 3]) for f in (self.query, self.key, self.value))
        scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(self.head_dim))
        # Causal: position t attends to positions <= t (a lower-triangular band).
        keep = tf.linalg.band_part(tf.ones_like(scores), -1, 0)
        scores = scores + (1.0 - keep) * -1e9
        weights = self.dropout(tf.nn.softmax(scores, axis=-1), training=training)
        out = tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3])
        return self.proj(out)


class MLP(tf_keras.layers.Layer):
    def __init__(self, cfg: TransformerConfig, name: str):
        super().__init__(name=name)
        self.fc = tf_keras.layers.Dense(
            cfg.mlp_ratio * cfg.d_model,
            use_bias=cfg.bias,
            kernel_initializer=normal(STD),
            name="fc",
        )
        self.proj = tf_keras.layers.Dense(
            cfg.d_model,
            use_bias=cfg.bias,
            kernel_initializer=normal(residual_std(cfg)),
            name="proj",
        )

    def call(self, x: Any) -> Any:
        return self.proj(tf.nn.gelu(self.fc(x), approximate=False))


class Block(tf_keras.layers.Layer):
    def __init__(self, cfg: TransformerConfig, name: str):
        super().__init__(name=name)
        self.ln_1 = layer_norm(cfg, "ln_1")
        self.attention = Attention(cfg, "attention")
        self.ln_2 = layer_norm(cfg, "ln_2")
        self.mlp = MLP(cfg, "mlp")
        self.dropout = tf_keras.layers.Dropout(cfg.dropout)

    def call(self, x: Any, training: bool = False) -> Any:
        x = x + self.dropout(self.attention(self.ln_1(x), training=training), training=training)
        return x + self.dropout(self.mlp(self.ln_2(x)), training=training)


class TiedHead(tf_keras.layers.Layer):
    """Logits from the token embedding's own table (its transpose): no weights of its own.
    (The embedding layer comes first in the model, so LayoutMap lays its table out there.)"""

    def __init__(self, embedding: Any, name: str):
        super().__init__(name=name)
        self.embedding = embedding

    def call(self, x: Any) -> Any:
        return tf.einsum("btd,vd->btv", x, tf.convert_to_tensor(self.embedding.embeddings))
