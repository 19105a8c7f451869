"""Checkpoints that appear only once complete, verify themselves, and describe their run.

A checkpoint is written into a hidden temporary folder and renamed into place
(`checkpoints/ckpt-00000120/`): a crash, kill or full disk mid-save leaves the previous checkpoint
as the latest complete one. On a remote file system (dtcli.storage: object stores cannot rename
folders) it is written in place and counts only once its meta.json, written last, is there.
`checkpoints/checkpoint` names the latest for `tf.train.latest_checkpoint`. Its `meta.json`
(written last, before the rename) holds the step, epoch, mesh, versions and resolved recipe, so
`dtcli eval` and `--resume` need nothing but the path, and the size and SHA-256 of every file
TensorFlow wrote, so a checkpoint damaged later (truncated, overwritten, a garbled meta.json) is
named as damaged instead of failing to restore. Where checkpoint folders live is the run
directory's business (dtcli.rundir).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dtcli import storage
from dtcli.errors import TrainingError, UsageError, one_line

META = "meta.json"
# TensorFlow's CheckpointState file, read by tf.train.latest_checkpoint.
STATE = "checkpoint"
# Bumped when meta.json changes incompatibly; 2: per-file sizes and checksums.
FORMAT = 2
REQUIRED = ("format", "step", "epoch", "epoch_state", "mesh", "recipe", "weights", "files")
_NAME = re.compile(r"ckpt-(\d+)$")
# A checkpoint held open while it is read (`held`): its private folder -> the checkpoint.
_HELD: dict[Path, Path] = {}


class DamagedCheckpoint(UsageError):
    """A checkpoint whose files are not what was written (one line, exit code 2)."""

    def __init__(self, checkpoint: Path, reason: str, message: str | None = None) -> None:
        read, checkpoint = storage.as_path(checkpoint), shown(checkpoint)
        self.checkpoint = checkpoint
        self.reason = reason  # what is wrong, without the checkpoint's name
        message = message.replace(str(read), str(checkpoint)) if message else None
        super().__init__(message or f"checkpoint {checkpoint} is damaged: {reason}")


def complete(folder: Path) -> list[Path]:
    """Complete checkpoints in a checkpoints folder, oldest first (not yet verified)."""
    folder = storage.as_path(folder)
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if _NAME.match(p.name) and (p / META).is_file()]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))


def shown(checkpoint: Path) -> Path:
    """The checkpoint a path names to the user: a held checkpoint's private folder is shown as
    the checkpoint itself."""
    checkpoint = storage.as_path(checkpoint)
    return _HELD.get(checkpoint, checkpoint)


@contextlib.contextmanager
def held(checkpoint: Path) -> Iterator[Path]:
    """The checkpoint's files held open while it is read (storage.held_open): a run in training
    removes its older checkpoints (train.keep) as it saves, perhaps the one being read; read
    through the folder this gives, it stays one whole checkpoint. FileNotFoundError when it was
    removed before its files were open (perhaps only some of them: `verify` then names one
    missing). Messages name the checkpoint itself (`shown`)."""
    checkpoint = storage.as_path(checkpoint)
    with storage.held_open(checkpoint) as private:
        _HELD[private] = checkpoint
        try:
            yield private
        finally:
            _HELD.pop(private, None)


def removed(checkpoint: Path, wait: float = 0.2) -> bool:
    """Whether a checkpoint that failed to be read is being removed (it is gone shortly), as a
    run in training removes its older ones, rather than damaged."""
    checkpoint = shown(checkpoint)
    deadline = time.monotonic() + wait
    while checkpoint.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def looks_like_checkpoint(path: Path) -> bool:
    path = storage.as_path(path)
    return path.is_dir() and ((path / META).exists() or bool(_NAME.match(path.name)))


def sha256_of(path: Path) -> str:
    """A file's SHA-256 (hex), read in blocks of 1 MiB."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(folder: Path) -> dict[str, dict[str, Any]]:
    return {
        p.name: {"size": p.stat().st_size, "sha256": sha256_of(p)}
        for p in sorted(folder.iterdir())
        if p.is_file() and p.name != META
    }


def _no_file(path: Path) -> bool:
    """Whether something that is no regular file is at `path`: a folder, a named pipe, a
    socket, a link to nothing (never opened)."""
    return not path.is_file() and (path.exists() or path.is_symlink())


