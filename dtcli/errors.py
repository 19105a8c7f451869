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
