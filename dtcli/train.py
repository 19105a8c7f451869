"""`dtcli train`: orchestration of one run, and the loop that decides when to log, evaluate and
checkpoint.

The engine (devices, mesh, data, model, optimizer, the compiled steps, evaluation) is
dtcli.session; the run directory's layout, lock and checkpoints are dtcli.rundir. This module
opens the run, builds the session, restores a checkpoint on resume, runs the epochs, and stops
loudly on a non-finite loss.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from dtcli import cluster as cluster_lib
from dtcli import devices as devices_lib
from dtcli import layout as layout_lib
from dtcli import mesh as mesh_lib
from dtcli import recipe as recipe_lib
from dtcli import rundir, runlog, storage
from dtcli.errors import (
    INTERRUPTED_EXIT,
    PREEMPTED_EXIT,
    Preempted,
    Stopped,
    TrainingError,
    UsageError,
)
from dtcli.recipe import Recipe
from dtcli.session import (
    EpochState,
    NonFiniteLoss,
    Session,
    epoch_steps,
    evaluate,
    flops_per_token,
    make_steps,
    pack_all,
    prepare,
    run_epoch,
)

# Seconds between a SIGTERM and this process' exit (schedulers send SIGKILL after their own).
DEFAULT_GRACE = 30.0


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


# What a checkpoint's state depends on: a resume may not change it. The mesh, devices, layouts,
# data, optimizer hyperparameters and schedule may change and take effect from the resumed step.
# (SGD with and without momentum keep different optimizer slots.)
FIXED_ON_RESUME: dict[str, Callable[[Recipe], Any]] = {
    "seed": lambda r: r.seed,
    "model": lambda r: r.model,
    "optimizer.name": lambda r: r.optimizer.name,
    "optimizer.momentum": lambda r: r.optimizer.name == "sgd" and r.optimizer.momentum != 0,
    "data.batch_size": lambda r: r.data.batch_size,
}


def resume_recipe(
    run_dir: Path,
    sets: list[str] | tuple[str, ...] = (),
    mesh: str | None = None,
    devices: str | None = None,
    epochs: int | None = None,
    chief: bool = True,
) -> Recipe:
    """The recipe a run was written with, with command-line overrides (for --resume).

    `chief`: False for clients 1.. of a multi-client run, which read the run client 0 holds."""
    path = rundir.read_recipe_text(run_dir, check_lock=chief)
    before = recipe_lib.load(path)
    after = recipe_lib.load(path, sets, mesh=mesh, devices=devices, epochs=epochs)
    for key, value in FIXED_ON_RESUME.items():
        if value(before) != value(after):
            raise UsageError(
                f"--set {key}: a run resumes with the {key} it was trained with; train a new "
                "run (--out) to change it"
            )
    return after


def recipe_changes(before: Recipe, after: Recipe) -> dict[str, list[Any]]:
    """{dotted key: [old, new]} for every recipe value that differs."""

    def flat(recipe: Recipe) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in recipe_lib.to_mapping(recipe).items():
            if isinstance(value, dict) and key != "mesh":  # a section: one entry per key
                out.update({f"{key}.{k}": v for k, v in value.items()})
            else:
                out[key] = value
        return out

    a, b = flat(before), flat(after)
    return {k: [a.get(k), b.get(k)] for k in {**a, **b} if a.get(k) != b.get(k)}


def train(
    recipe: Recipe,
    out: Path | None = None,
    resume: Path | None = None,
    console: Any = None,
    progress: bool = True,
    cluster: cluster_lib.Cluster | None = None,
    connect_timeout: float = cluster_lib.DEFAULT_CONNECT_TIMEOUT,
    grace: float = DEFAULT_GRACE,
    profile: tuple[int, int] | None = None,
) -> RunResult:
    """Train a recipe end to end and write its run directory (or continue one with `resume`).

    The run directory is created (or opened) and locked before any TensorFlow work. A new run
    that fails before its first complete checkpoint is removed; a resume that fails before its
    first step leaves every file as it was. With a `cluster`, this process is one client of a
    multi-client run: a preflight checks the other clients first (within `connect_timeout`
    seconds); all clients train and save checkpoints together, only client 0 holds the lock and
    writes the recipe, metrics and plots.
    """
    with _SigtermOutsideTheLoop() as early:
        return _open_and_train(
            recipe, out, resume, console, progress, cluster, connect_timeout, grace, profile, early
        )


class _SigtermOutsideTheLoop:
    """SIGTERM while the run is set up (or wound down): stop at once as an exception, so that a
    new run without a checkpoint is removed and a resume left as it was, exit 143. (In the loop
    _StopOnSignal takes over and saves; in a multi-client run TensorFlow's runtime takes the
    signal once it has started, see _PreemptionWatch.)

    `deferred()`: while the run folder is made and locked the exception waits (Python runs
    signal handlers in the main thread, whichever thread the signal reached), so that the
    clean-up sees what to remove."""

    MESSAGE = (
        "preempted (SIGTERM) outside the training loop; nothing new was saved (a new run "
        "without a checkpoint is removed, an existing run keeps its checkpoints)"
    )

    def __init__(self) -> None:
        self._holding = False
        self._pending = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self._holding:
            self._pending = True
            return
        raise Preempted(self.MESSAGE)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self._holding = True
        try:
            yield
        finally:
            self._holding = False
        if self._pending:
            raise Preempted(self.MESSAGE)

    def __enter__(self) -> _SigtermOutsideTheLoop:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        import signal

        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)


def _open_and_train(
    recipe: Recipe,
    out: Path | None,
    resume: Path | None,
    console: Any,
    progress: bool,
    cluster: cluster_lib.Cluster | None,
    connect_timeout: float,
    grace: float,
    profile: tuple[int, int] | None,
    early: _SigtermOutsideTheLoop,
) -> RunResult:
    from rich.console import Console

    devices_lib.check_runtime_env()
    # soft_wrap: logs piped to a file keep one line per message
    console = console or runlog.LoggedConsole(stderr=True, soft_wrap=True)

    def warn(message: str) -> None:
        console.print(message, markup=False, highlight=False)

    chief = cluster is None or cluster.is_chief
    if not chief:
        # Every client would print the same lines; client 0 speaks for the run. Errors still
        # reach stderr (the CLI prints them), so a failing client says why.
        console = Console(stderr=True, quiet=True)
    if cluster is not None:
        devices_lib.check_clients(
            recipe.devices,
            mesh_lib.device_count_for(recipe.mesh),
            cluster.num_clients,
            "recipe key 'devices'",
        )
    path = storage.as_path(resume or out or rundir.default_path(recipe.name))
    logged = chief and isinstance(console, runlog.LoggedConsole)
    run: rundir.RunDir | None = None
    try:
        # A SIGTERM while the folder is made and locked waits until `run` exists, so that the
        # clean-up below sees what to remove (a new run's folder) or to leave as it was.
        with early.deferred():
            if not chief:
                run = rundir.unlocked(path)
            elif resume is not None:
                run = rundir.open_for_resume(path, "--resume", warn)
            else:
                run = rundir.create(path, "--out", warn)
            if logged and resume is None:
                # A resume's lines: once its first step trained (_commit_resume).
                console.commit(run.train_log, runlog.header())
        latest = None
        if resume is not None and chief:
            latest = run.latest_checkpoint("--resume", "to resume from", warn)
        if cluster is not None:
            # Before TensorFlow's runtime starts: a missing peer would otherwise hang it for good.
            leader = {
                "run_dir": str(run.path),
                "resume_from": str(latest) if latest else None,
                "tag": f"{os.getpid()}-{int(time.time())}",
            }
            cluster = cluster_lib.preflight(
                cluster, recipe_lib.fingerprint(recipe), connect_timeout, leader
            )
            chosen, latest = _agree(cluster, run.path, latest, out is not None)
            if not chief:
                run = rundir.unlocked(chosen)
        result = _train(recipe, run, latest, console, progress, cluster, chief, grace, profile)
    except BaseException as exc:
        if run is not None:  # None: opening the run failed, and left everything as it was
            if logged:
                console.log_only(_as_printed(exc))
            if chief:
                run.abandon()
        raise
    if chief:
        run.release()
    return result


def _train(
    recipe: Recipe,
    run: rundir.RunDir,
    latest: Path | None,
    console: Any,
    progress: bool,
    cluster: cluster_lib.Cluster | None,
    chief: bool,
    grace: float = DEFAULT_GRACE,
    profile: tuple[int, int] | None = None,
) -> RunResult:
    from dtcli import checkpoint as ckpt_lib
    from dtcli import metrics as metrics_lib

    meta = ckpt_lib.read_meta(latest) if latest is not None else None
    if meta is not None and meta["epoch_state"]["epoch"] >= recipe.train.epochs:
        # Said before the devices, the model and the compilation are set up for nothing.
        done = meta["epoch_state"]["epoch"]
        console.print(
            f"[yellow]nothing to train:[/] the run has {done} epochs and train.epochs is "
            f"{recipe.train.epochs}; --epochs is the total, give more",
            highlight=False,
        )
        history = _history_until(run, meta["step"]) if chief else []
        _summary(console, history, done)
        return RunResult(run.path, history)
    session = prepare(recipe, cluster=cluster)
    recipe = session.recipe
    train_step, eval_step = make_steps(session)
    checkpointer = ckpt_lib.Checkpointer(
        run.checkpoints,
        session.checkpoint_objects(),
        recipe.train.keep,
        chief=chief,
        barrier=(lambda: mesh_lib.barrier(session.mesh)) if cluster else None,
        tag=cluster.leader.get("tag") if cluster else None,
    )
    history: list[dict[str, Any]] = []
    start = EpochState(0)
    on_first_step: Callable[[], None] | None = None
    if latest is not None and meta is not None:
        checkpointer.restore(latest, session.model.weights)
        # The checkpoint holds the optimizer's old learning rate: the recipe's takes effect now.
        session.optimizer.set_hyperparameters(recipe.optimizer)
        checkpointer.last_step = meta["step"]
        start = EpochState(**meta["epoch_state"])
        if chief:
            history = _history_until(run, meta["step"])
        console.print(
            f"resuming {latest} (epoch {start.epoch + 1}, batch {start.batch}, "
            f"step {meta['step']})",
            highlight=False,
        )
        if chief:
            on_first_step = _once(
                lambda: _commit_resume(run, recipe, latest, meta, checkpointer, console)
            )
    elif chief:
        run.write_text(run.recipe, recipe_lib.dump(recipe))
    writer: Any = metrics_lib.MetricsWriter(
        run.metrics,
        run.steps,
        run.tensorboard,
        hparams=metrics_lib.hparams_of(recipe_lib.to_mapping(recipe)),
    )
    if not chief:
        writer = _NoWriter()
    _describe(console, session, run.path)
    # One process: Ctrl-C or SIGTERM stops after the current call and saves. Several clients
    # must agree on that call: a SIGTERM does (through the train call, _PreemptionWatch), a
    # Ctrl-C interrupts at once instead (dtcli launch stops every client).
    stopper = _StopOnSignal(grace) if cluster is None else _PreemptionWatch(grace)
    profiler = None
    if profile is not None and chief:  # client 0's trace (clients on one host would collide)
        profiler = metrics_lib.Profiler(run.tensorboard, *profile)
    before = len(history)
    try:
        with stopper as stop, _peer_failures(cluster, checkpointer):
            history = _loop(
                session,
                train_step,
                eval_step,
                writer,
                checkpointer,
                console,
                progress,
                history,
                start,
                stop,
                on_first_step,
                profiler,
            )
    finally:
        writer.close()
        if profiler is not None and profiler.running:
            profiler.finish(int(session.optimizer.iterations.numpy()))
    if profiler is not None and profiler.traced is not None:
        first, last = profiler.traced
        console.print(
            f"profile: steps {first}-{last} traced into {run.tensorboard} "
            "(TensorBoard's Profile tab, with tensorboard-plugin-profile installed)",
            highlight=False,
        )
    elif profiler is not None:
        step = int(session.optimizer.iterations.numpy())
        console.print(
            f"[yellow]warning:[/] --profile {profiler.start}:{profiler.stop}: no step of it ran "
            f"(this session trained up to step {step}); no trace was written",
            highlight=False,
        )
    if chief and len(history) > before:
        from dtcli import plot as plot_lib

        try:
            plot_lib.plot_runs([run.path], run.plots)
        except UsageError as exc:  # plots cannot be written (a full disk): training is done
            raise TrainingError(
                f"{exc}; training finished and its checkpoints and metrics are complete"
            ) from None
    if chief:
        _summary(console, history, start.epoch if latest is not None else 0)
    return RunResult(run.path, history)


def _history_until(run: rundir.RunDir, step: int) -> list[dict[str, Any]]:
    """The run's epoch records up to `step` (a resume replays the epochs after it)."""
    from dtcli import metrics as metrics_lib

    if not run.metrics.is_file():
        return []
    return [r for r in metrics_lib.read(run.metrics) if r.get("step", 0) <= step]


