"""The command line: each command loads its input and calls one library function.

TensorFlow is imported only inside commands that need it, so `dtcli --help` and `dtcli plot`
answer at once. Every failure ends in one `error:` line: bad input exits 2, a fault after training
started 1, Ctrl-C 130, SIGTERM (a scheduler's preemption: checkpoint written) 143; `--debug` (or
DTCLI_DEBUG=1) adds the full traceback.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import typer

from dtcli import terminal
from dtcli.errors import INTERRUPTED_EXIT, Preempted, Stopped, TrainingError, UsageError, printed

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
DEBUG_ENV = "DTCLI_DEBUG"
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


SetOption = typer.Option(
    None, "--set", help="Override a recipe key: --set optimizer.learning_rate=3e-4 (repeatable)."
)
MeshOption = typer.Option(None, "--mesh", help="Mesh axes, like batch=4,model=2 (one may be -1).")
DevicesOption = typer.Option(None, "--devices", help="cpu, cpu:N, gpu, gpu:N, tpu or auto.")
EpochsOption = typer.Option(
    None, "--epochs", help="Override train.epochs (the total, also with --resume)."
)
OutOption = typer.Option(None, "--out", help="Run directory (default runs/NAME-TIME).")
NoProgressOption = typer.Option(False, "--no-progress", help="No live progress bar.")
ConnectTimeoutOption = typer.Option(
    60.0,
    "--connect-timeout",
    help="Seconds a client waits for the others to answer before it gives up.",
)


MemoryOption = typer.Option(
    None,
    "--memory",
    help="Memory budget per device, like 16GiB, 512MiB, 1.5GB or bytes (default: the device's "
    "own, where TensorFlow reports it); a plan over it is refused (exit 2), by train before "
    "anything is allocated.",
)
NoMemoryCheckOption = typer.Option(
    False, "--no-memory-check", help="Train even where the memory plan does not fit."
)


GraceOption = typer.Option(
    30.0,
    "--grace-period",
    help="Seconds from a SIGTERM (a scheduler's preemption notice) to exit: the run saves "
    "at the end of the current call and exits 143; if that takes longer, it exits 143 then "
    "and the last complete checkpoint stands.",
)


ProfileOption = typer.Option(
    None,
    "--profile",
    help="START:STOP: write a TensorBoard profiler trace of optimizer steps START to STOP "
    "into RUN_DIR/tensorboard (at call boundaries: K steps a call; client 0's in a launch).",
)


def _check_grace(seconds: float) -> None:
    if not 1 <= seconds <= 86400:
        raise UsageError(
            f"--grace-period {seconds:g}: expected seconds, at least 1 and at most 86400 (a day)"
        )


def _overrides(
    sets: list[str] | None, mesh: str | None, devices: str | None, epochs: int | None = None
) -> Any:
    """The command line's recipe overrides, as one recipe.Overrides."""
    from dtcli.recipe import Overrides

    return Overrides(tuple(sets or ()), mesh, devices, epochs)


def _console() -> Any:
    """A rich console on stdout that leaves a closed pipe (`dtcli plan ... | head -3`) to run()
    as a BrokenPipeError: rich's own answer is exit 1."""
    from rich.console import Console

    class PipedConsole(Console):
        def on_broken_pipe(self) -> None:
            self.quiet = True
            raise BrokenPipeError

    return PipedConsole(soft_wrap=True)


def _check_folders(**given: str | None) -> None:
    """An empty --out/--resume would silently mean the default (or the current folder)."""
    for name, value in given.items():
        if value is not None and not value.strip():
            raise UsageError(f"--{name} {value!r}: expected a folder")


def _check_timeout(seconds: float) -> None:
    if not seconds > 0:
        raise UsageError(f"--connect-timeout {seconds:g}: expected a positive number of seconds")


