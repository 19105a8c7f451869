"""One command line run in this process: its exit code, and one `error:` line per failure."""

from __future__ import annotations

import os
import signal
import sys
import threading

import typer

from dtcli import terminal
from dtcli.cli.app import app
from dtcli.errors import INTERRUPTED_EXIT, Preempted, Stopped, TrainingError, UsageError, printed

DEBUG_ENV = "DTCLI_DEBUG"


# What a command may leave set for the rest of its process (see run).
PROCESS_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def run(argv: list[str] | None = None) -> int:
    """Run one command line in this process and return its exit code.

    The process goes on after it (a test, a script calling dtcli): SIGINT's and SIGTERM's
    handlers are left as they were found. (A complete run ignores both until its process exits,
    main(): the exit code is decided.)"""
    if threading.current_thread() is not threading.main_thread():
        return command_line(argv)
    found = {sig: signal.getsignal(sig) for sig in PROCESS_SIGNALS}
    try:
        return command_line(argv)
    finally:
        for sig, handler in found.items():
            if handler is not None:  # None: set outside Python, nothing to put back
                signal.signal(sig, handler)


def command_line(argv: list[str] | None = None) -> int:
    """One command line and its exit code (main() exits with it).

    No traceback reaches the user without --debug: bad input is one `error:` line and exit 2,
    a fault after training started (a full disk, a non-finite loss) one line and exit 1, any
    other exception (a bug, an error in user model code) one line naming its type and exit 1.
    """
    import traceback

    NoArgsIsHelpError, ArgumentError = _click_errors()
    args = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get(DEBUG_ENV, "") not in ("", "0") or "--debug" in args
    args = terminal.completion_shells([a for a in args if a != "--debug"])
    if debug:
        # TensorFlow is not imported yet: its native errors and warnings are shown too.
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "1"
    else:
        terminal.quiet_python_warnings()

    def fail(line: str, code: int) -> int:
        if debug:
            traceback.print_exc()
        print(line, file=sys.stderr)
        return code

    try:
        terminal.check_given_once(app, args)
        code = app(args, standalone_mode=False, prog_name="dtcli")
    except NoArgsIsHelpError:
        app(["--help"], standalone_mode=False, prog_name="dtcli")
        return 2
    except ArgumentError as exc:  # unknown option, missing argument, bad value
        return fail("error: " + terminal.usage_line(exc), exc.exit_code)
    except (UsageError, TrainingError) as exc:
        return fail(printed(exc), exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):  # Ctrl-C outside training's own handling
        return fail(printed(KeyboardInterrupt()), INTERRUPTED_EXIT)
    except (Stopped, Preempted) as exc:  # Ctrl-C or SIGTERM that saved what it could: no error
        print(printed(exc), file=sys.stderr)
        return exc.exit_code
    except (BrokenPipeError, terminal.ClosedPipe):  # `dtcli plan ... | head -3`: the reader is done
        terminal.stdout_to_devnull()
        return 0
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: one line, exit 1
        if _interrupted(exc):
            return fail(printed(KeyboardInterrupt()), INTERRUPTED_EXIT)
        hint = "its traceback is above" if debug else "run again with --debug for the traceback"
        return fail(f"{printed(exc)} (unexpected; {hint})", 1)
    if code == INTERRUPTED_EXIT:
        # Typer turns a Ctrl-C that reaches it (one before training's own handler is set: an
        # import, the session's build) into a silent return of 130.
        print(printed(KeyboardInterrupt()), file=sys.stderr)
    return code if isinstance(code, int) else 0


def _click_errors() -> tuple[type[Exception], type[Exception]]:
    """Click's no-arguments-is-help and usage errors (typer >= 0.25 carries its own click)."""
    try:
        from typer._click.exceptions import NoArgsIsHelpError, UsageError
    except ImportError:
        from click.exceptions import NoArgsIsHelpError, UsageError
    return NoArgsIsHelpError, UsageError


def _interrupted(exc: BaseException) -> bool:
    """A Ctrl-C raised while TensorFlow's C++ called back into Python (a tensor's `__array__`)
    comes back as a SystemError ("returned a result with an exception set") caused by the
    KeyboardInterrupt: it is the user's Ctrl-C all the same (seen in one-device generate)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def main() -> None:
    """The console script: what a command leaves set for the rest of the process stays (a
    complete run ignores SIGINT and SIGTERM until it exits, with 0)."""
    code = command_line()
    try:
        sys.stdout.flush()  # what is still buffered meets a closed pipe here
    except BrokenPipeError:
        terminal.stdout_to_devnull()
    sys.exit(code)