def _as_printed(exc: BaseException) -> str:
    """The line the command line prints for an exception that ends a run (for train.log)."""
    if isinstance(exc, (Stopped, Preempted)):
        return str(exc)
    if isinstance(exc, (UsageError, TrainingError)):
        return f"error: {exc}"
    if isinstance(exc, KeyboardInterrupt):
        return "error: interrupted"
    text = str(exc).strip().splitlines()
    return f"error: {type(exc).__name__}{': ' + text[0] if text else ''}"


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    done = False

    def call() -> None:
        nonlocal done
        if not done:
            done = True
            fn()

    return call


def _commit_resume(
    run: rundir.RunDir,
    recipe: Recipe,
    checkpoint: Path,
    meta: dict[str, Any],
    checkpointer: Any,
    console: Any = None,
) -> None:
    """The resumed run trained a step: from here on its files describe it. Until now a failure
    (a bad override, a non-finite first loss) left every file of the run as it was."""
    from dtcli import metrics as metrics_lib

    step = meta["step"]
    try:
        before = recipe_lib.load(run.recipe)
        changes = recipe_changes(before, recipe)
        metrics_lib.truncate_after(run.metrics, step)
        metrics_lib.truncate_after(run.steps, step)
        run.write_text(run.recipe, recipe_lib.dump(recipe))
        record = {
            "time": datetime.now().isoformat(timespec="seconds"),
            "checkpoint": storage.as_path(checkpoint).name,
            "step": step,
            "epoch": meta["epoch"],
            "changes": changes,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        storage.append_line(run.resumes, json.dumps(record))
        checkpointer.clean()
        if isinstance(console, runlog.LoggedConsole):
            console.commit(run.train_log, runlog.header())
    except OSError as exc:
        raise TrainingError(
            f"{run.path}: recording the resume failed ({rundir.os_reason(exc)})"
        ) from None


def _agree(
    cluster: cluster_lib.Cluster, run_dir: Path, latest: Path | None, explicit: bool
) -> tuple[Path, Path | None]:
    """The run directory and resume checkpoint client 0 chose, which every client must use
    (a default run directory carries a timestamp that differs between clients)."""
    if cluster.is_chief:
        return run_dir, latest
    chosen = storage.as_path(cluster.leader["run_dir"])
    if explicit and chosen.resolve() != run_dir.resolve():
        raise UsageError(
            f"--out {str(run_dir)!r}: client 0 writes the run to {str(chosen)!r}; every client "
            "needs the same run directory (on storage they all share)"
        )
    resume_from = cluster.leader.get("resume_from")
    return chosen, storage.as_path(resume_from) if resume_from else None


class _NoWriter:
    """Clients other than 0 write no metrics: client 0 holds the same global numbers."""

    def epoch(self, record: dict[str, Any]) -> None:
        pass

    def step_loss(self, step: int, loss: float, **more: float) -> None:
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
            f"{checkpointer.latest() or 'none'}"
        ) from None


