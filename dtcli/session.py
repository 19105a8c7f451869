"""The engine every command builds on: a recipe built on its mesh, the compiled steps, evaluation.

`prepare` configures the devices, loads the data and builds the model and optimizer with their
layouts; `make_steps` gives the compiled train and eval steps, both of (batch) -> sums over the
global batch; `run_epoch` trains through one epoch in data order. Loss is the mean over the real
examples of the global batch plus regularization, so one recipe gives the same numbers on any
mesh. train (the loop), eval, doctor and bench import this module; it imports none of them.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from dtcli import cluster as cluster_lib
from dtcli import data as data_lib
from dtcli import devices as devices_lib
from dtcli import layout as layout_lib
from dtcli import mesh as mesh_lib
from dtcli import models, optimizers
from dtcli import pipeline as pipeline_lib
from dtcli import recipe as recipe_lib
from dtcli.errors import UsageError
from dtcli.recipe import Recipe


@dataclass
class Session:
    """Everything a recipe builds on its mesh; shared by train and eval."""

    recipe: Recipe  # resolved: mesh sizes and devices filled in
    devices: devices_lib.Devices
    axes: dict[str, int]
    mesh: Any
    data: data_lib.Dataset
    plans: list[layout_lib.WeightPlan]
    model: models.Built
    optimizer: Any
    packer: pipeline_lib.Packer
    train_feed: pipeline_lib.Feed
    eval_feed: pipeline_lib.Feed
    cluster: cluster_lib.Cluster | None = None  # set in a multi-client run
    # The training split's (x, y) placed on the devices (data.placement), or None.
    placed: tuple[Any, Any] | None = None
    # Whether the train step has run in this process (its first call traces and compiles it).
    compiled: bool = False

    @property
    def eval_batch_size(self) -> int:
        return self.recipe.data.eval_batch_size or self.recipe.data.batch_size

    def checkpoint_objects(self) -> dict[str, Any]:
        return {"model": self.model.module, "optimizer": self.optimizer.trackable}


def prepare(
    recipe: Recipe,
    splits: tuple[str, ...] = ("train", "eval"),
    cluster: cluster_lib.Cluster | None = None,
    use_devices: int | None = None,
) -> Session:
    """Configure devices, then load data and build the model and optimizer on the mesh.

    `splits` (): no data is read, only its shape (for generation).
    `use_devices`: build the mesh over only the first N of the configured devices (so that one
    process can compare a 1-device mesh with a multi-device one, as `dtcli doctor` does).
    With a `cluster` this process is one client of a multi-client run: it configures only its
    own devices and the mesh spans every client's (the global device list).
    """
    want = mesh_lib.device_count_for(recipe.mesh)
    devices = devices_lib.configure(recipe.devices, want, cluster=cluster)
    if use_devices is not None:
        devices = devices_lib.Devices(devices.device_type, use_devices)
    axes = mesh_lib.resolve_axes(recipe.mesh, devices.count)
    data_axis = recipe.layouts.data_axis
    mesh_lib.check_batch(axes, data_axis, recipe.data.batch_size, "data.batch_size")
    if recipe.data.eval_batch_size:
        mesh_lib.check_batch(axes, data_axis, recipe.data.eval_batch_size, "data.eval_batch_size")
    dataset = data_lib.load(recipe.data, splits) if splits else data_lib.no_data(recipe.data)
    if "train" in splits:
        data_lib.check_batch_fits(recipe.data, dataset)
    plans, initial = models.weight_plans(recipe, dataset.input_shape, dataset.num_classes, axes)
    mesh = mesh_lib.build_mesh(
        axes, devices.device_type, distributed=cluster is not None, count=use_devices
    )
    if recipe.model.api == "keras":
        built = models.build_keras(
            recipe.model,
            dataset.input_shape,
            dataset.num_classes,
            mesh,
            plans,
            initial,
            recipe.seed,
        )
    else:
        built = models.build_core(
            recipe.model, dataset.input_shape, dataset.num_classes, mesh, plans, recipe.seed
        )
    optimizer = optimizers.make(recipe.model.api, recipe.optimizer, mesh)
    trainable = {id(v) for v in built.trainable_variables}
    no_decay = [
        var
        for path, var in built.variables.items()
        if id(var) in trainable and not optimizers.decayed(recipe.optimizer, path)
    ]
    optimizer.build(built.trainable_variables, no_decay)
    resolved = recipe_lib.replace(recipe, mesh=axes, devices=devices.text)
    packer = pipeline_lib.Packer(mesh, data_axis)
    cfg = recipe.data
    steps = recipe.train.steps_per_epoch
    if (
        "train" in splits
        and recipe.train.steps
        and steps > pipeline_lib.steps_per_epoch(len(dataset.train), cfg.batch_size)
    ):
        raise UsageError(
            f"recipe key 'train.eval_every': {steps} steps is more than one pass over the "
            f"training data ({len(dataset.train)} examples in batches of {cfg.batch_size}); "
            "use at most that many"
        )
    placed = None
    if "train" in splits and place_on_device(cfg, dataset.train, devices.local_count):
        placed = packer.place(dataset.train.x), packer.place(dataset.train.y)
    return Session(
        resolved,
        devices,
        axes,
        mesh,
        dataset,
        plans,
        built,
        optimizer,
        packer,
        pipeline_lib.Feed(
            dataset.train,
            cfg.batch_size,
            recipe.seed,
            cfg.shuffle,
            packer.share(cfg.batch_size),
            on_device=placed is not None,
        ),
        eval_feed(recipe, dataset.eval, packer),
        cluster,
        placed,
    )


def eval_feed(recipe: Recipe, split: Any, packer: pipeline_lib.Packer) -> pipeline_lib.Feed:
    """`split` read for evaluation: unshuffled, in eval batches, the last one padded and masked,
    so that each example counts once."""
    size = recipe.data.eval_batch_size or recipe.data.batch_size
    return pipeline_lib.Feed(split, size, recipe.seed, False, packer.share(size))


# data.placement auto: the most bytes the copies of a training split on this process's devices
# may take together (virtual CPUs share host memory; a GPU holds one copy in its own).
ON_DEVICE_BYTES = 1 << 30


def place_on_device(cfg: recipe_lib.DataConfig, split: Any, local_devices: int) -> bool:
    """Whether the training split lives on the devices (see data.placement)."""
    if cfg.placement == "host" or not isinstance(split, data_lib.Split):
        return False
    if isinstance(split, data_lib.TextSplit):
        return False  # windows are views of the tokens; a batch copies a few bytes
    if cfg.placement == "device":
        return True
    return (split.x.nbytes + split.y.nbytes) * local_devices <= ON_DEVICE_BYTES


# --------------------------------------------------------------------------- steps


# What the train call returns for each step, read back once per call (the last two only
# where the recipe schedules or clips, see make_steps).
PER_STEP = ("loss", "correct", "count", "grad_norm", "learning_rate")


def make_steps(session: Session) -> tuple[Any, Any]:
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
    from tensorflow.experimental import dtensor

    model = session.model
    optimizer = session.optimizer
    packer = session.packer
    placed = session.placed
    variables = model.trainable_variables

    language_model = session.recipe.task == "language_model"

    def sums(logits: Any, y: Any, mask: Any) -> dict[str, Any]:
        """Sums over the real examples of the batch (a language model: over their tokens)."""
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

    cfg = session.recipe.optimizer
    # The learning rate of a schedule and the gradient norm are computed (and logged) only where
    # a recipe schedules or clips, as language-model recipes do; other recipes do not pay for a
    # norm over every gradient each step.
    measured = cfg.schedule != "constant" or cfg.warmup_steps > 0 or cfg.clip_norm is not None
    per_step = PER_STEP if measured else PER_STEP[:3]
    total_steps = session.recipe.train.steps or session.recipe.train.epochs * epoch_steps(session)

    def one_step(x: Any, y: Any, mask: Any, apply: Any) -> dict[str, Any]:
        with tf.GradientTape() as tape:
            logits = model.forward(x, training=True)
            out = sums(logits, y, mask)
            loss = out["ce_sum"] / tf.maximum(out["count"], 1.0)
            if model.regularization is not None:
                loss += model.regularization()
        grads = tape.gradient(loss, variables)
        # Embedding lookups give IndexedSlices; DTensor cannot lay out their scatter update.
        grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in grads]
        if measured:
            norm = tf.linalg.global_norm(grads)
            if cfg.clip_norm is not None:
                grads, _ = tf.clip_by_global_norm(grads, cfg.clip_norm, use_norm=norm)
            rate = optimizers.learning_rate_at(cfg, optimizer.iterations, total_steps)
        finite = tf.math.is_finite(loss)

        def update() -> Any:
            # All gradients before any update. This barrier alone does NOT make the step right
            # with DTensor's all-reduce combining pass on (measured: 1e-2 off after 5 steps on
            # batch=4,model=2); dtcli turns the pass off and `train` refuses to run with it on.
            with tf.control_dependencies(grads):
                optimizer.apply(grads, variables, rate if measured else None)
            return tf.constant(True)

        applied = tf.cond(
            tf.logical_and(apply, tf.logical_and(finite, out["count"] > 0)),
            update,
            lambda: tf.constant(False),
        )
        out["loss"] = loss
        out["finite"] = finite
        out["applied"] = applied
        if measured:
            out["grad_norm"] = norm
            out["learning_rate"] = rate
        return out

    def pick(block: Any, i: Any) -> Any:
        # tf.gather, not block[i]: DTensor gives a strided slice with a dynamic index the
        # layout of its input shifted by one dim (measured: a rank-5 block trains on scrambled
        # rows with no error; MaxPool refuses "unsharded,batch,..."). The relayout states the
        # step's batch layout (a no-op when it is already right).
        return dtensor.relayout(tf.gather(block, i), packer.layout(len(block.shape) - 1))

    def batch_at(inputs: tuple, masks: Any, i: Any) -> tuple[Any, Any, Any]:
        if placed is None:
            xs, ys = inputs
            return pick(xs, i), pick(ys, i), pick(masks, i)
        # The split is on every device; each device gathers its own rows of the batch.
        (index,) = inputs
        rows = pick(index, i)
        x, y = (tf.gather(t, rows) for t in placed)
        return (
            dtensor.relayout(x, packer.layout(len(x.shape))),
            dtensor.relayout(y, packer.layout(1)),
            pick(masks, i),
        )

    def train_call(inputs: tuple, masks: Any, runs: Any, notices: Any = None) -> dict[str, Any]:
        """`inputs`: the block's (xs, ys) [K, batch, ...], or (positions,) [K, batch] of a
        split placed on the devices; `masks` [K, batch]; `runs` [K] bool: the steps to run
        (the first ones; see Packer.flags for why not their count). `notices` (multi-client
        runs): each client's preemption flag (Packer.notices); `stop` is their max."""
        steps = masks.shape[0]
        real = tf.reduce_sum(tf.cast(runs, tf.int32))

        def body(i: Any, healthy: Any, applied: Any, *vectors: Any) -> tuple:
            out = one_step(*batch_at(inputs, masks, i), healthy)
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
        return sums(model.forward(x, training=False), y, mask)

    # The loop and the cond are written as TensorFlow ops, so AutoGraph has nothing of dtcli's
    # to convert; with it off, tracing skips converting the Keras and optimizer code too
    # (measured on the quick start: the K-step call compiles in about 3.8 s instead of 5.5).
    # A user's own model (`model.build`) may branch on tensors in Python: AutoGraph stays on.
    autograph = model.needs_autograph
    return (
        tf.function(train_call, autograph=autograph),
        tf.function(eval_step, autograph=autograph),
    )


