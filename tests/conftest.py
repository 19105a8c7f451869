"""Shared helpers. Anything that starts TensorFlow runs in a fresh process: the virtual CPU count
can be set only before TensorFlow's runtime starts, and each mesh needs its own count."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
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


@pytest.fixture(scope="session")
def cpu8() -> None:
    """TensorFlow in this process on 8 virtual CPUs, configured once for the whole session.

    Every in-process test that touches TensorFlow asks for it, whatever the order the tests run
    in; a test that needs another device count runs in a fresh process instead.
    """
    from dtcli import devices

    devices.configure("cpu:8", 8)


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def err_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.strip()]


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run `dtcli ARGS...` in this process (fast: TensorFlow is imported once) -> Result."""
    from dtcli import cli as cli_lib

    def run(*args: object, cwd: Path | None = None) -> Result:
        capsys.readouterr()
        with monkeypatch.context() as m:
            m.chdir(cwd or ROOT)
            code = cli_lib.run([str(a) for a in args])
        captured = capsys.readouterr()
        return Result(code, captured.out, captured.err)

    return run


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden ones too) with its bytes; folders as None."""
    folder = Path(folder)
    if not folder.exists():
        return {}
    out: dict = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        out[rel] = None if path.is_dir() else path.read_bytes()
    return out


def checkpoint_tensors(checkpoint: Path) -> dict:
    """The model's weights stored in a checkpoint folder, by their checkpoint keys."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(Path(checkpoint) / "ckpt"))
    return {
        key: reader.get_tensor(key)
        for key in reader.get_variable_to_shape_map()
        if key.startswith("model/") and "OPTIMIZER_SLOT" not in key
    }
