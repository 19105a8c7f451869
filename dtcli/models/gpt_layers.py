"""The GPT's layers (dtcli.models.transformer), as module-level tf-keras classes like nanoGPT's.

This module imports TensorFlow: only `transformer.build` imports it, when it builds the model, so
`dtcli plan`, `dtcli config` and `--help` stay free of TensorFlow. Each layer takes the
`TransformerConfig` (and keeps only the numbers it needs); the class names are the `layer` of
the weights they own (`dtcli plan`).
Initial weights follow nanoGPT: normal(0, STD), the residual projections scaled by
1/sqrt(2 * layers).

Every layer reads its weights through a `Compute` (models/compute.py): gathered off the data
axis where FSDP shards them, cast to bfloat16 for the matmuls under `train.precision: bf16`. So
the Dense, EinsumDense and LayerNormalization here are dtcli's own small layers (tf-keras'
read their variables directly); they keep tf-keras' names, weight names and arithmetic, so
checkpoints, layout rules and float32 numbers are the same as with the stock layers. The Dense
and EinsumDense (with LoRA's adapters beside their kernels) are in kernels.py, the norms in
norms.py, rotary positions in rope.py.

Generation's KV cache (models/decode.py) runs the same layers through their own methods:
Attention.attend (the training attention, also giving its keys and values) and decode (one
position over a cache), Block.prefill and decode, PositionEmbedding.add_at. `call` stays the
training path: the same ops, so the same numbers bit for bit (float32 and bf16, checked).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf
import tf_keras

from dtcli.models.compute import FLOAT32, Compute
from dtcli.models.kernels import Dense, EinsumDense, normal
from dtcli.models.norms import norm_layer
from dtcli.models.rope import Rotary
from dtcli.recipe import TransformerConfig

STD = 0.02  # of the normal initializer
# No LoRA adapters (models.lora): the layers' `adapters` by kernel path.
NO_ADAPTERS: Mapping[str, Any] = {}


def residual_std(cfg: TransformerConfig) -> float:
    """The initial stddev of the projections into the residual stream."""
    return STD / math.sqrt(2 * cfg.layers)


class Embedding(tf_keras.layers.Layer):
    def __init__(self, cfg: TransformerConfig, rows: int, name: str, compute: Compute = FLOAT32):
        super().__init__(name=name)
        self.rows = rows
        self.d_model = cfg.d_model
        self.compute = compute

    def build(self, input_shape: Any) -> None:
        self.embeddings = self.compute.add(
            self, "embeddings", (self.rows, self.d_model), normal(STD)
        )

    def table(self, matmul: bool = False) -> Any:
        """The table in its compute layout (the tied head reads it as a matmul weight)."""
        return self.compute.weight(self.embeddings, matmul=matmul)

    def call(self, ids: Any) -> Any:
        ids = tf.cast(ids, tf.int32)
        # A gather from the table's value, not the variable: a dense gradient (a gather from
        # the variable gives IndexedSlices, whose scatter update DTensor cannot lay out).
        return tf.gather(self.table(), ids)


class PositionEmbedding(tf_keras.layers.Layer):
    """Adds a learned vector per position to its input [batch, time, d_model] (a table of
    max_positions rows, the first `time` used)."""

    def __init__(self, cfg: TransformerConfig, name: str, compute: Compute = FLOAT32):
        super().__init__(name=name)
        self.rows = cfg.position_rows
        self.d_model = cfg.d_model
        self.compute = compute

    def build(self, input_shape: Any) -> None:
        self.embeddings = self.compute.add(
            self, "embeddings", (self.rows, self.d_model), normal(STD)
        )

    def call(self, x: Any) -> Any:
        table = self.compute.weight(self.embeddings, matmul=False)
        time = x.shape[1]
        return x + (table if time == self.rows else table[:time])

    def add_at(self, x: Any, at: Any) -> Any:
        """Generation: x [batch, 1, d_model] plus each row's position vector, the position given
        as a one-hot row of `at` [batch, context] (a product with 0s and a 1: exactly the table's
        row; a row of 0s adds nothing)."""
        table = self.compute.weight(self.embeddings, matmul=False)
        if at.shape[1] != self.rows:
            table = table[: at.shape[1]]
        return x + tf.matmul(tf.cast(at, table.dtype), table)[:, None, :]


class Attention(tf_keras.layers.Layer):
    """Causal self-attention; key/value with kv_heads heads (grouped-query attention: query
    head i reads key/value head i // (heads // kv_heads), Hugging Face's repeat_kv order).
    `adapters`: LoRA's by kernel path (models.lora), the layer at `path` in the model."""

    def __init__(
        self,
        cfg: TransformerConfig,
        name: str,
        compute: Compute = FLOAT32,
        adapters: Mapping[str, Any] = NO_ADAPTERS,
        path: str = "",
    ):
        super().__init__(name=name)
        self.head_dim = cfg.head_dim
        self.groups = cfg.heads // cfg.key_heads
        self.compute = compute
        for part, heads in (("query", cfg.heads), ("key", cfg.key_heads), ("value", cfg.key_heads)):
            kernel = (cfg.d_model, heads, self.head_dim)
            bias = (heads, self.head_dim) if cfg.bias else None
            adapter = adapters.get(f"{path}.{part}.kernel")
            projection = EinsumDense("btd,dhk->bthk", kernel, bias, STD, part, compute, adapter)
            setattr(self, part, projection)
        self.proj = EinsumDense(
            "bthk,hkd->btd",
            (cfg.heads, self.head_dim, cfg.d_model),
            (cfg.d_model,) if cfg.bias else None,
            residual_std(cfg),
            "proj",
            compute,
            adapters.get(f"{path}.proj.kernel"),
        )
        self.dropout = tf_keras.layers.Dropout(cfg.dropout)
        self.rotary = Rotary(cfg) if cfg.positions == "rope" else None

    def call(self, x: Any, training: bool = False) -> Any:
        return self.attend(x, training)[0]

    def attend(self, x: Any, training: bool = False) -> tuple[Any, Any, Any]:
        """The attention's output, and its keys and values [batch, kv_heads, time, head_dim]
        (what generation keeps as the K/V cache of a window; `call` drops them: the same ops)."""
        c = self.compute
        # [batch, heads, time, head_dim]: batched matmuls (an einsum over these dims
        # measured 3x slower on CPU).
        q, k, v = self._heads(x)
        if self.rotary is not None:
            q, k = self.rotary.rotate(q), self.rotary.rotate(k)
        scores = c.result(
            tf.matmul(c.activation(q), c.activation(self._grouped(k)), transpose_b=True)
        )
        scores = scores * (1.0 / math.sqrt(self.head_dim))
        # Causal: position t attends to positions <= t (a lower-triangular band).
        keep = tf.linalg.band_part(tf.ones_like(scores), -1, 0)
        scores = scores + (1.0 - keep) * -1e9
        weights = self.dropout(tf.nn.softmax(scores, axis=-1), training=training)
        out = c.result(tf.matmul(c.activation(weights), c.activation(self._grouped(v))))
        return self.proj(tf.transpose(out, [0, 2, 1, 3])), k, v

    def _heads(self, x: Any) -> tuple[Any, Any, Any]:
        return tuple(tf.transpose(f(x), [0, 2, 1, 3]) for f in (self.query, self.key, self.value))

    def _grouped(self, kv: Any) -> Any:
        """Keys or values [batch, kv_heads, time, head_dim] for every query head: each repeated
        `groups` times in place (kv0, kv0, kv1, kv1...: repeat_kv's order). Kept whole where
        the model axis splits the key/value heads: the repeat keeps a device's heads on it."""
        return kv if self.groups == 1 else tf.repeat(kv, self.groups, axis=1)

    def decode(
        self, x: Any, cache_k: Any, cache_v: Any, at: Any, unseen: Any
    ) -> tuple[Any, Any, Any]:
        """One new position per row, attending over the cache (generation; no dropout).

        x [batch, 1, d_model]; cache_k, cache_v [batch, kv_heads, context, head_dim]; `at`
        [batch, context] bool, one-hot: where the row's new key and value are written (a row
        with none writes nothing) and, with rope, the position it is rotated to; `unseen`
        [batch, 1, 1, context] float: 0 at the positions the row attends to (its own and those
        before), else the training path's -1e9 (so their weights are exactly 0). Returns the
        output and both caches updated."""
        c = self.compute
        q, k, v = self._heads(x)
        if self.rotary is not None:
            cos, sin = self.rotary.at(at)
            q, k = self.rotary.rotate(q, cos, sin), self.rotary.rotate(k, cos, sin)
        write = at[:, None, :, None]
        # A select, not a blend: the cache keeps its values bit for bit where nothing is written.
        cache_k, cache_v = tf.where(write, k, cache_k), tf.where(write, v, cache_v)
        scores = c.result(
            tf.matmul(c.activation(q), c.activation(self._grouped(cache_k)), transpose_b=True)
        )
        scores = scores * (1.0 / math.sqrt(self.head_dim))
        weights = tf.nn.softmax(scores + unseen, axis=-1)
        out = c.result(tf.matmul(c.activation(weights), c.activation(self._grouped(cache_v))))
        return self.proj(tf.transpose(out, [0, 2, 1, 3])), cache_k, cache_v


class MLP(tf_keras.layers.Layer):
    """gelu / gelu_tanh: proj(act(fc(x))); swiglu: proj(silu(gate(x)) * fc(x))."""

    def __init__(
        self,
        cfg: TransformerConfig,
        name: str,
        compute: Compute = FLOAT32,
        adapters: Mapping[str, Any] = NO_ADAPTERS,
        path: str = "",
    ):
        super().__init__(name=name)

        def dense(units: int, stddev: float, part: str) -> Dense:
            return Dense(
                units, cfg.bias, stddev, part, compute, adapters.get(f"{path}.{part}.kernel")
            )

        self.fc = dense(cfg.hidden, STD, "fc")
        self.gate = None
        if cfg.activation == "swiglu":
            self.gate = dense(cfg.hidden, STD, "gate")
        self.approximate = cfg.activation == "gelu_tanh"
        self.proj = dense(cfg.d_model, residual_std(cfg), "proj")

    def call(self, x: Any) -> Any:
        if self.gate is not None:
            # SiLU spelled out: tf.nn.silu's custom gradient (an IdentityN) breaks DTensor's
            # lowering of the steps' loop ("operand #0 does not dominate this use").
            gate = self.gate(x)
            return self.proj(gate * tf.sigmoid(gate) * self.fc(x))
        return self.proj(tf.nn.gelu(self.fc(x), approximate=self.approximate))


class Block(tf_keras.layers.Layer):
    """A pre-LayerNorm block. With `remat` its forward pass runs again in the backward pass
    (tf.recompute_grad) instead of keeping its activations: only its input is kept.
    `adapters`: LoRA's by kernel path (models.lora)."""

    def __init__(
        self,
        cfg: TransformerConfig,
        name: str,
        compute: Compute = FLOAT32,
        adapters: Mapping[str, Any] = NO_ADAPTERS,
    ):
        super().__init__(name=name)
        self.ln_1 = norm_layer(cfg, "ln_1", compute)
        self.attention = Attention(cfg, "attention", compute, adapters, f"{name}.attention")
        self.ln_2 = norm_layer(cfg, "ln_2", compute)
        self.mlp = MLP(cfg, "mlp", compute, adapters, f"{name}.mlp")
        self.dropout = tf_keras.layers.Dropout(cfg.dropout)
        self.remat = cfg.remat

    def call(self, x: Any, training: bool = False) -> Any:
        if self.remat and training:
            # The recipe refuses remat with dropout: a recompute would draw other masks.
            return tf.recompute_grad(lambda h: self._forward(h, True))(x)
        return self._forward(x, training)

    def _forward(self, x: Any, training: bool) -> Any:
        x = x + self.dropout(self.attention(self.ln_1(x), training=training), training=training)
        return x + self.dropout(self.mlp(self.ln_2(x)), training=training)

    # Generation (models/decode.py): inference only, so no dropout (it is the identity there).
    def prefill(self, x: Any) -> tuple[Any, Any, Any]:
        """The block over a whole window [batch, context, d_model], and its keys and values."""
        out, k, v = self.attention.attend(self.ln_1(x))
        x = x + out
        return x + self.mlp(self.ln_2(x)), k, v

    def decode(
        self, x: Any, cache_k: Any, cache_v: Any, at: Any, unseen: Any
    ) -> tuple[Any, Any, Any]:
        """The block at one new position per row [batch, 1, d_model] (Attention.decode)."""
        out, cache_k, cache_v = self.attention.decode(self.ln_1(x), cache_k, cache_v, at, unseen)
        x = x + out
        return x + self.mlp(self.ln_2(x)), cache_k, cache_v


class TiedHead(tf_keras.layers.Layer):
    """Logits from the token embedding's own table (its transpose): no weights of its own.
    (The embedding layer comes first in the model, so LayoutMap lays its table out there.)"""

    def __init__(self, embedding: Any, name: str, compute: Compute = FLOAT32):
        super().__init__(name=name)
        self.embedding = embedding
        self.compute = compute

    def call(self, x: Any) -> Any:
        c = self.compute
        table = self.embedding.table(True)
        if c.bf16:  # a bfloat16 einsum is slow on CPUs (kernels.py); the same as a matmul
            return c.result(tf.tensordot(c.activation(x), table, [[2], [1]]))
        return tf.einsum("btd,vd->btv", x, table)


class VocabMask(tf_keras.layers.Layer):
    """The logits of the ids past the real vocabulary (model.transformer.vocab_size; the tables
    are rounded up past it) set to -inf, so every softmax after the model (the loss, eval,
    score, sampling) gives them probability 0. An addition of 0 keeps the others bit for bit."""

    def __init__(self, vocab_size: int, name: str):
        super().__init__(name=name)
        self.vocab_size = vocab_size

    def call(self, logits: Any) -> Any:
        rows = logits.shape[-1]
        mask = np.where(np.arange(rows) < self.vocab_size, 0.0, -np.inf).astype(np.float32)
        return logits + tf.constant(mask)