def read_meta(checkpoint: Path) -> dict[str, Any]:
    """meta.json of a checkpoint, checked to be whole; DamagedCheckpoint otherwise."""
    checkpoint = storage.as_path(checkpoint)
    path = checkpoint / META
    if not storage.is_remote(path) and _no_file(path):  # a named pipe's open would block
        raise DamagedCheckpoint(checkpoint, f"{META} is not a file")
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise DamagedCheckpoint(checkpoint, f"it has no {META}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not text"
        raise DamagedCheckpoint(checkpoint, f"cannot read {META} ({reason})") from None
    try:
        meta = json.loads(text)
    except ValueError:
        raise DamagedCheckpoint(checkpoint, f"{META} is not complete JSON") from None
    if not isinstance(meta, dict):
        raise DamagedCheckpoint(checkpoint, f"{META} is not an object")
    missing = [k for k in REQUIRED if k not in meta]
    if missing:
        reason = f"{META} lacks {', '.join(missing)}"
        raise DamagedCheckpoint(
            checkpoint,
            reason,
            f"checkpoint {checkpoint} is damaged or from an older dtcli: {reason}",
        )
    if meta["format"] != FORMAT or not isinstance(meta["files"], dict) or not meta["files"]:
        reason = f"{META} format {meta['format']!r} is not the {FORMAT} this dtcli reads"
        raise DamagedCheckpoint(checkpoint, reason, f"checkpoint {checkpoint}: {reason}")
    return meta


def weights_only(meta: dict[str, Any]) -> bool:
    """A checkpoint of the model alone, nothing trained: an import's step 0 (no optimizer, no
    data behind it). Imports made before the `weights_only` key are known by `hf_dtype`, which
    only an import writes."""
    return bool(meta.get("weights_only", "hf_dtype" in meta))


def verify(checkpoint: Path) -> dict[str, Any]:
    """Check every file against the sizes and checksums in meta.json; returns the meta."""
    checkpoint = storage.as_path(checkpoint)
    meta = read_meta(checkpoint)
    for name, want in meta["files"].items():
        path = checkpoint / name
        if not path.is_file():
            what = "is not a file" if _no_file(path) else "is missing"
            raise DamagedCheckpoint(checkpoint, f"{name} {what}")
        size = path.stat().st_size
        if size != want.get("size"):
            raise DamagedCheckpoint(
                checkpoint, f"{name} has {size} bytes, {want.get('size')} were written"
            )
        if sha256_of(path) != want.get("sha256"):
            raise DamagedCheckpoint(checkpoint, f"{name} does not match its checksum")
    return meta


class Checkpointer:
    """Saves and restores the model, optimizer and counters of one run.

    In a multi-client run every client calls `save` (TensorFlow's save is collective: each client
    writes the shards its devices hold into the same folder, which must therefore be on storage
    all clients share); `barrier` then waits for all of them, and only the chief (client 0)
    writes meta.json, renames the folder into place and prunes old checkpoints.
    """

    def __init__(
        self,
        folder: Path,
        objects: dict[str, Any],
        keep: int,
        chief: bool = True,
        barrier: Callable[[], None] | None = None,
        tag: str | None = None,
    ):
        import tensorflow as tf

        self.folder = storage.as_path(folder)
        # Object stores cannot rename folders: there a checkpoint is written in place.
        self.in_place = storage.is_remote(self.folder)
        self.keep = keep
        self.ckpt = tf.train.Checkpoint(**objects)
        self.chief = chief
        self.barrier = barrier
        # Every client must name the same temporary folder: the pid of one process will not do.
        self.tag = tag or str(os.getpid())
        # The step this process last saved (or restored): the same on every client, unlike the
        # folder, where client 0 renames a checkpoint into place after the others return.
        self.last_step: int | None = None

    def latest(self) -> Path | None:
        found = complete(self.folder)
        return found[-1] if found else None

    def clean(self) -> None:
        """Remove what an interrupted save left (never visible as a checkpoint)."""
        if self.chief and self.folder.is_dir():
            for leftover in self.folder.glob(".tmp-ckpt-*"):
                storage.rmtree(leftover, ignore_errors=True)
            if self.in_place:  # a save cut short in place: a ckpt folder without meta.json
                done = set(complete(self.folder))
                for folder in self.folder.glob("ckpt-*"):
                    if folder not in done:
                        storage.rmtree(folder, ignore_errors=True)

    def save(self, step: int, meta: dict[str, Any]) -> Path:
        """Write a checkpoint; a failure (a full disk) leaves the earlier ones as they were."""
        import tensorflow as tf

        final = self.folder / f"ckpt-{step:08d}"
        tmp = final if self.in_place else self.folder / f".tmp-ckpt-{step:08d}-{self.tag}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if self.barrier is None:
                # With several writers none may delete what another has begun to write; their
                # tag is new for each run, so the folder cannot hold an earlier attempt anyway.
                storage.rmtree(tmp, ignore_errors=True)
            self.ckpt.write(str(tmp / "ckpt"))
            if self.barrier is not None:
                self.barrier()  # every client's shards are on disk
            _fault_point()
            if not self.chief:
                self.last_step = step
                return final
            meta = {**meta, "format": FORMAT, "files": _manifest(tmp)}
            storage.fsync_write(tmp / META, json.dumps(meta, indent=1))
        except (OSError, tf.errors.OpError) as exc:
            if self.barrier is None:
                storage.rmtree(tmp, ignore_errors=True)
            reason = exc.strerror if isinstance(exc, OSError) else _cause(exc)
            previous = self.latest()
            raise TrainingError(
                f"saving checkpoint {final} failed ({reason}); the run stopped; earlier "
                f"checkpoints are intact, the last: {previous or 'none'}"
            ) from None
        if not self.in_place:
            if final.exists():  # the same step saved again (e.g. interrupted right after a save)
                storage.rmtree(final)
            storage.rename(tmp, final)  # atomic: the checkpoint is visible only once complete
        kept = complete(self.folder)
        for old in kept[: -self.keep]:
            storage.rmtree(old, ignore_errors=True)
        self._write_state(kept[-self.keep :])
        self.last_step = step
        return final

    def _write_state(self, kept: list[Path]) -> None:
        """TensorFlow's own pointer to the latest checkpoint (tf.train.latest_checkpoint); a
        convenience: dtcli itself finds checkpoints by their meta.json."""
        if not kept:
            return
        lines = [f'model_checkpoint_path: "{kept[-1].name}/ckpt"']
        lines += [f'all_model_checkpoint_paths: "{p.name}/ckpt"' for p in kept]
        try:
            storage.write_atomic(self.folder / STATE, "\n".join(lines) + "\n")
        except OSError:
            pass  # a full disk right after a complete save: the checkpoint itself stands

    def restore(self, checkpoint: Path, weights: list | None = None, partial: bool = False) -> None:
        """Restore into the live objects, which may sit on another mesh than the writer's.

        `weights` (WeightInfo of the live model) are checked against the shapes the checkpoint
        recorded, so a checkpoint of another model fails with the first weight that differs.
        `partial`: restore only the objects this Checkpointer tracks (eval needs no optimizer).
        """
        import tensorflow as tf
        from tensorflow.python.eager import context

        if weights is not None:
            check_weights(checkpoint, weights)
        try:
            status = self.ckpt.read(str(storage.as_path(checkpoint) / "ckpt"))
            if partial:
                status.expect_partial()
            else:
                status.assert_existing_objects_matched()
            # DTensor restores asynchronously: a file that cannot be read must fail here, while
            # the caller can still tell why, not in the next operation.
            context.async_wait()
        except (AssertionError, ValueError, tf.errors.OpError) as exc:
            context.async_clear_error()
            raise UsageError(
                f"checkpoint {shown(checkpoint)}: does not fit this model and optimizer "
                f"({_cause(exc)})"
            ) from None


# What the OS said, found inside TensorFlow's multi-line "N root error(s) found" messages.
_OS_REASONS = re.compile(
    r"No space left on device|Disk quota exceeded|Read-only file system|Permission denied"
    r"|Input/output error|File too large|No such file or directory"
)


def _cause(exc: BaseException) -> str:
    text = (getattr(exc, "message", None) or str(exc)).strip()
    found = _OS_REASONS.search(text)
    if found:
        return found.group(0)
    lines = [s.strip() for s in text.splitlines() if s.strip()]
    # Drop TensorFlow's framing: "N root error(s) found", "(0) ...", "[[{{node SaveV2}}]]".
    lines = [
        s for s in lines if "root error(s) found" not in s and not s.startswith(("(", "[["))
    ] or lines
    return one_line(exc, text="\n".join(lines))


def _fault_point() -> None:
    """Test hook: DTCLI_TEST_PAUSE_IN_SAVE=SECONDS holds every save half-written that long, so a
    test can kill the process in the middle of one."""
    pause = os.environ.get("DTCLI_TEST_PAUSE_IN_SAVE")
    if pause:
        time.sleep(float(pause))


def check_weights(checkpoint: Path, weights: list) -> None:
    saved = read_meta(checkpoint).get("weights", {})
    checkpoint = shown(checkpoint)
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
