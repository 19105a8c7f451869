"""One optimizer step as the train call traces it: the forward pass, the loss as sums over the
real examples of the global batch, the gradients (of the whole batch, or accumulated over
train.accumulate micro-batches), clipping, the schedule and the update."""

from __future__ import annotations

from typing import Any

from dtcli import optimizers
from dtcli.recipe import OptimizerConfig
from dtcli.steps.batch import batch_at
from dtcli.steps.engine import Engine, epoch_steps


def step_at_fn(session: Engine, language_model: bool, measured: bool) -> Any:
    """step_at(inputs, masks, i, apply, totals) -> the outputs of optimizer step `i` of a block:
    its batch, or its train.accumulate micro-batches (`totals`: each step's real count)."""
    import tensorflow as tf

    packer, placed = session.packer, session.placed
    micro = session.recipe.train.accumulate
    if micro == 1:
        one_step = _one_step_fn(session, language_model, measured)
        return lambda inputs, masks, i, apply, totals: one_step(
            *batch_at(packer, placed, inputs, masks, i), apply
        )
    accumulated = _accumulated_step_fn(session, language_model, measured)

    def step_at(inputs: tuple, masks: Any, i: Any, apply: Any, totals: Any) -> dict[str, Any]:
        return accumulated(
            lambda j: batch_at(packer, placed, inputs, masks, i * micro + j),
            tf.gather(totals, i),
            apply,
        )

    return step_at


def is_measured(cfg: OptimizerConfig) -> bool:
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
            out = sums(logits, y, mask, language_model)
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
        grads = _as_weights(grads, variables, session.packer.mesh)
        if measured:
            norm = optimizers.global_norm(grads, variables)
            if cfg.clip_norm is not None:
                grads, _ = tf.clip_by_global_norm(grads, cfg.clip_norm, use_norm=norm)
            rate = optimizers.learning_rate_at(cfg, optimizer.iterations, total_steps)
        finite = tf.math.is_finite(loss)

        def apply_grads() -> Any:
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


def _as_weights(grads: list, variables: list, mesh: Any) -> list:
    """Each gradient laid out as its weight, before the update (on a mesh).

    DTensor's all-reduce combining pass (on, see tfruntime) merges a block's independent
    all-reduces and then reorders the block by data alone: a write of a variable can move past
    a read of it. The update writes the slots and reads them back (Adam: m, then m * alpha), so
    it must hold no collective; a gradient laid out unlike its weight (a replicated bias of a
    split kernel: its gradient is split) would be gathered inside it. Laid out here, the
    collectives run before the update's branch. Without this, a model-split MLP with replicated
    biases ended 1.09 (relative) away from one device on batch=4,model=2 and model=8
    (tests/test_mesh_invariance.py's functional and subclassed cases)."""
    if mesh is None:
        return grads
    from tensorflow.experimental import dtensor

    return [dtensor.relayout(g, v.layout) for g, v in zip(grads, variables)]


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

    model = session.model
    variables = model.trainable_variables
    micro = session.recipe.train.accumulate
    update = _update_fn(session, measured)

    def one_step(micro_at: Any, total: Any, apply: Any) -> dict[str, Any]:
        denom = tf.maximum(total, 1.0)

        def body(j: Any, loss: Any, correct: Any, count: Any, *acc: Any) -> tuple:
            x, y, mask = micro_at(j)
            with tf.GradientTape() as tape:
                out = sums(model.forward(x, training=True), y, mask, language_model)
                part = out["ce_sum"] / denom
                if model.regularization is not None:
                    part += tf.cast(tf.equal(j, 0), tf.float32) * model.regularization()
            grads = tape.gradient(
                part, variables, unconnected_gradients=tf.UnconnectedGradients.ZERO
            )
            # A loop variable keeps one layout through the loop: the variable's, as its zeros.
            grads = _as_weights(_dense(grads), variables, session.packer.mesh)
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


def step_counts(masks: Any, micro: int, ys: Any = None) -> Any:
    """[K] what each step of a block of K*micro micro-batches counts, before any of them runs
    (each micro-batch's loss is over its step's total): its real examples, or (`ys` given, a
    language model's targets [K*micro, batch/micro, context]) their targets that are in the
    loss (>= 0, as `sums` counts them: instruction data leaves prompts and padding out). One
    sum over the sharded batch dim (one all-reduce) for the whole block. A language model's
    split is never placed on the devices (session.place_on_device), so its ys are the block's."""
    import tensorflow as tf

    if ys is None:
        per_micro = tf.reduce_sum(masks, axis=1)  # [K*micro], replicated
    else:
        weights = masks[:, :, None] * tf.cast(ys >= 0, tf.float32)
        per_micro = tf.reduce_sum(weights, axis=[1, 2])
    return tf.reduce_sum(tf.reshape(per_micro, [-1, micro]), axis=1)


def sums(logits: Any, y: Any, mask: Any, language_model: bool) -> dict[str, Any]:
    """Sums over the real examples of the batch (a language model: over their tokens)."""
    import tensorflow as tf

    y = tf.cast(y, tf.int32)
    if language_model:  # logits [batch, time, vocab], y [batch, time], mask [batch]
        # A target below 0 is outside the loss (instruction data: a prompt's tokens, padding,
        # the seam between packed examples); its weight is 0 and its label any valid id.
        mask = mask[:, None] * tf.cast(y >= 0, tf.float32)
        y = tf.maximum(y, 0)
    ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
    hit = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), y), tf.float32)
    # One sum of the three stacked, not three sums: each sum over the sharded batch dim is
    # an all-reduce across the mesh, and on a small model the step's time is mostly those
    # (measured on the quick start: 1.11x examples/s with one instead of three).
    stacked = tf.stack([ce * mask, hit * mask, mask], axis=-1)
    ce_sum, correct, count = tf.unstack(tf.reduce_sum(stacked, axis=list(range(len(ce.shape)))))
    return {"ce_sum": ce_sum, "correct": correct, "count": count}
