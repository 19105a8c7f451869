"""The log probability of targets on the mesh (score's, and lm-eval's loglikelihood requests):
a batch of windows in, each position's log probability of its target token out, on the host,
and whether the target is the model's most likely token there (lm-eval's is_greedy). The
model's own forward pass (the one training and eval run), then log_softmax at the target, on
the devices: only [rows, length] numbers leave them, never the logits [rows, length, vocab].
Windows may be shorter than the context (a causal model's position sees none after it); each
shape traces and compiles once. On one device (plain variables, mesh.compiles_with_xla) it is
compiled by XLA, as eval's step is; on a bigger mesh it runs on DTensor, the windows split along
the data axis (session.packer).

The log probabilities are over the model's whole output: logits the model itself masks (ids past
a vocabulary it was padded to) are -inf and take no probability; nothing is renormalised here.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np


class TargetLogprobs:
    """(inputs [rows, length], targets [rows, length]) -> (log p(target) [rows, length] float32,
    whether the target is the argmax of its logits [rows, length] bool)."""

    def __init__(self, session: Any, any_length: bool = False):
        """`any_length`: windows shorter than the context are taken as they are (dtcli's own
        unpacked GPT: models.transformer.any_window); otherwise they must be [rows, context]."""
        import tensorflow as tf
        from tensorflow.experimental import dtensor

        from dtcli.layout import replicated

        model, mesh = session.model, session.mesh
        self.session = session

        # jit_compile only on plain variables (on a mesh it compiles nothing, DTENSOR_NOTES).
        @tf.function(autograph=model.needs_autograph, jit_compile=True if session.xla else None)
        def logprobs(inputs: tf.Tensor, targets: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
            logits = tf.cast(model.forward(inputs, training=False), tf.float32)
            # log_softmax at the target, as eval's loss computes it (its negative)
            out = -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
            # argmax takes the first of equal logits, as torch's does for lm-eval's hf model
            best = tf.argmax(logits, axis=-1, output_type=tf.int32)
            greedy = tf.cast(tf.equal(best, targets), tf.int32)
            if mesh is None:
                return out, greedy
            both = replicated(mesh, 2)
            return dtensor.relayout(out, both), dtensor.relayout(greedy, both)

        self.logprobs = logprobs
        self.any_length = any_length

    def __call__(self, inputs: np.ndarray, targets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        from dtcli.infer.forward import on_host
        from dtcli.models.transformer import any_window
        from dtcli.steps import xla_refusal

        pack = self.session.packer.pack
        module = self.session.model.module
        lengths = any_window(module) if self.any_length else contextlib.nullcontext()
        # A `model.build` model with an op XLA has no kernel for: one line, as `train` says it.
        with xla_refusal(self.session), lengths:  # a new length traces the model anew
            out, greedy = self.logprobs(pack(inputs), pack(targets))
        return on_host(out), on_host(greedy).astype(bool)