class _Deadline:
    """A preemption's grace period: once started, `grace` seconds until this process exits
    whatever it is doing (the scheduler's SIGKILL would come next), leaving the last complete
    checkpoint. Starting it again does not extend it."""

    def __init__(self, grace: float):
        self.grace = grace
        self._timer: Any = None

    def start(self) -> None:
        import threading

        if self._timer is None:
            self._timer = threading.Timer(self.grace, self._out_of_time)
            self._timer.daemon = True
            self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()

    def _out_of_time(self) -> None:
        # The current call (or the save) outlasted the grace period: go now, as the scheduler
        # would. A half-written checkpoint is never committed, so the last complete one stands.
        print(
            f"error: preempted (SIGTERM) and the grace period of {self.grace:g} s ran out "
            "before the checkpoint of the current step was written (the training call or the "
            "save took longer); the last complete checkpoint stands",
            file=sys.stderr,
            flush=True,
        )
        os._exit(PREEMPTED_EXIT)


class _StopOnSignal:
    """The first Ctrl-C (SIGINT) or SIGTERM asks the loop to stop after the current call (it
    then checkpoints); a second Ctrl-C interrupts at once. SIGTERM is a scheduler's preemption
    notice: it also starts the grace period (_Deadline)."""

    def __init__(self, grace: float = DEFAULT_GRACE):
        self.requested = False
        self.signal_name = ""
        self.deadline = _Deadline(grace)

    def __call__(self) -> bool:
        return self.requested

    def __enter__(self) -> _StopOnSignal:
        import signal
        import threading

        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        import signal

        if signum == signal.SIGTERM:
            if not self.requested:
                self.requested, self.signal_name = True, "SIGTERM"
            self.deadline.start()
            return
        if self.requested:
            raise KeyboardInterrupt
        self.requested, self.signal_name = True, "SIGINT"
        signal.signal(signal.SIGINT, signal.default_int_handler)

    def __exit__(self, *exc: Any) -> None:
        import signal

        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self.deadline.cancel()


