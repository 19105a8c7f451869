"""The engine every command builds on: a recipe built on its mesh, evaluation, the epoch loop.

`prepare` configures the devices, loads the data and builds the model and optimizer with their
layouts; steps.make_steps gives the compiled train and eval steps, both of (batch) -> sums over
the global batch; `run_epoch` trains through one epoch in data order. Loss is the mean over the
real examples of the global batch plus regularization, so one recipe gives the same numbers on
any mesh. train (the loop), eval, doctor and bench import this module; it imports none of them.
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
from dtcli.steps import (
    PER_STEP,
    epoch_steps,
    make_steps,
    steps_per_call,
    train_block,
)
from dtcli.stretches import resume_position

__all__ = [
    "EpochState",
    "NonFiniteLoss",
    "Session",
    "eval_feed",
    "evaluate",
    "flops_per_token",
    "pack_all",
    "prepare",
    "resume_state",
    "run_epoch",
    "run_steps",
]


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
    def local_device_count(self) -> int:
        """The devices this process computes on: the mesh's local ones (XLA: the one)."""
        return 1 if self.mesh is None else self.mesh.num_local_devices()

    @property
    def xla(self) -> bool:
        """Whether the steps compile with XLA on plain variables (train.compile; `mesh` None)."""
        return self.mesh is None

    def checkpoint_objects(self) -> dict[str, Any]:
        return {"model": self.model.module, "optimizer": self.optimizer.trackable}


def prepare(
    recipe: Recipe,
    splits: tuple[str, ...] = ("train", "eval"),
    cluster: cluster_lib.Cluster | None = None,
    use_devices: int | None = None,
    devices_key: str = devices_lib.RECIPE_KEY,
    tokenizer_file: Any = None,
) -> Session:
    """Configure devices, then load data and build the model and optimizer on the mesh.

    `splits` (): no data is read, only its shape (for generation).
    `use_devices`: build the mesh over only the first N of the configured devices (so that one
    process can compare a 1-device mesh with a multi-device one, as `dtcli doctor` does).
    With a `cluster` this process is one client of a multi-client run: it configures only its
    own devices and the mesh spans every client's (the global device list).
    `devices_key`: how messages name the devices (--devices when the command line gave them).
    `tokenizer_file`: where the run keeps a language model's tokenizer (rundir.TOKENIZER): read
    when it is there, else the recipe's tokenizer is made (its `data.tokenizer` to be saved).
    """
    want = mesh_lib.device_count_for(recipe.mesh)
    devices = devices_lib.configure(recipe.devices, want, devices_key, cluster=cluster)
    if use_devices is not None:
        devices = devices_lib.Devices(devices.device_type, use_devices)
    axes = mesh_lib.resolve_axes(recipe.mesh, devices.count)
    _check_batches(recipe, axes)
    if splits:
        dataset = data_lib.load(recipe.data, splits, tokenizer_file)
    else:
        dataset = data_lib.no_data(recipe.data, tokenizer_file)
    if "train" in splits:
        data_lib.check_batch_fits(recipe.data, dataset)
    plans, initial = models.weight_plans(recipe, dataset.input_shape, dataset.num_classes, axes)
    # Generation (no splits) runs its own forward passes on a DTensor mesh.
    xla = bool(splits) and mesh_lib.compiles_with_xla(
        recipe.train.compile, axes, 1 if cluster is None else cluster.num_clients
    )
    mesh = None  # XLA: plain variables on the one device, no mesh
    if not xla:
        mesh = mesh_lib.build_mesh(
            axes, devices.device_type, distributed=cluster is not None, count=use_devices
        )
    built, optimizer = _model_on_mesh(recipe, dataset, mesh, plans, initial)
    resolved = recipe_lib.replace(recipe, mesh=axes, devices=devices.text)
    packer = (
        pipeline_lib.Packer(mesh, recipe.layouts.data_axis) if mesh else pipeline_lib.PlainPacker()
    )
    if "train" in splits:
        _check_steps_per_epoch(recipe, dataset)
    placed = None
    if "train" in splits and place_on_device(recipe.data, dataset.train, devices.local_count):
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
        _train_feed(recipe, dataset.train, packer, placed is not None),
        eval_feed(recipe, dataset.eval, packer),
        cluster,
        placed,
    )


def _check_batches(recipe: Recipe, axes: dict[str, int]) -> None:
    """The batch sizes divide by the data axis (the recipe checks it where the sizes are known
    without devices; here the axis has its size)."""
    data_axis = recipe.layouts.data_axis
    mesh_lib.check_batch(axes, data_axis, recipe.data.batch_size, "data.batch_size")
    if recipe.data.eval_batch_size:
        mesh_lib.check_batch(axes, data_axis, recipe.data.eval_batch_size, "data.eval_batch_size")
    recipe_lib.check_micro_batch(recipe, axes)


def _model_on_mesh(
    recipe: Recipe, dataset: data_lib.Dataset, mesh: Any, plans: list, initial: dict
) -> tuple[models.Built, Any]:
    """The model built on the mesh (None: plain variables on the one device), and its
    optimizer with its slots made (a restore fills them)."""
    built = models.build(recipe, dataset.input_shape, dataset.num_classes, mesh, plans, initial)
    optimizer = optimizers.make(built.api, recipe.optimizer, mesh)
    trainable = {id(v) for v in built.trainable_variables}
    no_decay = [
        var
        for path, var in built.variables.items()
        if id(var) in trainable and not optimizers.decayed(recipe.optimizer, path)
    ]
    optimizer.build(built.trainable_variables, no_decay)
    return built, optimizer


