"""Experiment trackers (`track:`, dtcli.track) against the real packages, offline: MLflow on a
SQLite store in tmp_path, W&B in offline mode read back with its own reader (`wandb leet
inspect --json`). One shared run: a crash after step 6's records were written but before its
checkpoint, then `--resume`, so that every check below also holds across a resume."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import QUICK, run_cli

from dtcli import metrics as metrics_lib
from dtcli import recipe as recipe_lib

# Two epochs of 3 steps, every step in steps.jsonl, a checkpoint after each epoch.
STEPS = [
    "--epochs",
    "2",
    *("--set", "train.steps_per_epoch=3", "--set", "train.log_every=1"),
    *("--set", "train.checkpoint_every=1"),
]


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """Neither tracker reaches the network or the user's folders."""
    home = tmp_path_factory.mktemp("trackers")
    env = {
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "WANDB_SILENT": "true",
        "WANDB_DIR": str(home / "wandb"),
        "WANDB_CONFIG_DIR": str(home / "wandb-config"),
        "WANDB_CACHE_DIR": str(home / "wandb-cache"),
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("WANDB_MODE", raising=False)
        yield env


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, offline, cpu8):
    """The quickstart with `track: [mlflow, wandb]` (a relative sqlite:/// store), its save of
    step 6 failing (a full disk) after step 6's records were written, then resumed with
    another learning rate. The root logger holds a handler of the test's, at INFO."""
    from dtcli import checkpoint as ckpt_lib

    tmp = tmp_path_factory.mktemp("tracked")
    (tmp / "recipes").mkdir()
    recipe = tmp / "recipes" / "r.yaml"
    track = [{"mlflow": {"tracking_uri": "sqlite:///store/m.db"}}, {"wandb": {"mode": "offline"}}]
    recipe.write_text(yaml.safe_dump({"base": QUICK, "track": track}))
    (tmp / "recipes" / "store").mkdir()
    run = tmp / "run"
    root = logging.getLogger()
    mine = logging.StreamHandler()
    handlers, level = root.handlers[:], root.level
    root.addHandler(mine)
    root.setLevel(logging.INFO)
    save = ckpt_lib.Checkpointer.save

    def full_disk_at_6(self, step, meta):
        if step == 6:
            raise OSError(28, "No space left on device")
        return save(self, step, meta)

    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(ckpt_lib.Checkpointer, "save", full_disk_at_6)
            crashed = run_cli("train", recipe, *STEPS, "--out", run, "--no-progress", cwd=tmp)
        first = {
            "recipe": recipe_lib.load(run / "recipe.yaml"),
            "metrics": (run / "metrics.jsonl").read_text(),
            "status": _mlflow_status(run),
        }
        resumed = run_cli(
            "train", "--resume", run, "--set", "optimizer.learning_rate=0.002", "--no-progress",
            cwd=tmp,
        )  # fmt: skip
        kept = (root.handlers[:], root.level)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return {
        "tmp": tmp,
        "run": run,
        "crashed": crashed,
        "resumed": resumed,
        "first": first,
        "root": kept,
        "expected_root": ([*handlers, mine], logging.INFO),
    }


def _ids(run: Path) -> dict:
    return json.loads((run / "trackers.json").read_text())


def _client(run: Path):
    from mlflow import MlflowClient

    recipe = recipe_lib.load(run / "recipe.yaml")
    return MlflowClient(tracking_uri=recipe.track[0].mlflow.tracking_uri)


def _mlflow_status(run: Path) -> str:
    return _client(run).get_run(_ids(run)["mlflow"]["run_id"]).info.status


def _expected(run: Path) -> dict[str, dict[int, float]]:
    """Every metric name the trackers get -> {step: value}, from metrics.jsonl and steps.jsonl."""
    out: dict[str, dict[int, float]] = {}
    for name, prefix in (("metrics.jsonl", ""), ("steps.jsonl", "step/")):
        for record in metrics_lib.read(run / name):
            for key, value in record.items():
                if key != "step" and isinstance(value, (int, float)):
                    assert record["step"] not in out.get(prefix + key, {}), "a step twice"
                    out.setdefault(prefix + key, {})[record["step"]] = value
    return out


def test_the_crash_and_the_resume_as_the_fixture_means_them(tracked):
    assert tracked["crashed"].code != 0, tracked["crashed"].err
    assert tracked["resumed"].code == 0, tracked["resumed"].err
    assert '"step": 6' in tracked["first"]["metrics"]  # step 6's record was written, not sent
    assert tracked["first"]["status"] == "FAILED"
    assert "warning" not in tracked["crashed"].err + tracked["resumed"].err


def test_mlflow_holds_every_metric_of_the_json_lines_once_across_a_resume(tracked):
    run = tracked["run"]
    client, run_id = _client(run), _ids(run)["mlflow"]["run_id"]
    expected = _expected(run)
    assert {"eval_loss", "train_loss", "epoch", "step/loss"} <= set(expected)
    assert len(expected["step/loss"]) == 6
    found = client.get_run(run_id)
    assert set(found.data.metrics) == set(expected)
    for name, values in expected.items():
        history = client.get_metric_history(run_id, name)
        assert sorted((m.step, m.value) for m in history) == sorted(values.items()), name
    assert found.info.status == "FINISHED"
    # One MLflow run for the crashed attempt and its resume.
    assert len(client.search_runs([found.info.experiment_id])) == 1


