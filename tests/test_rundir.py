"""The run directory's contract: one writer (the lock), resume semantics, self-verifying
checkpoints with fallback, and faults of the file system. In-process on the session's 8 CPUs
wherever one process suffices; a second process only where two writers must race."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
from conftest import QUICK, ROOT, SHORT, checkpoint_tensors, dtcli, env, snapshot

from dtcli import checkpoint as ckpt_lib
from dtcli import metrics, rundir, storage
from dtcli import recipe as R
from dtcli.errors import UsageError

# The contract is files, locks, records and resumes equal to the runs they continue, all made
# here: Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")


def max_rel_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys() and a
    return max(float(np.max(np.abs(a[k] - b[k])) / (np.max(np.abs(b[k])) + 1e-12)) for k in a)


def copy_run(trained_run, tmp_path, name="run"):
    dst = tmp_path / name
    shutil.copytree(trained_run, dst)
    return dst


# --------------------------------------------------------------------------- checkpoints


def test_checkpoint_meta_records_size_and_checksum_of_every_file(trained_run):
    ckpt = rundir.complete_checkpoints(trained_run)[-1]
    meta = ckpt_lib.verify(ckpt)
    on_disk = sorted(p.name for p in ckpt.iterdir() if p.name != "meta.json")
    assert sorted(meta["files"]) == on_disk and "ckpt.index" in on_disk
    for name, entry in meta["files"].items():
        assert entry["size"] == (ckpt / name).stat().st_size
        assert len(entry["sha256"]) == 64


def _data_file(ckpt):
    return max((p for p in ckpt.iterdir() if p.name.startswith("ckpt.data")), key=os.path.getsize)


DAMAGE = {
    "truncated data file": lambda c: _data_file(c).write_bytes(_data_file(c).read_bytes()[:100]),
    "random index file": lambda c: (c / "ckpt.index").write_bytes(
        np.random.default_rng(0).bytes((c / "ckpt.index").stat().st_size)
    ),
    "garbage meta.json": lambda c: (c / "meta.json").write_text('{"step": 9, "epo'),
}


@pytest.mark.parametrize("damage", DAMAGE, ids=list(DAMAGE))
def test_resume_falls_back_from_a_damaged_checkpoint_and_ends_equal(
    damage, trained_run, tmp_path, cli
):
    run = copy_run(trained_run, tmp_path)
    newest = run / "checkpoints" / "ckpt-00000009"
    DAMAGE[damage](newest)
    # eval of the damaged checkpoint itself: one line naming it damaged, nothing changed
    before = snapshot(run)
    r = cli("eval", newest)
    assert r.code == 2 and len(r.err_lines) == 1 and "Traceback" not in r.err, r.err
    assert "is damaged" in r.err and "ckpt-00000009" in r.err
    assert snapshot(run) == before
    # --resume: one warning, continues from step 6, ends equal to the uninterrupted run
    r = cli("train", "--resume", run, "--epochs", "3", "--no-progress")
    assert r.code == 0, r.err
    warnings = [line for line in r.err_lines if line.startswith("warning:")]
    assert len(warnings) == 1 and "ckpt-00000009 is damaged" in warnings[0], r.err
    assert "resuming" in r.err and "ckpt-00000006" in r.err
    assert ckpt_lib.verify(newest)["step"] == 9  # rewritten whole
    diff = max_rel_diff(
        checkpoint_tensors(newest),
        checkpoint_tensors(trained_run / "checkpoints" / "ckpt-00000009"),
    )
    assert diff <= 1e-5
    assert [r["epoch"] for r in metrics.read(run / "metrics.jsonl")] == [1, 2, 3]


def test_eval_of_a_run_whose_newest_checkpoint_is_damaged_uses_the_one_before(
    trained_run, tmp_path, cli
):
    run = copy_run(trained_run, tmp_path)
    DAMAGE["truncated data file"](run / "checkpoints" / "ckpt-00000009")
    r = cli("eval", run, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out.splitlines()[-1])["step"] == 6
    assert [line for line in r.err_lines if "is damaged" in line]


@pytest.mark.parametrize(
    "command, sets, refused",
    [
        ("eval", ["data.eval_batch_size=60"], None),  # data.batch_size (64) is training's
        ("eval", [], "'data.batch_size'"),  # eval's batch where no eval_batch_size is set
        ("eval", ["data.eval_batch_size=64"], "'data.eval_batch_size'"),
        ("generate", [], None),  # it pads its prompts to the data axis
        ("score", [], None),  # it pads its windows to the data axis
    ],
)
def test_a_checkpoint_is_read_with_the_batches_its_command_uses(
    trained_run, command, sets, refused
):
    ckpt = rundir.complete_checkpoints(trained_run)[-1]
    overrides = R.Overrides(tuple(sets), mesh="batch=3")
    if refused is None:
        assert rundir.checkpoint_recipe(ckpt, command, overrides).mesh == {"batch": 3, "model": 1}
    else:
        with pytest.raises(
            UsageError, match=f"^recipe key {refused}: eval batches of 64 .*do not divide by .* 3"
        ):
            rundir.checkpoint_recipe(ckpt, command, overrides)


def test_eval_on_a_data_axis_the_training_batch_does_not_divide_gives_the_same_figures(
    trained_run, cpu8
):
    """The quickstart trained in batches of 64 on batch=4,model=2, evaluated on batch=3 in
    batches of 60: the session checks eval's batch only, and the figures are the mesh's own."""
    from dtcli import evaluate

    ckpt = rundir.complete_checkpoints(trained_run)[-1]
    sets = ("data.eval_batch_size=60",)
    on3 = rundir.checkpoint_recipe(ckpt, "eval", R.Overrides(sets, "batch=3", "cpu:8"))
    three = evaluate.evaluate_checkpoint(ckpt, ckpt, on3, use_devices=3)
    trained = evaluate.evaluate_checkpoint(ckpt, ckpt, rundir.checkpoint_recipe(ckpt, "eval"))
    assert three["mesh"] == "batch=3,model=1" and trained["mesh"] == "batch=4,model=2"
    assert three["examples"] == trained["examples"]
    assert three["accuracy"] == trained["accuracy"]
    assert abs(three["loss"] - trained["loss"]) <= 1e-6 * abs(trained["loss"])


def test_a_checkpoint_removed_while_it_is_read_is_not_called_damaged(
    trained_run, tmp_path, cli, monkeypatch
):
    """A run that is training removes its oldest checkpoints as it saves (train.keep): eval of
    the run takes the newest that is there, with no "damaged" warning; eval of a checkpoint
    folder that goes away says so in one line."""
    from dtcli import evaluate as evaluate_lib

    run = copy_run(trained_run, tmp_path)
    verify = ckpt_lib.verify

    def removed_while_verified(checkpoint):
        original = ckpt_lib.shown(checkpoint)  # read held open, through a private folder
        if checkpoint.name == "ckpt-00000009" and original.exists():
            shutil.rmtree(original)  # the trainer's rotation, during the read
            raise ckpt_lib.DamagedCheckpoint(checkpoint, "ckpt.index is missing")
        return verify(checkpoint)

    monkeypatch.setattr(ckpt_lib, "verify", removed_while_verified)
    warnings = []
    assert rundir.latest_intact(run, warnings.append).name == "ckpt-00000006"
    assert warnings == []
    monkeypatch.setattr(ckpt_lib, "verify", verify)

    # Held open (checkpoint.held), a checkpoint removed during its restore is still read whole;
    # where files cannot be held (remote storage, as here), the run's newest is read again.
    monkeypatch.setattr(storage, "_FD_LINKS", tmp_path / "no-proc-fd")
    run = copy_run(trained_run, tmp_path, "run2")
    restore = ckpt_lib.Checkpointer.restore

    def removed_while_restored(self, checkpoint, *args, **kwargs):
        if checkpoint.name == "ckpt-00000009":
            shutil.rmtree(ckpt_lib.shown(checkpoint))
            raise ckpt_lib.DamagedCheckpoint(checkpoint, "it has no meta.json")
        return restore(self, checkpoint, *args, **kwargs)

    monkeypatch.setattr(ckpt_lib.Checkpointer, "restore", removed_while_restored)
    assert evaluate_lib.evaluate_path(run)["step"] == 6  # the run's newest, found again
    run = copy_run(trained_run, tmp_path, "run3")
    r = cli("eval", run / "checkpoints" / "ckpt-00000009")
    assert r.code == 2 and r.err_lines == [
        f"error: CHECKPOINT '{run / 'checkpoints' / 'ckpt-00000009'}': removed while it was "
        "read (a run in training keeps only its newest train.keep checkpoints); give the run "
        "directory to read its newest"
    ], r.err


def test_a_read_retries_only_what_removal_caused(trained_run, tmp_path, monkeypatch):
    """read_checkpoint holds the checkpoint: a read that fails failed on its own, and is not
    retried. Where files cannot be held (remote storage) and a read fails with the checkpoint
    gone, the run's newest is read anew; the user's own error (a mesh that does not fit, say)
    is raised at once, whatever the run removed meanwhile."""
    run = copy_run(trained_run, tmp_path)
    calls = []

    def failing(checkpoint, held):
        calls.append(checkpoint.name)
        shutil.rmtree(checkpoint)  # the trainer's rotation, during the read
        raise OSError("its own failure")

    with pytest.raises(OSError, match="its own failure"):
        rundir.read_checkpoint(run, failing)
    assert calls == ["ckpt-00000009"]
    run = copy_run(trained_run, tmp_path, "unheld")
    monkeypatch.setattr(storage, "_FD_LINKS", tmp_path / "no-proc-fd")
    calls = []

    def removed_then(error):
        def read(checkpoint, held):
            calls.append(checkpoint.name)
            if len(calls) == 1:
                shutil.rmtree(checkpoint)  # the trainer's rotation, during the read
                raise error
            return ckpt_lib.read_meta(held)["step"]

        return read

    assert rundir.read_checkpoint(run, removed_then(OSError("gone"))) == 6
    assert calls == ["ckpt-00000009", "ckpt-00000006"]
    calls.clear()
    with pytest.raises(UsageError, match="--mesh: does not fit"):
        rundir.read_checkpoint(run, removed_then(UsageError("--mesh: does not fit")))
    assert calls == ["ckpt-00000006"]


def test_what_is_no_file_in_a_checkpoint_is_never_opened(trained_run, tmp_path, monkeypatch):
    """A named pipe (whose open would block), a link to nothing and a socket in a checkpoint
    folder: ignored as strays; in place of a checkpoint file, the checkpoint is damaged (one
    line), never a hang or an unexpected error."""
    import socket

    source = trained_run / "checkpoints" / "ckpt-00000009"
    stray = tmp_path / "stray"
    shutil.copytree(source, stray)
    os.mkfifo(stray / "a.pipe")
    (stray / "a.link").symlink_to(tmp_path / "nothing")
    server = socket.socket(socket.AF_UNIX)
    monkeypatch.chdir(stray)  # a socket's path is limited to 107 bytes
    server.bind("a.sock")
    try:
        with ckpt_lib.held(stray) as held:
            assert ckpt_lib.verify(held)["step"] == 9
        for name in ("ckpt.index", "meta.json"):
            for kind, make in [("pipe", os.mkfifo), ("link", lambda p: p.symlink_to("nothing"))]:
                broken = tmp_path / f"{name}-{kind}"
                shutil.copytree(source, broken)
                (broken / name).unlink()
                make(broken / name)
                with pytest.raises(ckpt_lib.DamagedCheckpoint, match=f"{name} is not a file"):
                    with ckpt_lib.held(broken) as held:
                        ckpt_lib.verify(held)
    finally:
        server.close()


def test_eval_of_a_run_rotating_checkpoints_as_fast_as_it_can_never_fails(
    trained_run, tmp_path, cpu8
):
    """`dtcli eval RUN` beside a run that is training (train.keep=1): a writer thread renames a
    new complete checkpoint into place and removes the older one as fast as it can (1 ms apart:
    a thread shares the reader's GIL, a run is another process), maybe during the verify, the
    meta read or TensorFlow's own restore. Each of 10 evaluations returns the
    result of some complete checkpoint the writer wrote. (Let go between its verification and
    its restore, the checkpoint was gone 20 times in a row in one CI run: it is held throughout.)"""
    import threading

    from dtcli import evaluate as evaluate_lib

    run = copy_run(trained_run, tmp_path)
    folder = run / "checkpoints"
    source = tmp_path / "source"
    shutil.copytree(folder / "ckpt-00000009", source)
    for old in rundir.complete_checkpoints(run):
        shutil.rmtree(old)
    meta = json.loads((source / ckpt_lib.META).read_text())
    stop = threading.Event()
    written = []

    def rotate() -> None:  # dtcli's save: hidden, then renamed; then only the newest is kept
        try:
            save_as_fast_as_it_can()
        except BaseException as exc:  # shown by the test
            written.append(exc)
            raise

    def save_as_fast_as_it_can() -> None:
        step = 10
        while not stop.is_set():
            tmp = folder / f".tmp-ckpt-{step:08d}-stress"
            shutil.copytree(source, tmp)
            (tmp / ckpt_lib.META).write_text(json.dumps({**meta, "step": step}))
            os.rename(tmp, folder / f"ckpt-{step:08d}")
            written.append(step)
            for old in rundir.complete_checkpoints(run)[:-1]:
                shutil.rmtree(old, ignore_errors=True)
            step += 1
            # A real writer is another process; this thread shares the reader's GIL and, given
            # only sleep(0), could starve it through all of its retries (1 of 4 loaded runs).
            # 1 ms still leaves many saves during each restore (asserted below).
            time.sleep(0.001)

    writer = threading.Thread(target=rotate, daemon=True)
    writer.start()
    while not written:
        time.sleep(0.01)
    failures, steps = [], []
    try:
        for _ in range(10):
            try:
                result = evaluate_lib.evaluate_path(run)
            except Exception as exc:  # noqa: BLE001 - every failure is counted, then shown
                failures.append(f"{type(exc).__name__}: {exc}")
                continue
            assert result["checkpoint"] == str(folder / f"ckpt-{result['step']:08d}")
            steps.append(result["step"])
    finally:
        stop.set()
        writer.join()
    assert all(isinstance(step, int) for step in written), written[-1]
    assert failures == [], f"{len(failures)} of 10 failed, the first: {failures[0]}"
    # Rotation during every restore: here ~1,800 saves in the 10 (more than 100 asserted).
    assert set(steps) <= set(written) and len(written) > 100, (steps, len(written))


# --------------------------------------------------------------------------- resume semantics


def test_resume_with_a_new_learning_rate_takes_effect(trained_run, tmp_path, cli):
    run = copy_run(trained_run, tmp_path)
    for ckpt in rundir.complete_checkpoints(run)[1:]:
        shutil.rmtree(ckpt)  # resume from step 3
    start = checkpoint_tensors(run / "checkpoints" / "ckpt-00000003")
    r = cli(
        "train",
        "--resume",
        run,
        "--epochs",
        "2",
        "--set",
        "optimizer.learning_rate=1e-12",
        "--no-progress",
    )
    assert r.code == 0, r.err
    after = checkpoint_tensors(run / "checkpoints" / "ckpt-00000006")
    # 3 Adam steps of at most ~1e-12 each: the weights stay put (the recipe's 3e-3 moves them
    # by about 1e-2, which the uninterrupted run shows).
    assert max_rel_diff(after, start) < 1e-8
    assert (
        max_rel_diff(checkpoint_tensors(trained_run / "checkpoints" / "ckpt-00000006"), start)
        > 1e-3
    )
    recorded = yaml.safe_load((run / "recipe.yaml").read_text())
    assert recorded["optimizer"]["learning_rate"] == 1e-12 and recorded["train"]["epochs"] == 2
    (entry,) = metrics.read(run / "resumes.jsonl")
    assert entry["checkpoint"] == "ckpt-00000003" and entry["step"] == 3
    # Where the run went on, counted as the console and metrics.jsonl count epochs (from 1).
    assert (entry["epoch"], entry["batch"]) == (2, 0)
    assert "(epoch 2, batch 0, step 3)" in r.err
    assert entry["changes"] == {
        "optimizer.learning_rate": [0.003, 1e-12],
        "train.epochs": [3, 2],
    }
    assert (
        ckpt_lib.read_meta(run / "checkpoints" / "ckpt-00000006")["recipe"]["optimizer"][
            "learning_rate"
        ]
        == 1e-12
    )


RESUME_FAILS_BEFORE_A_STEP = {
    "mesh that does not fit": ["--mesh", "batch=3,model=2", "--devices", "cpu:8"],
    "missing data folder": ["--set", "data.source=idx", "--set", "data.path=/no/such/folder"],
    "layout that cannot split": ["--set", "layouts.rules={dense_0\\.kernel: [model, model]}"],
    "fixed key": ["--set", "data.batch_size=32"],
}


@pytest.mark.parametrize("case", RESUME_FAILS_BEFORE_A_STEP, ids=list(RESUME_FAILS_BEFORE_A_STEP))
def test_a_resume_that_fails_before_a_step_leaves_every_file_as_it_was(
    case, trained_run, tmp_path, cli
):
    run = copy_run(trained_run, tmp_path)
    before = snapshot(run)
    r = cli("train", "--resume", run, "--epochs", "4", *RESUME_FAILS_BEFORE_A_STEP[case])
    assert r.code == 2 and len(r.err_lines) == 1 and r.err.startswith("error: "), r.err
    assert snapshot(run) == before


def test_interrupt_before_the_first_resumed_step_changes_nothing(
    trained_run, tmp_path, cli, monkeypatch
):
    import dtcli.train.loop as train_loop
    import dtcli.train.run as train_run
    from dtcli.train.signals import StopOnSignal

    run = copy_run(trained_run, tmp_path)
    before = snapshot(run)

    class StopAtOnce(StopOnSignal):
        def __call__(self) -> bool:
            return True

    monkeypatch.setattr(train_run, "StopOnSignal", StopAtOnce)
    monkeypatch.setattr(train_loop, "run_epoch", lambda session, step, state, *a, **k: state)
    r = cli("train", "--resume", run, "--epochs", "4", "--no-progress")
    assert r.code == 130 and "nothing new to save" in r.err, r.err
    assert snapshot(run) == before


# --------------------------------------------------------------------------- the lock


def test_a_second_writer_fails_at_once_naming_the_holder_and_the_run_resumes(tmp_path, cli):
    out = tmp_path / "run"
    first = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dtcli.cli",
            "train",
            QUICK,
            "--out",
            str(out),
            "--epochs",
            "2",
            "--set",
            "train.checkpoint_every=1",
            "--no-progress",
        ],
        cwd=ROOT,
        # Each save holds 2 s: the first writer is surely still running when the others try.
        env={**env(), "DTCLI_TEST_PAUSE_IN_SAVE": "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 600
        while rundir.held_by(out) is None:
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        for args in (["train", QUICK, "--out", out], ["train", "--resume", out]):
            r = cli(*args)
            # At once: it did not wait for the lock (the first writer still runs), whatever the
            # machine's load (a wall-clock bound failed at 9 s on a loaded 2-core machine).
            assert first.poll() is None
            assert r.code == 2 and len(r.err_lines) == 1, r.err
            assert f"pid {first.pid} on " in r.err and "being written by another dtcli" in r.err
        stdout, stderr = first.communicate(timeout=600)
    finally:
        first.kill()
    assert first.returncode == 0, stderr
    assert [r["epoch"] for r in metrics.read(out / "metrics.jsonl")] == [1, 2]
    assert not (out / rundir.LOCK).exists()
    r = cli(
        "train",
        "--resume",
        out,
        "--epochs",
        "3",
        "--set",
        "train.steps_per_epoch=2",
        "--no-progress",
    )
    assert r.code == 0, r.err
    assert [r["epoch"] for r in metrics.read(out / "metrics.jsonl")] == [1, 2, 3]


def test_a_lock_left_by_a_dead_process_is_taken_over_with_a_warning(trained_run, tmp_path, cli):
    run = copy_run(trained_run, tmp_path)
    dead = {"pid": 999999, "host": "elsewhere", "since": "2026-01-01T00:00:00"}
    (run / rundir.LOCK).write_text(json.dumps(dead))
    assert rundir.held_by(run) is None  # nobody holds the flock
    r = cli("train", "--resume", run, "--epochs", "4", "--no-progress")
    assert r.code == 0, r.err
    assert "took over the lock of pid 999999 on elsewhere" in r.err
    assert not (run / rundir.LOCK).exists()


# --------------------------------------------------------------------------- full disk


@pytest.fixture
def small_disk(tmp_path):
    """A 2 MiB tmpfs where the process may mount one (root); else None."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True
    )
    if proc.returncode != 0:
        yield None
        return
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(folder, leave: int) -> None:
    st = os.statvfs(folder)
    free = st.f_bavail * st.f_frsize
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * max(free - leave, 0))


