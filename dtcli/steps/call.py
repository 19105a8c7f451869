"""The compiled train call (K optimizer steps in one `tf.function`) and eval step, and a block of
batches run through the call from the host."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from dtcli import pipeline as pipeline_lib
from dtcli.errors import UsageError, one_line
from dtcli.steps.engine import PER_STEP, Engine, steps_per_call
from dtcli.steps.lowering import Compiled, MeshSteps
from dtcli.steps.step import is_measured, step_at_fn, step_counts, sums


def make_steps(session: Engine) -> tuple[Any, Any]:
    """The compiled train call and eval step.

    The train call runs K steps (K = the leading dim of its masks, `train.steps_per_call`) in one
    `tf.function`, on a block of K batches already on the mesh (or their positions in a split
    placed on the devices, see data.placement), and returns per-step vectors
    (loss, correct, count) and `applied`, the steps whose loss was finite. Once a loss is not
    finite no later update of the call is applied: the weights kept are the last finite ones.
    A step whose mask is all zero (padding of an epoch's last block) changes nothing. The eval
    step returns sums over the global batch. On a mesh, calling them deletes the DTensor
    lowerings of the steps an earlier make_steps gave (steps/lowering.py says why).
    """
    import tensorflow as tf

    model = session.model
    language_model = session.recipe.task == "language_model"
    train_call = _train_call_fn(session, language_model)

    def eval_step(x: Any, y: Any, mask: Any) -> dict[str, Any]:
        return sums(model.forward(x, training=False), y, mask, language_model)

    # The loop and the cond are written as TensorFlow ops, so AutoGraph has nothing of dtcli's
    # to convert; with it off, tracing skips converting the Keras and optimizer code too
    # (measured on the quick start: the K-step call compiles in about 3.8 s instead of 5.5).
    # A user's own model (`model.build`) may branch on tensors in Python: AutoGraph stays on.
    autograph = model.needs_autograph
    # A one-device run (session.xla) compiles both with XLA: the K steps, the optimizer and
    # the loss become a few fused kernels instead of thousands of op launches (see
    # bench/nanogpt.py); `graph` runs them on TensorFlow's own kernels. DTensor's own
    # jit_compile compiles nothing (DTENSOR_NOTES).
    xla = session.xla
    # On a mesh the two hold their DTensor lowerings together, one make_steps' at a time.
    steps = None if session.packer.mesh is None else MeshSteps()
    return tuple(
        Compiled(lambda fn=fn: tf.function(fn, autograph=autograph, jit_compile=xla or None), steps)
        for fn in (train_call, eval_step)
    )


def _train_call_fn(session: Engine, language_model: bool) -> Any:
    """train_call(inputs, masks, runs, notices) -> the block's per-step vectors and `applied`
    (see make_steps): the K steps as one TensorFlow loop over one traced step."""
    import tensorflow as tf

    measured = is_measured(session.recipe.optimizer)
    per_step = PER_STEP if measured else PER_STEP[:3]
    micro = session.recipe.train.accumulate
    step_at = step_at_fn(session, language_model, measured)

    def train_call(inputs: tuple, masks: Any, runs: Any, notices: Any = None) -> dict[str, Any]:
        """`inputs`: the block's (xs, ys) [K, batch, ...], or (positions,) [K, batch] of a
        split placed on the devices; `masks` [K, batch]; `runs` [K] bool: the steps to run
        (the first ones; see Packer.flags for why not their count). With train.accumulate N
        the block holds K*N micro-batches [K*N, batch/N, ...], step i's being i*N...i*N+N-1.
        `notices` (multi-client runs): each client's preemption flag (Packer.notices); `stop`
        is their max."""
        steps = runs.shape[0]
        real = tf.reduce_sum(tf.cast(runs, tf.int32))
        totals = None
        if micro > 1:
            totals = step_counts(masks, micro, inputs[1] if language_model else None)

        def body(i: Any, healthy: Any, applied: Any, *vectors: Any) -> tuple:
            out = step_at(inputs, masks, i, healthy, totals)
            # TensorArrays do not expand under DTensor; one-hot sums do.
            at = tf.one_hot(i, steps)
            return (
                i + 1,
                tf.logical_and(healthy, out["finite"]),
                applied + tf.cast(out["applied"], tf.int32),
                *(v + at * out[name] for v, name in zip(vectors, per_step)),
            )

        # One traced step whatever K is (a Python loop would compile K). Only the `real` steps
        # of the block run: the padding of a short last block costs nothing (measured:
        # computing it made K=16 0.88x of K=4 on 39-step epochs).
        zeros = tf.zeros([steps])
        _, _, applied, *vectors = tf.while_loop(
            lambda i, *_: i < real,
            body,
            (tf.constant(0), tf.constant(True), tf.constant(0), *(zeros for _ in per_step)),
        )
        out = {"applied": applied, **dict(zip(per_step, vectors))}
        if notices is not None:
            out["stop"] = tf.reduce_max(notices)
        return out

    return train_call


def train_block(
    session: Engine, train_call: Any, batches: list, notice: bool | None = None
) -> dict:
    """Run `batches` (at most K) in one call; padded to K so that the shapes never change.
    Returns host numpy: per-step loss/correct/count of the real steps, and `applied`; in a
    multi-client run (`notice`: this client's preemption flag) `stop`, the clients' agreement."""
    k = steps_per_call(session)
    real = len(batches)
    if real < k:
        batches = batches + [pipeline_lib.empty_like(batches[0])] * (k - real)
    # (xs, ys, masks), or (positions, masks) of a split placed on the devices.
    *inputs, masks = session.packer.pack_block(batches, session.recipe.train.accumulate)
    runs = session.packer.flags([i < real for i in range(k)])
    with xla_refusal(session):
        if session.cluster is None:
            out = train_call(tuple(inputs), masks, runs)
        else:
            out = train_call(tuple(inputs), masks, runs, session.packer.notices(bool(notice)))
    result = {
        **{name: out[name].numpy()[:real] for name in PER_STEP if name in out},
        "applied": int(out["applied"].numpy()),
    }
    if "stop" in out:
        result["stop"] = bool(out["stop"].numpy() > 0)
    return result


@contextlib.contextmanager
def xla_refusal(session: Engine) -> Iterator[None]:
    """A model XLA cannot compile (an op it has no kernel for, in a `model.build` model) fails
    the first call of an XLA run: one line naming train.compile and the way around it."""
    import tensorflow as tf

    try:
        yield
    except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError) as exc:
        text = str(exc)
        if not session.xla or not ("XLA" in text or "unsupported op" in text):
            raise
        raise UsageError(
            f"recipe key 'train.compile': XLA cannot compile this model ({one_line(exc)}); "
            "set train.compile=graph (TensorFlow's own kernels) or dtensor"
        ) from None
