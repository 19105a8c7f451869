"""`dtcli sweep`: one recipe trained once per trial of a grid or of random draws, ranked."""

from __future__ import annotations

import typer

from dtcli.cli.options import SetOption

DistributionsArgument = typer.Argument(
    None,
    help="With --random N: KEY=DIST for each key drawn, DIST uniform(a,b), loguniform(a,b), "
    "int(a,b) (inclusive) or choice(v1,v2,...).",
    show_default=False,
)
GridOption = typer.Option(
    None,
    "--grid",
    help="KEY=V1,V2,...: a swept key and its values (repeatable: the cross product). "
    "Commas inside [], {} or quotes do not split.",
)
RandomOption = typer.Option(
    None, "--random", help="N trials drawn from the KEY=DIST arguments (needs --seed)."
)
SweepOutOption = typer.Option(
    None,
    "--out",
    help="The sweep's folder (default runs/sweep-NAME-DIGEST: the same command, the same folder).",
)
NoRelayOption = typer.Option(
    False,
    "--no-progress",
    help="Relay only each trial's error line, not the rest of its output (the trials always "
    "run with --no-progress; the sweep's own lines stay).",
)
JobsOption = typer.Option(
    1,
    "--jobs",
    help="Trials at once: on CPUs each gets its share of the cores, on GPUs its share of the GPUs.",
)


def sweep(
    recipe: str = typer.Argument(..., help="The recipe YAML file."),
    distributions: list[str] | None = DistributionsArgument,
    grid: list[str] | None = GridOption,
    random: int | None = RandomOption,
    seed: int | None = typer.Option(None, "--seed", help="The seed of --random's draws."),
    sets: list[str] | None = SetOption,
    metric: str = typer.Option(
        "eval_loss", "--metric", help="The metrics.jsonl key that ranks the trials."
    ),
    mode: str | None = typer.Option(
        None, "--mode", help="min or max: which is better (default: by the metric's name)."
    ),
    rank: str = typer.Option(
        "last", "--rank", help="last: the last evaluation's value ranks; best: the best one."
    ),
    out: str | None = SweepOutOption,
    jobs: int = JobsOption,
    dry_run: bool = typer.Option(
        False, "--dry-run", help="List the trials and their folders; run and write nothing."
    ),
    no_progress: bool = NoRelayOption,
) -> None:
    """Train a recipe once per trial (a grid, or random draws), each in a fresh process, and
    rank the trials by a metric."""
    from dtcli import sweep as sweep_lib

    ask = sweep_lib.SweepAsk(
        recipe=recipe,
        grid=tuple(grid or ()),
        random=random,
        distributions=tuple(distributions or ()),
        seed=seed,
        sets=tuple(sets or ()),
        metric=metric,
        mode=mode,
        rank=rank,
        out=out,
        jobs=jobs,
    )
    # stdout: for scripts, SWEEP=$(dtcli sweep ...), also when a trial failed or it was stopped
    sweep_lib.command(ask, dry_run=dry_run, progress=not no_progress, summarized=print)