def test_disk_full_during_a_save_one_line_checkpoints_intact_resume_works(
    small_disk, trained_run, tmp_path, cli, monkeypatch
):
    where = small_disk or tmp_path
    run = copy_run(trained_run, where)
    for later in rundir.complete_checkpoints(run)[1:]:
        shutil.rmtree(later)  # the run as its first epoch left it: one checkpoint, step 3
    first = rundir.complete_checkpoints(run)
    assert [p.name for p in first] == ["ckpt-00000003"]
    if small_disk is not None:
        _fill(where, leave=16 * 1024)  # room for the metrics, not for a checkpoint
    else:  # no tmpfs here: the OS error is injected where TensorFlow writes the checkpoint

        def no_space(self, *a, **k):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(ckpt_lib, "_fault_point", lambda: no_space(None))
    if small_disk is not None:
        # A fresh process: TensorFlow's failed write poisons DTensor's executor for good (every
        # later op of the process is cancelled), which would fail the tests that follow.
        r = dtcli("train", "--resume", run, "--epochs", "2", "--no-progress")
    else:
        r = cli("train", "--resume", run, "--epochs", "2", "--no-progress")
    assert r.code == 1 and "Traceback" not in r.err, r.err
    assert len(r.err_lines) <= 4  # the run's own lines, then one error line
    error = r.err_lines[-1]
    assert error.startswith("error: saving checkpoint") and "No space left on device" in error, (
        error
    )
    assert "ckpt-00000003" in error
    assert rundir.complete_checkpoints(run) == first and ckpt_lib.verify(first[0])
    assert not list((run / "checkpoints").glob(".tmp-*"))  # nothing half written
    if small_disk is not None:
        (where / "filler").unlink()
    else:
        monkeypatch.undo()
    r = cli("train", "--resume", run, "--epochs", "2", "--no-progress")
    assert r.code == 0, r.err
    assert [p.name for p in rundir.complete_checkpoints(run)] == ["ckpt-00000003", "ckpt-00000006"]


