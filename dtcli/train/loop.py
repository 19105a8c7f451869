"""The training loop: one epoch, then its record (evaluation, throughput, console line, metrics),
then a checkpoint when one is due; Ctrl-C or SIGTERM saves where the run is and stops."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from dtcli import devices as devices_lib
from dtcli import progress as progress_lib
from dtcli import recipe as recipe_lib
from dtcli.errors import Interrupted, TrainingError
from dtcli.session import (
    EpochState,
    NonFiniteLoss,
    Session,
    evaluate,
    flops_per_token,
    pack_all,
    run_epoch,
)
from dtcli.steps import epoch_steps
from dtcli.train.console import epoch_line, resume_command


class Writer(Protocol):
    """Where the loop's numbers go (dtcli.track.TrackedWriter, or NoWriter)."""

    def epoch(self, record: dict[str, Any]) -> None: ...

    def step_loss(self, step: int, loss: float, **more: float) -> None: ...

    def committed(self, step: int) -> None:
        """The checkpoint of `step` is complete (the remote trackers hear up to it)."""
        ...

    def close(self, status: str, files: list[Path], summary: dict[str, Any]) -> None: ...


class Checkpointer(Protocol):
    """What the loop needs of dtcli.checkpoint.Checkpointer."""

    folder: Path
    last_step: int | None

    def latest(self) -> Path | None: ...

    def save(self, step: int, meta: dict[str, Any]) -> Path: ...


class Stop(Protocol):
    """Asked after each call whether to stop (signals.StopOnSignal, signals.PreemptionWatch)."""

    signal_name: str

    def __call__(self) -> bool: ...


class NoWriter:
    """Clients other than 0 write no metrics: client 0 holds the same global numbers."""

    def epoch(self, record: dict[str, Any]) -> None:
        pass

    def step_loss(self, step: int, loss: float, **more: float) -> None:
        pass

    def committed(self, step: int) -> None:
        pass

    def close(self, status: str, files: list[Path], summary: dict[str, Any]) -> None:
        pass


