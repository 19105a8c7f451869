"""Training a session in data order: `run_epoch` (the rest of an epoch, K steps a call),
`run_steps` (N steps, for mesh-equivalence checks), an epoch's progress (`EpochState`) and where
a resumed run goes on."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass
from typing import Any

from dtcli import recipe as recipe_lib
from dtcli.session.build import Session
from dtcli.steps import PER_STEP, epoch_steps, make_steps, steps_per_call, train_block
from dtcli.stretches import resume_position


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
        out = _call(session, train_call, block, stop, state)
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
            _show(bar, state)
    return state


def _call(session: Session, train_call: Any, block: list, stop: Any, state: EpochState) -> dict:
    """One train call of `block`; the process's first (tracing and compiling it) timed into
    `state.compile_seconds`."""
    called = time.perf_counter()
    out = train_block(session, train_call, block, getattr(stop, "noticed", None))
    if not session.compiled:
        session.compiled = True
        # `auto`'s measuring of its two paths (session.choice) is part of the first step's cost.
        state.compile_seconds = time.perf_counter() - called + session.probe_seconds
    return out


def _show(bar: Any, state: EpochState) -> None:
    """The epoch so far on the progress bar: batches, mean loss, accuracy, examples/s."""
    bar.update(
        state.batch,
        state.loss_sum / state.count,
        state.correct / state.count,
        state.count / state.seconds,
    )


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
