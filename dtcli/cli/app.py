"""The Typer app: dtcli's global options (`--version`, `--debug`, completion) and its commands,
registered here in the order `dtcli --help` lists them. Each command lives in a module of this
package; none imports another."""

from __future__ import annotations

import typer

from dtcli import terminal
from dtcli.cli import checkpoint, doctor, plot, prepare_text, recipe, sweep, train

app = typer.Typer(
    cls=terminal.Group,
    help="Train neural networks on TensorFlow DTensor meshes from a YAML recipe.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # dtcli's own --install-completion/--show-completion (below): Typer's are flags, so that
    # `--show-completion zsh` printed the current shell's script and ignored zsh.
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
terminal.flags_without_placeholder()


def _print_version(value: bool) -> None:
    if value:
        import platform
        from importlib import metadata

        from dtcli import __version__

        parts = []
        for dist in ("tensorflow", "tf-keras"):  # read from metadata: no TensorFlow import
            try:
                parts.append(f"{dist} {metadata.version(dist)}")
            except metadata.PackageNotFoundError:
                parts.append(f"{dist} not installed")
        parts.append(f"python {platform.python_version()}")
        print(f"dtcli {__version__} ({', '.join(parts)})")
        raise typer.Exit(0)


@app.callback()
def _options(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print dtcli's version (and TensorFlow's, tf-keras', Python's) and exit.",
    ),
    debug: bool = typer.Option(
        False,
        "--debug",
        help="On any error, print the full traceback too (for bug reports; also DTCLI_DEBUG=1). "
        "May stand anywhere on the command line.",
    ),
    install_completion: str | None = typer.Option(
        None,
        "--install-completion",
        metavar="[SHELL]",
        callback=terminal.completion,
        is_eager=True,
        expose_value=False,
        help="Install completion for SHELL (bash, zsh, fish, powershell; default: this one).",
    ),
    show_completion: str | None = typer.Option(
        None,
        "--show-completion",
        metavar="[SHELL]",
        callback=terminal.completion,
        is_eager=True,
        expose_value=False,
        help="Print SHELL's completion script (default: this shell's), to copy or customize.",
    ),
) -> None:
    """Train neural networks on TensorFlow DTensor meshes from a YAML recipe."""


app.command()(train.train)
app.command()(train.launch)
app.command()(sweep.sweep)
app.command("eval")(checkpoint.eval_)
app.command()(checkpoint.generate)
app.command()(checkpoint.score)
app.command()(checkpoint.export)
app.command("import-hf")(checkpoint.import_hf)
app.command()(recipe.plan)
app.command()(recipe.config)
app.command()(doctor.doctor)
app.command()(plot.plot)
app.command("prepare-text")(prepare_text.prepare_text)