# --------------------------------------------------------------------------- storage


# Direct file-system calls allowed in the run directory's modules: the local lock (flock has no
# remote equivalent; remote run directories have no lock), the default local run folder, and
# reading argv. Everything else goes through dtcli.storage (tf.io.gfile for URLs).
ALLOWED = (
    'Path("runs")',
    "Path(run_dir) / LOCK",
    "os.open(path, os.O_RDONLY)",
    "os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)",
    "os.unlink(self.path)",
    "Path(args[0]).name",
    "os.open(os.devnull, os.O_WRONLY)",  # a closed stderr pipe's output goes nowhere
    "carried(Path(run.recipe.model.from_hf))",  # the Hugging Face folder read from (local)
)
# Modules that read a Hugging Face model folder (local, as dtcli/hf/ reads it), never a run
# directory.
NOT_RUN_DIR = ("dtcli/recipe/from_hf.py",)
RUN_DIR_MODULES = (
    "rundir", "checkpoint", "metrics", "runlog", "train", "evaluate", "plot", "generate",
    "score", "launch", "recipe", "track",
)  # fmt: skip


def test_no_run_directory_path_bypasses_storage():
    import re

    direct = re.compile(
        r"\bos\.(replace|rename|open|unlink|remove|makedirs|listdir|fsync|scandir)\(|\bshutil\."
        r"|(?<![.\w])open\(|(?<![.\w])Path\("
    )
    found = []
    for name in RUN_DIR_MODULES:
        module = ROOT / "dtcli" / f"{name}.py"  # or a package: every module in it
        paths = [module] if module.exists() else sorted((ROOT / "dtcli" / name).glob("*.py"))
        for path in paths:
            if str(path.relative_to(ROOT)) in NOT_RUN_DIR:
                continue
            for number, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#")[0]
                if direct.search(code) and not any(a in code for a in ALLOWED):
                    found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert found == []


