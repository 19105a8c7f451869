"""`dtcli train` and `dtcli launch`: a recipe trained by one process, or by N local clients."""

from __future__ import annotations

import typer

from dtcli.cli.options import (
    ConnectTimeoutOption,
    DevicesOption,
    EpochsOption,
    GraceOption,
    MemoryOption,
    MeshOption,
    NoMemoryCheckOption,
    NoProgressOption,
    OutOption,
    ProfileOption,
    SetOption,
    checked_run_options,
    overrides,
)


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
    from dtcli import memory as memory_lib
    from dtcli import train as train_lib

    steps = checked_run_options(out, resume, connect_timeout, grace_period, profile)
    cluster = cluster_lib.from_args(client_id, jobs)
    budget = memory_lib.budget_from_args(memory, no_memory_check)
    run_dir = train_lib.command(
        recipe,
        overrides(sets, mesh, devices, epochs),
        out,
        resume,
        cluster,
        devices,
        progress=not no_progress,
        connect_timeout=connect_timeout,
        grace=grace_period,
        profile=steps,
        memory=budget,
    )
    if run_dir is not None:
        print(run_dir)  # stdout: for scripts, RUN=$(dtcli train ...)


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

    steps = checked_run_options(out, resume, connect_timeout, grace_period, profile)
    launch_plan = launch_lib.plan(
        recipe,
        clients,
        devices_per_client,
        overrides(sets, mesh, None, epochs),
        out=out,
        resume=resume,
        port=port,
        connect_timeout=connect_timeout,
        grace=grace_period,
        profile=steps,
        memory=memory_lib.budget_from_args(memory, no_memory_check),
    )
    print(launch_lib.run(launch_plan, progress=not no_progress, until_exit=True))
