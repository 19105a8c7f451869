"""Client 0's writer for a run: metrics.jsonl, steps.jsonl and the recipe's trackers (dtcli.track),
told the run's mesh, devices and dtcli's version; how their runs end, and what they keep."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dtcli import rundir, track
from dtcli.errors import Preempted, Stopped
from dtcli.session import Session
from dtcli.train.loop import NoWriter, Writer
from dtcli.train.state import Run


def writer(run: Run, session: Session) -> Writer:
    """Client 0's: metrics.jsonl, steps.jsonl and the recipe's trackers (a resume: their runs
    go on); the other clients write nothing (client 0 holds the same global numbers)."""
    if not run.chief:
        return NoWriter()
    import dtcli

    tags = {
        "mesh": ",".join(f"{axis}={size}" for axis, size in session.axes.items()),
        "devices": session.devices.text,
        "dtcli.version": dtcli.__version__,
    }
    step = run.meta["step"] if run.meta is not None else None
    return track.open_writer(run.recipe, run.folder, tags, step, run.warn)


@contextlib.contextmanager
def writing(run: Run, session: Session) -> Iterator[Writer]:
    """Client 0's writer (`writer`) for what the block does; a failure or a stop in it ends the
    trackers' runs (FAILED, KILLED) before it goes on up."""
    opened = writer(run, session)
    try:
        yield opened
    except BaseException as exc:
        opened.close(ended(exc), artifacts(run.folder), {})
        raise


def finish(opened: Writer, folder: rundir.RunDir, history: list[dict[str, Any]]) -> None:
    """The run completed: its trackers' runs end FINISHED, with the recipe, the plots and the
    last evaluation's record as the summary."""
    opened.close(track.FINISHED, artifacts(folder), history[-1] if history else {})


def ended(exc: BaseException) -> str:
    """How the trackers' runs end: KILLED by Ctrl-C or SIGTERM (a resume continues them),
    FAILED otherwise."""
    stopped = isinstance(exc, (Stopped, Preempted, KeyboardInterrupt))
    return track.KILLED if stopped else track.FAILED


def artifacts(folder: rundir.RunDir) -> list[Path]:
    """The files the trackers keep of a run: its recipe and the plots drawn."""
    return [p for p in (folder.recipe, folder.plots) if p.exists()]
