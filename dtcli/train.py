"""Building a run (devices, mesh, data, model, optimizer) and the custom training loop.

The train step is one compiled function of (batch) -> sums over the global batch, closing over the
model and optimizer state; the loop decides when to log, evaluate and checkpoint, and stops loudly
on a non-finite loss. Loss is the mean over the real examples of the global batch plus
regularization, so one recipe gives the same numbers on any mesh.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import re
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from dtcli import cluster as cluster_lib
from dtcli import data as data_lib
from dtcli import devices as devices_lib
from dtcli import layout as layout_lib
from dtcli import mesh as mesh_lib
from dtcli import models, optimizers
from dtcli import plan as plan_lib
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
    cluster: cluster_lib.Cluster | None = None  # set in a multi-client run
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
    dataset = data_lib.load(recipe.data, splits)
    plans, initial = plan_lib.weight_plans(recipe, dataset.input_shape, dataset.num_classes, axes)
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
    optimizer.build(built.trainable_variables)
    resolved = recipe_lib.replace(recipe, mesh=axes, devices=devices.text)
    return Session(
        resolved,
        devices,
        axes,
        mesh,
        dataset,
        plans,
        built,
        optimizer,
        data_lib.Packer(mesh, data_axis),
        cluster,
    )


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
        return {
            "ce_sum": tf.reduce_sum(ce * mask),
            "correct": tf.reduce_sum(hit * mask),
            "count": tf.reduce_sum(mask),
        }

    @tf.function
    def train_step(x: Any, y: Any, mask: Any) -> dict[str, Any]:
        with tf.GradientTape() as tape:
            logits = model.forward(x, training=True)
            out = sums(logits, y, mask)
            loss = out["ce_sum"] / tf.maximum(out["count"], 1.0)
            if model.regularization is not None:
                loss += model.regularization()
        grads = tape.gradient(loss, variables)
        # All gradients before any update. This barrier alone does NOT make the step right with
        # DTensor's all-reduce combining pass on (measured: 1e-2 off after 5 steps on
        # batch=4,model=2); dtcli turns the pass off and `train` refuses to run with it forced on.
        with tf.control_dependencies(grads):
            optimizer.apply(grads, variables)
        out["loss"] = loss
        return out

    @tf.function
    def eval_step(x: Any, y: Any, mask: Any) -> dict[str, Any]:
        return sums(model.forward(x, training=False), y, mask)

    return train_step, eval_step


def evaluate(
    session: Session, eval_step: Any, split: data_lib.Split, packed: list | None = None
) -> dict[str, float]:
    """Loss and accuracy over every example of `split`, each counted exactly once."""
    ce = correct = count = 0.0
    batches = packed if packed is not None else pack_all(session, split)
    for x, y, mask in batches:
        out = eval_step(x, y, mask)
        ce += float(out["ce_sum"])
        correct += float(out["correct"])
        count += float(out["count"])
    return {
        "loss": ce / max(count, 1.0),
        "accuracy": correct / max(count, 1.0),
        "examples": int(count),
    }


def pack_all(session: Session, split: data_lib.Split) -> list:
    return [session.packer.pack_batch(b) for b in _batches(session, split, session.eval_batch_size)]


def _batches(session: Session, split: data_lib.Split, batch_size: int, order: Any = None) -> Any:
    """Host batches holding only the rows this process's devices take (all, in one process)."""
    return data_lib.batches(split, batch_size, order, session.packer.rows(batch_size))


def run_steps(session: Session, steps: int) -> list[float]:
    """Train `steps` steps in data order (for mesh-equivalence checks); returns the losses."""
    train_step, _ = make_steps(session)
    recipe = session.recipe
    losses: list[float] = []
    epoch = 0
    while len(losses) < steps:
        order = data_lib.epoch_order(
            len(session.data.train), recipe.seed, epoch, recipe.data.shuffle
        )
        for batch in _batches(session, session.data.train, recipe.data.batch_size, order):
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

    return {
        "dtcli": dtcli.__version__,
        "tensorflow": tf.__version__,
        "tf_keras": tf_keras.__version__,
    }


@dataclass
class RunResult:
    run_dir: Path
    history: list[dict[str, Any]]


RECIPE_FILE = "recipe.yaml"


