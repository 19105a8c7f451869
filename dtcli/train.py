"""Building a run (devices, mesh, data, model, optimizer) and the custom training loop.

The train step is one compiled function of (batch) -> sums over the global batch, closing over the
model and optimizer state; the loop decides when to log, evaluate and checkpoint, and stops loudly
on a non-finite loss. Loss is the mean over the real examples of the global batch plus
regularization, so one recipe gives the same numbers on any mesh.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from dtcli import data as data_lib
from dtcli import devices as devices_lib
from dtcli import layout as layout_lib
from dtcli import mesh as mesh_lib
from dtcli import models, optimizers
from dtcli import recipe as recipe_lib
from dtcli.errors import TrainingError, UsageError
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
    packer: data_lib.Packer

    @property
    def eval_batch_size(self) -> int:
        return self.recipe.data.eval_batch_size or self.recipe.data.batch_size

    def checkpoint_objects(self) -> dict[str, Any]:
        return {"model": self.model.module, "optimizer": self.optimizer.trackable}


def plan(recipe: Recipe, input_shape: tuple[int, ...], num_classes: int, axes: dict[str, int],
         seed: int) -> tuple[list[layout_lib.WeightPlan], dict]:
    """Weights of the model and where each lives; Keras initial values come with them."""
    if recipe.model.api == "keras":
        weights, initial = models.describe_keras(recipe.model, input_shape, num_classes, seed)
    else:
        weights, initial = models.describe_core(recipe.model, input_shape, num_classes), {}
    return layout_lib.plan_weights(recipe.layouts.rules, weights, axes), initial


def prepare(recipe: Recipe, splits: tuple[str, ...] = ("train", "eval")) -> Session:
    """Configure devices, then load data and build the model and optimizer on the mesh."""
    want = mesh_lib.device_count_for(recipe.mesh)
    devices = devices_lib.configure(recipe.devices, want)
    axes = mesh_lib.resolve_axes(recipe.mesh, devices.count)
    data_axis = recipe.layouts.data_axis
    mesh_lib.check_batch(axes, data_axis, recipe.data.batch_size, "data.batch_size")
    if recipe.data.eval_batch_size:
        mesh_lib.check_batch(axes, data_axis, recipe.data.eval_batch_size, "data.eval_batch_size")
    dataset = data_lib.load(recipe.data, splits)
    plans, initial = plan(recipe, dataset.input_shape, dataset.num_classes, axes, recipe.seed)
    mesh = mesh_lib.build_mesh(axes, devices.device_type)
    if recipe.model.api == "keras":
        built = models.build_keras(recipe.model, dataset.input_shape, dataset.num_classes, mesh,
                                   plans, initial, recipe.seed)
    else:
        built = models.build_core(recipe.model, dataset.input_shape, dataset.num_classes, mesh,
                                  plans, recipe.seed)
    optimizer = optimizers.make(recipe.model.api, recipe.optimizer, mesh)
    optimizer.build(built.trainable_variables)
    resolved = recipe_lib.replace(recipe, mesh=axes, devices=devices.text)
    return Session(resolved, devices, axes, mesh, dataset, plans, built, optimizer,
                   data_lib.Packer(mesh, data_axis))


# --------------------------------------------------------------------------- steps


def make_steps(session: Session) -> tuple[Any, Any]:
    """The compiled train and eval steps. Both return sums over the global batch."""
    import tensorflow as tf

    model = session.model
    optimizer = session.optimizer
    variables = model.trainable_variables

    def sums(logits: Any, y: Any, mask: Any) -> dict[str, Any]:
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
        hit = tf.cast(tf.equal(tf.argmax(logits, axis=-1, output_type=tf.int32), y), tf.float32)
        return {"ce_sum": tf.reduce_sum(ce * mask), "correct": tf.reduce_sum(hit * mask),
                "count": tf.reduce_sum(mask)}

    @tf.function
    def train_step(x: Any, y: Any, mask: Any) -> dict[str, Any]:
        with tf.GradientTape() as tape:
            logits = model.forward(x, training=True)
            out = sums(logits, y, mask)
            loss = out["ce_sum"] / tf.maximum(out["count"], 1.0)
            if model.regularization is not None:
                loss += model.regularization()
        grads = tape.gradient(loss, variables)
        # A barrier between computing and applying gradients: with DTensor's all-reduce
        # combining pass on, a fused step gives wrong weights on multi-device meshes.
        with tf.control_dependencies(grads):
            optimizer.apply(grads, variables)
        out["loss"] = loss
        return out

    @tf.function
    def eval_step(x: Any, y: Any, mask: Any) -> dict[str, Any]:
        return sums(model.forward(x, training=False), y, mask)

    return train_step, eval_step


def evaluate(session: Session, eval_step: Any, split: data_lib.Split,
             packed: list | None = None) -> dict[str, float]:
    """Loss and accuracy over every example of `split`, each counted exactly once."""
    ce = correct = count = 0.0
    batches = packed if packed is not None else pack_all(session, split)
    for x, y, mask in batches:
        out = eval_step(x, y, mask)
        ce += float(out["ce_sum"])
        correct += float(out["correct"])
        count += float(out["count"])
    return {"loss": ce / max(count, 1.0), "accuracy": correct / max(count, 1.0),
            "examples": int(count)}


def pack_all(session: Session, split: data_lib.Split) -> list:
    return [session.packer.pack_batch(b)
            for b in data_lib.batches(split, session.eval_batch_size)]


def run_steps(session: Session, steps: int) -> list[float]:
    """Train `steps` steps in data order (for mesh-equivalence checks); returns the losses."""
    train_step, _ = make_steps(session)
    recipe = session.recipe
    losses: list[float] = []
    epoch = 0
    while len(losses) < steps:
        order = data_lib.epoch_order(len(session.data.train), recipe.seed, epoch, recipe.data.shuffle)
        for batch in data_lib.batches(session.data.train, recipe.data.batch_size, order):
            if len(losses) == steps:
                break
            losses.append(float(train_step(*session.packer.pack_batch(batch))["loss"]))
        epoch += 1
    return losses


# --------------------------------------------------------------------------- the run


def default_run_dir(recipe: Recipe) -> Path:
    return Path("runs") / f"{recipe.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def _versions() -> dict[str, str]:
    import tensorflow as tf
    import tf_keras

    import dtcli

    return {"dtcli": dtcli.__version__, "tensorflow": tf.__version__, "tf_keras": tf_keras.__version__}


@dataclass
class RunResult:
    run_dir: Path
    history: list[dict[str, Any]]


def train(recipe: Recipe, out: Path | None = None, console: Any = None,
          progress: bool = True) -> RunResult:
    """Train a recipe end to end and write its run directory."""
    from rich.console import Console

    from dtcli import checkpoint as ckpt_lib
    from dtcli import plot as plot_lib
    from dtcli.metrics import MetricsWriter

    console = console or Console(stderr=True)
    run_dir = Path(out) if out is not None else default_run_dir(recipe)
    if run_dir.exists() and any(run_dir.iterdir()):
        raise UsageError(f"--out {str(run_dir)!r}: the folder exists and is not empty")

    session = prepare(recipe)
    recipe = session.recipe
    train_step, eval_step = make_steps(session)
    eval_packed = pack_all(session, session.data.eval)
    created = not run_dir.exists()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        (run_dir / "recipe.yaml").write_text(recipe_lib.dump(recipe))
        writer = MetricsWriter(run_dir)
        checkpointer = ckpt_lib.Checkpointer(run_dir, session.checkpoint_objects(), recipe.train.keep)
        _describe(console, session, run_dir)
        history = _loop(session, train_step, eval_step, eval_packed, writer, checkpointer, console,
                        progress)
        writer.close()
        plot_lib.plot_runs([run_dir], run_dir / "plots")
    except BaseException:
        # Nothing resumable was written: leave no half-written run directory behind.
        if created and not ckpt_lib.complete(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    _summary(console, history, run_dir)
    return RunResult(run_dir, history)


def _loop(session: Session, train_step: Any, eval_step: Any, eval_packed: list, writer: Any,
          checkpointer: Any, console: Any, progress: bool) -> list[dict[str, Any]]:
    recipe = session.recipe
    cfg = recipe.train
    train_split = session.data.train
    batch_size = recipe.data.batch_size
    steps = data_lib.steps_per_epoch(len(train_split), batch_size)
    if cfg.steps_per_epoch:
        steps = min(steps, cfg.steps_per_epoch)
    history: list[dict[str, Any]] = []
    bar = _Bar(console, enabled=progress)
    step = int(session.optimizer.iterations.numpy())
    for epoch in range(cfg.epochs):
        order = data_lib.epoch_order(len(train_split), recipe.seed, epoch, recipe.data.shuffle)
        loss_sum = correct = count = 0.0
        bar.start(epoch + 1, cfg.epochs, steps)
        started = time.perf_counter()
        for i, batch in enumerate(data_lib.batches(train_split, batch_size, order)):
            if i >= steps:
                break
            out = train_step(*session.packer.pack_batch(batch))
            loss = float(out["loss"])
            step += 1
            if not math.isfinite(loss):
                bar.stop()
                last = _last_checkpoint(checkpointer)
                raise TrainingError(
                    f"non-finite training loss ({loss}) at step {step} (epoch {epoch + 1}); "
                    f"the run stopped without saving these weights; last good checkpoint: {last}; "
                    "try a lower optimizer.learning_rate"
                )
            n = float(out["count"])
            loss_sum += loss * n
            correct += float(out["correct"])
            count += n
            if step % cfg.log_every == 0:
                writer.scalars(step, {"step_loss": loss})
            bar.update(i + 1, loss_sum / count, correct / count,
                       count / (time.perf_counter() - started))
        seconds = time.perf_counter() - started
        bar.stop()
        ev = evaluate(session, eval_step, session.data.eval, eval_packed)
        record = {
            "epoch": epoch + 1, "step": step,
            "train_loss": loss_sum / count, "train_accuracy": correct / count,
            "eval_loss": ev["loss"], "eval_accuracy": ev["accuracy"],
            "examples_per_sec": count / seconds, "seconds": seconds,
            "train_examples": int(count), "eval_examples": ev["examples"],
        }
        history.append(record)
        writer.epoch(record)
        console.print(
            f"epoch {epoch + 1}/{cfg.epochs} loss {record['train_loss']:.4f} "
            f"acc {record['train_accuracy']:.4f} | eval loss {ev['loss']:.4f} "
            f"acc {ev['accuracy']:.4f} | {record['examples_per_sec']:,.0f} ex/s",
            highlight=False,
        )
        last_epoch = epoch + 1 == cfg.epochs
        if last_epoch or (cfg.checkpoint_every and (epoch + 1) % cfg.checkpoint_every == 0):
            checkpointer.save(step, _meta(session, step, epoch + 1))
    return history


def _last_checkpoint(checkpointer: Any) -> str:
    from dtcli import checkpoint as ckpt_lib

    last = ckpt_lib.latest(checkpointer.folder.parent)
    return str(last) if last else "none"


def _meta(session: Session, step: int, epoch: int) -> dict[str, Any]:
    return {
        "step": step, "epoch": epoch, "mesh": session.axes, "devices": session.devices.text,
        "time": datetime.now().isoformat(timespec="seconds"), "versions": _versions(),
        "pid": os.getpid(), "recipe": recipe_lib.to_mapping(session.recipe),
    }


class _Bar:
    """A rich progress bar for one epoch: loss, accuracy and examples/s as it goes."""

    def __init__(self, console: Any, enabled: bool):
        self.console = console
        self.enabled = enabled
        self.progress = None

    def start(self, epoch: int, epochs: int, steps: int) -> None:
        if not self.enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.progress = Progress(
            TextColumn(f"epoch {epoch}/{epochs}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
            console=self.console, transient=True,
        )
        self.progress.start()
        self.task = self.progress.add_task("train", total=steps, stats="")

    def update(self, done: int, loss: float, acc: float, rate: float) -> None:
        if self.progress is not None:
            self.progress.update(self.task, completed=done,
                                 stats=f"loss {loss:.4f} acc {acc:.4f} {rate:,.0f} ex/s")

    def stop(self) -> None:
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def _describe(console: Any, session: Session, run_dir: Path) -> None:
    r = session.recipe
    sharded = sum(1 for p in session.plans if any(s != "unsharded" for s in p.spec))
    console.print(
        f"[bold]{r.name}[/]: {r.model.api} model, {len(session.plans)} weights ({sharded} sharded) "
        f"on mesh {mesh_lib.mesh_text(session.axes)} over {session.devices.text}; "
        f"data: {session.data.description}; run directory: {run_dir}",
        highlight=False,
    )


def _summary(console: Any, history: list[dict[str, Any]], run_dir: Path) -> None:
    from rich.table import Table

    table = Table(title=f"{run_dir}")
    for col in ("epoch", "train loss", "train acc", "eval loss", "eval acc", "examples/s", "seconds"):
        table.add_column(col, justify="right")
    for r in history:
        table.add_row(str(r["epoch"]), f"{r['train_loss']:.4f}", f"{r['train_accuracy']:.4f}",
                      f"{r['eval_loss']:.4f}", f"{r['eval_accuracy']:.4f}",
                      f"{r['examples_per_sec']:,.0f}", f"{r['seconds']:.2f}")
    console.print(table)