def steps_per_call(session: Session) -> int:
    return session.recipe.train.steps_per_call


def train_block(
    session: Session, train_call: Any, batches: list, notice: bool | None = None
) -> dict:
    """Run `batches` (at most K) in one call; padded to K so that the shapes never change.
    Returns host numpy: per-step loss/correct/count of the real steps, and `applied`; in a
    multi-client run (`notice`: this client's preemption flag) `stop`, the clients' agreement."""
    k = steps_per_call(session)
    real = len(batches)
    if real < k:
        batches = batches + [pipeline_lib.empty_like(batches[0])] * (k - real)
    # (xs, ys, masks), or (positions, masks) of a split placed on the devices.
    *inputs, masks = session.packer.pack_block(batches)
    runs = session.packer.flags([i < real for i in range(k)])
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


def evaluate(
    session: Session, eval_step: Any, feed: pipeline_lib.Feed, packed: list | None = None
) -> dict[str, float]:
    """Loss and accuracy over every example of `feed`'s split, each counted exactly once."""
    ce = correct = count = 0.0
    batches = packed if packed is not None else map(session.packer.pack_batch, feed.epoch(0))
    for x, y, mask in batches:
        out = eval_step(x, y, mask)
        ce += float(out["ce_sum"])
        correct += float(out["correct"])
        count += float(out["count"])
    loss = ce / max(count, 1.0)
    if session.recipe.task == "language_model":  # counts are tokens
        import math

        return {
            "loss": loss,
            "accuracy": correct / max(count, 1.0),
            "perplexity": math.exp(min(loss, 700.0)),
            "tokens": int(count),
        }
    return {"loss": loss, "accuracy": correct / max(count, 1.0), "examples": int(count)}


