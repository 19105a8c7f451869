"""`dtcli doctor` passes on a sound installation (DTensor's all-reduce combining on, as dtcli runs
it) and fails, naming the checks, when a flag that gives wrong numbers is set; `dtcli train`
refuses to run with that flag."""

from __future__ import annotations

import errno
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import RECIPES, ROOT, env


def doctor(extra_env: dict) -> subprocess.CompletedProcess:
    """`dtcli doctor` in a fresh process: the flags it checks are read when TensorFlow starts."""
    return subprocess.run(
        # 4 devices: the probes' mesh is still 2-D (batch=2 x model=2), at half the cost of 8.
        [sys.executable, "-m", "dtcli.cli", "doctor", "--devices", "cpu:4"],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**env(), "COLUMNS": "200", **extra_env},
    )


@pytest.mark.slow
def test_doctor_passes_here(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # the table unwrapped, a row per line
    proc = cli("doctor", "--devices", "cpu:8")  # in this process: its devices are cpu:8 too
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [line for line in proc.stdout.splitlines() if "probe:" in line]
    assert len(rows) == 7  # the runtime probe + 2 APIs x 3 optimizers
    assert all(" ok " in row for row in rows), proc.stdout
    assert "FAIL" not in proc.stdout
    # What it does, said as it starts (a minute of probes was silent), on stderr: the table is
    # stdout's, whole for a pipe.
    doing = [line for line in proc.stderr.splitlines() if line.startswith("doctor: ")]
    assert doing[:2] == [
        "doctor: starting TensorFlow...",
        "doctor: probe: DTensor runtime (1 vs 8 devices)...",
    ]
    assert doing[2:] == [
        f"doctor: probe: dtcli {api} + {optimizer} (1 device vs batch=4,model=2)..."
        for api in ("keras", "core")
        for optimizer in ("sgd", "adam", "adamw")
    ]
    # This process, and so every in-process test of the same numbers on any mesh, runs with
    # DTensor's all-reduce combining on, as `dtcli train` does (see tfruntime).
    assert "'1' (all-reduce combining on" in proc.stdout


@pytest.mark.slow
def test_doctor_fails_when_multi_device_expansion_is_forced_on():
    proc = doctor({"DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION": "1"})
    assert proc.returncode == 1
    failed = proc.stderr.strip().splitlines()[-1]
    assert failed.startswith("doctor: ")
    assert "DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION" in failed
    # Not only the flag check: the fused-step probe sees the wrong numbers itself.
    assert "probe: DTensor runtime (fused step)" in failed
    # dtcli's own probes would say nothing on a runtime that is wrong already: not run, and said
    assert "probe: dtcli train steps" in failed and "not run: DTensor's own" in proc.stdout


def test_train_refuses_the_flag_that_gives_wrong_weights(tmp_path):
    out = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dtcli.cli",
            "train",
            str(RECIPES / "quickstart.yaml"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
        env={**env(), "DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION": "1"},
    )
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(
        "error: environment DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION=1"
    )
    assert not out.exists()


def test_doctor_says_where_the_xla_cache_is_and_what_it_holds(monkeypatch, tmp_path):
    from dtcli import doctor as doctor_lib
    from dtcli import tfruntime

    monkeypatch.setenv("DTCLI_XLA_CACHE", str(tmp_path))
    folder = tfruntime.xla_cache_dir(os.environ)
    monkeypatch.setenv("TF_XLA_FLAGS", tfruntime.xla_cache_flags("", folder))
    folder.mkdir()
    (folder / "xla_compile_cache__1__XLA_CPU_JIT.pb").write_bytes(b"x" * (3 << 20))
    check = doctor_lib._xla_cache()
    assert check.status == "ok"
    assert check.detail.startswith(f"{folder}: 1 compiled step, 3 MB")
    monkeypatch.setenv("TF_XLA_FLAGS", "--tf_xla_persistent_cache_directory=/mine")
    assert doctor_lib._xla_cache().detail == "not used: TF_XLA_FLAGS names its own folder"
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DTCLI_XLA_CACHE", str(blocker))
    monkeypatch.setenv("TF_XLA_FLAGS", "")  # as set_runtime_env leaves it for such a folder
    check = doctor_lib._xla_cache()  # named by the user: a one-device run refuses it (exit 2)
    assert check.status == "FAIL" and f"{blocker} is not a folder" in check.detail
    assert check.detail.startswith(f"DTCLI_XLA_CACHE={blocker}: cannot keep")
    monkeypatch.delenv("DTCLI_XLA_CACHE")  # the default folder unusable: runs go on without it
    monkeypatch.delenv("DTCLI_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    check = doctor_lib._xla_cache()
    assert check.status == "warn" and f"{blocker} is not a folder" in check.detail
    monkeypatch.setenv("DTCLI_XLA_CACHE", "off")
    assert doctor_lib._xla_cache().detail.startswith("off")
    # A folder its parent's permissions allow that still cannot be made (/proc/x, as root): as
    # for a run, doctor makes it, and says so when it cannot.
    unmakeable = tmp_path / "x"
    monkeypatch.setenv("DTCLI_XLA_CACHE", str(unmakeable))
    folder = tfruntime.xla_cache_dir(os.environ)
    monkeypatch.setenv("TF_XLA_FLAGS", tfruntime.xla_cache_flags("", folder))
    real_mkdir = Path.mkdir

    def refuse(self, *args, **kwargs):
        if self == folder:
            raise OSError(errno.ENOENT, "No such file or directory")
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    check = doctor_lib._xla_cache()
    assert check.status == "FAIL" and "(No such file or directory)" in check.detail
    assert check.detail.startswith(f"environment DTCLI_XLA_CACHE={unmakeable}: cannot keep")


def screen(text: str) -> list[str]:
    """The lines a terminal shows once `text` is written to it: carriage returns, rich's
    cursor-up and erase-line applied (a transient status erases itself), other control
    sequences dropped."""
    rows, y, x = [""], 0, 0
    for token in re.split(r"(\x1b\[[0-9;?]*[A-Za-z]|\r|\n)", text):
        if token == "\n":
            y, x = y + 1, 0
            rows += [""] * (y + 1 - len(rows))
        elif token == "\r":
            x = 0
        elif token == "\x1b[1A":
            y = max(y - 1, 0)
        elif token == "\x1b[2K":
            rows[y] = ""
        elif token and not token.startswith("\x1b"):
            rows[y] = rows[y][:x].ljust(x) + token + rows[y][x + len(token) :]
            x += len(token)
    return [row for row in rows if row.strip()]


def test_doctor_says_what_it_does_into_a_pipe_and_leaves_no_line_at_a_terminal(cpu8):
    """Into a pipe, a plain line as each step starts (a log shows where it is); at a terminal a
    status that goes when the step is done: 8 permanent lines used to stand above the table."""
    from rich.console import Console

    from dtcli import doctor as doctor_lib

    piped, shown = io.StringIO(), io.StringIO()
    doctor_lib.run("cpu:8", probe=False, console=Console(file=piped))
    assert piped.getvalue().splitlines() == ["doctor: starting TensorFlow..."]
    terminal = Console(file=shown, force_terminal=True, width=80)
    doctor_lib.run("cpu:8", probe=False, console=terminal)
    assert "doctor: starting TensorFlow..." in shown.getvalue()  # shown while it lasts...
    assert screen(shown.getvalue()) == []  # ... and gone before the table


def test_no_progress_leaves_doctor_nothing_to_say_as_it_goes(cli, monkeypatch):
    """`dtcli doctor --no-progress` was refused ("No such option") while docs/cli.md named it."""
    from dtcli import doctor as doctor_lib

    consoles = []

    def run(spec=None, probe=True, console=None):
        consoles.append(console)
        return [doctor_lib.Check("versions", True, "tensorflow")]

    monkeypatch.setattr(doctor_lib, "run", run)
    quiet, said = cli("doctor", "--no-progress"), cli("doctor")
    assert quiet.code == said.code == 0, quiet.err
    assert consoles[0] is None and consoles[1] is not None  # where doctor says it: nowhere
    assert "versions" in quiet.out and quiet.err == ""


@pytest.mark.parametrize("spec", ["cpu:abc", "cpu:0", "npu", ""])
def test_doctor_refuses_bad_devices_before_starting_tensorflow(spec):
    """`dtcli doctor --devices cpu:abc` said `doctor: starting TensorFlow...` and only then, 5 to
    40 s later, refused the spec: train parses --devices first, and so does doctor now."""
    from rich.console import Console

    from dtcli import doctor as doctor_lib
    from dtcli.errors import UsageError

    said = io.StringIO()
    with pytest.raises(UsageError, match=r"^--devices: expected cpu, cpu:N, gpu"):
        doctor_lib.run(spec, console=Console(file=said))
    assert said.getvalue() == ""  # nothing started, nothing said


def test_doctor_lists_the_compile_choices_kept_for_this_cpu(monkeypatch, tmp_path):
    """What `train.compile: auto` measured and kept (session/choice.py), this CPU's alone."""
    import json

    from dtcli import doctor as doctor_lib
    from dtcli import tfruntime
    from dtcli.session import choice

    monkeypatch.setenv("DTCLI_CACHE_DIR", str(tmp_path))
    assert doctor_lib._compile_choices().detail.startswith("0 kept for this CPU")
    host = tfruntime.host_key(os.environ)
    entry = {"compiler": "graph", "xla_ms": 1350.0, "graph_ms": 1264.0, "flops": 2.68e11}
    other = {**entry, "compiler": "xla"}
    kept = {f"{host}/abc": entry, "tf0-another-cpu/abc": other}
    choice.choices_path().write_text(json.dumps(kept))
    detail = doctor_lib._compile_choices().detail
    path = tmp_path / choice.CHOICES_FILE
    assert detail == (
        f"1 kept for this CPU in {path}: graph (1350.0 ms a step with XLA, 1264.0 without, "
        "268 GFLOP a step)"
    )
    assert "xla (" not in detail  # another CPU's choice is not this one's
