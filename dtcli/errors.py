"""The one exception type users see: a bad recipe, argument or input, reported in one line."""

from __future__ import annotations


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
    """SIGTERM while a run is set up or wound down (outside the loop, which saves instead).

    A BaseException, as KeyboardInterrupt is: raised from a signal handler into whatever code
    runs, it must not be caught by that code's `except Exception` (TensorFlow's import turned
    it into a TypeError; a layer check reported it as a bad recipe)."""

    exit_code = 143


# Exit codes a script or scheduler can act on (1: training fault, 2: bad input).
INTERRUPTED_EXIT = 130  # Ctrl-C: a checkpoint of the current step was written
# SIGTERM (a scheduler's preemption notice): a checkpoint of the current step was written, or
# the grace period ran out and the last complete one stands; requeue and resume. 128 + 15, the
# code a shell reports for SIGTERM, which Kubeflow's ExitCode restart policy treats as retryable.
PREEMPTED_EXIT = 143
