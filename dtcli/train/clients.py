"""A multi-client run's clients: the preflight with the others before TensorFlow's runtime
starts, client 0's run directory and checkpoint for every client, and a lost client said in one
line."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from dtcli import cluster as cluster_lib
from dtcli import recipe as recipe_lib
from dtcli import rundir, storage
from dtcli.errors import TrainingError, UsageError, one_line
from dtcli.train.loop import Checkpointer
from dtcli.train.state import Run


def join(run: Run) -> None:
    """A multi-client run: check the other clients (before TensorFlow's runtime starts: a
    missing peer would otherwise hang it for good) and take client 0's run directory and
    checkpoint."""
    leader = {
        "run_dir": str(run.folder.path),
        "resume_from": str(run.latest) if run.latest else None,
        "tag": f"{os.getpid()}-{int(time.time())}",
    }
    run.cluster = cluster_lib.preflight(
        run.cluster, recipe_lib.fingerprint(run.recipe), run.connect_timeout, leader
    )
    chosen, run.latest = _client0_choice(
        run.cluster, run.folder.path, run.latest, run.out is not None
    )
    if not run.chief:
        run.folder = rundir.unlocked(chosen)


def _client0_choice(
    cluster: cluster_lib.Cluster, run_dir: Path, latest: Path | None, explicit: bool
) -> tuple[Path, Path | None]:
    """The run directory and resume checkpoint client 0 chose, which every client must use
    (a default run directory carries a timestamp that differs between clients)."""
    if cluster.is_chief:
        return run_dir, latest
    chosen = storage.as_path(cluster.leader["run_dir"])
    if explicit and chosen.resolve() != run_dir.resolve():
        raise UsageError(
            f"--out {str(run_dir)!r}: client 0 writes the run to {str(chosen)!r}; every client "
            "needs the same run directory (on storage they all share)"
        )
    resume_from = cluster.leader.get("resume_from")
    return chosen, storage.as_path(resume_from) if resume_from else None


@contextlib.contextmanager
def peer_failures(
    cluster: cluster_lib.Cluster | None, checkpointer: Checkpointer
) -> Iterator[None]:
    """In a multi-client run, a client that dies makes the others' next collective fail; say so
    in one line (the launcher names the client that died) instead of a runtime traceback."""
    if cluster is None:
        yield
        return
    import tensorflow as tf

    try:
        yield
    except tf.errors.OpError as exc:
        raise TrainingError(
            f"client {cluster.client_id}: lost the other clients ({one_line(exc, named=True)}); "
            f"the run stopped; last complete checkpoint: {checkpointer.latest() or 'none'}"
        ) from None
