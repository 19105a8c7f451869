"""The compiled steps: K training steps per `tf.function` call, and the eval step.

`make_steps` builds them from a session (session.Session: the model, optimizer and packer on the
mesh); `train_block` runs one block of at most K batches through the train call and reads its
per-step results back. Loss is the mean over the real examples of the global batch plus
regularization, so one recipe gives the same numbers on any mesh. With train.accumulate N each
step runs its batch as N micro-batches and applies their summed gradient once: the same numbers
as the whole batch in one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

from dtcli import models, optimizers
from dtcli import pipeline as pipeline_lib
from dtcli.errors import UsageError, one_line
from dtcli.recipe import OptimizerConfig, Recipe
from dtcli.stretches import stretch_steps


class Engine(Protocol):
    """What the steps read of a session.Session (a Protocol: session.py imports this module)."""

    recipe: Recipe
    model: models.Built
    optimizer: Any
    packer: pipeline_lib.Packer
    train_feed: pipeline_lib.Feed
    placed: tuple[Any, Any] | None
    cluster: Any


# What the train call returns for each step, read back once per call (the last two only
# where the recipe schedules or clips, see make_steps).
PER_STEP = ("loss", "correct", "count", "grad_norm", "learning_rate")


def make_steps(session: Engine) -> tuple[Any, Any]:
    """The compiled train call and eval step.

    The train call runs K steps (K = the leading dim of its masks, `train.steps_per_call`) in one
    `tf.function`, on a block of K batches already on the mesh (or their positions in a split
    placed on the devices, see data.placement), and returns per-step vectors
    (loss, correct, count) and `applied`, the steps whose loss was finite. Once a loss is not
    finite no later update of the call is applied: the weights kept are the last finite ones.
    A step whose mask is all zero (padding of an epoch's last block) changes nothing. The eval
    step returns sums over the global batch.
    """
    import tensorflow as tf

    model = session.model
    placed = session.placed
    language_model = session.recipe.task == "language_model"
    measured = _measured(session.recipe.optimizer)
    per_step = PER_STEP if measured else PER_STEP[:3]
    micro = session.recipe.train.accumulate
    step_at = _step_at_fn(session, language_model, measured)

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
            totals = _step_counts(masks, micro, _per_example(inputs, placed, language_model))

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

    def eval_step(x: Any, y: Any, mask: Any) -> dict[str, Any]:
        return _sums(model.forward(x, training=False), y, mask, language_model)

    # The loop and the cond are written as TensorFlow ops, so AutoGraph has nothing of dtcli's
    # to convert; with it off, tracing skips converting the Keras and optimizer code too
    # (measured on the quick start: the K-step call compiles in about 3.8 s instead of 5.5).
    # A user's own model (`model.build`) may branch on tensors in Python: AutoGraph stays on.
    autograph = model.needs_autograph
    # A one-device run (session.xla) compiles both with XLA: the K steps, the optimizer and
    # the loss become a few fused kernels instead of thousands of op launches (see
    # bench/nanogpt.py). DTensor's own jit_compile compiles nothing (DTENSOR_NOTES).
    xla = session.packer.mesh is None
    return (
        tf.function(train_call, autograph=autograph, jit_compile=xla or None),
        tf.function(eval_step, autograph=autograph, jit_compile=xla or None),
    )


def _step_at_fn(session: Engine, language_model: bool, measured: bool) -> Any:
    """step_at(inputs, masks, i, apply, totals) -> the outputs of optimizer step `i` of a block:
    its batch, or its train.accumulate micro-batches (`totals`: each step's real count)."""
    import tensorflow as tf

    packer, placed = session.packer, session.placed
    micro = session.recipe.train.accumulate
    if micro == 1:
        one_step = _one_step_fn(session, language_model, measured)
        return lambda inputs, masks, i, apply, totals: one_step(
            *_batch_at(packer, placed, inputs, masks, i), apply
        )
    accumulated = _accumulated_step_fn(session, language_model, measured)

    def step_at(inputs: tuple, masks: Any, i: Any, apply: Any, totals: Any) -> dict[str, Any]:
        return accumulated(
            lambda j: _batch_at(packer, placed, inputs, masks, i * micro + j),
            tf.gather(totals, i),
            apply,
        )

    return step_at


def _measured(cfg: OptimizerConfig) -> bool:
    """Whether each step computes (and logs) the gradient norm and the learning rate: only where
    a recipe schedules or clips, as language-model recipes do; other recipes do not pay for a
    norm over every gradient each step."""
    return cfg.schedule != "constant" or cfg.warmup_steps > 0 or cfg.clip_norm is not None


def _one_step_fn(session: Engine, language_model: bool, measured: bool) -> Any:
    """one_step(x, y, mask, apply) -> the batch's sums, its loss, whether the loss is finite and
    whether the update was `applied` (only where `apply`, the loss is finite and the batch has
    real examples); with `measured`, the gradient norm and the scheduled learning rate too."""
    import tensorflow as tf

    model = session.model
    variables = model.trainable_variables
    update = _update_fn(session, measured)

    def one_step(x: Any, y: Any, mask: Any, apply: Any) -> dict[str, Any]:
        with tf.GradientTape() as tape:
            logits = model.forward(x, training=True)
            out = _sums(logits, y, mask, language_model)
            loss = out["ce_sum"] / tf.maximum(out["count"], 1.0)
            if model.regularization is not None:
                loss += model.regularization()
        return update(out, loss, _dense(tape.gradient(loss, variables)), apply)

    return one_step


def _update_fn(session: Engine, measured: bool) -> Any:
    """update(out, loss, grads, apply) -> `out` with the step's loss, `finite` and `applied`
    (and, `measured`, grad_norm and learning_rate): the optimizer step of a step's gradients,
    clipped and scheduled once per optimizer step."""
    import tensorflow as tf

    optimizer = session.optimizer
    variables = session.model.trainable_variables
    cfg = session.recipe.optimizer
    total_steps = session.recipe.train.steps or session.recipe.train.epochs * epoch_steps(session)

    def update(out: dict[str, Any], loss: Any, grads: list, apply: Any) -> dict[str, Any]:
        if measured:
            norm = tf.linalg.global_norm(grads)
            if cfg.clip_norm is not None:
                grads, _ = tf.clip_by_global_norm(grads, cfg.clip_norm, use_norm=norm)
            rate = optimizers.learning_rate_at(cfg, optimizer.iterations, total_steps)
        finite = tf.math.is_finite(loss)

        def apply_grads() -> Any:
            # All gradients before any update. This barrier alone does NOT make the step right
            # with DTensor's all-reduce combining pass on (measured: 1e-2 off after 5 steps on
            # batch=4,model=2); dtcli turns the pass off and `train` refuses to run with it on.
            with tf.control_dependencies(grads):
                optimizer.apply(grads, variables, rate if measured else None)
            return tf.constant(True)

        applied = tf.cond(
            tf.logical_and(apply, tf.logical_and(finite, out["count"] > 0)),
            apply_grads,
            lambda: tf.constant(False),
        )
        out["loss"] = loss
        out["finite"] = finite
        out["applied"] = applied
        if measured:
            out["grad_norm"] = norm
            out["learning_rate"] = rate
        return out

    return update


def _dense(grads: list) -> list:
    """Embedding lookups give IndexedSlices; DTensor cannot lay out their scatter update."""
    import tensorflow as tf

    return [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]


def _accumulated_step_fn(session: Engine, language_model: bool, measured: bool) -> Any:
    """one_step(micro_at, total, apply): one optimizer step over train.accumulate N
    micro-batches (`micro_at(j)` -> micro-batch j's x, y, mask), as _one_step_fn's step over
    their whole batch. Each micro-batch's loss is its cross-entropy sum over `total`, the real
    examples (tokens) of the whole step, so the summed gradient is the big batch's gradient;
    regularization counts once (in micro-batch 0). Clipping, the schedule and the update act
    on the sum once; a non-finite loss in any micro-batch makes the step's loss non-finite,
    so the update is not applied."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    model = session.model
    variables = model.trainable_variables
    micro = session.recipe.train.accumulate
    update = _update_fn(session, measured)

    def one_step(micro_at: Any, total: Any, apply: Any) -> dict[str, Any]:
        denom = tf.maximum(total, 1.0)

        def body(j: Any, loss: Any, correct: Any, count: Any, *acc: Any) -> tuple:
            x, y, mask = micro_at(j)
            with tf.GradientTape() as tape:
                out = _sums(model.forward(x, training=True), y, mask, language_model)
                part = out["ce_sum"] / denom
                if model.regularization is not None:
                    part += tf.cast(tf.equal(j, 0), tf.float32) * model.regularization()
            grads = tape.gradient(
                part, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO
            )
            # A loop variable keeps one layout through the loop: the variable's, as its zeros.
            grads = _dense(grads)
            if session.packer.mesh is not None:
                grads = [dtensor.relayout(g, v.layout) for g, v in zip(grads, variables)]
            return (
                j + 1,
                loss + part,
                correct + out["correct"],
                count + out["count"],
                *(a + g for a, g in zip(acc, grads)),
            )

        # A loop, not a Python unroll: the graph holds one micro-batch's step whatever N is,
        # and the micro-batches run one after another, so only one micro-batch's activations
        # are live (the point of accumulating). Measured (tiny_gpt, N=4, one device): the
        # first call took 5.2-6.6 s of CPU time, unrolled 11.5-12.0 s; a step 221-257 ms,
        # unrolled 215-230 ms (a loaded machine: noisy).
        zero = tf.constant(0.0)
        _, loss, correct, count, *grads = tf.while_loop(
            lambda j, *_: j < micro,
            body,
            (tf.constant(0), zero, zero, zero, *(tf.zeros_like(v) for v in variables)),
        )
        return update({"correct": correct, "count": count}, loss, grads, apply)

    return one_step


def _per_example(inputs: tuple, placed: Any, language_model: bool) -> int:
    """What a real example counts for in a step's count: its tokens (a language model), or 1."""
    if not language_model:
        return 1
    y_shape = placed[1].shape[1:] if placed is not None else inputs[1].shape[2:]
    return int(y_shape.num_elements())


def _step_counts(masks: Any, micro: int, per_example: int) -> Any:
    """[K] the real examples (tokens) of each step of a block of K*micro micro-batches' masks,
    counted before any of them runs (each micro-batch's loss is over its step's total). One
    sum over the sharded batch dim (one all-reduce) for the whole block."""
    import tensorflow as tf

    per_micro = tf.reduce_sum(masks, axis=1)  # [K*micro], replicated
    return tf.reduce_sum(tf.reshape(per_micro, [-1, micro]), axis=1) * float(per_example)


def _sums(logits: Any, y: Any, mask: Any, language_model: bool) -> dict[str, Any]:
    """Sums over the real examples of the batch (a language model: over their tokens)."""
    import tensorflow as tf

    y = tf.cast(y, tf.int32)
    if language_model:  # logits [batch, time, vocab], y [batch, time], mask [batch]
        mask = mask[:, None] * tf.ones_like(y, tf.float32)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
    hit = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), y), tf.float32)
    # One sum of the three stacked, not three sums: each sum over the sharded batch dim is
    # an all-reduce across the mesh, and on a small model the step's time is mostly those
    # (measured on the quick start: 1.11x examples/s with one instead of three).
    stacked = tf.stack([ce * mask, hit * mask, mask], axis=-1)
    ce_sum, correct, count = tf.unstack(tf.reduce_sum(stacked, axis=list(range(len(ce.shape)))))
    return {"ce_sum": ce_sum, "correct": correct, "count": count}