def resume_recipe(
    run_dir: Path,
    sets: list[str] | tuple[str, ...] = (),
    mesh: str | None = None,
    devices: str | None = None,
    epochs: int | None = None,
) -> Recipe:
    """The recipe a run was written with, with command-line overrides (for --resume)."""
    path = Path(run_dir) / RECIPE_FILE
    if not path.is_file():
        raise UsageError(f"--resume {str(run_dir)!r}: not a run directory (no {RECIPE_FILE})")
    before = recipe_lib.load(path)
    after = recipe_lib.load(path, sets, mesh=mesh, devices=devices, epochs=epochs)
    # What the checkpoint's state depends on stays; the mesh, devices, layouts, data source and
    # schedule may change. (SGD with and without momentum keep different optimizer slots.)
    fixed = {
        "seed": lambda r: r.seed,
        "model": lambda r: r.model,
        "optimizer.name": lambda r: r.optimizer.name,
        "optimizer.momentum": lambda r: r.optimizer.name == "sgd" and r.optimizer.momentum != 0,
        "data.batch_size": lambda r: r.data.batch_size,
    }
    for key, value in fixed.items():
        if value(before) != value(after):
            raise UsageError(
                f"--set {key}: a run resumes with the {key} it was trained with; train a new "
                "run (--out) to change it"
            )
    return after


def train(
    recipe: Recipe,
    out: Path | None = None,
    resume: Path | None = None,
    console: Any = None,
    progress: bool = True,
    cluster: cluster_lib.Cluster | None = None,
    connect_timeout: float = cluster_lib.DEFAULT_CONNECT_TIMEOUT,
) -> RunResult:
    """Train a recipe end to end and write its run directory (or continue one with `resume`).

    With a `cluster`, this process is one client of a multi-client run: a preflight checks the
    other clients first (within `connect_timeout` seconds); all clients train and save
    checkpoints together, only client 0 writes the recipe, metrics and plots.
    """
    from rich.console import Console

    from dtcli import checkpoint as ckpt_lib
    from dtcli import metrics as metrics_lib
    from dtcli import plot as plot_lib

    devices_lib.check_runtime_env()
    # soft_wrap: logs piped to a file keep one line per message
    console = console or Console(stderr=True, soft_wrap=True)
    chief = cluster is None or cluster.is_chief
    latest = None
    if resume is not None:
        run_dir = Path(resume)
        latest = ckpt_lib.latest(run_dir)
        if latest is None:
            raise UsageError(f"--resume {str(run_dir)!r}: no complete checkpoint to resume from")
    else:
        run_dir = Path(out) if out is not None else default_run_dir(recipe)
        if chief and run_dir.exists() and any(run_dir.iterdir()):
            raise UsageError(
                f"--out {str(run_dir)!r}: the folder exists and is not empty "
                "(use --resume to continue a run)"
            )
    if cluster is not None:
        devices_lib.check_clients(
            recipe.devices,
            mesh_lib.device_count_for(recipe.mesh),
            cluster.num_clients,
            "recipe key 'devices'",
        )
        # Before TensorFlow's runtime starts: a missing peer would otherwise hang it for good.
        leader = {
            "run_dir": str(run_dir),
            "resume_from": str(latest) if latest else None,
            "tag": f"{os.getpid()}-{int(time.time())}",
        }
        cluster = cluster_lib.preflight(
            cluster, recipe_lib.fingerprint(recipe), connect_timeout, leader
        )
        run_dir, latest = _agree(cluster, run_dir, latest, out is not None)

    session = prepare(recipe, cluster=cluster)
    recipe = session.recipe
    train_step, eval_step = make_steps(session)
    eval_packed = pack_all(session, session.data.eval)
    checkpointer = ckpt_lib.Checkpointer(
        run_dir,
        session.checkpoint_objects(),
        recipe.train.keep,
        chief=chief,
        barrier=(lambda: mesh_lib.barrier(session.mesh)) if cluster else None,
        tag=cluster.leader.get("tag") if cluster else None,
    )
    history: list[dict[str, Any]] = []
    start = EpochState(0)
    if latest is not None:
        checkpointer.clean()
        checkpointer.restore(latest, session.model.weights)
        meta = ckpt_lib.read_meta(latest)
        start = EpochState(**meta["epoch_state"])
        metrics_path = run_dir / metrics_lib.METRICS_FILE
        if chief:
            metrics_lib.truncate_after(metrics_path, meta["step"])
            metrics_lib.truncate_after(run_dir / metrics_lib.STEPS_FILE, meta["step"])
            history = metrics_lib.read(metrics_path) if metrics_path.exists() else []
        console.print(
            f"resuming {latest} (epoch {start.epoch + 1}, batch {start.batch}, "
            f"step {meta['step']})",
            highlight=False,
        )
        if start.epoch >= recipe.train.epochs:
            console.print(
                f"[yellow]nothing to train:[/] the run has {start.epoch} epochs and "
                f"train.epochs is {recipe.train.epochs}; --epochs is the total, give more",
                highlight=False,
            )
    created = not run_dir.exists()
    if chief:
        run_dir.mkdir(parents=True, exist_ok=True)
    try:
        if chief:
            _write_atomic(run_dir / RECIPE_FILE, recipe_lib.dump(recipe))
            writer: Any = metrics_lib.MetricsWriter(run_dir)
        else:
            writer = _NoWriter()
        _describe(console, session, run_dir)
        # Ctrl-C in a multi-client run: stopping after "the current step" would leave the
        # clients at different steps, waiting on each other's collectives for good. The first
        # Ctrl-C interrupts at once instead (dtcli launch stops every client).
        stopper = _StopOnSigint() if cluster is None else contextlib.nullcontext()
        with stopper as stop, _peer_failures(cluster, checkpointer):
            history = _loop(
                session,
                train_step,
                eval_step,
                eval_packed,
                writer,
                checkpointer,
                console,
                progress,
                history,
                start,
                stop,
            )
        writer.close()
        if chief:
            plot_lib.plot_runs([run_dir], run_dir / "plots")
    except BaseException:
        # Nothing resumable was written: leave no half-written run directory behind.
        if chief and created and not ckpt_lib.complete(run_dir):
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    if chief:
        _summary(console, history, run_dir)
    return RunResult(run_dir, history)


