"""A multi-client run as one client sees it: its id and every client's `host:port`.

The jobs list is checked here once, whoever gives it (`--jobs`, `DTENSOR_JOBS`, a scheduler's
variables): every entry `host:port`, none empty, none twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dtcli.errors import UsageError

DEFAULT_JOB_NAME = "worker"


@dataclass(frozen=True)
class Cluster:
    """One client's view of a multi-client run."""

    client_id: int
    jobs: tuple[str, ...]  # host:port of every client, in client-id order
    job_name: str = DEFAULT_JOB_NAME
    # Agreed in the preflight: what client 0 decided for everyone (run directory, save tag).
    leader: dict[str, Any] = field(default_factory=dict)
    # Where the jobs list came from, for error messages: "--jobs" or "DTENSOR_JOBS".
    where: str = "--jobs"

    @property
    def num_clients(self) -> int:
        return len(self.jobs)

    @property
    def is_chief(self) -> bool:
        return self.client_id == 0

    @property
    def address(self) -> str:
        return self.jobs[self.client_id]


def split_address(text: str, where: str) -> tuple[str, int]:
    """`host:port` (or `[v6-host]:port`) as (host, port); UsageError naming `where` otherwise."""
    host, sep, port = text.strip().rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"{where}: expected host:port entries, got {text!r}")
    return host, int(port)


def parse_jobs(jobs: str | list[str], where: str) -> tuple[str, ...]:
    """The jobs list (`host:port,host:port,...`, or its entries) as a tuple, checked."""
    items = jobs.split(",") if isinstance(jobs, str) else jobs
    entries = tuple(j.strip() for j in items)
    if not any(entries):
        raise UsageError(f"{where}: expected host:port,host:port,..., got {jobs!r}")
    if not all(entries):
        # A missing address would shift every later client's number: refused, not skipped.
        raise UsageError(
            f"{where}: an empty entry in {jobs!r} (two commas in a row, or one at an end); "
            "expected host:port,host:port,..."
        )
    for entry in entries:
        split_address(entry, where)
    if len(set(entries)) != len(entries):
        raise UsageError(f"{where}: an address appears twice in {','.join(entries)!r}")
    return entries