# Where TensorFlow's multi-client runtime records a SIGTERM to any client (its own handler
# takes the signal and writes the notice into the coordination service's key-value store).
PREEMPTION_KEY = "TF_DEFAULT_PREEMPTION_NOTICE_KEY"


class _PreemptionWatch:
    """A multi-client run's preemption: TensorFlow takes SIGTERM itself and records it in its
    coordination service, which every client can read. A thread polls for that notice; each
    train call carries every client's flag and returns their max (Packer.notices), so all
    clients learn of it after the same call, stop there and write one checkpoint together.
    From the notice, `grace` seconds until this process exits regardless."""

    signal_name = "SIGTERM"

    def __init__(self, grace: float = DEFAULT_GRACE):
        import threading

        self.noticed = False  # this client has read the notice
        self.requested = False  # all clients agreed: stop after the call just run
        self.deadline = _Deadline(grace)
        self._done = threading.Event()
        self._thread: Any = None

    def __call__(self) -> bool:
        return self.requested

    def agree(self) -> None:
        self.requested = True

    def __enter__(self) -> _PreemptionWatch:
        import threading

        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def _watch(self) -> None:
        from tensorflow.python.eager import context

        while not self._done.is_set():
            try:
                # Waits up to 0.5 s for the key: a short poll that never holds exit up long.
                context.context().get_config_key_value(PREEMPTION_KEY, 500)
            except Exception:  # noqa: BLE001 - not there yet (DeadlineExceeded), or shutting down
                self._done.wait(0.1)  # an error that returns at once must not spin
                continue
            self.noticed = True
            self.deadline.start()
            return

    def __exit__(self, *exc: Any) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
        self.deadline.cancel()


