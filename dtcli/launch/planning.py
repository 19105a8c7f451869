"""`dtcli launch`, before any client starts: the plan (clients, ports, devices, the run
directory, each client's `dtcli train` arguments), checked without TensorFlow."""

from __future__ import annotations

import dataclasses
import socket
from dataclasses import dataclass
from pathlib import Path

from dtcli import devices as devices_lib
from dtcli import memory as memory_lib
from dtcli import mesh as mesh_lib
from dtcli import recipe as recipe_lib
from dtcli import rundir, storage
from dtcli.errors import UsageError

LOOPBACK = "127.0.0.1"


@dataclass(frozen=True)
class LaunchPlan:
    clients: int
    jobs: tuple[str, ...]
    devices: str | None  # --devices for every client (the mesh's total), None: the recipe's
    gpus_per_client: int | None  # set: client i sees GPUs i*K .. i*K+K-1 (CUDA_VISIBLE_DEVICES)
    run_dir: Path
    train_args: tuple[str, ...]  # passed to every client's `dtcli train`
    connect_timeout: float
    grace: float = 30.0  # SIGTERM: seconds each client has to save and exit


def plan(
    recipe: Path | None,
    clients: int,
    devices_per_client: str | None = None,
    overrides: recipe_lib.Overrides = recipe_lib.NO_OVERRIDES,
    out: Path | None = None,
    resume: Path | None = None,
    port: int | None = None,
    connect_timeout: float = 60.0,
    grace: float = 30.0,
    profile: tuple[int, int] | None = None,
    memory: memory_lib.Budget = memory_lib.NO_BUDGET,
) -> LaunchPlan:
    """Check everything that can be checked without TensorFlow, before any client starts.
    `profile`: `dtcli train --profile START:STOP` for the clients (client 0 writes the trace).
    `memory`: --memory, checked once here against the recipe's plan (the clients, a
    multi-client run, check no device budget of their own)."""
    if clients < 1:
        raise UsageError(f"--clients {clients}: expected at least 1")
    for arg, value in (("--out", out), ("--resume", resume)):
        if value is not None and str(value).startswith("ram://"):
            raise UsageError(
                f"{arg} {str(value)!r}: ram:// lives inside one process, and launch starts "
                "several; give a folder or a shared file system (gs://...)"
            )
    loaded = rundir.command_recipe(recipe, out, resume, overrides)
    if resume is not None:
        rundir.require_intact(storage.as_path(resume), "--resume", "to resume from", quiet)
        run_dir = storage.as_path(resume)
    else:
        run_dir = storage.as_path(out) if out is not None else rundir.default_path(loaded.name)
        rundir.check_new(run_dir, "--out")
    devices, gpus = _devices(loaded, clients, devices_per_client)
    on_devices = loaded if devices is None else recipe_lib.replace(loaded, devices=devices)
    memory_lib.check_before_run(on_devices, memory, "launcher", clients)
    _check_eval_tasks(loaded)
    train_args: list[str] = []
    if resume is not None:
        train_args += ["--resume", str(run_dir)]
    else:
        train_args += [str(recipe), "--out", str(run_dir)]
    train_args += dataclasses.replace(overrides, devices=devices).to_argv()
    train_args += ["--grace-period", f"{grace:g}"]
    if profile is not None:
        train_args += ["--profile", f"{profile[0]}:{profile[1]}"]
    return LaunchPlan(
        clients,
        tuple(f"{LOOPBACK}:{p}" for p in _ports(clients, port)),
        devices,
        gpus,
        run_dir,
        tuple(train_args),
        connect_timeout,
        grace,
    )


def _check_eval_tasks(recipe: recipe_lib.Recipe) -> None:
    """train.eval_tasks' names known to lm-eval: once here, before any client starts (each
    client checks them again, as `train` does)."""
    from dtcli import harness

    harness.check_section(recipe.train.eval_tasks)


def _devices(
    recipe: recipe_lib.Recipe, clients: int, per_client: str | None
) -> tuple[str | None, int | None]:
    """The --devices every client gets (a total over all clients), and GPUs per client."""
    if per_client is not None:
        spec = devices_lib.parse(per_client, "--devices-per-client")
        if spec.kind not in ("cpu", "gpu") or spec.count is None:
            raise UsageError(
                f"--devices-per-client {per_client!r}: expected cpu:K or gpu:K "
                "(a local launch splits one host's devices)"
            )
        total = spec.count * clients
        if spec.kind == "gpu":
            _check_gpus(per_client, clients, spec.count)
        try:
            mesh_lib.resolve_axes(recipe.mesh, total)  # the mesh must take exactly these devices
        except UsageError:
            raise UsageError(
                f"--devices-per-client {per_client}: {clients} clients x {spec.count} = {total} "
                f"devices, which the mesh {mesh_lib.mesh_text(recipe.mesh)} cannot take"
            ) from None
        return f"{spec.kind}:{total}", spec.count if spec.kind == "gpu" else None
    spec = devices_lib.parse(recipe.devices)
    try:
        devices_lib.check_clients(
            recipe.devices, mesh_lib.device_count_for(recipe.mesh), clients, "devices"
        )
    except UsageError:
        raise UsageError(
            f"--clients {clients}: {clients} clients do not divide the devices of the mesh "
            f"{mesh_lib.mesh_text(recipe.mesh)} (devices {recipe.devices}); "
            "give --devices-per-client or another --clients"
        ) from None
    if spec.kind == "gpu":
        raise UsageError(
            "--devices-per-client: a local launch on GPUs needs gpu:K, so that each client "
            "gets its own K GPUs"
        )
    return None, None


def _check_gpus(per_client: str, clients: int, count: int) -> None:
    """The GPUs the clients split, there before any client starts: each would find none only
    after its TensorFlow started, and name a --devices the user never typed."""
    found = devices_lib.gpus_without_tensorflow()
    if found is None or found >= clients * count:
        return
    there = (
        "this machine shows no GPU (no NVIDIA driver, no GPU device file)"
        if found == 0
        else f"the NVIDIA driver lists {found} GPU{'' if found == 1 else 's'} "
        f"(/{devices_lib.NVIDIA_GPUS})"
    )
    raise UsageError(
        f"--devices-per-client {per_client}: {there}, and {clients} clients x {count} need "
        f"{clients * count}; use cpu:K to run the clients on the CPU"
    )


def _ports(clients: int, first: int | None) -> list[int]:
    """Free loopback ports: PORT..PORT+N-1 checked now, or ports the kernel hands out."""
    if first is not None:
        ports = list(range(first, first + clients))
        if not (0 < first and ports[-1] < 65536):
            raise UsageError(f"--port {first}: expected ports between 1 and 65535")
        for p in ports:
            with socket.socket() as s:
                try:
                    s.bind((LOOPBACK, p))
                except OSError as exc:
                    raise UsageError(
                        f"--port {first}: {LOOPBACK}:{p} (client {p - first}) is in use "
                        f"({exc.strerror}); choose another --port"
                    ) from None
        return ports
    held = []
    try:
        for _ in range(clients):  # all held at once, so no two clients get the same port
            s = socket.socket()
            s.bind((LOOPBACK, 0))
            held.append(s)
        return [s.getsockname()[1] for s in held]
    finally:
        for s in held:
            s.close()


def quiet(message: str) -> None:
    """The launcher checks quietly; client 0 repeats the check and says what it found."""
