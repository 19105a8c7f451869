"""Generation's two forward passes on the mesh (decoding.Forward): a step in, logits [rows, vocab]
out on the host. On one device (a session of plain variables, mesh.compiles_with_xla) both
are compiled by XLA, as `train` compiles its steps; on a bigger mesh they run on DTensor.

`WindowForward` (--no-cache, and any language model that is not dtcli's GPT): the model's own
forward pass, the one training runs, over every row's whole window at every step.
`CachedForward`: dtcli's GPT with K/V caches (models/decode.py): a pass over the window only where
it starts anew (the prompt, a restart of the windowing policy), else one position per row.

On a mesh every input is packed with its rows split along the data axis (session.packer), never
replicated: DTensor folds a small replicated int input into the lowered program and lowers it
again when its value changes (measured here: a replicated int32 [1, 1] token lowered a second
time, a batch-split one never, even on an axis of size 1; DTENSOR_NOTES.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dtcli.infer.decoding import Step


class WindowForward:
    """The model's forward pass over each row's window (right-padded: a causal model's logits
    at the last real position do not see the padding)."""

    def __init__(self, session: Any):
        import tensorflow as tf
        from tensorflow.experimental import dtensor

        from dtcli.layout import replicated

        model, mesh = session.model, session.mesh
        self.session = session

        # jit_compile only on plain variables (on a mesh it compiles nothing, DTENSOR_NOTES).
        @tf.function(autograph=model.needs_autograph, jit_compile=True if session.xla else None)
        def logits_at(window: tf.Tensor, last: tf.Tensor) -> tf.Tensor:
            out = model.forward(window, training=False)  # [rows, context, vocab]
            # A sum of 0s and the row at `last`: exactly that row.
            rows = tf.reduce_sum(out * tf.cast(last, out.dtype)[:, :, None], axis=1)
            return rows if mesh is None else dtensor.relayout(rows, replicated(mesh, 2))

        self.logits_at = logits_at
        self._logits_at = Traced(logits_at)

    def __call__(self, step: Step) -> np.ndarray:
        from dtcli.steps import xla_refusal

        pack = self.session.packer.pack
        # A `model.build` model with an op XLA has no kernel for: one line, as `train` says it.
        with xla_refusal(self.session):
            out = self._logits_at(pack(step.windows), pack(step.last))
        return on_host(out)


class CachedForward:
    """dtcli's GPT with K/V caches for a batch of `rows`; the caches live between steps."""

    def __init__(self, session: Any, rows: int):
        from dtcli.models import decode

        recipe = session.recipe
        gather = session.model.module.get_layer("block_0").attention.compute.gather_axis
        self.gpt = decode.CachedGPT(
            session.model.module,
            recipe.model.transformer,
            session.mesh,  # None: plain variables
            recipe.layouts.data_axis,
            decode.heads_axis(session.plans, gather),
            jit=session.xla,
        )
        self.packer = session.packer
        self.rows = rows
        self.caches = self.gpt.empty(rows)
        self._prefill, self._decode = Traced(self.gpt.prefill), Traced(self.gpt.decode)

    def reset(self) -> None:
        """Forget every row (a new batch of prompts)."""
        self.caches = self.gpt.empty(self.rows)

    def __call__(self, step: Step) -> np.ndarray:
        """Rows whose window starts anew refill their caches from it; the others add their last
        token at its position. A step may need both calls (rows restart at different times)."""
        pack = self.packer.pack
        refill = step.active & step.restart
        extend = step.active & ~step.restart
        last = step.last
        logits = None
        if refill.any():
            out, self.caches = self._prefill(
                pack(step.windows), pack(last), pack(refill), self.caches
            )
            logits = on_host(out)
        if extend.any():
            tokens = step.windows[np.arange(len(last)), step.lengths - 1][:, None]
            at = last & extend[:, None]  # rows not extended write nothing
            out, self.caches = self._decode(pack(tokens), pack(at), self.caches)
            rows = on_host(out)
            logits = rows if logits is None else np.where(extend[:, None], rows, logits)
        if logits is None:  # no row is active (the loop stops before this)
            raise RuntimeError("a generation step with no active row")
        return logits


class Traced:
    """A `tf.function` called through the one concrete function its first call traces: its
    arguments' shapes never change, and a concrete call skips the dispatch on them (the
    function's cache lookup) that a `tf.function` call pays each time (measured on tiny_gpt's
    XLA decode step: 0.72 ms of CPU a call against 0.98). A call of other shapes fails instead
    of tracing and compiling again."""

    def __init__(self, function: Any):
        self.function = function
        self.concrete: Any = None

    def __call__(self, *args: Any) -> Any:
        if self.concrete is None:
            self.concrete = self.function.get_concrete_function(*args)
        return self.concrete(*args)


def on_host(tensor: Any) -> np.ndarray:
    """A tensor's value on the host: a plain tensor's, or a replicated DTensor's first (every
    device holds all of it)."""
    from tensorflow.experimental import dtensor

    if dtensor.is_dtensor(tensor):
        return dtensor.unpack(tensor)[0].numpy()
    return tensor.numpy()
