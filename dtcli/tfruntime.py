"""The TensorFlow process runtime: the environment DTensor and XLA read at start-up (XLA's
persistent compilation cache among it), and importing TensorFlow without its native start-up
notices.

The lowest layer with `errors` and `storage`: it imports no other dtcli module but `errors`, and
TensorFlow only inside `import_tensorflow`, so importing it costs nothing.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import re
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dtcli import cpuinfo
from dtcli.errors import UsageError

# Set before TensorFlow is imported anywhere in the process (dtcli/__init__ calls this).
# DTensor's all-reduce combining pass merges independent all-reduces into one (the tensor-parallel
# GPT: 54 a step down to 20). It reorders a block's ops by their data alone, so it is right only
# where no collective shares a block with a variable written and then read (DTENSOR_NOTES' trap):
# dtcli's step lays every gradient out as its weight before the update (steps/step.py), which
# keeps collectives out of the update. "1" says so in `dtcli doctor`; a user's "0" turns it off.
RUNTIME_ENV = {
    "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION": "1",
    # 3: not even TensorFlow's native ERROR lines (a cancelled collective logs several when a
    # save fails); the Python exception says what went wrong in one line. --debug shows them.
    "TF_CPP_MIN_LOG_LEVEL": "3",
    # `tf.keras` is then tf-keras, the Keras that carries DTensor (Keras 3 has no DTensor on
    # TensorFlow), so a model.build that writes tf.keras gets layers dtcli can lay out. It also
    # spares the start-up: otherwise `import tensorflow` imports Keras 3, and through it
    # matplotlib.pyplot (measured: 2.1 s instead of 2.6 s to import TensorFlow).
    "TF_USE_LEGACY_KERAS": "1",
}


def set_runtime_env() -> None:
    for key, value in RUNTIME_ENV.items():
        os.environ.setdefault(key, value)
    global _xla_cache_decided
    if not _xla_cache_decided:
        _xla_cache_decided = True
        folder = xla_cache_dir(os.environ)
        # Once per process, at its first import of dtcli: TensorFlow reads TF_XLA_FLAGS once,
        # and fails every compile whose cache folder is unusable (not a folder, say), so the
        # flag names only a folder that can be made and written (open_xla_cache makes it, or
        # says why not). Nothing is made here: importing dtcli writes nothing.
        if folder is not None and xla_cache_problem(folder) is None:
            flags = os.environ.get("TF_XLA_FLAGS", "")
            os.environ["TF_XLA_FLAGS"] = xla_cache_flags(flags, folder)


_xla_cache_decided = False


def xla_cache_problem(folder: Path) -> str | None:
    """Why `folder` cannot hold XLA's cache (made if missing), or None: it, or the nearest
    folder above it that exists, must be a folder this process can write to."""
    if re.search(r"\s", str(folder)):
        return "TF_XLA_FLAGS cannot hold a path with a space"
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


# XLA's persistent compilation cache (TensorFlow's own, `--tf_xla_persistent_cache_directory`):
# a one-device run's compiled train and eval steps are written to disk and the next run of the
# same steps loads them instead of compiling (measured, tiny_gpt.yaml on 2 cores: the first step
# 4.8 -> 2.9 s; about 30 MB a recipe). TensorFlow keys an entry by the step's HLO and signature,
# checks the HLO when it loads one, and writes each entry atomically (a temporary file renamed).
# Its key does not name the CPU nor XLA_FLAGS, so the folder does (see host_key): a home folder
# shared by machines of other CPUs never hands one a binary built for another. CPU only: a GPU
# entry is keyed by its device type alone, and GPUs of a cluster differ. Kept in dtcli's cache
# folder (DTCLI_CACHE_DIR, else $XDG_CACHE_HOME/dtcli, else ~/.cache/dtcli, as calibrations)
# under xla/; DTCLI_XLA_CACHE names another folder, or "off".
XLA_CACHE_ENV = "DTCLI_XLA_CACHE"
CACHE_ROOT_ENV = "DTCLI_CACHE_DIR"
XLA_CACHE_FLAG = "--tf_xla_persistent_cache_directory"
XLA_CACHE_LIMIT = 1 << 30  # bytes a host's cache keeps; the least recently written go first
_OFF = ("off", "0", "false", "no")
_STALE_TMP_SECONDS = 3600  # a temporary entry this old was left by a process that died writing


def xla_cache_dir(environ: Mapping[str, str]) -> Path | None:
    """This host's folder of XLA's persistent cache (it may not exist yet), or None when
    DTCLI_XLA_CACHE turns it off."""
    value = environ.get(XLA_CACHE_ENV, "").strip()
    if value.lower() in _OFF:
        return None
    base = Path(value).expanduser().absolute() if value else cache_root(environ) / "xla"
    return base / host_key(environ)


def cache_root(environ: Mapping[str, str]) -> Path:
    """dtcli's cache folder (calibrations, XLA's compiled steps), never inside the repository:
    DTCLI_CACHE_DIR, else $XDG_CACHE_HOME/dtcli, else ~/.cache/dtcli."""
    root = environ.get(CACHE_ROOT_ENV)
    if root:
        return Path(root)
    return Path(environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")) / "dtcli"


def host_key(environ: Mapping[str, str]) -> str:
    """TensorFlow's version, the CPU (model and instruction sets), XLA_FLAGS, an intra-op
    thread count set by environment and the cores this process may use (its affinity: XLA:CPU
    splits loops into as many parts when it compiles): what may decide the machine code of an
    entry, which TensorFlow's own key leaves out."""
    from importlib import metadata

    try:
        version = metadata.version("tensorflow")
    except metadata.PackageNotFoundError:
        version = "unknown"
    cpu = "\n".join(cpuinfo.lines()) or platform.processor()
    threads = environ.get("TF_NUM_INTRAOP_THREADS", "")
    parts = (version, platform.machine(), cpu, environ.get("XLA_FLAGS", ""), threads)
    if hasattr(os, "sched_getaffinity"):  # Linux; elsewhere a process may use every core
        parts += (f"cores={len(os.sched_getaffinity(0))}",)
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]
    return f"tf{version}-{digest}"


