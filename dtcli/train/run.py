"""One `dtcli train` run: open (or lock) its directory, check the other clients of a multi-client
run, restore a checkpoint on resume, run the loop under the signal handlers, draw the plots.

The engine (devices, mesh, data, model, optimizer, the compiled steps, evaluation) is
dtcli.session; the run directory's layout, lock and checkpoints are dtcli.rundir.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from dtcli import cluster as cluster_lib
from dtcli import devices as devices_lib
from dtcli import memory as memory_lib
from dtcli import mesh as mesh_lib
from dtcli import progress as progress_lib
from dtcli import recipe as recipe_lib
from dtcli import rundir, runlog, storage, tfruntime
from dtcli.errors import TrainingError, UsageError, one_line, printed
from dtcli.recipe import Recipe
from dtcli.session import EpochState, Session, prepare, resume_state
from dtcli.steps import make_steps
from dtcli.stretches import finished
from dtcli.train.console import header, nothing_to_train, profile_report, summary
from dtcli.train.loop import Checkpointer, EpochLoop, NoWriter, Writer
from dtcli.train.signals import (
    DEFAULT_GRACE,
    PreemptionWatch,
    SigtermOutsideTheLoop,
    StopOnSignal,
    silent_stop,
)


@dataclass
class RunResult:
    run_dir: Path
    history: list[dict[str, Any]]


@dataclass
class Run:
    """One run as this process trains it: what it was asked (the recipe, where, how to report,
    the cluster) and what it found on the way (its folder, the checkpoint to resume from)."""

    recipe: Recipe
    out: Path | None
    resume: Path | None
    console: Any
    progress: bool
    cluster: cluster_lib.Cluster | None
    connect_timeout: float
    grace: float
    profile: tuple[int, int] | None
    early: SigtermOutsideTheLoop
    chief: bool = True  # client 0 (or the only one): holds the lock, writes files and speaks
    logged: bool = False  # the console copies its lines into train.log
    folder: rundir.RunDir | None = None
    latest: Path | None = None  # the checkpoint a resume starts from
    meta: dict[str, Any] | None = field(default=None, repr=False)  # its meta.json
    devices_key: str = devices_lib.RECIPE_KEY  # --devices when the command line gave them
    memory: memory_lib.Budget = memory_lib.NO_BUDGET  # --memory, --no-memory-check

    def warn(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False)


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
    devices_key: str = devices_lib.RECIPE_KEY,
    memory: memory_lib.Budget = memory_lib.NO_BUDGET,
) -> RunResult:
    """Train a recipe end to end and write its run directory (or continue one with `resume`).

    The run directory is created (or opened) and locked before any TensorFlow work. A new run
    that fails before its first complete checkpoint is removed; a resume that fails before its
    first step leaves every file as it was. With a `cluster`, this process is one client of a
    multi-client run: a preflight checks the other clients first (within `connect_timeout`
    seconds); all clients train and save checkpoints together, only client 0 holds the lock and
    writes the recipe, metrics and plots. A recipe whose memory plan does not fit `memory` (or
    the devices' own memory) is refused first, before its folder or model exists.
    """
    from rich.console import Console

    with SigtermOutsideTheLoop() as early:
        tfruntime.check_runtime_env()
        # soft_wrap: logs piped to a file keep one line per message
        console = console or runlog.LoggedConsole(stderr=True, soft_wrap=True)
        chief = cluster is None or cluster.is_chief
        if not chief:
            # Every client would print the same lines; client 0 speaks for the run. Errors still
            # reach stderr (the CLI prints them), so a failing client says why.
            console = Console(stderr=True, quiet=True)
        run = Run(
            recipe,
            out,
            resume,
            console,
            progress,
            cluster,
            connect_timeout,
            grace,
            profile,
            early,
            chief=chief,
            logged=chief and isinstance(console, runlog.LoggedConsole),
            devices_key=devices_key,
            memory=memory,
        )
        with silent_stop(not chief and progress_lib.launched()):
            return _open_and_train(run)


def _open_and_train(run: Run) -> RunResult:
    """Open the run, join the other clients, train; on any failure leave the run as the rules
    say (a new run without a checkpoint removed, a resume as it was) and say why in train.log."""
    recipe, cluster = run.recipe, run.cluster
    if cluster is not None:
        devices_lib.check_clients(
            recipe.devices,
            mesh_lib.device_count_for(recipe.mesh),
            cluster.num_clients,
            run.devices_key,
        )
    # Before the folder is made and before the model is allocated.
    role, clients = ("process", 1) if cluster is None else ("client", cluster.num_clients)
    memory_lib.check_before_run(recipe, run.memory, role, clients, run.devices_key)
    path = storage.as_path(run.resume or run.out or rundir.default_path(recipe.name))
    try:
        _open(run, path)
        if cluster is not None:
            _join(run)
        result = _train(run)
    except BaseException as exc:
        if run.folder is not None:  # None: opening the run failed, and left everything as it was
            if run.logged:
                run.console.log_only(printed(exc))
            if run.chief:
                run.folder.abandon()
        raise
    if run.chief:
        run.folder.release()
    return result


def _open(run: Run, path: Path) -> None:
    """Create (or open for a resume) and lock the run's folder; find the checkpoint to resume."""
    # A SIGTERM while the folder is made and locked waits until `run.folder` exists, so that the
    # clean-up sees what to remove (a new run's folder) or to leave as it was.
    with run.early.deferred():
        if not run.chief:
            run.folder = rundir.unlocked(path)
        elif run.resume is not None:
            run.folder = rundir.open_for_resume(path, "--resume", run.warn)
        else:
            run.folder = rundir.create(path, "--out", run.warn)
        if run.logged and run.resume is None:
            # A resume's lines: once its first step trained (_commit_resume).
            run.console.commit(run.folder.train_log, runlog.header())
    if run.resume is not None and run.chief:
        run.latest = run.folder.latest_checkpoint("--resume", "to resume from", run.warn)


def _join(run: Run) -> None:
    """A multi-client run: check the other clients (before TensorFlow's runtime starts: a
    missing peer would otherwise hang it for good) and take client 0's run directory and
    checkpoint."""
    leader = {
        "run_dir": str(run.folder.path),
        "resume_from": str(run.latest) if run.latest else None,
        "tag": f"{os.getpid()}-{int(time.time())}",
    }
    run.cluster = cluster_lib.preflight(
        run.cluster, recipe_lib.fingerprint(run.recipe), run.connect_timeout, leader
    )
    chosen, run.latest = _client0_choice(
        run.cluster, run.folder.path, run.latest, run.out is not None
    )
    if not run.chief:
        run.folder = rundir.unlocked(chosen)


def _train(run: Run) -> RunResult:
    """Set up the session, restore a resume's checkpoint, run the loop, plot and sum up."""
    from dtcli import checkpoint as ckpt_lib

    run.meta = ckpt_lib.read_meta(run.latest) if run.latest is not None else None
    if run.meta is not None and finished(
        run.recipe.train, run.meta["step"], run.meta["epoch_state"]["epoch"]
    ):
        return _nothing_to_train(run)
    session = prepare(
        run.recipe,
        cluster=run.cluster,
        devices_key=run.devices_key,
        tokenizer_file=run.folder.tokenizer,
    )
    run.recipe = session.recipe
    if run.chief and session.data.tokenizer is not None and run.resume is None:
        # Before the first checkpoint: every checkpoint's run has it (eval, generate, resume).
        run.folder.keep_tokenizer(session.data.tokenizer.to_json())
    train_step, eval_step = make_steps(session)
    checkpointer = _checkpointer(run, session)
    history, start, on_first_step = _restore(run, session, checkpointer)
    writer = _writer(run)
    header(run.console, session, run.folder.path)
    # One process: Ctrl-C or SIGTERM stops after the current call and saves. Several clients
    # must agree on that call: a SIGTERM does (through the train call, PreemptionWatch), a
    # Ctrl-C interrupts at once instead (dtcli launch stops every client).
    if run.cluster is None:
        stopper: Any = StopOnSignal(run.grace)
    else:
        stopper = PreemptionWatch(run.grace)
    profiler = None
    if run.profile is not None and run.chief:  # client 0's trace (clients on one host collide)
        from dtcli import metrics as metrics_lib

        profiler = metrics_lib.Profiler(run.folder.tensorboard, *run.profile)
    loop = EpochLoop(
        session,
        train_step,
        eval_step,
        writer,
        checkpointer,
        run.console,
        run.progress,
        stopper,
        on_first_step,
        profiler,
    )
    before = len(history)
    try:
        with stopper, _peer_failures(run.cluster, checkpointer):
            history = loop.run(history, start)
    finally:
        writer.close()
        if profiler is not None and profiler.running:
            profiler.finish(int(session.optimizer.iterations.numpy()))
    if profiler is not None:
        step = int(session.optimizer.iterations.numpy())
        profile_report(run.console, profiler, run.folder.tensorboard, step)
    if run.chief and len(history) > before:
        _plot(run.folder)
    run.early.complete()  # a Ctrl-C after the summary: the run is complete, exit 0
    if run.chief:
        summary(run.console, history, before, run.folder.complete_checkpoints())
    return RunResult(run.folder.path, history)


def _nothing_to_train(run: Run) -> RunResult:
    """Said before the devices, the model and the compilation are set up for nothing."""
    done = run.meta["epoch_state"]["epoch"]
    nothing_to_train(run.console, run.recipe.train, done, run.meta["step"])
    history = _history_until(run.folder, run.meta["step"]) if run.chief else []
    checkpoints = run.folder.complete_checkpoints() if run.chief else []
    summary(run.console, history, len(history), checkpoints)  # nothing trained in this process
    return RunResult(run.folder.path, history)


def _checkpointer(run: Run, session: Session) -> Any:
    from dtcli import checkpoint as ckpt_lib

    cluster = run.cluster
    return ckpt_lib.Checkpointer(
        run.folder.checkpoints,
        session.checkpoint_objects(),
        run.recipe.train.keep,
        chief=run.chief,
        barrier=(lambda: mesh_lib.barrier(session.mesh)) if cluster else None,
        tag=cluster.leader.get("tag") if cluster else None,
    )


def _restore(
    run: Run, session: Session, checkpointer: Any
) -> tuple[list[dict[str, Any]], EpochState, Callable[[], None] | None]:
    """A resume: the checkpoint restored, the history up to it, where the loop starts, and what
    to do after the first step trained. A new run: its recipe written, from the start."""
    if run.latest is None or run.meta is None:
        if run.chief:
            run.folder.write_text(run.folder.recipe, recipe_lib.dump(run.recipe))
        return [], EpochState(0), None
    meta = run.meta
    checkpointer.restore(run.latest, session.model.weights)
    # The checkpoint holds the optimizer's old learning rate: the recipe's takes effect now.
    session.optimizer.set_hyperparameters(run.recipe.optimizer)
    checkpointer.last_step = meta["step"]
    # A train.steps run goes on from its global step, in the stretches of the eval_every it
    # resumes with (which may not be the one its checkpoint counted its epoch in).
    start = resume_state(run.recipe.train, meta["step"], meta["epoch_state"])
    history = _history_until(run.folder, meta["step"]) if run.chief else []
    run.console.print(
        f"resuming {run.latest} (epoch {start.epoch + 1}, batch {start.batch}, "
        f"step {meta['step']})",
        highlight=False,
    )
    if not run.chief:
        return history, start, None
    return history, start, _once(lambda: _commit_resume(run, checkpointer))


def _writer(run: Run) -> Writer:
    from dtcli import metrics as metrics_lib

    if not run.chief:
        return NoWriter()
    return metrics_lib.MetricsWriter(
        run.folder.metrics,
        run.folder.steps,
        run.folder.tensorboard,
        hparams=metrics_lib.hparams_of(recipe_lib.to_mapping(run.recipe)),
    )


def _plot(folder: rundir.RunDir) -> None:
    from dtcli import plot as plot_lib

    try:
        rundir.check_plots(folder.path, "the run folder")  # a file made there while it trained
        plot_lib.plot_runs([folder.path], folder.plots, out_arg="the run's plots")
    except UsageError as exc:  # plots cannot be written (a full disk): training is done
        raise TrainingError(
            f"{exc}; training finished and its checkpoints and metrics are complete"
        ) from None


def _history_until(folder: rundir.RunDir, step: int) -> list[dict[str, Any]]:
    """The run's epoch records up to `step` (a resume replays the epochs after it)."""
    from dtcli import metrics as metrics_lib

    if not folder.metrics.is_file():
        return []
    return [r for r in metrics_lib.read(folder.metrics) if r.get("step", 0) <= step]


def _once(fn: Callable[[], None]) -> Callable[[], None]:
    done = False

    def call() -> None:
        nonlocal done
        if not done:
            done = True
            fn()

    return call


def _commit_resume(run: Run, checkpointer: Any) -> None:
    """The resumed run trained a step: from here on its files describe it. Until now a failure
    (a bad override, a non-finite first loss) left every file of the run as it was."""
    from dtcli import metrics as metrics_lib

    folder, step = run.folder, run.meta["step"]
    try:
        before = recipe_lib.load(folder.recipe)
        changes = rundir.recipe_changes(before, run.recipe)
        metrics_lib.truncate_after(folder.metrics, step)
        metrics_lib.truncate_after(folder.steps, step)
        folder.write_text(folder.recipe, recipe_lib.dump(run.recipe))
        record = {
            "time": datetime.now().isoformat(timespec="seconds"),
            "checkpoint": storage.as_path(run.latest).name,
            "step": step,
            "epoch": run.meta["epoch"],
            "changes": changes,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        }
        storage.append_line(folder.resumes, json.dumps(record))
        checkpointer.clean()
        if isinstance(run.console, runlog.LoggedConsole):
            run.console.commit(folder.train_log, runlog.header())
    except OSError as exc:
        raise TrainingError(
            f"{folder.path}: recording the resume failed ({rundir.os_reason(exc)})"
        ) from None


def _client0_choice(
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


@contextlib.contextmanager
def _peer_failures(
    cluster: cluster_lib.Cluster | None, checkpointer: Checkpointer
) -> Iterator[None]:
    """In a multi-client run, a client that dies makes the others' next collective fail; say so
    in one line (the launcher names the client that died) instead of a runtime traceback."""
    if cluster is None:
        yield
        return
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as exc:
        raise TrainingError(
            f"client {cluster.client_id}: lost the other clients ({one_line(exc, named=True)}); "
            f"the run stopped; last complete checkpoint: {checkpointer.latest() or 'none'}"
        ) from None
