"""source idx: MNIST-style IDX files (optionally gzipped) in a folder, read whole into memory.

train-* and t10k-* pairs are the train and eval splits; a folder with one pair splits it in two
disjoint ranges."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np

from dtcli.data.base import Dataset, Split, ranges, scale, shaped
from dtcli.errors import UsageError, one_line
from dtcli.recipe import DataConfig

# What reading a missing, unreadable, corrupt or truncated (gzipped) file raises.
_READ_ERRORS = (OSError, EOFError, zlib.error)


def _dims(raw: bytes, path: Path) -> list[int]:
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise UsageError(f"recipe key 'data.path': {path} is not an unsigned-byte IDX file")
    ndim = raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise UsageError(f"recipe key 'data.path': {path} is truncated")
    return [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]


def _unreadable(path: Path, exc: BaseException) -> UsageError:
    """A file that cannot be read or decompressed, in one line."""
    if isinstance(exc, OSError) and exc.strerror:
        why = exc.strerror
    else:
        why = one_line(exc, named=True)
    if isinstance(exc, EOFError):
        why = "the compressed file is truncated"
    return UsageError(f"recipe key 'data.path': cannot read {path} ({why})")


def _header(path: Path) -> list[int]:
    """The dims of an IDX file, reading only its header."""
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        with gzip.open(path, "rb") if gzipped else open(path, "rb") as f:
            head = f.read(4 + 4 * 255)
    except _READ_ERRORS as exc:
        raise _unreadable(path, exc) from None
    return _dims(head, path)


def read_idx(path: Path) -> np.ndarray:
    """Read one IDX file (optionally gzipped) into a numpy array."""
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except _READ_ERRORS as exc:
        raise _unreadable(path, exc) from None
    dims = _dims(raw, path)
    body = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * len(dims))
    want = int(np.prod(dims, dtype=np.int64))
    if body.size < want:
        raise UsageError(
            f"recipe key 'data.path': {path} is truncated (its header {dims} needs {want} bytes "
            f"of data, it holds {body.size})"
        )
    if body.size > want:
        raise UsageError(
            f"recipe key 'data.path': {path} is not a valid IDX file (its header {dims} needs "
            f"{want} bytes of data, it holds {body.size})"
        )
    return body.reshape(dims)


def _labels(path: Path) -> np.ndarray:
    y = read_idx(path)
    if y.ndim != 1:
        raise UsageError(
            f"recipe key 'data.path': {path} holds {y.ndim}-D data, expected one label per example"
        )
    if len(y) == 0:
        raise UsageError(f"recipe key 'data.path': {path} holds no examples")
    return y


def _find(folder: Path, prefix: str, kind: str) -> Path | None:
    hits = sorted(folder.glob(f"{prefix}-{kind}-idx*-ubyte*"))
    return hits[0] if hits else None


def _pair(folder: Path, prefix: str) -> tuple[np.ndarray, np.ndarray] | None:
    images, labels = _find(folder, prefix, "images"), _find(folder, prefix, "labels")
    if images is None or labels is None:
        return None
    x, y = read_idx(images), _labels(labels)
    if x.ndim < 2:
        raise UsageError(
            f"recipe key 'data.path': {images} holds {x.ndim}-D data, expected images "
            "(examples x height x width)"
        )
    if len(x) != len(y):
        raise UsageError(
            f"recipe key 'data.path': {images.name} and {labels.name} differ in length"
        )
    return x, y


def _folder(cfg: DataConfig) -> Path:
    folder = Path(cfg.path or "")
    if not folder.is_dir():
        raise UsageError(f"recipe key 'data.path': {str(folder)!r} is not a folder")
    for prefix in ("train", "t10k"):
        if _find(folder, prefix, "images") and _find(folder, prefix, "labels"):
            return folder
    for prefix in ("train", "t10k"):
        for kind, other in (("images", "labels"), ("labels", "images")):
            found = _find(folder, prefix, kind)
            if found:
                raise UsageError(
                    f"recipe key 'data.path': {found.name} in {folder} has no "
                    f"{prefix}-{other}-idx*-ubyte[.gz] beside it"
                )
    raise UsageError(
        f"recipe key 'data.path': no IDX files (train-*-idx*-ubyte[.gz] or t10k-*) in {folder}"
    )


def describe(cfg: DataConfig) -> tuple[tuple[int, ...], int]:
    """The images' shape from an IDX header, the class count from the labels."""
    folder = _folder(cfg)
    images = [_find(folder, p, "images") for p in ("train", "t10k")]
    labels = [_find(folder, p, "labels") for p in ("train", "t10k")]
    header = _header(next(p for p in images if p is not None))
    classes = max(int(_labels(p).max()) + 1 for p in labels if p is not None)
    return tuple(header[1:]), classes


def load(cfg: DataConfig, split_names: tuple[str, ...]) -> Dataset:
    folder = _folder(cfg)
    train_pair = _pair(folder, "train")
    eval_pair = _pair(folder, "t10k")
    if train_pair is not None and eval_pair is not None:
        tx, ty = train_pair
        ex, ey = eval_pair
        tr = cfg.train_range or (0, len(ty))
        er = cfg.eval_range or (0, len(ey))
        for key, (lo, hi), n in (("train_range", tr, len(ty)), ("eval_range", er, len(ey))):
            if hi > n:
                raise UsageError(f"recipe key 'data.{key}': [{lo}, {hi}) is past the {n} examples")
    else:
        x, y = train_pair or eval_pair  # one pair serves both, in disjoint ranges
        tx = ex = x
        ty = ey = y
        tr, er = ranges(len(y), cfg, str(folder))
    return Dataset(
        shaped(Split(scale(tx[slice(*tr)]), ty[slice(*tr)]), cfg),
        shaped(Split(scale(ex[slice(*er)]), ey[slice(*er)]), cfg),
        int(max(ty.max(), ey.max())) + 1,
        f"IDX files in {folder} (train {tr[0]}-{tr[1] - 1}, eval {er[0]}-{er[1] - 1})",
    )