def test_a_folder_left_by_a_run_killed_while_starting_is_taken_anew(tmp_path, cli):
    """SIGKILL while a run sets up leaves its lock file and the start of its log: a requeued
    job's same `--out` must work (a real file in the folder still refuses it)."""
    out = tmp_path / "run"
    out.mkdir()
    (out / rundir.LOCK).write_text(json.dumps({"pid": 999999, "host": "gone"}))
    (out / rundir.TRAIN_LOG).write_text("# the first attempt\n")
    # killed in its first epoch (SIGKILL, or a grace period that ran out): no checkpoint yet
    (out / rundir.RECIPE).write_text("name: old\n")
    (out / rundir.STEPS).write_text('{"step": 999, "loss": 1.0}\n')
    (out / rundir.TENSORBOARD).mkdir()
    (out / rundir.CHECKPOINTS / ".tmp-ckpt-00000004-1").mkdir(parents=True)
    r = cli("train", QUICK, *SHORT, "--epochs", "1", "--out", out)
    assert r.code == 0, r.err
    assert "stopped before its first checkpoint; starting over (removed its" in r.err
    log = (out / rundir.TRAIN_LOG).read_text()
    assert log.startswith("# the first attempt\n# 20") and "done:" in log
    steps = out / rundir.STEPS  # the old attempt's records are gone
    assert not steps.exists() or all(r["step"] != 999 for r in metrics.read(steps))
    # a folder holding a complete checkpoint is a run to resume, never taken anew
    again = cli("train", QUICK, *SHORT, "--epochs", "1", "--out", out)
    assert again.code == 2 and "the folder exists and is not empty" in again.err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("mine")
    r = cli("train", QUICK, *SHORT, "--epochs", "1", "--out", other)
    assert r.code == 2 and "the folder exists and is not empty" in r.err


