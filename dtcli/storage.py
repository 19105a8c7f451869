"""Where run directories live: local folders, or any file system TensorFlow has (`gs://`, `s3://`
where its plug-ins are installed, `ram://` in memory), through `tf.io.gfile`.

`as_path(text)` gives a `pathlib.Path` for a local path and a `RemotePath` (the same small API,
on gfile) for a URL, so the run directory's code is written once. What pathlib cannot do for
both (replace a file whole, append a line, remove a tree) are the functions below, which pick
the local or the gfile way. Object stores cannot rename folders or lock files: on a remote run
directory a checkpoint is written in place and counts once its meta.json (written last) is
there, and there is no lock (keep one writer yourself). Local paths never import TensorFlow,
so plotting a local run stays TensorFlow-free.
"""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from dtcli.errors import one_line
from dtcli.tfruntime import import_tensorflow

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$", re.S)


def is_remote(path: Any) -> bool:
    return isinstance(path, RemotePath) or (
        bool(_URL.match(str(path))) and not str(path).startswith("file://")
    )


def as_path(path: Any) -> Path | RemotePath:
    """A local path as `pathlib.Path`, a URL (`gs://b/runs/x`, `ram://x`) as `RemotePath`."""
    if isinstance(path, (Path, RemotePath)):
        return path
    text = os.fspath(path) if not isinstance(path, str) else path
    if text.startswith("file://"):  # a local path written as a URL
        return Path(text[len("file://") :] or "/")
    return RemotePath(text) if _URL.match(text) else Path(text)


def _tf() -> Any:
    return import_tensorflow()  # without its native start-up lines


def _g(name: str, *args: Any, **kwargs: Any) -> Any:
    """tf.io.gfile.NAME(...), its errors as OSError (what the run directory's code handles)."""
    tf = _tf()

    try:
        return getattr(tf.io.gfile, name)(*args, **kwargs)
    except tf.errors.NotFoundError as exc:
        raise FileNotFoundError(errno.ENOENT, one_line(exc), str(args[0]) if args else "") from None
    except tf.errors.PermissionDeniedError as exc:
        raise PermissionError(errno.EACCES, one_line(exc), str(args[0]) if args else "") from None
    except tf.errors.OpError as exc:
        raise OSError(errno.EIO, one_line(exc), str(args[0]) if args else "") from None


class _File:
    """A gfile.GFile whose errors are OSError."""

    def __init__(self, path: str, mode: str):
        self._f = _g("GFile", path, mode)
        self._path = path

    def _wrap(self, name: str, *args: Any) -> Any:
        tf = _tf()

        try:
            return getattr(self._f, name)(*args)
        except tf.errors.OpError as exc:
            raise OSError(errno.EIO, one_line(exc), self._path) from None

    def read(self, n: int = -1) -> Any:
        return self._wrap("read", n)

    def write(self, data: Any) -> Any:
        return self._wrap("write", data)

    def close(self) -> None:
        self._wrap("close")

    def __enter__(self) -> _File:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Stat:
    def __init__(self, size: int):
        self.st_size = size


class RemotePath:
    """A path on a TensorFlow file system, with the part of pathlib's API dtcli uses."""

    def __init__(self, text: str):
        found = _URL.match(text)
        if found is None:
            raise ValueError(f"not a URL: {text!r}")
        self.scheme = found.group(1)
        rest = found.group(2)
        # No trailing slash, no doubled ones: "gs://b/runs/x" names one thing one way.
        self._parts = PurePosixPath("/" + rest).as_posix().lstrip("/")

    # --------------------------------------------------------------- names

    def __str__(self) -> str:
        return f"{self.scheme}://{self._parts}"

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __lt__(self, other: RemotePath) -> bool:
        return str(self) < str(other)

    def __truediv__(self, name: str) -> RemotePath:
        return RemotePath(f"{self}/{name}")

    @property
    def name(self) -> str:
        return PurePosixPath(self._parts).name

    @property
    def parent(self) -> RemotePath:
        parent = PurePosixPath(self._parts).parent.as_posix()
        return RemotePath(f"{self.scheme}://{'' if parent == '.' else parent}")

    @property
    def parents(self) -> list[RemotePath]:
        """Innermost first, down to the first component (a bucket); not the bare scheme."""
        out, path = [], self.parent
        while path._parts:
            out.append(path)
            path = path.parent
        return out

    def with_name(self, name: str) -> RemotePath:
        return self.parent / name

    def resolve(self) -> RemotePath:
        return self

    def is_absolute(self) -> bool:
        return True

    # --------------------------------------------------------------- queries

    def exists(self) -> bool:
        return bool(self._parts) and _g("exists", str(self))

    def is_dir(self) -> bool:
        return bool(self._parts) and _g("isdir", str(self))

    def is_file(self) -> bool:
        return self.exists() and not self.is_dir()

    def is_symlink(self) -> bool:
        return False

    def iterdir(self) -> list[RemotePath]:
        return [self / name.rstrip("/") for name in _g("listdir", str(self))]

    def glob(self, pattern: str) -> list[RemotePath]:
        return [p for p in self.iterdir() if fnmatch.fnmatch(p.name, pattern)]

    def stat(self) -> _Stat:
        return _Stat(int(_g("stat", str(self)).length))

    # --------------------------------------------------------------- changes

    def mkdir(self, parents: bool = False, exist_ok: bool = False) -> None:
        if self.exists():
            if exist_ok and self.is_dir():
                return
            raise FileExistsError(errno.EEXIST, "File exists", str(self))
        if not parents and not self.parent.is_dir() and self.parent._parts:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(self.parent))
        _g("makedirs", str(self))

    def rmdir(self) -> None:
        if self.iterdir():
            raise OSError(errno.ENOTEMPTY, "Directory not empty", str(self))
        _g("rmtree", str(self))

    def unlink(self, missing_ok: bool = False) -> None:
        if not self.exists():
            if missing_ok:
                return
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(self))
        _g("remove", str(self))

    def open(self, mode: str = "r") -> Any:
        return _File(str(self), mode)

    def read_bytes(self) -> bytes:
        if not self.is_file():
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(self))
        with self.open("rb") as f:
            return f.read()

    def read_text(self, encoding: str = "utf-8", errors: str = "strict") -> str:
        return self.read_bytes().decode(encoding, errors)

    def write_bytes(self, data: bytes) -> None:
        if self.scheme == "ram" and self.exists():
            # TensorFlow's ram:// file system opens an existing file for writing without
            # truncating it (seen with TF 2.21): the new bytes would land after the old ones.
            self.unlink()
        with self.open("wb") as f:
            f.write(data)

    def write_text(self, text: str, encoding: str = "utf-8") -> None:
        self.write_bytes(text.encode(encoding))