def _profile_steps(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    import re

    found = re.fullmatch(r"\s*(\d+)\s*:\s*(\d+)\s*", text)
    if found is None or not 1 <= int(found.group(1)) <= int(found.group(2)):
        raise UsageError(
            f"--profile {text!r}: expected START:STOP, optimizer steps with 1 <= START <= STOP "
            "(like 10:20)"
        )
    return int(found.group(1)), int(found.group(2))


@app.command()
def train(
    recipe: str | None = typer.Argument(None, help="The recipe YAML file."),
    sets: list[str] | None = SetOption,
    mesh: str | None = MeshOption,
    devices: str | None = DevicesOption,
    epochs: int | None = EpochsOption,
    out: str | None = OutOption,
    resume: str | None = typer.Option(
        None, "--resume", help="Continue RUN_DIR from its latest checkpoint (on any mesh)."
    ),
    no_progress: bool = NoProgressOption,
    client_id: int | None = typer.Option(
        None, "--client-id", help="This client's index in --jobs (multi-client runs)."
    ),
    jobs: str | None = typer.Option(
        None,
        "--jobs",
        help="host:port of every client, in client-id order: one DTensor multi-client run "
        "(default: DTENSOR_JOBS; the client count is the length of the list).",
    ),
    connect_timeout: float = ConnectTimeoutOption,
    profile: str | None = ProfileOption,
    grace_period: float = GraceOption,
    memory: str | None = MemoryOption,
    no_memory_check: bool = NoMemoryCheckOption,
) -> None:
    """Train a recipe on a DTensor mesh and write a run directory."""
    from dtcli import cluster as cluster_lib
    from dtcli import devices as devices_lib
    from dtcli import memory as memory_lib
    from dtcli import progress as progress_lib
    from dtcli import rundir
    from dtcli import train as train_lib

    _check_folders(out=out, resume=resume)
    cluster = cluster_lib.from_args(client_id, jobs)
    _check_timeout(connect_timeout)
    _check_grace(grace_period)
    steps = _profile_steps(profile)
    budget = memory_lib.budget_from_args(memory, no_memory_check)
    loaded = rundir.command_recipe(
        recipe,
        out,
        resume,
        _overrides(sets, mesh, devices, epochs),
        chief=cluster is None or cluster.is_chief,
    )
    result = train_lib.train(
        loaded,
        out=out,
        resume=resume,
        progress=not no_progress,
        cluster=cluster,
        connect_timeout=connect_timeout,
        grace=grace_period,
        profile=steps,
        devices_key=devices_lib.key_for(devices),
        memory=budget,
    )
    if not progress_lib.launched() and (cluster is None or cluster.is_chief):
        print(result.run_dir)  # stdout: for scripts, RUN=$(dtcli train ...)


@app.command()
def launch(
    recipe: str | None = typer.Argument(None, help="The recipe YAML file."),
    clients: int = typer.Option(..., "--clients", help="How many client processes to start."),
    devices_per_client: str | None = typer.Option(
        None,
        "--devices-per-client",
        help="Devices of each client, like cpu:4 (default: the recipe's devices split evenly).",
    ),
    port: int | None = typer.Option(
        None, "--port", help="First job port; client i uses PORT+i (default: free ports)."
    ),
    sets: list[str] | None = SetOption,
    mesh: str | None = MeshOption,
    epochs: int | None = EpochsOption,
    out: str | None = OutOption,
    resume: str | None = typer.Option(
        None, "--resume", help="Continue RUN_DIR from its latest checkpoint."
    ),
    no_progress: bool = NoProgressOption,
    connect_timeout: float = ConnectTimeoutOption,
    profile: str | None = ProfileOption,
    grace_period: float = GraceOption,
    memory: str | None = MemoryOption,
    no_memory_check: bool = NoMemoryCheckOption,
) -> None:
    """Run a recipe as N local DTensor clients on loopback (a multi-client run on one host)."""
    from dtcli import launch as launch_lib
    from dtcli import memory as memory_lib

    _check_folders(out=out, resume=resume)
    _check_timeout(connect_timeout)
    _check_grace(grace_period)
    steps = _profile_steps(profile)
    launch_plan = launch_lib.plan(
        recipe,
        clients,
        devices_per_client,
        _overrides(sets, mesh, None, epochs),
        out=out,
        resume=resume,
        port=port,
        connect_timeout=connect_timeout,
        grace=grace_period,
        profile=steps,
        memory=memory_lib.budget_from_args(memory, no_memory_check),
    )
    print(launch_lib.run(launch_plan, progress=not no_progress))


@app.command("eval")
def eval_(
    checkpoint: str = typer.Argument(
        ..., help="A run directory (its latest checkpoint) or one checkpoint folder."
    ),
    split: str = typer.Option("eval", "--split", help="eval or train."),
    mesh: str | None = MeshOption,
    devices: str | None = DevicesOption,
    batch_size: int | None = typer.Option(None, "--batch-size", help="Evaluation batch size."),
    sets: list[str] | None = SetOption,
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on the last line."),
    no_progress: bool = typer.Option(
        False, "--no-progress", help="As train's (eval draws no bar: it prints its result only)."
    ),
) -> None:
    """Evaluate a checkpoint, on the mesh it was trained on or another one."""
    from dtcli import evaluate as evaluate_lib

    result = evaluate_lib.evaluate_path(
        checkpoint, split, _overrides(sets, mesh, devices), batch_size
    )
    if as_json:
        import json

        print(json.dumps(result))
        return
    evaluate_lib.render(result, _console())


@app.command()
def generate(
    checkpoint: str = typer.Argument(
        ..., help="A language model's run directory (its latest checkpoint) or one checkpoint."
    ),
    prompt: list[str] | None = typer.Option(
        None,
        "--prompt",
        help="The text to continue (default: a newline); repeat it for several prompts, "
        "generated together.",
    ),
    prompts_file: str | None = typer.Option(
        None, "--prompts", help="A file of prompts, one a line (blank lines skipped)."
    ),
    tokens: int = typer.Option(200, "--tokens", help="How many new tokens per prompt."),
    temperature: float = typer.Option(
        1.0, "--temperature", help="Softmax temperature; 0: greedy (the most likely token)."
    ),
    top_k: int | None = typer.Option(None, "--top-k", help="Sample among the K most likely."),
    top_p: float | None = typer.Option(
        None,
        "--top-p",
        help="Sample among the fewest most likely tokens whose probabilities add up to P "
        "(nucleus; 0 < P <= 1).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the sampling (same seed, same text)."),
    no_cache: bool = typer.Option(
        False,
        "--no-cache",
        help="Run the whole window for every token instead of the KV cache (same greedy text; "
        "for comparison and debugging).",
    ),
    mesh: str | None = MeshOption,
    devices: str | None = DevicesOption,
) -> None:
    """Generate text from a language model checkpoint: the new text on stdout (a block per
    prompt when there are several), tokens/s on stderr."""
    from dtcli import generate as generate_lib

    prompts = generate_lib.read_prompts(prompt, prompts_file)
    settings = generate_lib.Settings(tokens, temperature, top_k, top_p, seed, not no_cache)
    generate_lib.check_options(settings)  # before the model is built
    generator = generate_lib.Generator(checkpoint, mesh=mesh, devices=devices)
    generate_lib.write(generator, prompts, settings, sys.stdout, sys.stderr)


@app.command()
def export(
    checkpoint: str = typer.Argument(..., help="A run directory or one checkpoint folder."),
    out: str = typer.Option(..., "--out", help="Folder for the SavedModel."),
) -> None:
    """Export a checkpoint as a SavedModel serving plain tensors on one device."""
    from dtcli import export as export_lib

    print(export_lib.export_path(checkpoint, out))


@app.command()
def plan(
    recipe: str = typer.Argument(..., help="The recipe YAML file."),
    sets: list[str] | None = SetOption,
    mesh: str | None = MeshOption,
    devices: str | None = DevicesOption,
    as_json: bool = typer.Option(False, "--json", help="Print the plan as one JSON object."),
    memory: str | None = MemoryOption,
    auto: bool = typer.Option(
        False, "--auto", help="Search meshes x layouts under --memory, best predicted first."
    ),
    top: int | None = typer.Option(None, "--top", help="--auto: show and measure the best N."),
    measure: int | None = typer.Option(
        None, "--measure", help="--auto: train each shown candidate K steps and time them."
    ),
    write: str | None = typer.Option(None, "--write", help="--auto: the chosen as a recipe."),
    plot_file: str | None = typer.Option(None, "--plot", help="--auto: the ranking as a PNG."),
    recalibrate: bool = typer.Option(
        False, "--recalibrate", help="--auto: probe the devices again, not the cached rates."
    ),
) -> None:
    """Show where every weight lives on the mesh and what each device holds; trains nothing.
    With --auto: the meshes and layouts that fit, ranked by a calibrated cost model."""
    from dtcli import autoplan
    from dtcli import memory as memory_lib
    from dtcli import plan as plan_lib
    from dtcli import recipe as recipe_lib

    budget = memory_lib.budget_from_args(memory)
    opts = autoplan.options(auto, mesh, top, measure, write, plot_file, as_json, recalibrate)
    if opts is not None:
        autoplan.run(recipe, _overrides(sets, None, devices), opts, budget, _console())
        return
    loaded = recipe_lib.load(recipe, _overrides(sets, mesh, devices))
    report = plan_lib.make_report(loaded, budget)
    if as_json:
        import json

        print(json.dumps(report.to_json()))
    else:
        plan_lib.render(report, _console())
    plan_lib.refuse_over_budget(report)  # after the plan: it shows what does not fit


@app.command()
def config(
    recipe: str | None = typer.Argument(None, help="The recipe YAML file."),
    sets: list[str] | None = SetOption,
    mesh: str | None = MeshOption,
    devices: str | None = DevicesOption,
    schema: bool = typer.Option(
        False,
        "--schema",
        help="Print the recipes' JSON schema instead (a RECIPE given is checked first).",
    ),
) -> None:
    """Print the resolved recipe (bases merged, ${VAR}s filled, overrides and defaults applied)."""
    from dtcli import recipe as recipe_lib

    if recipe is None and not schema:
        raise UsageError("RECIPE: give a recipe file (or --schema)")
    if recipe is not None:  # with --schema too: the recipe is checked against it first
        loaded = recipe_lib.load(recipe, _overrides(sets, mesh, devices))
        recipe_lib.check_mesh_on_devices(loaded)  # as train does, before any device exists
    elif sets or mesh or devices:
        raise UsageError("--set, --mesh and --devices need a RECIPE")
    if schema:
        import json

        print(json.dumps(recipe_lib.schema(), indent=2))
        return
    sys.stdout.write(recipe_lib.dump(loaded))


@app.command()
def doctor(
    devices: str | None = typer.Option(
        None, "--devices", help="Devices to probe (default: gpu if any, else cpu:8)."
    ),
) -> None:
    """Check versions, devices, DTensor flags, and that 1 device and a mesh give equal numbers."""
    from dtcli import doctor as doctor_lib

    checks = doctor_lib.run(devices)
    doctor_lib.render(checks, _console())
    failed = [c.name for c in checks if not c.ok]
    if failed:
        print(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}", file=sys.stderr)
        raise typer.Exit(1)


@app.command()
def plot(
    run_dirs: list[str] = typer.Argument(..., help="One or more run directories."),
    out: str | None = typer.Option(
        None,
        "--out",
        help="Folder for the PNGs (default RUN_DIR/plots for one run, ./plots for several).",
    ),
    metric: list[str] | None = typer.Option(
        None,
        "--metric",
        help="loss, accuracy, step_loss, examples_per_sec; language models also perplexity, "
        "bpb, tokens_per_sec, learning_rate, grad_norm (repeatable).",
    ),
) -> None:
    """Draw the metric curves of one or more runs (overlaid when several)."""
    from dtcli import rundir, storage
    from dtcli.plot import plot_runs

    paths = [storage.as_path(r) for r in run_dirs]
    if out is None and len(paths) == 1:  # the default: name the run the user gave
        rundir.check_plots(run_dirs[0])
    target = storage.as_path(out) if out else (paths[0] / "plots" if len(paths) == 1 else "plots")
    out_arg = "--out" if out else "the default --out"
    for path in plot_runs(paths, target, metric or None, out_arg=out_arg):
        print(path)


@app.command("prepare-text")
def prepare_text(
    source: str = typer.Argument(
        ..., help="A text file, a folder or a glob of them, or tfds:NAME (a TFDS text data set)."
    ),
    out: str = typer.Option(..., "--out", help="A new (or empty) folder for the shards."),
    tokenizer: str = typer.Option(
        "bytes",
        "--tokenizer",
        help="bytes, bpe:N (a byte-level BPE of N ids trained on the training split), or a "
        "tokenizer.json (or a folder holding one: a hub model's, a run's).",
    ),
    eval_fraction: float = typer.Option(
        0.1, "--eval-fraction", help="Files: the last part of their bytes kept for evaluation."
    ),
    shard_tokens: int = typer.Option(1 << 20, "--shard-tokens", help="Token ids per shard."),
    train_split: str = typer.Option("train", "--train-split", help="tfds: the training split."),
    eval_split: str = typer.Option("test", "--eval-split", help="tfds: the evaluation split."),
    data_dir: str | None = typer.Option(None, "--data-dir", help="tfds: its data folder."),
    download: bool = typer.Option(False, "--download", help="tfds: download and prepare it."),
) -> None:
    """Tokenize text into the binary shards `data.source: tokens` streams (never all in memory).
    A failure, Ctrl-C (exit 130) or SIGTERM (exit 143) leaves nothing of --out behind."""
    from dtcli.data import prepare

    tfds = prepare.TfdsOptions(train_split, eval_split, data_dir, download)
    index = prepare.prepare_text(source, tokenizer, out, eval_fraction, shard_tokens, tfds)
    for split, info in index["splits"].items():
        per = info["bytes"] / max(info["tokens"], 1)
        docs, shards = info["documents"], len(info["shards"])
        print(
            f"{split}: {info['tokens']:,} tokens ({per:.2f} bytes each) of {docs:,} "
            f"document{'s' * (docs != 1)} in {shards:,} shard{'s' * (shards != 1)}"
        )
    print(f"{out}: {index['dtype']} ids of {index['tokenizer']}")


def run(argv: list[str] | None = None) -> int:
    """Run one command line in this process and return its exit code (main() exits with it).

    No traceback reaches the user without --debug: bad input is one `error:` line and exit 2,
    a fault after training started (a full disk, a non-finite loss) one line and exit 1, any
    other exception (a bug, an error in user model code) one line naming its type and exit 1.
    """
    import traceback

    try:  # typer >= 0.25 carries its own copy of click
        from typer._click.exceptions import NoArgsIsHelpError
        from typer._click.exceptions import UsageError as ArgumentError
    except ImportError:
        from click.exceptions import NoArgsIsHelpError
        from click.exceptions import UsageError as ArgumentError

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
        return fail(f"{printed(exc)} (unexpected; run again with --debug for the traceback)", 1)
    return code if isinstance(code, int) else 0


def main() -> None:
    """The console script."""
    code = run()
    try:
        sys.stdout.flush()  # what is still buffered meets a closed pipe here
    except BrokenPipeError:
        terminal.stdout_to_devnull()
    sys.exit(code)


if __name__ == "__main__":
    main()