def _pick(packer: pipeline_lib.Packer, block: Any, i: Any) -> Any:
    """Batch `i` of a block [K, batch, ...] on the mesh, with the step's batch layout."""
    import tensorflow as tf

    # tf.gather, not block[i]: DTensor gives a strided slice with a dynamic index the
    # layout of its input shifted by one dim (measured: a rank-5 block trains on scrambled
    # rows with no error; MaxPool refuses "unsharded,batch,..."). The relayout states the
    # step's batch layout (a no-op when it is already right).
    return _on_batch_layout(packer, tf.gather(block, i))


def _on_batch_layout(packer: pipeline_lib.Packer, tensor: Any) -> Any:
    """`tensor` with the batch layout of its rank (as it is in an XLA run: no mesh)."""
    from tensorflow.experimental import dtensor

    if packer.mesh is None:
        return tensor
    return dtensor.relayout(tensor, packer.layout(len(tensor.shape)))


def _batch_at(
    packer: pipeline_lib.Packer, placed: Any, inputs: tuple, masks: Any, i: Any
) -> tuple[Any, Any, Any]:
    """(x, y, mask) of step `i` of a block: from the block's batches, or gathered from the
    split placed on the devices (`placed`) at the block's positions."""
    import tensorflow as tf

    if placed is None:
        xs, ys = inputs
        return _pick(packer, xs, i), _pick(packer, ys, i), _pick(packer, masks, i)
    # The split is on every device; each device gathers its own rows of the batch.
    (index,) = inputs
    rows = _pick(packer, index, i)
    x, y = (tf.gather(t, rows) for t in placed)
    return _on_batch_layout(packer, x), _on_batch_layout(packer, y), _pick(packer, masks, i)


def steps_per_call(session: Engine) -> int:
    return session.recipe.train.steps_per_call


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
        if session.packer.mesh is not None or not ("XLA" in text or "unsupported op" in text):
            raise
        raise UsageError(
            f"recipe key 'train.compile': XLA cannot compile this model ({one_line(exc)}); "
            "set train.compile=dtensor"
        ) from None


def epoch_steps(session: Engine, epoch: int = 0) -> int:
    """Steps of epoch `epoch`: a pass over the data, or train.steps_per_epoch; a train.steps
    run's last stretch may be shorter."""
    return stretch_steps(session.recipe.train, session.train_feed.steps, epoch)