# --------------------------------------------------------------------------- what pathlib lacks


def write_atomic(path: Path | RemotePath, data: str | bytes) -> None:
    """Write a whole file so that readers see the old or the new content, never a part (locally
    a temporary file renamed over it; an object store's write is whole already)."""
    raw = data.encode() if isinstance(data, str) else data
    if isinstance(path, RemotePath):
        path.write_bytes(raw)
        return
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(raw)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def append_line(path: Path | RemotePath, line: str) -> None:
    """Append one line whole or not at all: a failed write (a full disk) is cut back off. On
    an object store (no appends) the file is rewritten whole."""
    data = (line + "\n").encode()
    if isinstance(path, RemotePath):
        before = path.read_bytes() if path.exists() else b""
        path.write_bytes(before + data)
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        size = os.fstat(fd).st_size
        try:
            written = os.write(fd, data)
            if written != len(data):
                raise OSError(28, "No space left on device")
        except OSError:
            os.ftruncate(fd, size)
            raise
    finally:
        os.close(fd)


def rmtree(path: Path | RemotePath, ignore_errors: bool = False) -> None:
    if isinstance(path, RemotePath):
        try:
            if path.exists():
                _g("rmtree", str(path))
        except OSError:
            if not ignore_errors:
                raise
        return
    shutil.rmtree(path, ignore_errors=ignore_errors)


def rename(src: Path | RemotePath, dst: Path | RemotePath) -> None:
    """Rename a file or (locally) a folder, atomically where the file system can."""
    if isinstance(src, RemotePath):
        _g("rename", str(src), str(dst), overwrite=True)
        return
    os.rename(src, dst)


def fsync_write(path: Path | RemotePath, text: str) -> None:
    """Write a new file and make it durable before returning (locally: fsync)."""
    if isinstance(path, RemotePath):
        path.write_text(text)
        return
    with path.open("w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


# Where an open file of this process can be opened again, even once it was removed (Linux).
_FD_LINKS = Path("/proc/self/fd")


@contextlib.contextmanager
def held_open(folder: Path) -> Iterator[Path]:
    """A private folder of links to `folder`'s files, each held open meanwhile: what is read
    through it stays readable if `folder` is removed (a file open is not freed). Where files
    cannot be held (a remote file system, no /proc/self/fd), `folder` itself. FileNotFoundError
    when a file goes before it is open. Only regular files are held: anything else (a named
    pipe, whose open would block; a link to nothing; a socket; a folder) is linked by its path,
    never opened, so a reader sees it is there and no file."""
    if is_remote(folder) or not _FD_LINKS.is_dir():
        yield folder
        return
    with contextlib.ExitStack() as stack:
        private = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dtcli-held-")))
        private = private / folder.name
        private.mkdir()
        for path in folder.iterdir():
            if not _is_regular(path):
                os.symlink(path, private / path.name)
                continue
            # O_NONBLOCK: a regular file swapped for a pipe since its stat does not block either.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            stack.callback(os.close, fd)
            os.symlink(_FD_LINKS / str(fd), private / path.name)
        yield private


def _is_regular(path: Path) -> bool:
    """Whether `path` is (or links to) a regular file; FileNotFoundError when it is gone."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except FileNotFoundError:
        if not os.path.lexists(path):
            raise  # removed meanwhile
        return False  # a link to nothing