def flops_per_token(session: Session) -> float | None:
    """Training FLOPs per token of dtcli's transformer (None for other models)."""
    from dtcli import transformer

    cfg = session.recipe.model.transformer
    if cfg is None:
        return None
    context = session.data.input_shape[0]
    return transformer.flops_per_token(cfg, session.data.num_classes, context)


def pack_all(session: Session, feed: pipeline_lib.Feed) -> list | None:
    """An in-memory split's batches packed once, to evaluate on again and again (a streamed
    split is read again each time: it need not fit in memory)."""
    if not feed.in_memory:
        return None
    return [session.packer.pack_batch(b) for b in feed.epoch(0)]


def run_steps(session: Session, steps: int) -> list[float]:
    """Train `steps` steps in data order (for mesh-equivalence checks); returns the losses."""
    train_call, _ = make_steps(session)
    k = steps_per_call(session)
    losses: list[float] = []
    epoch = 0
    while len(losses) < steps:
        batches = session.train_feed.epoch(epoch, 0, steps - len(losses))
        while block := list(itertools.islice(batches, k)):
            out = train_block(session, train_call, block)
            losses += [float(v) for v in out["loss"]]
        epoch += 1
    return losses


@dataclass
class EpochState:
    """Progress through one epoch; saved in checkpoints written mid-epoch (Ctrl-C)."""

    epoch: int  # 0-based index of the epoch in progress
    batch: int = 0  # batches of it already trained
    loss_sum: float = 0.0
    correct: float = 0.0
    count: float = 0.0
    seconds: float = 0.0
    # The first step this process ran in this epoch, tracing and compiling included (0: none).
    compile_seconds: float = 0.0