def test_mlflow_params_are_the_first_recipe_and_the_resume_a_tag(tracked):
    from dtcli.track.mlflow import metric_name

    run = tracked["run"]
    found = _client(run).get_run(_ids(run)["mlflow"]["run_id"])
    first = metrics_lib.hparams_of(recipe_lib.to_mapping(tracked["first"]["recipe"]))
    assert found.data.params == {metric_name(k): str(v) for k, v in first.items()}
    assert found.data.params["optimizer.learning_rate"] == "0.003"
    tags = found.data.tags
    assert tags["dtcli.resumed.optimizer.learning_rate"] == "0.002"
    assert tags["mesh"] == "batch=4,model=2" and tags["devices"] == "cpu:8"
    import dtcli

    assert tags["dtcli.version"] == dtcli.__version__
    assert tags["dtcli.run_dir"] == str(run.resolve())


def test_mlflow_artifacts_and_where_its_files_are(tracked):
    tmp, run = tracked["tmp"], tracked["run"]
    client, run_id = _client(run), _ids(run)["mlflow"]["run_id"]
    names = {a.path for a in client.list_artifacts(run_id)}
    assert names == {"recipe.yaml", "plots", "summary.json"}
    plots = {a.path for a in client.list_artifacts(run_id, "plots")}
    assert plots == {f"plots/{p.name}" for p in (run / "plots").iterdir()}
    summary = json.loads(Path(client.download_artifacts(run_id, "summary.json", tmp)).read_text())
    assert summary == metrics_lib.read(run / "metrics.jsonl")[-1]
    # The relative store and its artifacts: beside the recipe file, never in the working folder.
    assert (tmp / "recipes" / "store" / "m.db").is_file()
    artifacts = tmp / "recipes" / "store" / "mlartifacts"
    assert (artifacts / run_id / "artifacts" / "recipe.yaml").is_file()
    assert not (tmp / "mlruns").exists() and not (tmp / "store").exists()
    assert not (run / "tensorboard").exists()  # track given without tensorboard: no events


def test_train_log_and_the_root_logger_survive_mlflow(tracked):
    assert tracked["root"] == tracked["expected_root"]
    log = (tracked["run"] / "train.log").read_text()
    for line in (
        tracked["crashed"].err_lines + tracked["resumed"].err_lines
    ):  # every line the two processes printed, MLflow's store set up in both
        if not line.startswith("error:"):
            assert line in log, line
    assert "epoch 2/2" in log and "done: 2 epochs" in log
    assert "mlflow" not in tracked["crashed"].err + tracked["resumed"].err  # no INFO lines


def _wandb_records(run: Path) -> list[dict]:
    """Every record of the run's offline .wandb files, oldest file first, by wandb's reader."""
    records = []
    files = sorted((run / "wandb").glob("offline-run-*/run-*.wandb"))
    for path in files:
        proc = subprocess.run(
            [str(Path(sys.executable).parent / "wandb"), "leet", "inspect", "--json", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "WANDB_SILENT": "true"},
        )
        assert proc.returncode == 0, proc.stderr
        records.append([json.loads(line) for line in proc.stdout.splitlines() if line.strip()])
    return records


def test_wandb_offline_history_and_config_read_back(tracked):
    run = tracked["run"]
    files = _wandb_records(run)
    assert len(files) == 2  # the crashed attempt's and the resume's, one W&B run id
    found: dict[str, dict[int, float]] = {}
    for records in files:
        for record in (r for r in records if r["type"] == "history"):
            step = record["history"]["step"]["num"]
            for key, value in record["history"]["item"].items():
                if not key.startswith("_"):
                    assert step not in found.get(key, {}), f"{key} at step {step} twice"
                    found.setdefault(key, {})[step] = value
    assert found == _expected(run)
    ids = {r["run"]["run_id"] for records in files for r in records if r["type"] == "run"}
    assert ids == {_ids(run)["wandb"]["run_id"]}
    (config,) = [r["run"]["config"]["update"] for r in files[0] if r["type"] == "run"]
    first = metrics_lib.hparams_of(recipe_lib.to_mapping(tracked["first"]["recipe"]))
    assert {k: v for k, v in config.items() if k != "_wandb"} == first


def test_an_unreachable_tracking_server_is_one_warning_and_training_completes(
    tmp_path, offline, cpu8
):
    recipe = tmp_path / "r.yaml"
    track = [{"mlflow": {"tracking_uri": "http://127.0.0.1:1"}}]  # connection refused
    recipe.write_text(yaml.safe_dump({"base": QUICK, "track": track}))
    began = time.monotonic()
    result = run_cli(
        "train", recipe, "--epochs", "1", "--set", "train.steps_per_epoch=3", "--out",
        tmp_path / "run", "--no-progress", cwd=tmp_path,
    )  # fmt: skip
    took = time.monotonic() - began
    assert result.code == 0, result.err
    warnings = [line for line in result.err_lines if "warning" in line]
    assert len(warnings) == 1 and warnings[0].startswith("warning: track: mlflow failed ("), (
        warnings
    )
    assert len(metrics_lib.read(tmp_path / "run" / "metrics.jsonl")) == 1
    # Generous: the run takes seconds; MLflow's own retries (7, backing off up to 120 s a call)
    # would hold it for minutes.
    assert took < 60, took


def test_which_trackers_a_recipe_gets():
    from dtcli import track
    from dtcli.train import tracking

    base = yaml.safe_load(Path(QUICK).read_text())
    assert [t.name for t in track.trackers_of(recipe_lib.load(base))] == ["tensorboard"]
    assert track.trackers_of(recipe_lib.load({**base, "track": []})) == ()
    from dtcli.errors import Preempted, TrainingError

    assert tracking.ended(KeyboardInterrupt()) == tracking.ended(Preempted("x")) == "KILLED"
    assert tracking.ended(TrainingError("x")) == "FAILED"