def xla_cache_flags(flags: str, folder: Path) -> str:
    """TF_XLA_FLAGS with the persistent cache in `folder` added; a user's own cache folder in
    TF_XLA_FLAGS is kept as it is."""
    if XLA_CACHE_FLAG in flags:
        return flags
    ours = f"{XLA_CACHE_FLAG}={folder} --tf_xla_persistent_cache_device_types=CPU"
    return f"{flags} {ours}".strip()


def open_xla_cache(environ: Mapping[str, str] | None = None) -> Path | None:
    """This host's cache folder, kept under XLA_CACHE_LIMIT; before a run compiles its steps
    with XLA. A folder DTCLI_XLA_CACHE (or DTCLI_CACHE_DIR) names that cannot be made or
    written is a usage error (set_runtime_env left it out of TF_XLA_FLAGS); the default one
    then only goes unused."""
    environ = os.environ if environ is None else environ
    folder = xla_cache_dir(environ)
    if folder is None:
        return None
    named = xla_cache_named(environ)
    problem = xla_cache_problem(folder)
    if problem is None:
        try:
            folder.mkdir(parents=True, exist_ok=True)
            prune_xla_cache(folder.parent, XLA_CACHE_LIMIT)
        except OSError as exc:
            problem = exc.strerror or str(exc)
    if problem is None:
        return folder
    if named:
        raise UsageError(
            f"environment {named}={environ[named]}: cannot keep XLA's compiled steps in "
            f"{folder} ({problem}); name a folder dtcli can write to, with no spaces in its "
            f"path, or set {XLA_CACHE_ENV}=off"
        )
    return None


def xla_cache_named(environ: Mapping[str, str]) -> str | None:
    """The variable by which the user named the cache's folder (DTCLI_XLA_CACHE, else
    DTCLI_CACHE_DIR), or None for the default folder: a named folder that cannot be used is an
    error, the default one only goes unused."""
    return next((k for k in (XLA_CACHE_ENV, CACHE_ROOT_ENV) if environ.get(k, "").strip()), None)


def drop_unreadable_xla_cache(message: str, environ: Mapping[str, str] | None = None) -> bool:
    """After a compile failed with `message`: where it says TensorFlow could not read an entry
    of this host's cache (a truncated or damaged file: a disk that filled, a partial copy of a
    home folder), delete that entry (all of them where the message names none) and say True;
    the caller traces its step again, which compiles it anew (TensorFlow remembers the failed
    compile of the old trace). Else False: the failure is not the cache's."""
    environ = os.environ if environ is None else environ
    folder = xla_cache_dir(environ)
    if folder is None or not folder.is_dir():
        return False
    named = [p for p in folder.iterdir() if p.name in message]
    if named:
        doomed = named
    elif "Read less bytes than requested" in message:
        doomed = list(folder.iterdir())
    else:
        return False
    for path in doomed:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return bool(doomed)


def prune_xla_cache(folder: Path, limit: int, now: float | None = None) -> list[Path]:
    """Delete the oldest entries (by the time written) under `folder`, every host's folder in
    it (an older TensorFlow's too), until they hold at most `limit` bytes, and temporary files
    a dead process left; returns what it deleted. An entry another process deletes first, or
    is still loading, is no harm: it is compiled again."""
    now = time.time() if now is None else now
    entries, removed = [], []
    for path in folder.rglob("*"):
        with contextlib.suppress(FileNotFoundError):
            stat = path.stat()
            if ".tmp" in path.name:
                if now - stat.st_mtime > _STALE_TMP_SECONDS:
                    path.unlink()
                    removed.append(path)
            elif path.is_file():
                entries.append((stat.st_mtime, stat.st_size, path))
    total = sum(size for _, size, _ in entries)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
            removed.append(path)
        total -= size
    return removed


def check_runtime_env() -> None:
    """Refuse to train with a flag that makes DTensor's numbers silently wrong."""
    if os.environ.get("DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION") == "1":
        raise UsageError(
            "environment DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION=1: gives wrong numbers even on "
            "one device; unset it"
        )


# TensorFlow 2.21's native start-up lines ignore TF_CPP_MIN_LOG_LEVEL and are written straight to
# file descriptor 2: oneDNN notices, "no CUDA driver", cuInit failures on CPU-only machines.
_NATIVE_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called"
    r"|[IW]\d{4} [\d:.]+ +\d+ \S+:\d+\] "
    r"|E\d{4} [\d:.]+ +\d+ cuda_\w+\.cc:\d+\] )"
)


@contextlib.contextmanager
def quiet_native_logs() -> Iterator[None]:
    """Hide TensorFlow's native start-up notices; every other stderr line still gets through.

    DTCLI_TF_LOGS=1 shows everything.
    """
    if os.environ.get("DTCLI_TF_LOGS") == "1":
        yield
        return
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no real stderr (embedded interpreters)
        yield
        return
    with tempfile.TemporaryFile(mode="w+b") as capture:
        os.dup2(capture.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            for line in capture.read().decode(errors="replace").splitlines():
                if line and not _NATIVE_NOISE.match(line):
                    print(line, file=sys.stderr)


def import_tensorflow() -> Any:
    """Import TensorFlow (once) without its native start-up notices."""
    set_runtime_env()
    if "tensorflow" in sys.modules:
        return sys.modules["tensorflow"]
    with quiet_native_logs():
        import tensorflow as tf
    return tf