def _agree(
    cluster: cluster_lib.Cluster, run_dir: Path, latest: Path | None, explicit: bool
) -> tuple[Path, Path | None]:
    """The run directory and resume checkpoint client 0 chose, which every client must use
    (a default run directory carries a timestamp that differs between clients)."""
    if cluster.is_chief:
        return run_dir, latest
    chosen = Path(cluster.leader["run_dir"])
    if explicit and chosen.resolve() != run_dir.resolve():
        raise UsageError(
            f"--out {str(run_dir)!r}: client 0 writes the run to {str(chosen)!r}; every client "
            "needs the same run directory (on storage they all share)"
        )
    resume_from = cluster.leader.get("resume_from")
    return chosen, Path(resume_from) if resume_from else None


class _NoWriter:
    """Clients other than 0 write no metrics: client 0 holds the same global numbers."""

    def epoch(self, record: dict[str, Any]) -> None:
        pass

    def step_loss(self, step: int, loss: float) -> None:
        pass

    def close(self) -> None:
        pass


@contextlib.contextmanager
def _peer_failures(cluster: cluster_lib.Cluster | None, checkpointer: Any) -> Iterator[None]:
    """In a multi-client run, a client that dies makes the others' next collective fail; say so
    in one line (the launcher names the client that died) instead of a runtime traceback."""
    if cluster is None:
        yield
        return
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as exc:
        first = (exc.message or str(exc)).strip().splitlines()[0]
        first = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", first)[:200]
        raise TrainingError(
            f"client {cluster.client_id}: lost the other clients ({type(exc).__name__}: "
            f"{first}); the run stopped; last complete checkpoint: "
            f"{_last_checkpoint(checkpointer)}"
        ) from None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class _StopOnSigint:
    """The first Ctrl-C asks the loop to stop after the current step (it then checkpoints);
    a second one interrupts at once."""

    def __init__(self):
        self.requested = False

    def __call__(self) -> bool:
        return self.requested

    def __enter__(self) -> _StopOnSigint:
        import signal
        import threading

        self._previous = None
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        import signal

        if self.requested:
            raise KeyboardInterrupt
        self.requested = True
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc: Any) -> None:
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)


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


def epoch_steps(session: Session) -> int:
    steps = data_lib.steps_per_epoch(len(session.data.train), session.recipe.data.batch_size)
    limit = session.recipe.train.steps_per_epoch
    return min(steps, limit) if limit else steps


