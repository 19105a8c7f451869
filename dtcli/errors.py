"""The exceptions users see, each reported in one line, their exit codes, and the one rule that
turns any exception into that line (`one_line`, `printed`)."""

from __future__ import annotations

import contextlib
import re
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any


class UsageError(Exception):
    """Bad input from the user. The CLI prints `error: <message>` and exits with code 2.

    The message names the recipe key or command-line argument at fault and what was expected.
    """

    exit_code = 2


class TrainingError(Exception):
    """Training stopped for a reason the user must act on (a non-finite loss). Exit code 1."""

    exit_code = 1


class Stopped(Exception):
    """The run stopped on request (Ctrl-C, a preemption), having saved what it could: not an
    error. The CLI prints the message without `error:` and exits with `exit_code`."""

    exit_code = 130


class Preempted(BaseException):
    """SIGTERM while a run is set up or wound down (outside the loop, which saves instead), or
    while prepare-text writes its shards (it removes them).

    A BaseException, as KeyboardInterrupt is: raised from a signal handler into whatever code
    runs, it must not be caught by that code's `except Exception` (TensorFlow's import turned
    it into a TypeError; a layer check reported it as a bad recipe)."""

    exit_code = 143


@contextlib.contextmanager
def cleaned_up_on_stop(message: str, clean_up: Callable[[], None]) -> Iterator[None]:
    """Work that leaves nothing when it fails or is stopped (prepare-text, import-hf): on any
    exception, Ctrl-C included, `clean_up` runs, a second SIGTERM ignored meanwhile. SIGTERM (a
    scheduler's stop) is raised as Preempted(message) (one line, exit 143): Python's default
    handler would end the process without the clean-up. Signal handlers exist only in the main
    thread; elsewhere SIGTERM keeps its handler."""
    main = threading.current_thread() is threading.main_thread()
    stopped = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopped
        stopped = True
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one: the clean-up goes on
        raise Preempted(message)

    previous = signal.signal(signal.SIGTERM, stop) if main else None
    try:
        yield
    except BaseException as exc:
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        clean_up()
        if stopped and not isinstance(exc, Preempted):
            # Raised inside a TensorFlow callback it came back as another error: still the stop.
            raise Preempted(message) from None
        raise
    finally:
        if main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


# Exit codes a script or scheduler can act on (1: training fault, 2: bad input).
INTERRUPTED_EXIT = 130  # Ctrl-C: a checkpoint of the current step was written
# SIGTERM (a scheduler's preemption notice): a checkpoint of the current step was written, or
# the grace period ran out and the last complete one stands; requeue and resume. 128 + 15, the
# code a shell reports for SIGTERM, which Kubeflow's ExitCode restart policy treats as retryable.
PREEMPTED_EXIT = 143


class Interrupted(Stopped):
    """Ctrl-C or SIGTERM: a checkpoint was written at the current step.

    `again`: the command that resumes the run (default `dtcli train --resume RUN_DIR`; a launched
    client names `dtcli launch`)."""

    def __init__(
        self,
        checkpoint: Path | None,
        run_dir: Path | None,
        saved: bool = True,
        preempted: bool = False,
        message: str | None = None,
        again: str | None = None,
    ):
        what = f"saved {checkpoint}" if saved else f"nothing new to save (last: {checkpoint})"
        head = "preempted (SIGTERM)" if preempted else "interrupted"
        self.exit_code = PREEMPTED_EXIT if preempted else INTERRUPTED_EXIT
        again = again or f"dtcli train --resume {run_dir}"
        super().__init__(message or f"{head}; {what}; resume with: {again}")


# The longest one-line rendering of an exception's message: a line on a terminal or in a log,
# long enough for a path and a reason.
ONE_LINE_LIMIT = 300
# TensorFlow's framing around an op error's cause ("{{function_node __inference_...}}").
_FUNCTION_NODE = re.compile(r"\{\{function_node [^}]*\}\}\s*")
# ... and after it, the op that raised it (" [Op:ReduceDataset] name: "), which says nothing to a
# user.
_OP_SUFFIX = re.compile(r"\s*\[Op:\w+\](?: name: \S*)?[ \t]*$", re.M)


def one_line(exc: BaseException, named: bool = False, text: str | None = None) -> str:
    """An exception as one line: the first line of its message (TensorFlow's `.message` where it
    has one, without the `{{function_node ...}}` framing), at most ONE_LINE_LIMIT characters; the
    type's name when the message is empty. `named`: `TypeName: first line` (or `TypeName`).
    `text`: the part of the message that matters, where the caller knows better (a Keras layer's
    wrapped error, a tf.data iterator's cause), rendered by the same rule."""
    if text is None:
        text = getattr(exc, "message", None) or str(exc)
    text = _OP_SUFFIX.sub("", _FUNCTION_NODE.sub("", text))
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    first = lines[0][:ONE_LINE_LIMIT] if lines else ""
    if not first:
        return type(exc).__name__
    return f"{type(exc).__name__}: {first}" if named else first


def printed(exc: BaseException) -> str:
    """The line the command line prints for an exception that ends a command (train.log keeps
    the same line): a stop that saved what it could as it is, anything else `error: ...`.
    (The command line adds a hint to run again with --debug to an unexpected one.)"""
    if isinstance(exc, (Stopped, Preempted)):
        return str(exc)
    if isinstance(exc, (UsageError, TrainingError)):
        return f"error: {exc}"
    if isinstance(exc, KeyboardInterrupt):
        return "error: interrupted"
    return f"error: {one_line(exc, named=True)}"
