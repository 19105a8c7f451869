"""Checkpoints that appear only once complete, and describe the run that wrote them.

A checkpoint is written into a hidden temporary folder and renamed into place
(`checkpoints/ckpt-00000120/`): a crash or kill mid-save leaves the previous checkpoint as the
latest complete one. Each holds `meta.json` (step, epoch, mesh, versions, the resolved recipe), so
`dtcli eval` and `--resume` need nothing but the path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHECKPOINTS = "checkpoints"
META = "meta.json"
_NAME = re.compile(r"ckpt-(\d+)$")


def complete(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first."""
    folder = Path(run_dir) / CHECKPOINTS
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _NAME.match(p.name) and (p / META).is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def latest(run_dir: Path) -> Path | None:
    found = complete(run_dir)
    return found[-1] if found else None


def read_meta(checkpoint: Path) -> dict[str, Any]:
    return json.loads((Path(checkpoint) / META).read_text())


class Checkpointer:
    """Saves and restores the model, optimizer and counters of one run.

    In a multi-client run every client calls `save` (TensorFlow's save is collective: each client
    writes the shards its devices hold into the same folder, which must therefore be on storage
    all clients share); `barrier` then waits for all of them, and only the chief (client 0)
    writes meta.json, renames the folder into place and prunes old checkpoints.
    """

    def __init__(
        self,
        run_dir: Path,
        objects: dict[str, Any],
        keep: int,
        chief: bool = True,
        barrier: Callable[[], None] | None = None,
        tag: str | None = None,
    ):
        import tensorflow as tf

        self.folder = Path(run_dir) / CHECKPOINTS
        self.keep = keep
        self.ckpt = tf.train.Checkpoint(**objects)
        self.chief = chief
        self.barrier = barrier
        # Every client must name the same temporary folder: the pid of one process will not do.
        self.tag = tag or str(os.getpid())

    def clean(self) -> None:
        """Remove what an interrupted save left (never visible as a checkpoint)."""
        if self.chief and self.folder.is_dir():
            for leftover in self.folder.glob(".tmp-ckpt-*"):
                shutil.rmtree(leftover, ignore_errors=True)

    def save(self, step: int, meta: dict[str, Any]) -> Path:
        final = self.folder / f"ckpt-{step:08d}"
        tmp = self.folder / f".tmp-ckpt-{step:08d}-{self.tag}"
        self.folder.mkdir(parents=True, exist_ok=True)
        if self.barrier is None:
            # With several writers none may delete what another has begun to write; their tag
            # is new for each run, so the folder cannot hold an earlier attempt anyway.
            shutil.rmtree(tmp, ignore_errors=True)
        self.ckpt.write(str(tmp / "ckpt"))
        if self.barrier is not None:
            self.barrier()  # every client's shards are on disk
        _fault_point()
        if not self.chief:
            return final
        (tmp / META).write_text(json.dumps(meta, indent=1))
        if final.exists():  # the same step saved again (e.g. interrupted right after a save)
            shutil.rmtree(final)
        os.rename(tmp, final)  # atomic: the checkpoint is visible only once complete
        for old in complete(self.folder.parent)[: -self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def restore(self, checkpoint: Path, weights: list | None = None, partial: bool = False) -> None:
        """Restore into the live objects, which may sit on another mesh than the writer's.

        `weights` (WeightInfo of the live model) are checked against the shapes the checkpoint
        recorded, so a checkpoint of another model fails with the first weight that differs.
        `partial`: restore only the objects this Checkpointer tracks (eval needs no optimizer).
        """
        import tensorflow as tf

        from dtcli.errors import UsageError

        if weights is not None:
            check_weights(checkpoint, weights)
        try:
            status = self.ckpt.read(str(Path(checkpoint) / "ckpt"))
            if partial:
                status.expect_partial()
            else:
                status.assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            first = (getattr(exc, "message", None) or str(exc)).strip().splitlines()[0][:200]
            raise UsageError(
                f"checkpoint {checkpoint}: does not fit this model and optimizer ({first})"
            ) from None


def _fault_point() -> None:
    """Test hook: DTCLI_TEST_PAUSE_IN_SAVE=SECONDS holds every save half-written that long, so a
    test can kill the process in the middle of one."""
    pause = os.environ.get("DTCLI_TEST_PAUSE_IN_SAVE")
    if pause:
        import time

        time.sleep(float(pause))


def check_weights(checkpoint: Path, weights: list) -> None:
    from dtcli.errors import UsageError

    saved = read_meta(checkpoint).get("weights", {})
    live = {w.path: list(w.shape) for w in weights}
    for path, shape in live.items():
        if path not in saved:
            raise UsageError(
                f"checkpoint {checkpoint}: has no weight '{path}' (it was written by another model)"
            )
        if saved[path] != shape:
            raise UsageError(
                f"checkpoint {checkpoint}: weight '{path}' has shape {saved[path]} "
                f"there but {shape} in this model (it was written by another recipe)"
            )
    extra = [p for p in saved if p not in live]
    if extra:
        raise UsageError(
            f"checkpoint {checkpoint}: weight '{extra[0]}' is not in this model "
            "(it was written by another recipe)"
        )
