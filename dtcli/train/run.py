"""One `dtcli train` run: open (or lock) its directory, check the other clients of a multi-client
run, restore a checkpoint on resume, run the loop under the signal handlers, draw the plots.

The engine (devices, mesh, data, model, optimizer, the compiled steps, evaluation) is
dtcli.session; the run directory's layout, lock and checkpoints are dtcli.rundir.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtcli import cluster as cluster_lib
from dtcli import devices as devices_lib
from dtcli import memory as memory_lib
from dtcli import mesh as mesh_lib
from dtcli import progress as progress_lib
from dtcli import recipe as recipe_lib
from dtcli import rundir, runlog, storage, tfruntime, track
from dtcli.errors import TrainingError, UsageError, printed
from dtcli.recipe import Recipe
from dtcli.session import Session, finetune, prepare
from dtcli.steps import make_steps
from dtcli.stretches import finished
from dtcli.train import tasks as eval_tasks
from dtcli.train import tracking
from dtcli.train.clients import join, peer_failures
from dtcli.train.console import header, nothing_to_train, profile_report, summary
from dtcli.train.loop import EpochLoop
from dtcli.train.resume import history_until, restore
from dtcli.train.signals import (
    DEFAULT_GRACE,
    PreemptionWatch,
    SigtermOutsideTheLoop,
    StopOnSignal,
    silent_stop,
)
from dtcli.train.state import Run, RunResult


def command(
    recipe: str | None,
    overrides: recipe_lib.Overrides,
    out: str | None,
    resume: str | None,
    cluster: cluster_lib.Cluster | None,
    devices: str | None,
    *,
    progress: bool,
    connect_timeout: float,
    grace: float,
    profile: tuple[int, int] | None,
    memory: memory_lib.Budget,
) -> Path | None:
    """`dtcli train`: RECIPE's recipe (with `--resume` the run's own) with the command line's
    `overrides`, trained. Returns the run directory to print on stdout (for scripts:
    RUN=$(dtcli train ...)), or None where this process prints nothing there: a client other
    than 0, or any client `dtcli launch` started (the launcher prints it)."""
    chief = cluster is None or cluster.is_chief
    loaded = rundir.command_recipe(recipe, out, resume, overrides, chief=chief)
    result = train(
        loaded,
        until_exit=True,
        out=out,
        resume=resume,
        progress=progress,
        cluster=cluster,
        connect_timeout=connect_timeout,
        grace=grace,
        profile=profile,
        devices_key=devices_lib.key_for(devices),
        memory=memory,
    )
    if progress_lib.launched() or not chief:
        return None
    return result.run_dir


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
    until_exit: bool = False,
) -> RunResult:
    """Train a recipe end to end and write its run directory (or continue one with `resume`).

    The run directory is created (or opened) and locked before any TensorFlow work. A new run
    that fails before its first complete checkpoint is removed; a resume that fails before its
    first step leaves every file as it was. With a `cluster`, this process is one client of a
    multi-client run: a preflight checks the other clients first (within `connect_timeout`
    seconds); all clients train and save checkpoints together, only client 0 holds the lock and
    writes the recipe, metrics and plots. A recipe whose memory plan does not fit `memory` (or
    the devices' own memory) is refused first, before its folder or model exists.
    `until_exit`: this process ends with the run (the command line's): once it is complete,
    SIGINT and SIGTERM are ignored until it exits (signals.SigtermOutsideTheLoop).
    """
    from rich.console import Console

    with SigtermOutsideTheLoop(until_exit) as early:
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


# What a run is doing until its loop starts (progress.Heartbeat).
SETTING_UP = "setting up the run (TensorFlow, the data, the model on the mesh)"


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
    eval_tasks.check(recipe)  # lm-eval's task index: before the folder and TensorFlow
    track.check_installed(recipe)
    path = storage.as_path(run.resume or run.out or rundir.default_path(recipe.name))
    # Where the run's output is no terminal: a line at least every BEAT_EVERY seconds, from
    # TensorFlow's start to the plots (the first compile alone took ~90 s for gpt_fsdp_tp).
    run.beat = progress_lib.run_heartbeat(run.console, SETTING_UP, on=run.progress)
    try:
        with run.beat:
            _open(run, path)
            if cluster is not None:
                join(run)
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


def _keep_hf_files(run: Run) -> None:
    """A new run that starts from a model (model.from_hf, model.from_run): the Hugging Face
    files the model came with (generation and tokenizer settings, config.json) kept in
    RUN_DIR/hf/, as an import keeps them: generate's end-of-sequence ids, an export's. (Its
    step-0 weights: session.finetune.load_base.)"""
    from dtcli.hf import tokenizer_files
    from dtcli.rundir import base

    model = run.recipe.model
    if model.from_hf:
        carried = tokenizer_files.carried(Path(run.recipe.model.from_hf))
    else:
        carried = base.hf_files(model.from_run)
    if not carried:
        return
    folder = run.folder.path / tokenizer_files.FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in carried.items():
        storage.write_atomic(folder / name, data)


def _keep_chat_template(run: Run) -> None:
    """Instruction data whose tokenizer has a tokenizer_config.json beside it (its chat
    template, BOS and EOS): kept in RUN_DIR/hf/ (where model.from_hf keeps its own), so that
    eval, generate, a resume and an export render as the run trained once that folder is gone
    (data.jsonl reads the run's first)."""
    from dtcli.data import jsonl
    from dtcli.hf import tokenizer_files

    found = jsonl.tokenizer_config(run.recipe.data)
    target = run.folder.path / tokenizer_files.FOLDER / tokenizer_files.CARRIED[0]
    if found is None or target.exists():
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    storage.write_atomic(target, found.read_bytes())


def _adapters_from_peft(session: Session) -> None:
    """lora.from_peft: a new run's step-0 adapters are the peft folder's (models.peft_weights);
    a resume's are its checkpoint's."""
    from dtcli.models import peft_weights

    peft_weights.load_adapters(session.model, session.recipe, session.mesh)


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
    if run.resume is None or run.recipe.lora is not None:
        # The base's weights (model.from_hf, model.from_run): a new run's step 0; a LoRA
        # resume's base (its checkpoints hold the adapters alone), checked to be theirs.
        finetune.load_base(session, run.meta, run.latest)
    if run.resume is None and run.recipe.lora is not None and run.recipe.lora.from_peft:
        _adapters_from_peft(session)
    model = run.recipe.model
    if run.resume is None and run.chief and (model.from_hf or model.from_run):
        _keep_hf_files(run)
    if run.chief and session.data.tokenizer is not None and run.resume is None:
        # Before the first checkpoint: every checkpoint's run has it (eval, generate, resume).
        run.folder.keep_tokenizer(session.data.tokenizer.to_json())
    if run.chief and run.resume is None and run.recipe.data.source == "jsonl":
        _keep_chat_template(run)
    train_step, eval_step = make_steps(session)
    checkpointer = _checkpointer(run, session)
    history, start, on_first_step = restore(run, session, checkpointer)
    header(run.console, session, run.folder.path)
    stopper, profiler = _stopper(run), _profiler(run)
    before = len(history)
    with tracking.writing(run, session) as writer:
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
            run.beat,
            tasks=_task_runner(run, session),
        )
        try:
            with stopper, peer_failures(run.cluster, checkpointer):
                history = loop.run(history, start)
        finally:
            if profiler is not None and profiler.running:
                profiler.finish(int(session.optimizer.iterations.numpy()))
        _sum_up(run, session, profiler, history, before)
        tracking.finish(writer, run.folder, history)  # after the plots: they are artifacts
    return RunResult(run.folder.path, history)


def _task_runner(run: Run, session: Session) -> eval_tasks.TaskRunner | None:
    """train.eval_tasks' runner for the loop (None: the recipe names no tasks)."""
    cfg = run.recipe.train.eval_tasks
    return None if cfg is None else eval_tasks.TaskRunner(session, cfg, run.folder.path)


def _stopper(run: Run) -> Any:
    """One process: Ctrl-C or SIGTERM stops after the current call and saves. Several clients
    must agree on that call: a SIGTERM does (through the train call, PreemptionWatch), a
    Ctrl-C interrupts at once instead (dtcli launch stops every client)."""
    if run.cluster is None:
        return StopOnSignal(run.grace)
    return PreemptionWatch(run.grace)


def _profiler(run: Run) -> Any:
    """--profile's profiler: client 0's trace (clients on one host collide), or None."""
    if run.profile is not None and run.chief:
        from dtcli import metrics as metrics_lib

        return metrics_lib.Profiler(run.folder.tensorboard, *run.profile)
    return None


def _sum_up(
    run: Run, session: Session, profiler: Any, history: list[dict[str, Any]], before: int
) -> None:
    """After the loop: the profile's report, the plots and the summary (`before`: the epochs
    the history held before this process trained)."""
    if profiler is not None:
        step = int(session.optimizer.iterations.numpy())
        profile_report(run.console, profiler, run.folder.tensorboard, step)
    if run.chief and len(history) > before:
        run.beat.now("drawing the plots")
        _plot(run.folder)
    run.early.complete()  # a Ctrl-C after the summary: the run is complete, exit 0
    if run.chief:
        summary(run.console, history, before, run.folder.complete_checkpoints())


def _nothing_to_train(run: Run) -> RunResult:
    """Said before the devices, the model and the compilation are set up for nothing."""
    run.early.complete()  # a run trained to its end already: a signal now changes nothing
    state = run.meta["epoch_state"]
    nothing_to_train(
        run.console, run.recipe.train, state["epoch"], run.meta["step"], state["batch"]
    )
    history = history_until(run.folder, run.meta["step"]) if run.chief else []
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


def _plot(folder: rundir.RunDir) -> None:
    from dtcli import plot as plot_lib

    try:
        rundir.check_plots(folder.path, "the run folder")  # a file made there while it trained
        plot_lib.plot_runs([folder.path], folder.plots, out_arg="the run's plots")
    except UsageError as exc:  # plots cannot be written (a full disk): training is done
        raise TrainingError(
            f"{exc}; training finished and its checkpoints and metrics are complete"
        ) from None