def run_epoch(
    session: Session,
    train_step: Any,
    state: EpochState,
    bar: Any = None,
    writer: Any = None,
    stop: Any = None,
) -> EpochState:
    """Train the rest of one epoch (from `state.batch`); returns early when `stop()` is true."""
    recipe = session.recipe
    split = session.data.train
    steps = epoch_steps(session)
    order = data_lib.epoch_order(len(split), recipe.seed, state.epoch, recipe.data.shuffle)
    order = order[state.batch * recipe.data.batch_size : steps * recipe.data.batch_size]
    log_every = recipe.train.log_every
    started = time.perf_counter() - state.seconds
    for batch in _batches(session, split, recipe.data.batch_size, order):
        called = time.perf_counter()
        out = train_step(*session.packer.pack_batch(batch))
        loss = float(out["loss"])
        if not session.compiled:
            session.compiled = True
            state.compile_seconds = time.perf_counter() - called
        if not math.isfinite(loss):
            raise _NonFinite(loss)
        n = float(out["count"])
        state.batch += 1
        state.loss_sum += loss * n
        state.correct += float(out["correct"])
        state.count += n
        state.seconds = time.perf_counter() - started
        step = state.epoch * steps + state.batch  # the optimizer's step, without a device read
        if writer is not None and step % log_every == 0:
            writer.step_loss(step, loss)
        if bar is not None:
            bar.update(
                state.batch,
                state.loss_sum / state.count,
                state.correct / state.count,
                state.count / state.seconds,
            )
        if stop is not None and stop():
            break
    return state


class _NonFinite(Exception):
    def __init__(self, loss: float):
        self.loss = loss


class Interrupted(Exception):
    """Ctrl-C: a checkpoint was written at the current step."""

    exit_code = 130

    def __init__(self, checkpoint: Path, run_dir: Path):
        super().__init__(
            f"interrupted; saved {checkpoint}; resume with: dtcli train --resume {run_dir}"
        )


def _loop(
    session: Session,
    train_step: Any,
    eval_step: Any,
    eval_packed: list,
    writer: Any,
    checkpointer: Any,
    console: Any,
    progress: bool,
    history: list[dict[str, Any]],
    start: EpochState,
    stop: Any,
) -> list[dict[str, Any]]:
    cfg = session.recipe.train
    bar = _Bar(console, enabled=progress)
    steps = epoch_steps(session)
    state = start
    while state.epoch < cfg.epochs:
        epoch = state.epoch
        bar.start(epoch + 1, cfg.epochs, steps, done=state.batch)
        try:
            state = run_epoch(session, train_step, state, bar, writer, stop)
        except _NonFinite as exc:
            bar.stop()
            raise TrainingError(
                f"non-finite training loss ({exc.loss}) in epoch {epoch + 1} at step "
                f"{int(session.optimizer.iterations.numpy())}; the run stopped without saving "
                f"these weights; last good checkpoint: {_last_checkpoint(checkpointer)}; "
                "try a lower optimizer.learning_rate"
            ) from None
        bar.stop()
        step = int(session.optimizer.iterations.numpy())
        if state.batch < steps:  # stopped by Ctrl-C: save where we are, mid-epoch
            saved = checkpointer.save(step, _meta(session, step, state))
            raise Interrupted(saved, checkpointer.folder.parent)
        ev = evaluate(session, eval_step, session.data.eval, eval_packed)
        record = {
            "epoch": epoch + 1,
            "step": step,
            "train_loss": state.loss_sum / state.count,
            "train_accuracy": state.correct / state.count,
            "eval_loss": ev["loss"],
            "eval_accuracy": ev["accuracy"],
            "examples_per_sec": state.count / state.seconds,
            "seconds": state.seconds,
            "train_examples": int(state.count),
            "eval_examples": ev["examples"],
        }
        compiling = ""
        if state.compile_seconds:
            # examples_per_sec stays the loop's honest rate; this says why it is low here.
            record["compile_seconds"] = state.compile_seconds
            compiling = f" (incl. {state.compile_seconds:.1f} s compiling the step)"
        history.append(record)
        writer.epoch(record)
        console.print(
            f"epoch {epoch + 1}/{cfg.epochs} loss {record['train_loss']:.4f} "
            f"acc {record['train_accuracy']:.4f} | eval loss {ev['loss']:.4f} "
            f"acc {ev['accuracy']:.4f} | {record['examples_per_sec']:,.0f} ex/s{compiling}",
            highlight=False,
        )
        state = EpochState(epoch + 1)
        last_epoch = state.epoch == cfg.epochs
        if last_epoch or (cfg.checkpoint_every and state.epoch % cfg.checkpoint_every == 0):
            checkpointer.save(step, _meta(session, step, state))
    return history


def _last_checkpoint(checkpointer: Any) -> str:
    from dtcli import checkpoint as ckpt_lib

    last = ckpt_lib.latest(checkpointer.folder.parent)
    return str(last) if last else "none"