@dataclass
class EpochLoop:
    """Epochs from a start state to train.epochs. `on_first_step`: called after each trained step
    (a resume commits its files at the first)."""

    session: Session
    train_step: Any
    eval_step: Any
    writer: Writer
    checkpointer: Checkpointer
    console: Any
    progress: bool
    stop: Stop
    on_first_step: Callable[[], None] | None = None
    profiler: Any = None
    beat: progress_lib.Heartbeat | None = None  # told what the loop does (a piped run's lines)
    trained: int = 0  # steps this process trained
    eval_packed: list | None = None  # an in-memory eval split's batches, packed once
    tasks: Callable[[], dict[str, float]] | None = None  # train.eval_tasks: tasks.TaskRunner

    def run(self, history: list[dict[str, Any]], start: EpochState) -> list[dict[str, Any]]:
        """Train from `start`; `history` gets each epoch's record."""
        lm = self.session.recipe.task == "language_model"
        bar = progress_lib.Bar(
            self.console,
            enabled=self.progress,
            unit="tok/s" if lm else "ex/s",
            total_steps=self.session.recipe.train.steps,
            plain=True,  # long epochs: a log that is not a terminal still hears of them
            beat=self.beat,
        )
        state = start
        while state.epoch < self.session.recipe.train.epochs:
            # Checked here too: with K >= the steps of an epoch, an epoch is one call, and a Ctrl-C
            # during it (or during the evaluation or save after it) lands at an epoch boundary.
            if self.stop():
                self._interrupt(state)
            state = self._epoch(state, bar, history)
        return history

    def _epoch(
        self, state: EpochState, bar: progress_lib.Bar, history: list[dict[str, Any]]
    ) -> EpochState:
        """The rest of one epoch, its record, and its checkpoint when one is due."""
        cfg = self.session.recipe.train
        epoch = state.epoch
        steps = epoch_steps(self.session, epoch)
        bar.start(
            epoch + 1, cfg.epochs, steps, done=state.batch, first=epoch * epoch_steps(self.session)
        )
        try:
            state = run_epoch(
                self.session,
                self.train_step,
                state,
                bar,
                self.writer,
                self.stop,
                self._count_step,
                self.profiler,
                step=self._step(),  # steps.jsonl numbers the optimizer's steps, whatever the
            )  # epochs before this one were (a resume may change their length)
        except NonFiniteLoss as exc:
            bar.stop()
            raise TrainingError(
                f"non-finite training loss ({exc.loss}) in epoch {epoch + 1} at step "
                f"{exc.step}; the run stopped without saving; last good checkpoint: "
                f"{self.checkpointer.latest() or 'none'}; {non_finite_hint(self.session)}"
            ) from None
        bar.stop()
        step = self._step()
        if state.batch < steps:  # stopped by Ctrl-C: save where we are, mid-epoch
            self._interrupt(state)
        self._doing("evaluating")  # the first evaluation compiles its step
        record = self._record(epoch, step, state)
        history.append(record)
        self.writer.epoch(record)
        self.console.print(epoch_line(record, cfg), highlight=False)
        if self.beat is not None:
            self.beat.heard()
        state = EpochState(epoch + 1)
        last_epoch = state.epoch == cfg.epochs
        if last_epoch or (cfg.checkpoint_every and state.epoch % cfg.checkpoint_every == 0):
            self._doing(f"saving the checkpoint of step {step}")
            self.checkpointer.save(step, checkpoint_meta(self.session, step, state))
            self.writer.committed(step)
        return state

    def _doing(self, what: str) -> None:
        if self.beat is not None:
            self.beat.now(what)

    def _record(self, epoch: int, step: int, state: EpochState) -> dict[str, Any]:
        """The epoch's line of metrics.jsonl: training numbers, a full evaluation, throughput."""
        session = self.session
        if self.eval_packed is None:  # at the first evaluation: none of it before the first step
            self.eval_packed = pack_all(session, session.eval_feed)  # (None again for a stream)
        ev = evaluate(session, self.eval_step, session.eval_feed, self.eval_packed)
        record = {
            "epoch": epoch + 1,
            "step": step,
            "train_loss": state.loss_sum / state.count,
            "train_accuracy": state.correct / state.count,
            "eval_loss": ev["loss"],
            "eval_accuracy": ev["accuracy"],
            **throughput(session, state),
            "seconds": state.seconds,
        }
        peak = devices_lib.peak_memory(session.devices)
        if peak is not None:  # accelerators only: TensorFlow does not track CPU memory
            record["peak_memory_bytes"] = peak
        if session.recipe.task == "language_model":
            record["eval_perplexity"] = ev["perplexity"]
            if "bpb" in ev:
                record["eval_bpb"] = ev["bpb"]
            record["train_tokens"] = int(state.count)
            record["eval_tokens"] = ev["tokens"]
        else:
            record["train_examples"] = int(state.count)
            record["eval_examples"] = ev["examples"]
        if state.compile_seconds:
            # The rate stays the loop's honest rate; the epoch line says why it is low here.
            record["compile_seconds"] = state.compile_seconds
        if self.tasks is not None:  # every client: each computes the same requests
            self._doing("running lm-eval tasks")
            record.update(self.tasks())
        return record

    def _count_step(self) -> None:
        self.trained += 1
        if self.on_first_step is not None:
            self.on_first_step()

    def _step(self) -> int:
        return int(self.session.optimizer.iterations.numpy())

    def _interrupt(self, state: EpochState) -> None:
        """Ctrl-C or SIGTERM: save where the run is (unless a checkpoint of this step exists)
        and stop."""
        step = self._step()
        run_dir = self.checkpointer.folder.parent
        latest = self.checkpointer.latest()
        preempted = getattr(self.stop, "signal_name", "") == "SIGTERM"
        again = resume_command(run_dir)
        if not self.trained:  # nothing new since the checkpoint this run resumed from
            raise Interrupted(latest, run_dir, saved=False, preempted=preempted, again=again)
        # Decided by what this process saved, not by the folder: in a multi-client run client 0
        # renames a checkpoint into place after the others have returned from saving it.
        if self.checkpointer.last_step != step:
            self._doing(f"saving the checkpoint of step {step}")
            latest = self.checkpointer.save(step, checkpoint_meta(self.session, step, state))
        else:
            latest = self.checkpointer.folder / f"ckpt-{step:08d}"
        self.writer.committed(step)
        raise Interrupted(latest, run_dir, preempted=preempted, again=again)


def non_finite_hint(session: Session) -> str:
    """What to try after a non-finite loss. On a GPU (an H200), bf16 steps compiled by XLA went
    NaN at the second step in some runs and trained in identical others (ptxas 12.5, and 12.9:
    1 of 3), where float32 and DTensor trained each time: there the learning rate is not the
    suspect, and a rerun may train."""
    gpu = session.devices.device_type == "GPU"
    if gpu and session.xla and session.recipe.train.precision == "bf16":
        return (
            "bf16 steps compiled by XLA go NaN on a GPU in some runs that identical runs train "
            "(docs/benchmarks.md): try train.precision=float32 or train.compile=dtensor first, "
            "then a lower optimizer.learning_rate"
        )
    return "try a lower optimizer.learning_rate"


def throughput(session: Session, state: EpochState) -> dict[str, float]:
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


def checkpoint_meta(session: Session, step: int, state: EpochState) -> dict[str, Any]:
    """A checkpoint's meta.json: where the run is, and what it was trained with."""
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
        # A LoRA run's checkpoints hold the adapters alone: the base they belong to.
        **({"base": session.base} if session.base is not None else {}),
    }


def _versions() -> dict[str, str]:
    import tensorflow as tf
    import tf_keras

    import dtcli

    return {
        "dtcli": dtcli.__version__,
        "tensorflow": tf.__version__,
        "tf_keras": tf_keras.__version__,
    }
