"""`dtcli doctor`: the installation's versions, devices, flags and numerical probes."""

from __future__ import annotations

import sys

import typer

from dtcli.cli.options import NoStatusOption, console


def doctor(
    devices: str | None = typer.Option(
        None, "--devices", help="Devices to probe (default: gpu if any, else cpu:8)."
    ),
    no_progress: bool = NoStatusOption,
) -> None:
    """Check versions, devices, DTensor flags, and that 1 device and a mesh give equal numbers."""
    from dtcli import doctor as doctor_lib
    from dtcli import progress

    # What it does as it goes on stderr; the table, on stdout, stays whole for a pipe or a file.
    said = None if no_progress else progress.stderr_console()
    checks = doctor_lib.run(devices, console=said)
    doctor_lib.render(checks, console())
    failed = [c.name for c in checks if not c.ok]
    if failed:
        print(f"doctor: {len(failed)} check(s) failed: {', '.join(failed)}", file=sys.stderr)
        raise typer.Exit(1)