class Interrupted(Stopped):
    """Ctrl-C or SIGTERM: a checkpoint was written at the current step."""

    def __init__(
        self,
        checkpoint: Path | None,
        run_dir: Path | None,
        saved: bool = True,
        preempted: bool = False,
        message: str | None = None,
    ):
        what = f"saved {checkpoint}" if saved else f"nothing new to save (last: {checkpoint})"
        head = "preempted (SIGTERM)" if preempted else "interrupted"
        self.exit_code = PREEMPTED_EXIT if preempted else INTERRUPTED_EXIT
        if os.environ.get(LAUNCHED_ENV) == "1" and os.environ.get(cluster_lib.ENV_JOBS):
            clients = len(os.environ[cluster_lib.ENV_JOBS].split(","))
            again = f"dtcli launch --clients {clients} --resume {run_dir}"
        else:
            again = f"dtcli train --resume {run_dir}"
        super().__init__(message or f"{head}; {what}; resume with: {again}")


def _loop(
    session: Session,
    train_step: Any,
    eval_step: Any,
    writer: Any,
    checkpointer: Any,
    console: Any,
    progress: bool,
    history: list[dict[str, Any]],
    start: EpochState,
    stop: Any,
    on_first_step: Callable[[], None] | None = None,
    profiler: Any = None,
) -> list[dict[str, Any]]:
    cfg = session.recipe.train
    lm = session.recipe.task == "language_model"
    bar = _Bar(console, enabled=progress, unit="tok/s" if lm else "ex/s")
    state = start
    trained = 0
    eval_packed: list | None = None  # an in-memory eval split's batches, packed once

    def count_step() -> None:
        nonlocal trained
        trained += 1
        if on_first_step is not None:
            on_first_step()

    def interrupt(state: EpochState) -> None:
        """Ctrl-C or SIGTERM: save where the run is (unless a checkpoint of this step exists)
        and stop."""
        step = int(session.optimizer.iterations.numpy())
        run_dir = checkpointer.folder.parent
        latest = checkpointer.latest()
        preempted = getattr(stop, "signal_name", "") == "SIGTERM"
        if not trained:  # nothing new since the checkpoint this run resumed from
            raise Interrupted(latest, run_dir, saved=False, preempted=preempted)
        # Decided by what this process saved, not by the folder: in a multi-client run client 0
        # renames a checkpoint into place after the others have returned from saving it.
        if checkpointer.last_step != step:
            latest = checkpointer.save(step, _meta(session, step, state))
        else:
            latest = checkpointer.folder / f"ckpt-{step:08d}"
        raise Interrupted(latest, run_dir, preempted=preempted)

    while state.epoch < cfg.epochs:
        # Checked here too: with K >= the steps of an epoch, an epoch is one call, and a Ctrl-C
        # during it (or during the evaluation or save after it) lands at an epoch boundary.
        if stop is not None and stop():
            interrupt(state)
        epoch = state.epoch
        steps = epoch_steps(session, epoch)
        bar.start(epoch + 1, cfg.epochs, steps, done=state.batch)
        try:
            state = run_epoch(session, train_step, state, bar, writer, stop, count_step, profiler)
        except NonFiniteLoss as exc:
            bar.stop()
            raise TrainingError(
                f"non-finite training loss ({exc.loss}) in epoch {epoch + 1} at step "
                f"{exc.step}; the run stopped without saving; last good checkpoint: "
                f"{checkpointer.latest() or 'none'}; "
                "try a lower optimizer.learning_rate"
            ) from None
        bar.stop()
        step = int(session.optimizer.iterations.numpy())
        if state.batch < steps:  # stopped by Ctrl-C: save where we are, mid-epoch
            interrupt(state)
        if eval_packed is None:  # at the first evaluation: none of it before the first step
            eval_packed = pack_all(session, session.eval_feed)  # (None again for a stream)
        ev = evaluate(session, eval_step, session.eval_feed, eval_packed)
        record = {
            "epoch": epoch + 1,
            "step": step,
            "train_loss": state.loss_sum / state.count,
            "train_accuracy": state.correct / state.count,
            "eval_loss": ev["loss"],
            "eval_accuracy": ev["accuracy"],
            **_throughput(session, state),
            "seconds": state.seconds,
        }
        peak = devices_lib.peak_memory(session.devices)
        if peak is not None:  # accelerators only: TensorFlow does not track CPU memory
            record["peak_memory_bytes"] = peak
        if lm:
            record["eval_perplexity"] = ev["perplexity"]
            record["train_tokens"] = int(state.count)
            record["eval_tokens"] = ev["tokens"]
        else:
            record["train_examples"] = int(state.count)
            record["eval_examples"] = ev["examples"]
        compiling = ""
        if state.compile_seconds:
            # The rate stays the loop's honest rate; this says why it is low here.
            record["compile_seconds"] = state.compile_seconds
            compiling = f" (incl. {state.compile_seconds:.1f} s compiling the step)"
        history.append(record)
        writer.epoch(record)
        if lm:
            where = f"step {step}/{cfg.steps}" if cfg.steps else f"epoch {epoch + 1}/{cfg.epochs}"
            flops = record.get("flops_per_sec_per_device")
            mfu = f", MFU {record['mfu']:.1%}" if "mfu" in record else ""
            per_device = f", {flops / 1e9:,.1f} GFLOP/s per device{mfu}" if flops else ""
            console.print(
                f"{where} loss {record['train_loss']:.4f} | eval loss {ev['loss']:.4f} "
                f"ppl {ev['perplexity']:.2f} acc {ev['accuracy']:.4f} | "
                f"{record['tokens_per_sec']:,.0f} tok/s{per_device}{compiling}",
                highlight=False,
            )
        else:
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


