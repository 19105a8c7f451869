"""Experiment trackers (`track:`, dtcli.track) against the real packages, offline: MLflow on a
SQLite store in tmp_path, W&B in offline mode read back with its own reader (`wandb leet
inspect --json`). One shared run: a stop, a crash after step 9's records were written but before
its checkpoint, a resume without trackers, then one with them again, so that every check below
also holds across resumes."""

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

# Epochs of 3 steps, a call a step, every step in steps.jsonl, a checkpoint each epoch.
EPOCHS = [
    *("--set", "train.steps_per_epoch=3", "--set", "train.steps_per_call=1"),
    *("--set", "train.log_every=1", "--set", "train.checkpoint_every=1", "--no-progress"),
]
STEPS = ["--epochs", "3", *EPOCHS]


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
        "WANDB_DATA_DIR": str(home / "wandb-data"),
    }
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        mp.delenv("WANDB_MODE", raising=False)
        yield env


@pytest.fixture(scope="module")
def tracked(tmp_path_factory, offline, cpu8):
    """The quickstart with `track: [mlflow, wandb]` (a relative sqlite:/// store) in four
    turns: stopped (as by Ctrl-C) after step 5, which it saves; resumed with another learning
    rate, its save of step 9 failing (a full disk) after step 9's records were written; resumed
    to epoch 3 with `track: []`; resumed to epoch 4 with the trackers again (the same store):
    they must get steps 6-9, which no turn of theirs sent. The root logger holds a handler of
    the test's, at INFO."""
    from dtcli import checkpoint as ckpt_lib
    from dtcli.track import mlflow as mlflow_sink
    from dtcli.train import loop as train_loop
    from dtcli.train import run as train_run
    from dtcli.train.signals import StopOnSignal

    tmp = tmp_path_factory.mktemp("tracked")
    (tmp / "recipes" / "store").mkdir(parents=True)
    recipe = tmp / "recipes" / "r.yaml"
    track = [{"mlflow": {"tracking_uri": "sqlite:///store/m.db"}}, {"wandb": {"mode": "offline"}}]
    recipe.write_text(yaml.safe_dump({"base": QUICK, "track": track}))
    run = tmp / "run"
    root = logging.getLogger()
    mine = logging.StreamHandler()
    handlers, level = root.handlers[:], root.level
    root.addHandler(mine)
    root.setLevel(logging.INFO)
    trained: list[int] = []
    count, save = train_loop.EpochLoop._count_step, ckpt_lib.Checkpointer.save

    class StopAfter5(StopOnSignal):
        def __call__(self) -> bool:
            return len(trained) >= 5

    def counted(self):
        trained.append(1)
        count(self)

    def full_disk_at_9(self, step, meta):
        if step == 9:
            raise OSError(28, "No space left on device")
        return save(self, step, meta)

    out, seen = {}, {}
    # As a sweep starts its trials: a parent run, its id in the environment of the first turn
    # (which creates the MLflow run) and another in a resume's (which must not re-parent it).
    cfg = recipe_lib.load(recipe).track[0].mlflow
    seen["parent"] = mlflow_sink.start_parent(cfg, "sweep")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(mlflow_sink.PARENT_ENV, seen["parent"])
            mp.setattr(train_run, "StopOnSignal", StopAfter5)
            mp.setattr(train_loop.EpochLoop, "_count_step", counted)
            out["stopped"] = run_cli("train", recipe, *STEPS, "--out", run, cwd=tmp)
        seen["stopped"] = _seen(run, cfg.tracking_uri)
        seen["first recipe"] = recipe_lib.load(run / "recipe.yaml")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(mlflow_sink.PARENT_ENV, "another-sweeps-run")
            mp.setattr(ckpt_lib.Checkpointer, "save", full_disk_at_9)
            lr = ("--set", "optimizer.learning_rate=0.002")
            out["crashed"] = run_cli("train", "--resume", run, *lr, *STEPS, cwd=tmp)
        seen["crashed"] = _seen(run, cfg.tracking_uri)
        off = ("--set", "track=[]")
        out["untracked"] = run_cli("train", "--resume", run, *STEPS, *off, cwd=tmp)
        seen["untracked"] = _seen(run, cfg.tracking_uri)
        again = (
            "--set",
            "track=" + json.dumps(recipe_lib.to_mapping(seen["first recipe"])["track"]),
        )
        out["resumed"] = run_cli(
            "train", "--resume", run, "--epochs", "4", *EPOCHS, *again, cwd=tmp
        )
        kept = (root.handlers[:], root.level)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    return {
        "tmp": tmp,
        "run": run,
        "out": out,
        "seen": seen,
        "root": kept,
        "expected_root": ([*handlers, mine], logging.INFO),
    }


