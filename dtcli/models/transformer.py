"""dtcli's built-in language model: a decoder-only GPT as a tf-keras model (`model.transformer`).

Token and learned position embeddings, `layers` pre-LayerNorm blocks of causal self-attention
and a GELU MLP, a final LayerNorm and an output head (by default the token embedding's
transpose, as in GPT-2 and nanoGPT). Initial weights follow nanoGPT: normal(0, 0.02), the
residual projections scaled by 1/sqrt(2 * layers).

The weight paths are stable, so layout rules can target them (`block_i`: i from 0):

    token_embedding.embeddings          [vocab, d_model]
    position_embedding.embeddings       [context, d_model]
    block_i.ln_1.gamma  (.beta)        [d_model]
    block_i.attention.query.kernel     [d_model, heads, head_dim]   (also key, value)
    block_i.attention.query.bias       [heads, head_dim]            (with bias: true)
    block_i.attention.proj.kernel      [heads, head_dim, d_model]
    block_i.attention.proj.bias        [d_model]
    block_i.ln_2.gamma  (.beta)        [d_model]
    block_i.mlp.fc.kernel  (.bias)     [d_model, mlp_ratio * d_model]
    block_i.mlp.proj.kernel  (.bias)   [mlp_ratio * d_model, d_model]
    ln_f.gamma  (.beta)                 [d_model]
    head.kernel                         [d_model, vocab]   (tie_embeddings: false)

Tensor parallel (Megatron): shard the attention heads (dim 1 of query/key/value, dim 0 of
attention.proj) and the MLP's hidden dim (dim 1 of fc, dim 0 of proj) on one mesh axis; each
block then all-reduces twice per pass. Heads are an explicit dim of the attention kernels, so a
head is never split across devices: the head count must divide by that axis (checked with the
layouts).
The token embedding is looked up by gathering from its value, which works with the table
sharded on either dim (a resource gather refuses a vocab-sharded table).
"""

from __future__ import annotations

import math
from typing import Any

from dtcli.recipe import TransformerConfig