def epoch_steps(session: Session, epoch: int = 0) -> int:
    """Steps of epoch `epoch`: a pass over the data, or train.steps_per_epoch; a train.steps
    run's last stretch may be shorter."""
    t = session.recipe.train
    steps = session.train_feed.steps
    steps = min(steps, t.steps_per_epoch) if t.steps_per_epoch else steps
    if t.steps is not None:
        steps = min(steps, t.steps - epoch * steps)
    return steps


def run_epoch(
    session: Session,
    train_call: Any,
    state: EpochState,
    bar: Any = None,
    writer: Any = None,
    stop: Any = None,
    trained: Any = None,
    profiler: Any = None,
) -> EpochState:
    """Train the rest of one epoch (from `state.batch`), K steps a call (the process's first
    call: one); returns early, at a call boundary, when `stop()` is true.

    `trained()` is called once after each call that applied a step, before anything of it is
    written; `profiler` (metrics.Profiler) hears of each call before and after it. A non-finite
    loss raises NonFiniteLoss with the optimizer step it happened at."""
    steps = epoch_steps(session, state.epoch)
    k = steps_per_call(session)
    log_every = session.recipe.train.log_every
    started = time.perf_counter() - state.seconds
    batches = session.train_feed.epoch(state.epoch, state.batch, steps)

    def next_block() -> list:
        # A process's first call runs one step: it compiles the K-step call all the same, and
        # the first loss, the progress bar and compile_seconds then come after the compilation
        # and one step instead of K steps (the later calls run K).
        return list(itertools.islice(batches, k if session.compiled else 1))

    # stop() is checked before each call (a Ctrl-C stops the run before its next call).
    while not (stop is not None and stop()) and (block := next_block()):
        # The optimizer's step of block[0] (every epoch before this one was whole).
        first = state.epoch * epoch_steps(session) + state.batch + 1
        if profiler is not None:
            profiler.before_call(first, len(block))
        called = time.perf_counter()
        out = train_block(session, train_call, block, getattr(stop, "noticed", None))
        if not session.compiled:
            session.compiled = True
            state.compile_seconds = time.perf_counter() - called
        good = out["applied"]
        if profiler is not None:
            profiler.after_call(first + good - 1)
        if good and trained is not None:
            trained()
        for j in range(good):
            n = float(out["count"][j])
            state.batch += 1
            state.loss_sum += float(out["loss"][j]) * n
            state.correct += float(out["correct"][j])
            state.count += n
            if writer is not None and (first + j) % log_every == 0:
                more = {k: float(out[k][j]) for k in PER_STEP[3:] if k in out}
                writer.step_loss(first + j, float(out["loss"][j]), **more)
        if good < len(block):
            raise NonFiniteLoss(float(out["loss"][good]), first + good)
        if out.get("stop"):
            stop.agree()  # every client read the same answer: all stop after this call
        state.seconds = time.perf_counter() - started
        if bar is not None:
            bar.update(
                state.batch,
                state.loss_sum / state.count,
                state.correct / state.count,
                state.count / state.seconds,
            )
    return state


class NonFiniteLoss(Exception):
    def __init__(self, loss: float, step: int):
        self.loss = loss
        self.step = step  # the optimizer step whose loss it was (its update was not applied)
