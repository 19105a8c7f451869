"""The TensorFlow process runtime: the environment DTensor reads at start-up, and importing
TensorFlow without its native start-up notices.

The lowest layer with `errors` and `storage`: it imports no other dtcli module but `errors`, and
TensorFlow only inside `import_tensorflow`, so importing it costs nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

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
