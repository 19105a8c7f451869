"""`dtcli sweep`: trials drawn and named (pure), the dry run without TensorFlow, and real sweeps
of the quick start in fresh processes: ranked by each run's own metrics.jsonl, stopped by
SIGTERM during a trial and finished by the same command, a failing trial among done ones."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import QUICK, env

from dtcli.errors import UsageError
from dtcli.sweep import ranking, slots, trials

# The quick start's trials on 2 virtual CPUs (its layouts with a model axis of 1): each trial's
# process then costs about 6 CPU s instead of 10 (each virtual device rewrites its own copy of
# every function).
SMALL = ["--set", "devices=cpu:2", "--set", "mesh={batch: 2, model: 1}"]
# Short trials: epochs of 2 steps, a checkpoint after each, all kept; twelve of them, so that a
# trial stopped at its first checkpoint has eleven left to resume (about 0.14 CPU s each: the
# SIGTERM, sent within 50 ms of that checkpoint, lands well before the trial's end).
EPOCHS = 12
SHORT = [
    *SMALL,
    *("--set", f"train.epochs={EPOCHS}", "--set", "train.steps_per_epoch=2"),
    *("--set", "train.checkpoint_every=1", "--set", f"train.keep={EPOCHS}"),
]
GRID = ["--grid", "optimizer.learning_rate=1e-3,3e-3", "--grid", "data.batch_size=32,64"]


def sweep_argv(out: Path, *more: str) -> list[str]:
    return [sys.executable, "-m", "dtcli.cli", "sweep", QUICK, *more, "--out", str(out)]


def test_grid_values_split_outside_brackets_and_quotes():
    assert trials.split_values("1e-3, 3e-3") == ["1e-3", "3e-3"]
    assert trials.split_values("[64,64],[128],'a,b'") == ["[64,64]", "[128]", "'a,b'"]
    grid = trials.grid(["a=1,2", "b=[1,2],[3]"])
    assert [t.values for t in grid] == [
        {"a": 1, "b": [1, 2]},
        {"a": 1, "b": [3]},
        {"a": 2, "b": [1, 2]},
        {"a": 2, "b": [3]},
    ]
    # The folder: the index and a digest of the overrides, whatever the keys' order.
    assert grid[0].folder[:4] == "000-"
    assert trials.Trial(0, (("b", "[1,2]"), ("a", "1"))).folder == grid[0].folder


def test_random_draws_are_the_seeds_and_exact():
    dists = ["lr=loguniform(1e-4,1e-2)", "n=int(1,3)", "act=choice(relu,gelu)"]
    first = trials.random(6, dists, seed=7)
    assert first == trials.random(6, dists, seed=7)
    assert first != trials.random(6, dists, seed=8)
    for t in first:
        lr = t.values["lr"]
        assert 1e-4 <= lr <= 1e-2 and repr(lr) == dict(t.texts)["lr"]  # the recipe holds it
        assert t.values["n"] in (1, 2, 3) and t.values["act"] in ("relu", "gelu")
    with pytest.raises(UsageError, match="needs --seed"):
        trials.random(2, dists, seed=None)
    with pytest.raises(UsageError, match=r"int\(a,b\) needs two integers with a < b"):
        trials.random(2, ["n=int(1.5,3)"], seed=0)
    with pytest.raises(UsageError, match="loguniform needs 0 < a < b"):
        trials.random(2, ["lr=loguniform(0,1)"], seed=0)


def test_mode_by_the_metric_name_and_the_trial_value():
    assert ranking.default_mode("eval_loss", None) == "min"
    assert ranking.default_mode("eval_perplexity", None) == "min"
    assert ranking.default_mode("tiny_mc/acc", None) == "max"
    assert ranking.default_mode("tokens_per_sec", None) == "max"
    with pytest.raises(UsageError, match="give --mode min or --mode max"):
        ranking.default_mode("tiny/words", None)
    records = [{"eval_loss": 2.0}, {"eval_loss": 1.0}, {"eval_loss": 1.5}]
    assert ranking.value(records, "eval_loss", "min", "last") == 1.5
    assert ranking.value(records, "eval_loss", "min", "best") == 1.0
    assert ranking.value(records, "eval_loss", "max", "best") == 2.0
    assert ranking.value([], "eval_loss", "min", "last") is None


def test_jobs_split_the_cores_and_a_trial_keeps_to_its_share():
    cpu_slots = slots._cpu_slots(2, [0, 1, 2])
    assert [sorted(s.cores) for s in cpu_slots] == [[0, 1], [2]]
    with pytest.raises(UsageError, match="at most one trial per core"):
        slots._cpu_slots(4, [0, 1, 2])
    mine = slots.usable_cores()
    share = slots._cpu_slots(len(mine), mine)[-1]
    seen = subprocess.run(
        [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
        preexec_fn=share.enter,
        capture_output=True,
        text=True,
    )
    assert seen.stdout.strip() == str(sorted(share.cores))


def test_an_unreachable_store_is_one_short_warning_and_the_trials_try_it(monkeypatch):
    from dtcli.recipe.trackers import MlflowConfig
    from dtcli.sweep import parent

    # A refused connection on loopback: no network, and no retries to wait out.
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    said: list[str] = []
    cfg = MlflowConfig(tracking_uri="http://127.0.0.1:1", experiment="sw")
    assert parent.start(cfg, "sweep", None, said.append) is None
    (line,) = said  # once, for the sweep; each trial's own warning is its run's
    assert line.startswith("warning: sweep: no parent MLflow run (")
    assert line.endswith("); each trial tries the store itself, unnested")
    # track.mlflow.failure's short cause, not the HTTP client's 380 characters of retries
    assert "(cannot reach http://127.0.0.1:1 (connection refused))" in line, line
    assert parent.env(None) == {}  # the trials start with no parent to nest under


def test_dry_run_lists_the_same_folders_without_tensorflow(tmp_path):
    code = (
        "import sys; from dtcli.cli import run\n"
        f"argv = ['sweep', {QUICK!r}, '--grid', 'optimizer.learning_rate=1e-3,3e-3', "
        "'--grid', 'model.layers=[{Dense: {units: 10}}],[{Dense: {units: 32}}, {Dense: {units: 10}}]', "
        "'--dry-run']\n"
        "code = run(argv) + run(argv)\n"
        "print(code, 'tensorflow' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env()
    )
    lines = proc.stdout.splitlines()
    assert lines[-1] == "0 False", proc.stdout + proc.stderr
    folders = [w for line in lines for w in line.split()[1:2] if w.startswith("runs/")]
    assert len(folders) == 8 and folders[:4] == folders[4:]
    assert [Path(f).name[:4] for f in folders[:4]] == ["000-", "001-", "002-", "003-"]
    assert not (tmp_path / "runs").exists()


def _files(run: Path) -> dict[str, tuple[int, int]]:
    """Each file of a run's metrics and checkpoints: (size, mtime in ns)."""
    paths = [run / "metrics.jsonl", *sorted((run / "checkpoints").rglob("*"))]
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in paths if p.is_file()}