def _check_steps_per_epoch(recipe: Recipe, dataset: data_lib.Dataset) -> None:
    """A train.steps run's epochs (train.eval_every steps) fit in one pass over the data."""
    batch_size, t = recipe.data.batch_size, recipe.train
    steps = t.steps_per_epoch
    one_pass = pipeline_lib.steps_per_epoch(len(dataset.train), batch_size)
    if not t.steps or steps <= one_pass:
        return
    data = f"the training data ({len(dataset.train)} examples in batches of {batch_size}: "
    if steps == t.steps:  # eval_every not given (it defaults to train.steps), or set equal
        raise UsageError(
            f"recipe key 'train.steps': {steps} steps between evaluations (train.eval_every "
            f"unset or equal to train.steps) is more than one pass over {data}{one_pass} "
            f"batches); set train.eval_every to at most {one_pass}"
        )
    raise UsageError(
        f"recipe key 'train.eval_every': {steps} steps is more than one pass over {data}"
        f"{one_pass} batches); use at most {one_pass}"
    )


def _train_feed(
    recipe: Recipe, split: Any, packer: pipeline_lib.Packer, on_device: bool
) -> pipeline_lib.Feed:
    """The training split read in the recipe's batches, shuffled as it says."""
    cfg = recipe.data
    return pipeline_lib.Feed(
        split,
        cfg.batch_size,
        recipe.seed,
        cfg.shuffle,
        packer.share(cfg.batch_size),
        on_device=on_device,
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

        result = {
            "loss": loss,
            "accuracy": correct / max(count, 1.0),
            "perplexity": math.exp(min(loss, 700.0)),
            "tokens": int(count),
        }
        text_bytes = getattr(feed.split, "target_bytes", None)
        if text_bytes:  # bits per UTF-8 byte of the text: compares across tokenizers
            result["bpb"] = ce / math.log(2) / text_bytes
        return result
    return {"loss": loss, "accuracy": correct / max(count, 1.0), "examples": int(count)}


def flops_per_token(session: Session) -> float | None:
    """Training FLOPs per token of dtcli's transformer (None for other models)."""
    cfg = session.recipe.model.transformer
    if cfg is None:
        return None
    context = session.data.input_shape[0]
    return models.transformer.flops_per_token(cfg, session.data.num_classes, context)


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


def resume_state(train: recipe_lib.TrainConfig, step: int, saved: dict[str, Any]) -> EpochState:
    """Where a run resumed from a checkpoint at global step `step` goes on; `saved`: the
    checkpoint's epoch_state. Its sums so far count only where the checkpoint's epoch is the
    one the run goes on in (a train.steps run resumed with another eval_every starts afresh in
    the stretch that holds `step`, see stretches.resume_position)."""
    state = EpochState(**saved)
    epoch, batch = resume_position(train, step, state.epoch, state.batch)
    if (epoch, batch) == (state.epoch, state.batch):
        return state
    return EpochState(epoch, batch)


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


def run_epoch(
    session: Session,
    train_call: Any,
    state: EpochState,
    bar: Any = None,
    writer: Any = None,
    stop: Any = None,
    trained: Any = None,
    profiler: Any = None,
    step: int | None = None,
) -> EpochState:
    """Train the rest of one epoch (from `state.batch`), K steps a call (the process's first
    call: one); returns early, at a call boundary, when `stop()` is true.

    `trained()` is called once after each call that applied a step, before anything of it is
    written; `profiler` (metrics.Profiler) hears of each call before and after it. A non-finite
    loss raises NonFiniteLoss with the optimizer step it happened at. `step`: the optimizer's
    count before the state's next batch (None: every epoch before this one had epoch_steps)."""
    steps = epoch_steps(session, state.epoch)
    k = steps_per_call(session)
    log_every = session.recipe.train.log_every
    started = time.perf_counter() - state.seconds
    batches = session.train_feed.epoch(state.epoch, state.batch, steps)
    if step is None:
        step = state.epoch * epoch_steps(session) + state.batch

    def next_block() -> list:
        # A process's first call runs one step: it compiles the K-step call all the same, and
        # the first loss, the progress bar and compile_seconds then come after the compilation
        # and one step instead of K steps (the later calls run K).
        return list(itertools.islice(batches, k if session.compiled else 1))

    # stop() is checked before each call (a Ctrl-C stops the run before its next call).
    while not (stop is not None and stop()) and (block := next_block()):
        first = step + 1  # the optimizer's step of block[0]
        if profiler is not None:
            profiler.before_call(first, len(block))
        called = time.perf_counter()
        out = train_block(session, train_call, block, getattr(stop, "noticed", None))
        if not session.compiled:
            session.compiled = True
            state.compile_seconds = time.perf_counter() - called
        applied = out["applied"]  # the block's steps whose update was applied (the first ones)
        if profiler is not None:
            profiler.after_call(first + applied - 1)
        if applied and trained is not None:
            trained()
        _add_steps(state, out, first, applied, writer, log_every)
        step += applied
        if applied < len(block):
            raise NonFiniteLoss(float(out["loss"][applied]), first + applied)
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


def _add_steps(
    state: EpochState, out: dict, first: int, applied: int, writer: Any, log_every: int
) -> None:
    """Count the `applied` steps of a call (optimizer steps `first`...) into `state`; every
    `log_every`th step's loss (and norm and rate, where measured) goes to `writer`."""
    for j in range(applied):
        n = float(out["count"][j])
        state.batch += 1
        state.loss_sum += float(out["loss"][j]) * n
        state.correct += float(out["correct"][j])
        state.count += n
        if writer is not None and (first + j) % log_every == 0:
            more = {name: float(out[name][j]) for name in PER_STEP[3:] if name in out}
            writer.step_loss(first + j, float(out["loss"][j]), **more)


class NonFiniteLoss(Exception):
    def __init__(self, loss: float, step: int):
        self.loss = loss
        self.step = step  # the optimizer step whose loss it was (its update was not applied)