def build(cfg: TransformerConfig, vocab: int) -> Any:
    """The GPT as a Functional tf_keras.Model: int tokens [batch, context] -> logits
    [batch, context, vocab]."""
    import tensorflow as tf
    import tf_keras

    normal = tf_keras.initializers.RandomNormal
    std = 0.02
    residual_std = std / math.sqrt(2 * cfg.layers)
    head_dim = cfg.d_model // cfg.heads

    def layer_norm(name: str) -> Any:
        # Not fused: DTensor has no layout propagation for the fused kernels.
        return tf_keras.layers.LayerNormalization(epsilon=1e-5, center=cfg.bias, name=name)

    class Embedding(tf_keras.layers.Layer):
        def __init__(self, rows: int, name: str):
            super().__init__(name=name)
            self.rows = rows

        def build(self, input_shape: Any) -> None:
            self.embeddings = self.add_weight(
                "embeddings", (self.rows, cfg.d_model), initializer=normal(stddev=std)
            )

        def call(self, ids: Any) -> Any:
            ids = tf.cast(ids, tf.int32)
            # A dense gradient (a gather from the variable itself gives IndexedSlices, whose
            # scatter update DTensor cannot lay out).
            return tf.gather(tf.convert_to_tensor(self.embeddings), ids)

    class PositionEmbedding(tf_keras.layers.Layer):
        """Adds a learned vector per position to its input [batch, time, d_model]."""

        def build(self, input_shape: Any) -> None:
            self.embeddings = self.add_weight(
                "embeddings", (cfg.context, cfg.d_model), initializer=normal(stddev=std)
            )

        def call(self, x: Any) -> Any:
            table = tf.convert_to_tensor(self.embeddings)
            time = x.shape[1]
            return x + (table if time == cfg.context else table[:time])

    class Attention(tf_keras.layers.Layer):
        def __init__(self, name: str):
            super().__init__(name=name)
            einsum = tf_keras.layers.EinsumDense
            bias = "hk" if cfg.bias else None
            for part in ("query", "key", "value"):
                setattr(
                    self,
                    part,
                    einsum(
                        "btd,dhk->bthk",
                        (None, cfg.heads, head_dim),
                        bias_axes=bias,
                        kernel_initializer=normal(stddev=std),
                        name=part,
                    ),
                )
            self.proj = einsum(
                "bthk,hkd->btd",
                (None, cfg.d_model),
                bias_axes="d" if cfg.bias else None,
                kernel_initializer=normal(stddev=residual_std),
                name="proj",
            )
            self.dropout = tf_keras.layers.Dropout(cfg.dropout)

        def call(self, x: Any, training: bool = False) -> Any:
            # [batch, heads, time, head_dim]: batched matmuls (an einsum over these dims
            # measured 3x slower on CPU).
            q, k, v = (tf.transpose(f(x), [0, 2, 1, 3]) for f in (self.query, self.key, self.value))
            scores = tf.matmul(q, k, transpose_b=True) * (1.0 / math.sqrt(head_dim))
            # Causal: position t attends to positions <= t (a lower-triangular band).
            keep = tf.linalg.band_part(tf.ones_like(scores), -1, 0)
            scores = scores + (1.0 - keep) * -1e9
            weights = self.dropout(tf.nn.softmax(scores, axis=-1), training=training)
            out = tf.transpose(tf.matmul(weights, v), [0, 2, 1, 3])
            return self.proj(out)

    class MLP(tf_keras.layers.Layer):
        def __init__(self, name: str):
            super().__init__(name=name)
            self.fc = tf_keras.layers.Dense(
                cfg.mlp_ratio * cfg.d_model,
                use_bias=cfg.bias,
                kernel_initializer=normal(stddev=std),
                name="fc",
            )
            self.proj = tf_keras.layers.Dense(
                cfg.d_model,
                use_bias=cfg.bias,
                kernel_initializer=normal(stddev=residual_std),
                name="proj",
            )

        def call(self, x: Any) -> Any:
            return self.proj(tf.nn.gelu(self.fc(x), approximate=False))

    class Block(tf_keras.layers.Layer):
        def __init__(self, name: str):
            super().__init__(name=name)
            self.ln_1 = layer_norm("ln_1")
            self.attention = Attention("attention")
            self.ln_2 = layer_norm("ln_2")
            self.mlp = MLP("mlp")
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

    token_embedding = Embedding(vocab, "token_embedding")
    ids = tf_keras.Input((cfg.context,), dtype="int32", name="tokens")
    x = PositionEmbedding(name="position_embedding")(token_embedding(ids))
    x = tf_keras.layers.Dropout(cfg.dropout, name="dropout")(x)
    for i in range(cfg.layers):
        x = Block(f"block_{i}")(x)
    x = layer_norm("ln_f")(x)
    if cfg.tie_embeddings:
        logits = TiedHead(token_embedding, name="head")(x)
    else:
        logits = tf_keras.layers.Dense(
            vocab, use_bias=False, kernel_initializer=normal(stddev=std), name="head"
        )(x)
    return tf_keras.Model(ids, logits, name="gpt")


def parameters(cfg: TransformerConfig, vocab: int) -> int:
    """Trainable parameters (arithmetic, no TensorFlow)."""
    d, hidden = cfg.d_model, cfg.mlp_ratio * cfg.d_model
    per_block = 4 * d * d + 2 * d * hidden + 2 * d * (2 if cfg.bias else 1)
    if cfg.bias:
        per_block += 4 * d + hidden + d
    total = vocab * d + cfg.context * d + cfg.layers * per_block + d * (2 if cfg.bias else 1)
    if not cfg.tie_embeddings:
        total += d * vocab
    return total


def flops_per_token(cfg: TransformerConfig, vocab: int, context: int) -> float:
    """Training FLOPs per token: 6 per weight of the matmuls (forward 2, backward 4) plus the
    attention scores and weighted sums over `context` positions (PaLM's appendix B estimate,
    as nanoGPT's MFU)."""
    matmul_weights = parameters(cfg, vocab) - cfg.context * cfg.d_model
    return 6.0 * matmul_weights + 12.0 * cfg.layers * cfg.d_model * context