def _seen(run: Path, store: str) -> dict:
    """What the run's files and its MLflow run (in `store`) held after one turn."""
    from mlflow import MlflowClient

    client, run_id = MlflowClient(tracking_uri=store), _ids(run)["mlflow"]["run_id"]
    return {
        "metrics": metrics_lib.read(run / "metrics.jsonl"),
        "status": client.get_run(run_id).info.status,
        "step/loss": sorted(m.step for m in client.get_metric_history(run_id, "step/loss")),
        "ids": _ids(run),
    }


def _ids(run: Path) -> dict:
    return json.loads((run / "trackers.json").read_text())


def _client(run: Path):
    from mlflow import MlflowClient

    recipe = recipe_lib.load(run / "recipe.yaml")
    return MlflowClient(tracking_uri=recipe.track[0].mlflow.tracking_uri)


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


def test_each_turn_ends_its_tracker_run_and_sends_what_its_checkpoints_cover(tracked):
    out, seen = tracked["out"], tracked["seen"]
    assert out["stopped"].code == 130, out["stopped"].err
    assert out["crashed"].code != 0 and out["resumed"].code == 0, out["crashed"].err
    assert out["untracked"].code == 0, out["untracked"].err
    # Stopped: its save of step 5 sent steps 1-5 (the interrupt's checkpoint counts too).
    assert seen["stopped"]["status"] == "KILLED"
    assert seen["stopped"]["step/loss"] == [1, 2, 3, 4, 5]
    # Crashed: step 9's records written, never sent (no checkpoint covers them).
    assert seen["crashed"]["status"] == "FAILED"
    assert seen["crashed"]["metrics"][-1]["step"] == 9
    assert seen["crashed"]["step/loss"] == [1, 2, 3, 4, 5, 6]
    # Untracked: nothing sent; the kept run's confirmed step stays 6 for the next turn.
    assert seen["untracked"]["step/loss"] == [1, 2, 3, 4, 5, 6]
    assert seen["untracked"]["ids"]["mlflow"]["step"] == 6
    assert _ids(tracked["run"])["mlflow"]["step"] == _ids(tracked["run"])["wandb"]["step"] == 12
    assert "warning" not in "".join(o.err for o in out.values())


def test_mlflow_holds_every_metric_of_the_json_lines_once_across_a_resume(tracked):
    run = tracked["run"]
    client, run_id = _client(run), _ids(run)["mlflow"]["run_id"]
    expected = _expected(run)
    assert {"eval_loss", "train_loss", "epoch", "step/loss"} <= set(expected)
    assert len(expected["step/loss"]) == 12
    found = client.get_run(run_id)
    assert set(found.data.metrics) == set(expected)
    for name, values in expected.items():
        history = client.get_metric_history(run_id, name)
        assert sorted((m.step, m.value) for m in history) == sorted(values.items()), name
    assert found.info.status == "FINISHED"
    # One MLflow run for the three turns (and the sweep's parent run beside it).
    runs = client.search_runs([found.info.experiment_id])
    assert sorted(r.info.run_id for r in runs) == sorted(
        [found.info.run_id, tracked["seen"]["parent"]]
    )


def test_mlflow_params_are_the_first_recipe_and_the_resume_a_tag(tracked):
    from dtcli.track.mlflow import metric_name

    run = tracked["run"]
    found = _client(run).get_run(_ids(run)["mlflow"]["run_id"])
    first = metrics_lib.hparams_of(recipe_lib.to_mapping(tracked["seen"]["first recipe"]))
    assert found.data.params == {metric_name(k): str(v) for k, v in first.items()}
    assert found.data.params["optimizer.learning_rate"] == "0.003"
    tags = found.data.tags
    assert tags["dtcli.resumed.optimizer.learning_rate"] == "0.002"
    assert tags["mesh"] == "batch=4,model=2" and tags["devices"] == "cpu:8"
    import dtcli

    assert tags["dtcli.version"] == dtcli.__version__
    assert tags["dtcli.run_dir"] == str(run.resolve())


