"""The trials as processes: each a fresh `dtcli train` (or `train --resume`), K at once in
their slots, their output relayed with the trial's index in front, SIGTERM and Ctrl-C forwarded
so that each running trial saves and stops, and each trial's status as it ends."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtcli import children
from dtcli.errors import INTERRUPTED_EXIT, PREEMPTED_EXIT
from dtcli.sweep.slots import Slot
from dtcli.sweep.trials import Trial

# The statuses a trial ends with (docs/sweeps.md).
DONE, FAILED, REFUSED, INTERRUPTED = "done", "failed", "refused", "interrupted"


@dataclass(frozen=True)
class Job:
    """One trial to run: the `dtcli train` arguments that run it, and how (a new run or a
    resume)."""

    trial: Trial
    argv: list[str]
    resume: bool


def train_argv(recipe: str, sets: list[str], trial: Trial, out: Path, resume: bool) -> list[str]:
    if resume:
        return ["train", "--resume", str(out), "--no-progress"]
    argv = ["train", recipe]
    for assignment in [*sets, *trial.sets]:
        argv += ["--set", assignment]
    return [*argv, "--out", str(out), "--no-progress"]


def status_of(code: int) -> str:
    if code == 0:
        return DONE
    if code == 2:
        return REFUSED
    if code in (INTERRUPTED_EXIT, PREEMPTED_EXIT):
        return INTERRUPTED
    return FAILED


@dataclass
class _Running:
    job: Job
    slot: Slot
    proc: subprocess.Popen
    open_streams: int = 2
    last_error: str = ""


@dataclass
class Runner:
    """Runs `jobs` in `slots`; `ended(trial, status, last_error)` is called as each ends."""

    jobs: list[Job]
    slots: list[Slot]
    ended: Callable[[Trial, str, str], None]
    say: Callable[[str], None]
    relay: bool = True  # print the trials' own lines (else only their error lines)
    env: dict[str, str] = field(default_factory=dict)  # every trial's, beside its slot's
    stopped_by: int | None = None  # the signal that stopped the sweep
    _lines: queue.Queue = field(default_factory=queue.Queue)
    _running: dict[int, _Running] = field(default_factory=dict)

    def run(self) -> None:
        """Until every job has ended, or the sweep was stopped and the running ones have."""
        main = threading.current_thread() is threading.main_thread()
        previous = signal.signal(signal.SIGTERM, self._on_sigterm) if main else None
        pending = list(self.jobs)
        free = list(self.slots)
        try:
            while self._running or (pending and self.stopped_by is None):
                try:
                    while pending and free and self.stopped_by is None:
                        self._start(pending.pop(0), free.pop(0))
                    free += self._step()
                except KeyboardInterrupt:
                    self._stop(signal.SIGINT)
        finally:
            for running in self._running.values():  # only after a second Ctrl-C
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(running.proc.pid, signal.SIGKILL)
            if main:
                signal.signal(signal.SIGTERM, previous)

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        self._stop(signal.SIGTERM)

    def _stop(self, sig: int) -> None:
        """Forward the stop once to every running trial (each saves a checkpoint and exits 130
        or 143); start no other."""
        if self.stopped_by is not None:
            return
        self.stopped_by = sig
        for running in self._running.values():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(running.proc.pid, sig)

    def _start(self, job: Job, slot: Slot) -> None:
        env = {**os.environ, **self.env, **slot.env, "PYTHONUNBUFFERED": "1"}

        def in_child() -> None:
            if sys.platform == "linux":
                children.die_with_parent()
            slot.enter()

        proc = subprocess.Popen(
            [sys.executable, "-m", "dtcli.cli", *job.argv],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,  # a terminal's Ctrl-C reaches the sweep, which forwards it
            preexec_fn=in_child,
        )
        index = job.trial.index
        self._running[index] = _Running(job, slot, proc)
        how = "resuming" if job.resume else "starting"
        self.say(f"sweep: trial {index} ({job.trial.shown()}): {how} (pid {proc.pid})")
        for stream in (proc.stdout, proc.stderr):
            threading.Thread(
                target=children.pump, args=(index, stream, self._lines), daemon=True
            ).start()

    def _step(self) -> list[Slot]:
        """Relay what came in; returns the slots of the trials that ended."""
        try:
            index, line = self._lines.get(timeout=0.1)
        except queue.Empty:
            return []
        running = self._running[index]
        if line is not None:
            if line.startswith("error: "):
                running.last_error = line
            if self.relay or line.startswith("error: "):
                self.say(f"[trial {index}] {line}")
            return []
        running.open_streams -= 1
        if running.open_streams:
            return []
        code = running.proc.wait()
        del self._running[index]
        status = status_of(code)
        self.say(f"sweep: trial {index}: {status} ({children.describe_exit(code)})")
        self.ended(running.job.trial, status, running.last_error)
        return [running.slot]
