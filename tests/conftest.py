"""Shared helpers. Anything that starts TensorFlow runs in a fresh process: the virtual CPU count
can be set only before TensorFlow's runtime starts, and each mesh needs its own count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RECIPES = ROOT / "recipes"
SHARED_MNIST = ROOT.parent / "shared" / "data" / "mnist"


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["TF_CPP_MIN_LOG_LEVEL"] = "3"
    e["PYTHONPATH"] = str(ROOT) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION", None)
    return e


def run_python(code: str, timeout: int = 600, extra_env: dict | None = None) -> object:
    """Run `code` in a fresh interpreter; it prints one JSON value on its last line."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**env(), **(extra_env or {})},
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def dtcli(*args: str, timeout: int = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the installed `dtcli` command as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "dtcli.cli", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env=env(),
    )


@pytest.fixture
def shared_mnist() -> Path:
    if not (SHARED_MNIST / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"real MNIST not available at {SHARED_MNIST} (a fresh clone has no ../shared)")
    return SHARED_MNIST
