"""What one `dtcli train` run holds as this process trains it (`Run`), and what it returns
(`RunResult`): shared by the run's steps (run.py), its resume (resume.py) and its clients
(clients.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtcli import cluster as cluster_lib
from dtcli import devices as devices_lib
from dtcli import memory as memory_lib
from dtcli import rundir
from dtcli.recipe import Recipe
from dtcli.train.signals import SigtermOutsideTheLoop


@dataclass
class RunResult:
    run_dir: Path
    history: list[dict[str, Any]]


@dataclass
class Run:
    """One run as this process trains it: what it was asked (the recipe, where, how to report,
    the cluster) and what it found on the way (its folder, the checkpoint to resume from)."""

    recipe: Recipe
    out: Path | None
    resume: Path | None
    console: Any
    progress: bool
    cluster: cluster_lib.Cluster | None
    connect_timeout: float
    grace: float
    profile: tuple[int, int] | None
    early: SigtermOutsideTheLoop
    chief: bool = True  # client 0 (or the only one): holds the lock, writes files and speaks
    logged: bool = False  # the console copies its lines into train.log
    folder: rundir.RunDir | None = None
    latest: Path | None = None  # the checkpoint a resume starts from
    meta: dict[str, Any] | None = field(default=None, repr=False)  # its meta.json
    devices_key: str = devices_lib.RECIPE_KEY  # --devices when the command line gave them
    memory: memory_lib.Budget = memory_lib.NO_BUDGET  # --memory, --no-memory-check
    beat: Any = None  # progress.Heartbeat: what a piped run says while it is blocked

    def warn(self, message: str) -> None:
        self.console.print(message, markup=False, highlight=False)