def _records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_sigterm_mid_sweep_then_the_same_command_finishes_and_ranks(tmp_path):
    out = tmp_path / "sweep"
    argv = sweep_argv(out, *GRID, *SHORT, "--no-progress")
    proc = subprocess.Popen(
        argv, cwd=tmp_path, env=env(), stdout=subprocess.PIPE, text=True, stderr=subprocess.PIPE
    )
    try:
        # Trial 2 (the third) has written its first checkpoint: stop the sweep there.
        while proc.poll() is None:
            third = [p for p in out.glob("002-*/checkpoints/ckpt-*") if "." not in p.name]
            if third:
                break
            time.sleep(0.05)  # polling, not waiting for something to happen
        proc.send_signal(signal.SIGTERM)
        stopped_out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 143, err
    assert stopped_out.strip() == str(out)  # summary.json written: the folder for scripts
    assert "sweep preempted (SIGTERM); trials not done: 2, 3" in err.splitlines()[-1]
    first = json.loads((out / "summary.json").read_text())
    status = {Path(t["run_dir"]).name[:3]: t["status"] for t in first["trials"]}
    assert status == {"000": "done", "001": "done", "002": "interrupted", "003": "pending"}
    runs = sorted(p for p in out.iterdir() if p.name[:3].isdigit())
    kept = {str(r): _files(r) for r in runs[:2]}

    # The same sweep (--jobs is not part of it): trial 2's resume and trial 3 side by side, so
    # that their TensorFlow start-ups overlap.
    again = subprocess.run(
        [*argv, "--jobs", "2"], cwd=tmp_path, env=env(), capture_output=True, text=True
    )
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == str(out)
    assert "trial 0 (optimizer.learning_rate=1e-3 data.batch_size=32): done already" in again.stderr
    assert {str(r): _files(r) for r in runs[:2]} == kept  # trials 0-1 not run again
    resumed = sorted(p for p in out.iterdir() if p.name[:3].isdigit())[2]
    assert (resumed / "resumes.jsonl").is_file()
    assert [r["epoch"] for r in _records(resumed)] == list(range(1, EPOCHS + 1))  # each once

    summary = json.loads((out / "summary.json").read_text())
    assert (summary["metric"], summary["mode"], summary["rank"]) == ("eval_loss", "min", "last")
    runs = sorted(p for p in out.iterdir() if p.name[:3].isdigit())
    own = sorted((_records(r)[-1]["eval_loss"], str(r)) for r in runs)
    assert [(t["value"], t["run_dir"]) for t in summary["trials"]] == own
    assert {t["status"] for t in summary["trials"]} == {"done"}
    overrides = {t["run_dir"]: t["overrides"] for t in summary["trials"]}
    assert overrides[str(runs[0])] == {"optimizer.learning_rate": 0.001, "data.batch_size": 32}
    assert sorted(p.name for p in (out / "plots").iterdir()) == [
        "eval_loss-vs-data.batch_size.png",
        "eval_loss-vs-optimizer.learning_rate.png",
    ]