def _meta(session: Session, step: int, state: EpochState) -> dict[str, Any]:
    return {
        "step": step,
        "epoch": state.epoch,
        "epoch_state": dataclasses.asdict(state),
        "mesh": session.axes,
        "devices": session.devices.text,
        "time": datetime.now().isoformat(timespec="seconds"),
        "versions": _versions(),
        "pid": os.getpid(),
        "recipe": recipe_lib.to_mapping(session.recipe),
        "weights": {w.path: list(w.shape) for w in session.model.weights},
        "input_shape": list(session.data.input_shape),
        "num_classes": session.data.num_classes,
    }


# dtcli launch sets this for client 0: its progress goes to the launcher as event lines (which
# draws the one bar), since a bar drawn into a pipe shows nothing.
PROGRESS_EVENTS_ENV = "DTCLI_PROGRESS_EVENTS"
PROGRESS_EVENT = "\x1edtcli-progress "


class _Bar:
    """A rich progress bar for one epoch: loss, accuracy and examples/s as it goes."""

    def __init__(self, console: Any, enabled: bool):
        self.console = console
        # A live bar only on a terminal: piped to a file it would leave a blank line per epoch.
        self.enabled = enabled and console.is_terminal
        self.progress = None
        self.events = enabled and os.environ.get(PROGRESS_EVENTS_ENV) == "1"
        self._last = 0.0

    def _event(self, kind: str, **fields: Any) -> None:
        import json
        import sys

        sys.stderr.write(PROGRESS_EVENT + json.dumps({"event": kind, **fields}) + "\n")
        sys.stderr.flush()

    def start(self, epoch: int, epochs: int, steps: int, done: int = 0) -> None:
        if self.events:
            self._event("start", epoch=epoch, epochs=epochs, steps=steps, done=done)
            return
        if not self.enabled:
            return
        from rich.progress import Progress

        self.progress = Progress(
            *progress_columns(f"epoch {epoch}/{epochs}"),
            console=self.console,
            transient=True,
        )
        self.progress.start()
        self.task = self.progress.add_task("train", total=steps, completed=done, stats="")

    def update(self, done: int, loss: float, acc: float, rate: float) -> None:
        stats = f"loss {loss:.4f} acc {acc:.4f} {rate:,.0f} ex/s"
        if self.events:
            now = time.monotonic()
            if now - self._last >= 0.1:  # a few lines a second are plenty for a bar
                self._last = now
                self._event("update", done=done, stats=stats)
            return
        if self.progress is not None:
            self.progress.update(self.task, completed=done, stats=stats)

    def stop(self) -> None:
        if self.events:
            self._event("stop")
        if self.progress is not None:
            self.progress.stop()
            self.progress = None


def progress_columns(title: str) -> list[Any]:
    """The columns of the epoch bar (shared with dtcli launch, which draws client 0's)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    return [
        TextColumn(title),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[stats]}"),
        TimeElapsedColumn(),
    ]


def _describe(console: Any, session: Session, run_dir: Path) -> None:
    from rich.markup import escape

    r = session.recipe
    sharded = sum(1 for p in session.plans if layout_lib.is_sharded(p, session.axes))
    d = session.devices
    over = d.text if d.clients == 1 else f"{d.text} ({d.clients} clients x {d.local_count})"
    console.print(
        f"[bold]{r.name}[/]: {r.model.api} model, {len(session.plans)} weights ({sharded} sharded) "
        f"on mesh {mesh_lib.mesh_text(session.axes)} over {over}; "
        f"data: {session.data.description}; run directory: {run_dir}",
        highlight=False,
    )
    for warning in layout_lib.layout_warnings(
        r.layouts.rules, session.plans, session.axes, r.layouts.data_axis
    ):
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)


def _summary(console: Any, history: list[dict[str, Any]], run_dir: Path) -> None:
    from rich.table import Table

    table = Table(title=f"{run_dir}")
    for col in (
        "epoch",
        "train loss",
        "train acc",
        "eval loss",
        "eval acc",
        "examples/s",
        "seconds",
    ):
        table.add_column(col, justify="right")
    for r in history:
        table.add_row(
            str(r["epoch"]),
            f"{r['train_loss']:.4f}",
            f"{r['train_accuracy']:.4f}",
            f"{r['eval_loss']:.4f}",
            f"{r['eval_accuracy']:.4f}",
            f"{r['examples_per_sec']:,.0f}",
            f"{r['seconds']:.2f}",
        )
    console.print(table)
