"""Stopping a run on a signal: SIGTERM while the run is set up (at once, as an exception), Ctrl-C
or SIGTERM in the loop (after the current call, which then checkpoints), a multi-client run's
preemption (agreed by all clients), and the grace period after a SIGTERM."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from typing import Any

from dtcli.errors import PREEMPTED_EXIT, Preempted, Stopped

# Seconds between a SIGTERM and this process' exit (schedulers send SIGKILL after their own).
DEFAULT_GRACE = 30.0


class SigtermOutsideTheLoop:
    """SIGTERM while the run is set up (or wound down): stop at once as an exception, so that a
    new run without a checkpoint is removed and a resume left as it was, exit 143. (In the loop
    StopOnSignal takes over and saves; in a multi-client run TensorFlow's runtime takes the
    signal once it has started, see PreemptionWatch.)

    `deferred()`: while the run folder is made and locked the exception waits (Python runs
    signal handlers in the main thread, whichever thread the signal reached), so that the
    clean-up sees what to remove.

    `until_exit` (the command line's run, whose process ends with it): once the run is
    complete, SIGINT and SIGTERM stay ignored after the block, until the process exits, instead
    of the handlers found before it (Python's default ones turned a SIGTERM while the run
    directory was printed, or TensorFlow shut down, into 143: a scheduler would requeue a
    finished job)."""

    MESSAGE = (
        "preempted (SIGTERM) outside the training loop; nothing new was saved (a new run "
        "without a checkpoint is removed, an existing run keeps its checkpoints)"
    )

    def __init__(self, until_exit: bool = False) -> None:
        self.until_exit = until_exit
        self._holding = False
        self._pending = False
        self._complete = False
        self._previous: Any = None
        self._previous_int: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        if self._complete:
            return
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

    def complete(self) -> None:
        """The run is complete (trained, saved, its summary next): from here on a Ctrl-C or
        SIGTERM has nothing left to stop, and the command ends as it would have (exit 0)."""
        self._complete = True
        if threading.current_thread() is threading.main_thread():
            self._previous_int = signal.signal(signal.SIGINT, self._handle)

    def __enter__(self) -> SigtermOutsideTheLoop:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, kind: Any, *exc: Any) -> None:
        if self._complete and self.until_exit and kind is None and self._previous is not None:
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, signal.SIG_IGN)
            return
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
        if self._previous_int is not None:
            signal.signal(signal.SIGINT, self._previous_int)


@contextlib.contextmanager
def silent_stop(silent: bool) -> Iterator[None]:
    """A launched client other than 0 stops (Ctrl-C, a preemption) with its exit code but
    without a line of its own: client 0 and the launcher say it, once each."""
    try:
        yield
    except (Stopped, Preempted) as exc:
        if not silent:
            raise
        raise SystemExit(exc.exit_code) from None


class Deadline:
    """A preemption's grace period: once started, `grace` seconds until this process exits
    whatever it is doing (the scheduler's SIGKILL would come next), leaving the last complete
    checkpoint. Starting it again does not extend it."""

    def __init__(self, grace: float):
        self.grace = grace
        self._timer: Any = None

    def start(self) -> None:
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


class StopOnSignal:
    """The first Ctrl-C (SIGINT) or SIGTERM asks the loop to stop after the current call (it
    then checkpoints); a second Ctrl-C interrupts at once. SIGTERM is a scheduler's preemption
    notice: it also starts the grace period (Deadline)."""

    def __init__(self, grace: float = DEFAULT_GRACE):
        self.requested = False
        self.signal_name = ""
        self.deadline = Deadline(grace)

    def __call__(self) -> bool:
        return self.requested

    def __enter__(self) -> StopOnSignal:
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
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
        for sig, previous in self._previous.items():
            signal.signal(sig, previous)
        self.deadline.cancel()


# Where TensorFlow's multi-client runtime records a SIGTERM to any client (its own handler
# takes the signal and writes the notice into the coordination service's key-value store).
PREEMPTION_KEY = "TF_DEFAULT_PREEMPTION_NOTICE_KEY"


class PreemptionWatch:
    """A multi-client run's preemption: TensorFlow takes SIGTERM itself and records it in its
    coordination service, which every client can read. A thread polls for that notice; each
    train call carries every client's flag and returns their max (Packer.notices), so all
    clients learn of it after the same call, stop there and write one checkpoint together.
    From the notice, `grace` seconds until this process exits regardless."""

    signal_name = "SIGTERM"

    def __init__(self, grace: float = DEFAULT_GRACE):
        self.noticed = False  # this client has read the notice
        self.requested = False  # all clients agreed: stop after the call just run
        self.deadline = Deadline(grace)
        self._done = threading.Event()
        self._thread: Any = None

    def __call__(self) -> bool:
        return self.requested

    def agree(self) -> None:
        self.requested = True

    def __enter__(self) -> PreemptionWatch:
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