def test_a_failing_trial_among_done_ones_nested_under_the_sweeps_mlflow_run(tmp_path):
    from mlflow import MlflowClient

    out, store = tmp_path / "sweep", f"sqlite:///{tmp_path}/mlflow.db"
    more = ["--grid", "optimizer.learning_rate=3e-3,1e30", "--set", "train.epochs=1"]
    # --jobs 2: both trials at once (their start-ups overlap), each its own run in one store.
    more += ["--set", "train.steps_per_epoch=2", "--no-progress", "--jobs", "2", *SMALL]
    more += ["--set", f"track=[{{mlflow: {{tracking_uri: '{store}', experiment: sw}}}}]"]
    done = subprocess.run(
        sweep_argv(out, *more), cwd=tmp_path, env=env(), capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr
    assert done.stdout.strip() == str(out)  # summary.json written: the folder for scripts
    last = done.stderr.splitlines()[-1]
    assert last.startswith("error: 1 of 2 trials failed or were refused (trial 1: failed: ")
    assert "non-finite training loss" in last
    summary = json.loads((out / "summary.json").read_text())
    assert [t["status"] for t in summary["trials"]] == ["done", "failed"]
    assert (
        summary["trials"][0]["value"]
        == _records(Path(summary["trials"][0]["run_dir"]))[-1]["eval_loss"]
    )
    assert summary["trials"][1]["value"] is None

    client = MlflowClient(tracking_uri=store)
    parent_id = json.loads((out / "sweep.json").read_text())["mlflow_parent_run_id"]
    parent = client.get_run(parent_id)
    assert (parent.info.run_name, parent.info.status) == ("sweep", "FAILED")
    experiment = client.get_experiment_by_name("sw").experiment_id
    nested = [r for r in client.search_runs([experiment]) if r.info.run_id != parent_id]
    assert nested, "trial 0 created no MLflow run"
    assert {r.data.tags.get("mlflow.parentRunId") for r in nested} == {parent_id}