def test_resume_of_an_imported_run_trains_from_its_weights_with_a_new_optimizer(tmp_path, cli):
    """An import's step-0 checkpoint holds the model alone: a resume used to fail ("does not
    fit this model and optimizer"). Without data it is refused in one line, the run as it was;
    with data.path (and a batch size and optimizer of its own) it trains from the imported
    weights: at a learning rate of 1e-30 the first step's checkpoint holds them unchanged (a new
    model's random weights would differ everywhere), and an optimizer."""
    import hf_models

    folder = hf_models.numpy_gpt2(tmp_path / "hf")
    run = tmp_path / "run"
    # The session's 8 virtual CPUs: an in-process command uses them all.
    assert cli("import-hf", folder, "--out", run, "--devices", "cpu:8", "--no-progress").code == 0
    before = snapshot(run)
    result = cli("train", "--resume", run, "--no-progress")
    assert (result.code, result.err_lines) == (
        2,
        [
            f"error: --resume {str(run)!r}: an imported run has no training data; give it with "
            "--set data.path=FILE (text, read with the run's tokenizer), or train a recipe with "
            "model.from_hf"
        ],
    )
    assert snapshot(run) == before
    text = tmp_path / "text.txt"
    text.write_text("\n".join(hf_models.LINES))
    sets = [
        f"data.path={text}",
        "data.batch_size=8",
        "optimizer.name=sgd",
        "optimizer.learning_rate=1e-30",
        "train.steps=1",
    ]
    result = cli(
        "train", "--resume", run, "--no-progress", *[a for s in sets for a in ("--set", s)]
    )
    assert result.code == 0, result.err
    assert (
        f"{run}: an imported run, training starts from its step-0 weights with a new optimizer"
        in result.err_lines
    )
    imported, trained = (checkpoint_tensors(run / "checkpoints" / f"ckpt-{s:08d}") for s in (0, 1))
    assert imported.keys() == trained.keys() and len(imported) == 20
    for key, value in imported.items():
        np.testing.assert_allclose(trained[key], value, rtol=1e-6, atol=0, err_msg=key)
    reader = tf_reader(run / "checkpoints" / "ckpt-00000001")
    assert any(k.startswith("optimizer/") for k in reader.get_variable_to_shape_map())


def tf_reader(checkpoint):
    import tensorflow as tf

    return tf.train.load_checkpoint(str(checkpoint / "ckpt"))


def test_a_folder_written_whole_appears_only_once_complete(tmp_path):
    """rundir.written_whole (export --format hf and peft): the folder appears only once its
    writer returns; a writer that fails leaves nothing, an OSError as one line naming --out."""
    out = tmp_path / "out"
    with rundir.written_whole(out, "the model") as tmp:
        (tmp / "a").write_text("1")
        assert not out.exists() and tmp.name == ".out.tmp"
    assert (out / "a").read_text() == "1" and not tmp.exists()
    failed = tmp_path / "failed"
    with pytest.raises(UsageError) as caught:
        with rundir.written_whole(failed, "the adapters") as tmp:
            (tmp / "a").write_text("1")
            raise OSError(28, "No space left on device")
    assert str(caught.value) == (
        f"--out {str(failed)!r}: cannot write the adapters (No space left on device)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
