"""A resumed run: its checkpoint restored into the new session, the history up to it, where the
loop goes on, and the run's files brought up to date once its first step trained (until then a
failure leaves every file as it was)."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from datetime import datetime
from typing import Any

from dtcli import checkpoint as ckpt_lib
from dtcli import recipe as recipe_lib
from dtcli import rundir, runlog, storage
from dtcli.errors import TrainingError
from dtcli.session import EpochState, Session, resume_state
from dtcli.train.state import Run


def restore(
    run: Run, session: Session, checkpointer: Any
) -> tuple[list[dict[str, Any]], EpochState, Callable[[], None] | None]:
    """A resume: the checkpoint restored, the history up to it, where the loop starts, and what
    to do after the first step trained. A new run: its recipe written, from the start."""
    if run.latest is None or run.meta is None:
        if run.chief:
            run.folder.write_text(run.folder.recipe, recipe_lib.dump(run.recipe))
        return [], EpochState(0), None
    meta = run.meta
    # An import's step 0 holds the model alone: its weights restored, the optimizer new.
    imported = ckpt_lib.weights_only(meta)
    checkpointer.restore(run.latest, session.model.weights, partial=imported)
    # The checkpoint holds the optimizer's old learning rate: the recipe's takes effect now.
    session.optimizer.set_hyperparameters(run.recipe.optimizer)
    checkpointer.last_step = meta["step"]
    # A train.steps run goes on from its global step, in the stretches of the eval_every it
    # resumes with (which may not be the one its checkpoint counted its epoch in).
    start = resume_state(run.recipe.train, meta["step"], meta["epoch_state"])
    history = history_until(run.folder, meta["step"]) if run.chief else []
    if imported:
        said = (
            f"{run.folder.path}: an imported run, training starts from its step-0 weights "
            "with a new optimizer"
        )
    else:
        said = (
            f"resuming {run.latest} (epoch {start.epoch + 1}, batch {start.batch}, "
            f"step {meta['step']})"
        )
    run.console.print(said, highlight=False)
    if not run.chief:
        return history, start, None
    return history, start, _once(lambda: _commit_resume(run, checkpointer, start))


def history_until(folder: rundir.RunDir, step: int) -> list[dict[str, Any]]:
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


def _commit_resume(run: Run, checkpointer: Any, start: EpochState) -> None:
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
            # Where the run went on, as the console said it and metrics.jsonl counts epochs
            # (from 1); the checkpoint's own epoch_state counts from 0.
            "epoch": start.epoch + 1,
            "batch": start.batch,
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