def _throughput(session: Session, state: EpochState) -> dict[str, float]:
    """Examples/s (a language model: tokens/s), and for a transformer its model FLOP/s per
    device and, where the device's peak is known, the MFU."""
    rate = state.count / state.seconds
    if session.recipe.task != "language_model":
        return {"examples_per_sec": rate}
    out = {"tokens_per_sec": rate}
    per_token = flops_per_token(session)
    if per_token:
        achieved = per_token * rate / session.devices.count
        out["flops_per_sec_per_device"] = achieved
        peak = devices_lib.peak_flops()
        if peak:
            out["mfu"] = achieved / peak
    return out


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
# Set by `dtcli launch` for its clients: the run directory is printed once (by the launcher),
# and a stopped client names `dtcli launch --resume` as the way on.
LAUNCHED_ENV = "DTCLI_LAUNCHED"
PROGRESS_EVENT = "\x1edtcli-progress "


class _Bar:
    """A rich progress bar for one epoch: loss, accuracy and examples/s as it goes."""

    def __init__(self, console: Any, enabled: bool, unit: str = "ex/s"):
        self.console = console
        self.unit = unit
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
        stats = f"loss {loss:.4f} acc {acc:.4f} {rate:,.0f} {self.unit}"
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


def _summary(console: Any, history: list[dict[str, Any]], first_epoch: int) -> None:
    """One closing line with what the epoch lines did not say (they said the rest)."""
    if not history:
        return
    seconds = sum(r["seconds"] for r in history[first_epoch:])
    if "eval_perplexity" in history[-1]:
        last = history[-1]
        console.print(
            f"done: {last['step']} steps ({seconds:.1f} s training in this process); eval loss "
            f"{last['eval_loss']:.4f} (perplexity {last['eval_perplexity']:.2f})",
            highlight=False,
        )
        return
    best = max(history, key=lambda r: r["eval_accuracy"])
    console.print(
        f"done: {history[-1]['epoch']} epoch{'s' * (history[-1]['epoch'] != 1)}, "
        f"{history[-1]['step']} steps "
        f"({seconds:.1f} s training in this process); best eval acc {best['eval_accuracy']:.4f} "
        f"in epoch {best['epoch']}",
        highlight=False,
    )
