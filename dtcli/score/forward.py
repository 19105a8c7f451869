"""Score's forward pass on the mesh: a batch of windows in, each position's log probability of
its target token out, on the host. The model's own forward pass (the one training and eval run),
then log_softmax at the target, on the devices: only [rows, context] numbers leave them, never
the logits [rows, context, vocab]. On one device (plain variables, mesh.compiles_with_xla) it is
compiled by XLA, as eval's step is; on a bigger mesh it runs on DTensor, the windows split along
the data axis (session.packer).

The log probabilities are over the model's whole output: logits the model itself masks (ids past
a vocabulary it was padded to) are -inf and take no probability; nothing is renormalised here.
"""

from __future__ import annotations

from typing import Any

import numpy as np


class TargetLogprobs:
    """(inputs [rows, context], targets [rows, context]) -> log p(target) [rows, context]."""

    def __init__(self, session: Any):
        import tensorflow as tf
        from tensorflow.experimental import dtensor

        from dtcli.layout import replicated

        model, mesh = session.model, session.mesh
        self.session = session

        # jit_compile only on plain variables (on a mesh it compiles nothing, DTENSOR_NOTES).
        @tf.function(autograph=model.needs_autograph, jit_compile=True if session.xla else None)
        def logprobs(inputs: tf.Tensor, targets: tf.Tensor) -> tf.Tensor:
            logits = tf.cast(model.forward(inputs, training=False), tf.float32)
            # log_softmax at the target, as eval's loss computes it (its negative)
            out = -tf.nn.sparse_softmax_cross_entropy_with_logits(labels=targets, logits=logits)
            return out if mesh is None else dtensor.relayout(out, replicated(mesh, 2))

        self.logprobs = logprobs

    def __call__(self, inputs: np.ndarray, targets: np.ndarray) -> np.ndarray:
        from tensorflow.experimental import dtensor

        from dtcli.steps import xla_refusal

        pack = self.session.packer.pack
        # A `model.build` model with an op XLA has no kernel for: one line, as `train` says it.
        with xla_refusal(self.session):
            out = self.logprobs(pack(inputs), pack(targets))
        if dtensor.is_dtensor(out):  # replicated: every device holds all of it
            return dtensor.unpack(out)[0].numpy()
        return out.numpy()
