"""The command line's edges that are not commands: Click's usage errors in dtcli's words, a
closed stdout pipe, shell completion with a SHELL argument, Typer's help panels, Python warnings.
cli/ builds the app from these; nothing here imports a command."""

from __future__ import annotations

import sys
from typing import Any

import typer
from typer.core import TyperGroup

from dtcli import runlog
from dtcli.errors import UsageError


class ClosedPipe(Exception):
    """stdout's reader went away (a BrokenPipeError), carried past Click, which turns that into
    exit 1; run() ends quietly with 0."""


class Group(TyperGroup):
    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:
            raise ClosedPipe from exc


SHELLS = ("bash", "zsh", "fish", "powershell", "pwsh")
COMPLETION_OPTIONS = ("--install-completion", "--show-completion")
AUTO_SHELL = "auto"  # what a completion option given no SHELL gets (see run)


def flags_without_placeholder() -> None:
    """Typer's help panels show `<bool>` beside every flag (--help included), which takes no
    value: show nothing there, as Click's plain help does."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "dtcli", False):
        return

    def display_type_rich(self: Any, ctx: Any) -> str | None:
        return None if self.is_flag else shown(self, ctx)

    display_type_rich.dtcli = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich


def completion(ctx: Any, param: Any, value: str | None) -> None:
    """--show-completion [SHELL] prints SHELL's completion script, --install-completion [SHELL]
    installs it (no SHELL: the current one)."""
    if value is None or ctx.resilient_parsing:
        return
    from typer import completion as typer_completion

    option = param.opts[0]
    shell = value.strip().lower()
    if shell == AUTO_SHELL:
        shell = typer_completion._get_shell_name() or ""
        if shell not in SHELLS:
            raise UsageError(f"{option}: could not tell the current shell; name it: {option} zsh")
    elif shell not in SHELLS:
        raise UsageError(f"{option} {value!r}: expected {', '.join(SHELLS)} (or nothing)")
    typer_completion.completion_init()
    var = "_DTCLI_COMPLETE"
    if option == "--show-completion":
        script = typer_completion.get_completion_script
        print(script(prog_name="dtcli", complete_var=var, shell=shell))
    else:
        shell, path = typer_completion.install(shell=shell, prog_name="dtcli", complete_var=var)
        print(f"{shell} completion installed in {path}; it takes effect in a new terminal")
    raise typer.Exit(0)


def quiet_python_warnings() -> None:
    """Library warnings (tf-keras, TensorFlow's Python logger) are for --debug; the user sees
    dtcli's own lines."""
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    logging.getLogger("absl").setLevel(logging.ERROR)


def usage_line(exc: Exception) -> str:
    """Click's usage error as one line; a value an option's type refuses (`--epochs abc`) in
    dtcli's words: the option, the value, what was expected."""
    param, cause = getattr(exc, "param", None), exc.__cause__
    if type(exc).__name__ == "MissingParameter" and param is not None:
        return missing_line(param)
    errors = cause.errors() if hasattr(cause, "errors") else []
    if param is not None and getattr(param, "opts", None) and errors:
        expected = {"int": "an integer", "float": "a number"}.get(errors[0]["type"].split("_")[0])
        if expected is not None:
            name = max(param.opts, key=len)
            return f"{name} {str(errors[0].get('input'))!r}: expected {expected}"
    return exc.format_message().replace("\n", " ")


def missing_line(param: Any) -> str:
    """A required argument or option not given, named as --help shows it, with its help:
    `CHECKPOINT: missing; expected a run directory or one checkpoint folder`."""
    if getattr(param, "param_type_name", "") == "option":
        name = max(param.opts, key=len)
    else:
        name = (param.name or "argument").upper()
    text = (getattr(param, "help", None) or "").strip().rstrip(".")
    if not text:
        return f"{name}: missing"
    return f"{name}: missing; expected {text[0].lower()}{text[1:]}"


def completion_shells(args: list[str]) -> list[str]:
    """`--show-completion` and `--install-completion` take an optional SHELL (Click's options
    cannot): one given none gets AUTO_SHELL, the current shell."""
    out: list[str] = []
    for i, arg in enumerate(args):
        out.append(arg)
        if arg in COMPLETION_OPTIONS and (i + 1 == len(args) or args[i + 1].startswith("-")):
            out.append(AUTO_SHELL)
    return out


def stdout_to_devnull() -> None:
    """A closed pipe on stdout: what is left unwritten goes nowhere, so that Python's flush at
    exit does not fail once more ("Exception ignored ... BrokenPipeError")."""
    runlog.to_devnull(sys.stdout)


def check_given_once(app: Any, args: list[str]) -> None:
    """An option that takes one value, given twice (`--mesh batch=4 --mesh model=2`): Click keeps
    the last one silently; dtcli refuses it, naming both."""
    options = [a.partition("=")[0] for a in args if a.startswith("--")]
    if len(options) == len(set(options)):  # nothing repeated: no need to build Click's command
        return
    command = typer.main.get_command(app)
    name = next((a for a in args if not a.startswith("-")), None)
    sub = getattr(command, "commands", {}).get(name) if name else None
    if sub is None:
        return
    for param in sub.params:
        if getattr(param, "multiple", False) or getattr(param, "is_flag", False):
            continue
        for opt in (o for o in param.opts if o.startswith("--")):
            values = [
                args[i + 1] if a == opt and i + 1 < len(args) else a.partition("=")[2]
                for i, a in enumerate(args)
                if a == opt or a.startswith(opt + "=")
            ]
            if len(values) > 1:
                given = ", then ".join(repr(v) for v in values)
                raise UsageError(f"{opt}: given {len(values)} times ({given}); give it once")
