"""dtcli's GPT for generation with a K/V cache: each new token costs one position, not a window.

Two compiled calls over the layers of the built model (models/transformer.py), so they read
their weights through the same `compute` as training (FSDP gathers, bf16 matmuls) and the
training graph is not touched:

- `prefill(window, last, refill, caches)`: the whole window [batch, context] through every
  block, as the training forward pass computes it (Block.prefill: the same ops, without
  dropout); its keys and values become the caches of the rows `refill` marks (the others keep
  theirs), and the logits at each row's `last` position come back.
- `decode(tokens, at, caches)`: one token per row [batch, 1] at the position `at` marks, its keys
  and values written into the caches there, attending over the positions up to it.

Shapes never change: a cache is [batch, kv_heads, context, head_dim] per block (a key and a
value cache; grouped-query attention keeps only its key/value heads), filled up to a position;
positions arrive as one-hot bool masks [batch, context], never as a Python int or a scalar
(DTensor folds a small replicated int into the lowered program and lowers it again when it
changes, DTENSOR_NOTES.md); rope's cos and sin rows are picked by the same one-hot. So each
call is traced and lowered once.

On one device compiled by XLA (`mesh` None: a session of plain variables, mesh.compiles_with_xla)
both calls are XLA-compiled, once each (the shapes never change): a decode step's few hundred
small ops become a few fused kernels instead of as many executor launches.

Layouts (on a DTensor mesh): the caches are laid out [data axis, heads axis, -, -] (the batch of
prompts on the data axis, heads on the axis that splits the key kernel's heads, as the attention
computes its keys and values: replicated where the rules split the queries alone), and every
call relays its caches out to that layout, so a call's outputs are its next inputs without a
relayout in between (tests check `dtensor.fetch_layout`).
The logits come back replicated [batch, vocab] for the host to sample from.
"""

from __future__ import annotations

from typing import Any

from dtcli.layout import WeightPlan, replicated, to_layout
from dtcli.mesh import UNSHARDED
from dtcli.recipe import TransformerConfig


def heads_axis(plans: list[WeightPlan], gather_axis: str | None) -> str:
    """The mesh axis the attention computes its keys' and values' heads on: the key kernel's
    heads dim (dim 1) unless that is the FSDP axis (models.compute gathers it off that axis
    before use)."""
    spec = next(p.spec for p in plans if p.weight.path == "block_0.attention.key.kernel")
    axis = spec[1]
    return UNSHARDED if axis == gather_axis else axis


class CachedGPT:
    """The built GPT's layers as the two compiled calls above. `model`: the tf_keras.Model of
    transformer.build; `mesh`: its DTensor mesh, or None for plain variables compiled by XLA;
    `data_axis`: the mesh axis the batch of prompts is split along."""

    def __init__(
        self,
        model: Any,
        cfg: TransformerConfig,
        mesh: Any,
        data_axis: str,
        heads: str,
        jit: bool = True,
    ):
        import tensorflow as tf

        self.cfg = cfg
        self.mesh = mesh
        self.embedding = model.get_layer("token_embedding")
        names = {layer.name for layer in model.layers}
        # Learned positions are added to the embedding; rope rotates inside the attention.
        self.position = (
            model.get_layer("position_embedding") if cfg.positions == "learned" else None
        )
        self.vocab_mask = model.get_layer("vocab_mask") if "vocab_mask" in names else None
        self.blocks = [model.get_layer(f"block_{i}") for i in range(cfg.layers)]
        self.ln_f = model.get_layer("ln_f")
        self.head = model.get_layer("head")
        plain = mesh is None
        self.layout = None if plain else to_layout((data_axis, heads, UNSHARDED, UNSHARDED), mesh)
        # autograph=False: these are straight-line ops (like dtcli's steps). jit_compile only
        # on plain variables (`jit`: unless train.compile is graph): on a mesh it compiles
        # nothing and is not harmless (DTENSOR_NOTES).
        jit = True if plain and jit else None
        self.prefill = tf.function(self._prefill, autograph=False, jit_compile=jit)
        self.decode = tf.function(self._decode, autograph=False, jit_compile=jit)

    def empty(self, batch: int) -> tuple[Any, ...]:
        """Zero caches for `batch` rows: (key, value) of block 0, then of block 1, ..."""
        import tensorflow as tf
        from tensorflow.experimental import dtensor

        shape = (batch, self.cfg.key_heads, self.cfg.context, self.cfg.head_dim)
        if self.layout is None:
            zeros = tf.zeros(shape)
        else:
            zeros = dtensor.call_with_layout(tf.zeros, self.layout, shape=shape)
        return tuple(zeros for _ in range(2 * self.cfg.layers))

    def _prefill(self, window: Any, last: Any, refill: Any, caches: tuple) -> tuple[Any, tuple]:
        """window [batch, context] int32; last [batch, context] bool (one-hot: the position
        whose logits are wanted); refill [batch] bool."""
        import tensorflow as tf

        x = self.embedding(window)
        if self.position is not None:
            x = self.position(x)
        fresh = []
        for block in self.blocks:
            x, k, v = block.prefill(x)
            fresh += [k, v]
        # The row at `last`: a sum of 0s and that row, so exactly it (before ln_f and the head,
        # which act on each position alone: one position's worth of head instead of context's).
        h = tf.reduce_sum(x * tf.cast(last, x.dtype)[:, :, None], axis=1, keepdims=True)
        keep = refill[:, None, None, None]
        out = tuple(self._laid(tf.where(keep, f, c)) for f, c in zip(fresh, caches, strict=True))
        return self._logits(h), out

    def _decode(self, tokens: Any, at: Any, caches: tuple) -> tuple[Any, tuple]:
        """tokens [batch, 1] int32; at [batch, context] bool, one-hot (or all false: a row that
        is not generating this step leaves its caches as they are)."""
        import tensorflow as tf

        x = self.embedding(tokens)
        if self.position is not None:
            x = self.position.add_at(x, at)
        # Positions up to the new one (the reversed cumulative sum of its one-hot), as the
        # training path masks the others: (1 - keep) * -1e9, computed once for every block.
        seen = tf.cumsum(tf.cast(at, tf.int32), axis=1, reverse=True) > 0
        unseen = ((1.0 - tf.cast(seen, tf.float32)) * -1e9)[:, None, None, :]
        out = []
        for i, block in enumerate(self.blocks):
            x, k, v = block.decode(x, caches[2 * i], caches[2 * i + 1], at, unseen)
            out += [self._laid(k), self._laid(v)]
        return self._logits(x), tuple(out)

    def _laid(self, cache: Any) -> Any:
        from tensorflow.experimental import dtensor

        return cache if self.layout is None else dtensor.relayout(cache, self.layout)

    def _logits(self, h: Any) -> Any:
        """[batch, 1, d_model] -> logits [batch, vocab], replicated for the host."""
        from tensorflow.experimental import dtensor

        logits = self.head(self.ln_f(h))
        if self.vocab_mask is not None:
            logits = self.vocab_mask(logits)
        logits = logits[:, 0, :]
        return logits if self.mesh is None else dtensor.relayout(logits, replicated(self.mesh, 2))
