"""Rotary position embedding (model.transformer.positions: rope) as Hugging Face's Llama computes
it: its inverse frequencies (the `llama3` rope_scaling included) in float32 and in its order of
operations, and its half-split "rotate_half" layout, so that Llama's query and key weights are
dtcli's as they are (a rename and a transpose, no permutation). Imports TensorFlow (as
gpt_layers.py, whose attention uses it)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import tensorflow as tf

from dtcli.recipe import TransformerConfig


def inverse_frequencies(cfg: TransformerConfig) -> np.ndarray:
    """RoPE's inverse frequencies [head_dim / 2], float32 and in the order of operations of
    Hugging Face's Llama (its default and its `llama3` rope_type), so the angles are its own."""
    dim = cfg.head_dim
    exponent = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv = np.float32(1.0) / (np.float32(cfg.rope_theta) ** exponent)
    s = cfg.rope_scaling
    if s is None:
        return inv
    old = float(s.original_context)
    low_wavelen, high_wavelen = old / s.low_freq_factor, old / s.high_freq_factor
    wavelen = np.float32(2 * math.pi) / inv
    scaled = np.where(wavelen > low_wavelen, inv / np.float32(s.factor), inv)
    smooth = (np.float32(old) / wavelen - np.float32(s.low_freq_factor)) / np.float32(
        s.high_freq_factor - s.low_freq_factor
    )
    smoothed = (np.float32(1) - smooth) * scaled / np.float32(s.factor) + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(medium, smoothed, scaled).astype(np.float32)


class Rotary:
    """Rotary position embedding of a head's dims (positions: rope), in Hugging Face Llama's
    half-split layout: x * cos + rotate_half(x) * sin, cos and sin [time, head_dim] of
    concat(freqs, freqs), freqs = position x inverse frequency. No weights: its tables are
    constants of the context's positions."""

    def __init__(self, cfg: TransformerConfig):
        freqs = np.arange(cfg.context, dtype=np.float32)[:, None] * inverse_frequencies(cfg)
        angles = np.concatenate([freqs, freqs], axis=-1)
        self.cos, self.sin = np.cos(angles), np.sin(angles)

    def rotate(self, x: Any, cos: Any = None, sin: Any = None) -> Any:
        """x [batch, heads, time, head_dim] at positions 0.. (or at the given cos/sin)."""
        if cos is None:
            time = x.shape[2]
            cos, sin = tf.constant(self.cos[:time]), tf.constant(self.sin[:time])
        half = x.shape[-1] // 2
        rotated = tf.concat([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def gathered(self, positions: Any) -> tuple[Any, Any]:
        """cos and sin [batch, 1, time, head_dim] at each token's position [batch, time] (a
        packed window's: each example from 0): the rows the unpacked path uses at those
        positions, gathered."""
        # expand_dims, not [:, None]: DTensor's strided-slice expander fails on a new axis.
        cos, sin = (tf.gather(tf.constant(t), positions) for t in (self.cos, self.sin))
        return tf.expand_dims(cos, 1), tf.expand_dims(sin, 1)

    def at(self, at: Any) -> tuple[Any, Any]:
        """cos and sin [batch, 1, 1, head_dim] at each row's one-hot position `at` [batch,
        context] (a product with 0s and a 1: exactly the table's row)."""
        one_hot = tf.cast(at, tf.float32)
        pick = [tf.matmul(one_hot, tf.constant(t))[:, None, None, :] for t in (self.cos, self.sin)]
        return pick[0], pick[1]