def test_a_sweeps_trial_is_nested_under_its_parent_run(tracked):
    from dtcli.track import mlflow as mlflow_sink

    run, parent = tracked["run"], tracked["seen"]["parent"]
    client = _client(run)
    cfg = recipe_lib.load(run / "recipe.yaml").track[0].mlflow
    found = client.get_run(_ids(run)["mlflow"]["run_id"])
    assert found.data.tags[mlflow_sink.PARENT_TAG] == parent  # the creating turn's, kept
    assert client.get_run(parent).info.status == "RUNNING"
    assert mlflow_sink.start_parent(cfg, "sweep", parent) == parent  # reopened, not another
    mlflow_sink.end_parent(cfg, parent, "FINISHED")
    assert client.get_run(parent).info.status == "FINISHED"
    assert client.get_run(parent).info.experiment_id == found.info.experiment_id


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
    # Every line the three processes printed, MLflow's store set up in each.
    for line in (line for o in tracked["out"].values() for line in o.err_lines):
        if not line.startswith("error:"):
            assert line in log, line
    assert "epoch 3/3" in log and "done: 3 epochs" in log and "done: 4 epochs" in log
    assert "mlflow" not in "".join(o.err for o in tracked["out"].values())  # no INFO lines


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
    assert len(files) == 3  # a file per tracked turn, one W&B run id
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
    first = metrics_lib.hparams_of(recipe_lib.to_mapping(tracked["seen"]["first recipe"]))
    assert {k: v for k, v in config.items() if k != "_wandb"} == first
    # The files, as one artifact of the last turn, referenced where they lie.
    (artifact,) = [r["artifact"] for r in files[-1] if r["type"] == "artifact"]
    kept = {f["path"]: f["local_path"] for f in artifact["manifest"]["contents"]}
    plots = {f"plots/{p.name}": str(p.resolve()) for p in (run / "plots").iterdir()}
    assert kept == {"recipe.yaml": str((run / "recipe.yaml").resolve()), **plots}


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
    assert warnings == [
        "warning: track: mlflow failed (cannot reach http://127.0.0.1:1 (connection refused)); "
        "training goes on without it"
    ]
    assert len(metrics_lib.read(tmp_path / "run" / "metrics.jsonl")) == 1
    # Generous: the run takes seconds; MLflow's own retries (7, backing off up to 120 s a call)
    # would hold it for minutes.
    assert took < 60, took
    # A sweep's parent run fails the same way, its exception's line as short.
    from dtcli.recipe import MlflowConfig
    from dtcli.track import mlflow as mlflow_sink

    cfg = MlflowConfig(tracking_uri="http://127.0.0.1:1", experiment="x")
    said = r"^cannot reach http://127\.0\.0\.1:1 \(connection refused\)$"
    with pytest.raises(mlflow_sink.StoreError, match=said):
        mlflow_sink.start_parent(cfg, "sweep")
    with pytest.raises(mlflow_sink.StoreError, match=said):
        mlflow_sink.end_parent(cfg, "0" * 32, "FINISHED")


def test_which_trackers_a_recipe_gets(tmp_path, monkeypatch):
    from dtcli import track
    from dtcli.train import tracking

    base = yaml.safe_load(Path(QUICK).read_text())
    assert [t.name for t in track.trackers_of(recipe_lib.load(base))] == ["tensorboard"]
    assert track.trackers_of(recipe_lib.load({**base, "track": []})) == ()
    # A name alone is a list of one (`--set track=mlflow`).
    alone = recipe_lib.load({**base, "track": "wandb"}).track
    assert alone == recipe_lib.load({**base, "track": ["wandb"]}).track and len(alone) == 1
    # A relative sqlite path in MLFLOW_TRACKING_URI: from the working folder (the shell's),
    # not the recipe file's.
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "r.yaml").write_text(
        yaml.safe_dump({"base": QUICK, "track": ["mlflow"]})
    )
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///envrel.db")
    monkeypatch.chdir(tmp_path)
    (found,) = recipe_lib.load(tmp_path / "recipes" / "r.yaml").track
    assert found.mlflow.tracking_uri == f"sqlite:///{(tmp_path / 'envrel.db').resolve()}"
    from dtcli.errors import Preempted, TrainingError

    assert tracking.ended(KeyboardInterrupt()) == tracking.ended(Preempted("x")) == "KILLED"
    assert tracking.ended(TrainingError("x")) == "FAILED"


def test_a_tracker_new_to_a_resumed_run_first_hears_its_history_to_the_checkpoint(tmp_path):
    from dtcli import rundir, track

    steps = [{"step": s, "loss": 1.0 / s} for s in range(1, 7)]
    epochs = [{"epoch": e, "step": 3 * e, "eval_loss": 0.5 / e} for e in (1, 2)]
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in steps))
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in epochs))
    history = track._history(rundir.RunDir(tmp_path), 3)
    assert history == [
        (1, {"step/loss": 1.0}),
        (2, {"step/loss": 0.5}),
        (3, {"step/loss": 1.0 / 3}),
        (3, {"epoch": 1, "eval_loss": 0.5}),
    ]


def test_config_and_help_never_import_the_trackers(tmp_path):
    """mlflow and wandb are imported by their sinks only: not by dtcli's modules, `--help`, nor
    `dtcli config` of a recipe that names them."""
    from conftest import ROOT, env

    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"base": QUICK, "track": ["mlflow", "wandb"]}))
    code = (
        "import sys\n"
        "import dtcli.cli.app, dtcli.track, dtcli.train.tracking\n"
        "from dtcli.cli import run\n"
        f"codes = [run(['--help']), run(['config', {str(recipe)!r}])]\n"
        "print(codes, 'mlflow' in sys.modules, 'wandb' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env()
    )
    assert "mlflow:" in proc.stdout and "tracking_uri: sqlite:///" in proc.stdout, proc.stderr
    assert proc.stdout.split()[-4:] == ["[0,", "0]", "False", "False"], proc.stdout[-300:]
