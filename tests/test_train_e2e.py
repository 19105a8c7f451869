"""`dtcli train` end to end: the run directory, eval on other meshes, resume, Ctrl-C, kills
during a save, export and plots."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import RECIPES, ROOT, dtcli, env, run_cli, use_cpu8

from dtcli import checkpoint as ckpt_lib
from dtcli import metrics, rundir

# Checked: files, messages, exit codes, and runs equal to the runs they continue or
# evaluate, within 1e-4 or 1e-5; Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")

QUICK = str(RECIPES / "quickstart.yaml")
FIELDS = {
    "epoch",
    "step",
    "train_loss",
    "train_accuracy",
    "eval_loss",
    "eval_accuracy",
    "examples_per_sec",
    "seconds",
}


def train(*args, ok=True, cwd=None):
    """`dtcli train ARGS --no-progress` in this process (8 virtual CPUs)."""
    proc = run_cli("train", *args, "--no-progress", cwd=cwd)
    if ok:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.fixture(scope="module")
def run4(tmp_path_factory):
    """The quickstart for 4 epochs on batch=4 x model=2 (8 virtual CPUs)."""
    out = tmp_path_factory.mktemp("runs") / "q4"
    proc = train(
        QUICK, "--epochs", "4", "--set", "train.checkpoint_every=1", "--out", out,
        "--profile", "30:40",
    )  # fmt: skip
    (out.parent / "q4.stderr").write_text(proc.stderr)
    return out


def test_run_directory_holds_everything(run4):
    recipe = (run4 / "recipe.yaml").read_text()
    assert "batch: 4" in recipe and "devices: cpu:8" in recipe and "epochs: 4" in recipe
    records = metrics.read(run4 / "metrics.jsonl")
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]
    assert all(FIELDS <= set(r) for r in records)
    assert records[-1]["step"] == 4 * 23  # 1437 examples / 64, the last batch padded
    assert records[-1]["eval_examples"] == 360 and records[-1]["train_examples"] == 1437
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    # The first step's tracing and compiling is reported where it happened, and only there.
    assert records[0]["compile_seconds"] > 0
    assert all("compile_seconds" not in r for r in records[1:])
    assert [p.name for p in rundir.complete_checkpoints(run4)] == [
        "ckpt-00000069",
        "ckpt-00000092",
    ]  # keep 2
    meta = ckpt_lib.read_meta(run4 / "checkpoints" / "ckpt-00000092")
    assert meta["mesh"] == {"batch": 4, "model": 2} and meta["versions"]["tensorflow"]
    assert sorted(p.name for p in (run4 / "plots").iterdir()) == [
        "accuracy.png",
        "loss.png",
        "step_loss.png",
    ]
    steps = metrics.read(run4 / "steps.jsonl")
    assert [r["step"] for r in steps] == list(range(10, 4 * 23 + 1, 10))  # log_every 10
    assert any(p.name.startswith("events.out.tfevents") for p in (run4 / "tensorboard").iterdir())


def test_a_resume_with_no_epochs_left_says_so_at_once_and_changes_nothing(run4, cli):
    """`--epochs` is the total: a resume to fewer epochs than done says so before any device or
    model is set up, prints the run's summary and writes nothing."""
    before = {p.name: p.read_bytes() for p in run4.iterdir() if p.is_file()}
    proc = cli("train", "--resume", run4, "--epochs", "2", "--no-progress")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.splitlines() == [
        "nothing to train: the run has 4 epochs and train.epochs is 2; --epochs is the total, "
        "give more",
        proc.stderr.splitlines()[1],
    ]
    assert proc.stderr.splitlines()[1].startswith("done: 4 epochs, 92 steps (0.0 s training")
    assert {p.name: p.read_bytes() for p in run4.iterdir() if p.is_file()} == before


def test_train_log_tensorboard_groups_hparams_and_profile(run4):
    printed = (run4.parent / "q4.stderr").read_text().splitlines()
    log = (run4 / "train.log").read_text().splitlines()
    assert log[0].startswith("# 20") and "dtcli 0." in log[0]  # when, where, which dtcli
    assert log[1:] == printed  # every line the terminal got, and only those
    assert any(x.startswith("epoch 4/4 ") for x in log) and log[-1].startswith("done: 4 epochs")
    # 23 steps an epoch, K=16 a call (1-16, 17-23, 24-39, 40-46): the trace runs from the call
    # holding step 30 to the one reaching 40
    assert "profile: steps 24-46 traced into" in (run4.parent / "q4.stderr").read_text()
    assert list((run4 / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))

    from tensorboard.backend.event_processing import event_accumulator

    events = event_accumulator.EventAccumulator(
        str(run4 / "tensorboard"), size_guidance={"tensors": 0}
    )
    events.Reload()
    tags = set(events.Tags()["tensors"])
    assert {"train/loss", "train/accuracy", "eval/loss", "eval/accuracy", "step/loss"} <= tags
    assert {"perf/examples_per_sec", "time/seconds"} <= tags
    assert "_hparams_/session_start_info" in tags  # the recipe, in the HParams tab
    loss = [e.step for e in events.Tensors("eval/loss")]
    assert loss == [r["step"] for r in metrics.read(run4 / "metrics.jsonl")]


def test_hparams_flatten_the_recipe():
    from dtcli import recipe as recipe_lib

    flat = metrics.hparams_of(recipe_lib.to_mapping(recipe_lib.load(QUICK)))
    assert flat["optimizer.learning_rate"] == pytest.approx(3e-3)
    assert flat["mesh.batch"] == 4 and flat["devices"] == "cpu:8"
    assert json.loads(flat["model.layers"])[1] == {"Dense": {"units": 10}}  # lists as text
    assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())


@pytest.mark.parametrize("mesh", ["batch=1", "batch=8", "model=8"])
def test_eval_on_other_meshes_reproduces_training_metrics(run4, mesh):
    # One device needs a fresh process; the 8-device meshes run in this one.
    run = dtcli if mesh == "batch=1" else run_cli
    proc = run("eval", run4, "--mesh", mesh, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    final = metrics.read(run4 / "metrics.jsonl")[-1]
    assert result["examples"] == 360
    assert abs(result["accuracy"] - final["eval_accuracy"]) <= 1e-6
    assert result["loss"] == pytest.approx(final["eval_loss"], rel=1e-4)
    assert result["trained_on_mesh"] == "batch=4,model=2"


def test_eval_on_the_training_split_counts_each_example_once_on_any_mesh(run4):
    """The training split (placed on the devices while training, data.placement auto) is read
    as an eval split is: from the host, unshuffled, in eval batches, the last one masked."""
    results = []
    for extra in ([], ["--mesh", "model=8"], ["--batch-size", "100"]):
        proc = run_cli("eval", run4, "--split", "train", "--json", *extra)
        assert proc.returncode == 0, proc.stderr
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert [r["examples"] for r in results] == [1437] * 3 and results[0]["split"] == "train"
    for r in results[1:]:
        assert r["accuracy"] == results[0]["accuracy"]
        assert r["loss"] == pytest.approx(results[0]["loss"], rel=1e-5)
    # After 4 epochs the model fits its training data better than the held-out data.
    assert results[0]["loss"] < metrics.read(run4 / "metrics.jsonl")[-1]["eval_loss"]


def test_a_checkpoint_of_another_model_names_the_weight(run4):
    """`eval --set model.*` is refused before any weight is read (test_bad_inputs: eval keeps
    the checkpoint's model); a checkpoint checked against another model all the same (a
    `model.build` module edited since the run) names the weight whose shape differs, before
    anything is restored."""
    from types import SimpleNamespace as Weight

    from dtcli import evaluate
    from dtcli.errors import UsageError

    ckpt = evaluate.find_checkpoint(run4)
    saved = ckpt_lib.read_meta(ckpt)["weights"]
    assert saved["dense_0.bias"] == [128]
    live = [
        Weight(path=path, shape=[64] if path == "dense_0.bias" else shape)
        for path, shape in saved.items()
    ]
    with pytest.raises(
        UsageError, match=r"weight 'dense_0.bias' has shape \[128\] there but \[64\]"
    ):
        ckpt_lib.check_weights(ckpt, live)


def test_export_serves_plain_tensors_with_the_eval_accuracy(run4, tmp_path):
    out = tmp_path / "saved"
    proc = run_cli("export", run4, "--out", out)
    assert proc.returncode == 0, proc.stderr
    import tensorflow as tf

    from dtcli import data
    from dtcli.recipe import DataConfig

    ds = data.load(DataConfig())
    served = tf.saved_model.load(str(out))
    logits = served.signatures["serving_default"](x=tf.constant(ds.eval.x))["logits"].numpy()
    result = float(np.mean(np.argmax(logits, 1) == ds.eval.y))
    assert abs(result - metrics.read(run4 / "metrics.jsonl")[-1]["eval_accuracy"]) <= 1e-6


def final_weights(run_dir) -> dict:
    """The weights of a run's latest checkpoint, restored in this process (8 virtual CPUs)."""
    from dtcli import evaluate, models, session
    from dtcli.checkpoint import Checkpointer

    use_cpu8()
    ckpt = evaluate.find_checkpoint(run_dir)
    s = session.prepare(evaluate.checkpoint_recipe(ckpt, "eval"))
    Checkpointer(ckpt.parent, s.checkpoint_objects(), 1).restore(ckpt)
    return models.host_weights(s.model, s.mesh)


def max_rel(a: dict, b: dict) -> float:
    return max(
        float(
            np.max(np.abs(np.array(a[k]) - np.array(b[k])))
            / max(np.max(np.abs(np.array(b[k]))), 1e-12)
        )
        for k in b
    )


CORE = ["--set", "model.api=core", "--set", "model.layers=null", "--set", "model.hidden=[128]"]


@pytest.fixture(scope="module")
def whole_weights(run4):
    return final_weights(run4)


@pytest.fixture(scope="module")
def run2(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "q2"
    train(QUICK, "--epochs", "2", "--out", out)
    return out


def test_resume_gives_the_same_run_keras(run2, run4, whole_weights, tmp_path):
    split = tmp_path / "split"
    shutil.copytree(run2, split)
    proc = train("--resume", split, "--epochs", "4")
    a, b = metrics.read(run4 / "metrics.jsonl"), metrics.read(split / "metrics.jsonl")
    assert [r["epoch"] for r in b] == [1, 2, 3, 4]
    # the log goes on: the first session's lines, then the resumed one's under its own header
    log = (split / "train.log").read_text()
    assert log.startswith((run2 / "train.log").read_text())
    assert log.count("\n# 20") == 1 and log.endswith(proc.stderr)
    for key in ("train_loss", "eval_loss", "eval_accuracy", "step"):
        assert b[-1][key] == pytest.approx(a[-1][key], rel=1e-5)
    assert max_rel(final_weights(split), whole_weights) <= 1e-5


def test_resume_gives_the_same_run_core(tmp_path):
    whole, split = tmp_path / "whole", tmp_path / "split"
    train(QUICK, *CORE, "--epochs", "4", "--out", whole)
    train(QUICK, *CORE, "--epochs", "2", "--out", split)
    train("--resume", split, "--epochs", "4")
    a, b = metrics.read(whole / "metrics.jsonl"), metrics.read(split / "metrics.jsonl")
    for key in ("train_loss", "eval_loss", "eval_accuracy", "step"):
        assert b[-1][key] == pytest.approx(a[-1][key], rel=1e-5)
    assert max_rel(final_weights(split), final_weights(whole)) <= 1e-5


@pytest.mark.parametrize(
    "change", ["optimizer.name=sgd", "data.batch_size=32", "model.layers=[{Dense: {units: 10}}]"]
)
def test_resume_refuses_what_the_checkpoint_depends_on(run2, tmp_path, change):
    split = tmp_path / "split"
    shutil.copytree(run2, split)
    proc = train("--resume", split, "--epochs", "3", "--set", change, ok=False)
    key = change.split("=")[0].split(".")[0] if change.startswith("model") else change.split("=")[0]
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: --set {key}: a run resumes with the {key} it was trained with; train a new run "
        "(--out) to change it"
    ]
    assert sorted(os.listdir(split)) == sorted(os.listdir(run2))  # nothing touched


def test_resume_onto_another_mesh(run2, run4, whole_weights, tmp_path):
    split = tmp_path / "split"
    shutil.copytree(run2, split)
    train("--resume", split, "--epochs", "4", "--mesh", "batch=2,model=4")
    assert "batch: 2" in (split / "recipe.yaml").read_text()
    a, b = metrics.read(run4 / "metrics.jsonl"), metrics.read(split / "metrics.jsonl")
    for key in ("train_loss", "eval_loss", "eval_accuracy"):
        assert b[-1][key] == pytest.approx(a[-1][key], rel=1e-4)
    assert max_rel(final_weights(split), whole_weights) <= 1e-4


# Short epochs for the tests that interrupt a run: the interruption, not the training, is tested.
FOUR_STEPS = ["--set", "train.steps_per_epoch=4"]


def start_training(out, epochs, extra_env=None):
    """The quickstart in a fresh process (it gets signals), 4 steps an epoch, a save each."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "dtcli.cli",
            "train",
            QUICK,
            "--epochs",
            str(epochs),
            "--set",
            "train.checkpoint_every=1",
            *FOUR_STEPS,
            "--out",
            str(out),
            "--no-progress",
        ],
        cwd=ROOT,
        env={**env(), **(extra_env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition, proc, timeout=600.0):
    """Until `condition()` holds; fails at once if the training process `proc` ended first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        if proc.poll() is not None:
            raise AssertionError(f"training ended (exit {proc.returncode}): {proc.communicate()}")
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def test_sigterm_saves_exits_143_and_the_run_resumes_to_the_same_end(tmp_path):
    """A scheduler's preemption notice: the run saves at the end of the current call and exits
    with the requeue code; the resumed run ends where an uninterrupted one does. (Ctrl-C takes
    the same path with exit 130: test_stop_on_signal_* below.)"""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    train(QUICK, "--epochs", "12", *FOUR_STEPS, "--out", whole)
    # Slow saves (1 s each) keep the run going long enough to interrupt it mid-way.
    proc = start_training(cut, 12, {"DTCLI_TEST_PAUSE_IN_SAVE": "1"})
    try:
        wait_for(lambda: len(rundir.complete_checkpoints(cut)) >= 2, proc)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()  # nothing left running, even when an assert failed
    assert proc.returncode == 143, stderr
    assert "\npreempted (SIGTERM); saved " in stderr
    assert f"resume with: dtcli train --resume {cut}" in stderr
    assert "Traceback" not in stderr
    saved = re.search(r"saved (\S+);", stderr).group(1)
    assert Path(saved) == rundir.complete_checkpoints(cut)[-1]
    train("--resume", cut)
    a, b = metrics.read(whole / "metrics.jsonl"), metrics.read(cut / "metrics.jsonl")
    assert [r["epoch"] for r in b] == list(range(1, 13))
    assert b[-1]["eval_loss"] == pytest.approx(a[-1]["eval_loss"], rel=1e-5)
    assert b[-1]["step"] == a[-1]["step"]


def test_sigterm_before_training_removes_the_new_run_and_exits_143(tmp_path):
    """Preempted while it sets up (the run folder exists, TensorFlow is still starting): no
    half-made folder is left to block the requeued job's `--out`."""
    out = tmp_path / "run"
    proc = start_training(out, 3)
    try:
        wait_for(out.exists, proc)  # created (and locked) before any TensorFlow work
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 143, stderr
    assert (
        stderr.strip()
        .splitlines()[-1]
        .startswith("preempted (SIGTERM) outside the training loop; nothing new was saved")
    )
    assert "Traceback" not in stderr and not out.exists()


def test_a_sigterm_while_the_run_folder_is_made_lands_after_it():
    """Held back, not lost: raised once the block ends, where the clean-up can see the run."""
    from dtcli.errors import Preempted
    from dtcli.train.signals import SigtermOutsideTheLoop

    seen = []
    with SigtermOutsideTheLoop() as early:
        with pytest.raises(Preempted, match="preempted \\(SIGTERM\\) outside the training loop"):
            with early.deferred():
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(0.05)  # the handler has run by now, in this thread
                seen.append("block ended")
        with pytest.raises(Preempted):  # outside deferred(): at once
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    assert seen == ["block ended"]


def test_stop_on_signal_ctrl_c_twice_interrupts_sigterm_asks_and_exit_codes():
    from dtcli.errors import Interrupted
    from dtcli.train.signals import StopOnSignal

    stop = StopOnSignal(grace=60)
    with stop:
        assert not stop()
        stop._handle(signal.SIGINT, None)
        assert stop() and stop.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):  # the second Ctrl-C: at once
            stop._handle(signal.SIGINT, None)
    stop = StopOnSignal(grace=60)
    with stop:
        stop._handle(signal.SIGTERM, None)
        stop._handle(signal.SIGTERM, None)  # a repeated notice changes nothing
        assert stop() and stop.signal_name == "SIGTERM" and stop.deadline._timer.is_alive()
    assert stop.deadline._timer.finished.is_set()  # leaving the loop cancels the deadline
    assert Interrupted(None, Path("r"), preempted=True).exit_code == 143
    assert Interrupted(None, Path("r")).exit_code == 130


def test_sigterm_grace_period_running_out_exits_143_naming_it():
    code = (
        "import os, signal, time\n"
        "from dtcli.train.signals import StopOnSignal\n"
        "with StopOnSignal(grace=0.5):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(30)  # a call that outlasts the grace period\n"
    )
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 143, proc.stderr
    assert time.monotonic() - start < 20
    assert "grace period of 0.5 s ran out" in proc.stderr


def test_kill_during_a_save_leaves_the_previous_checkpoint_usable(tmp_path):
    out = tmp_path / "run"
    proc = start_training(out, 30, {"DTCLI_TEST_PAUSE_IN_SAVE": "3"})
    folder = out / "checkpoints"
    try:
        wait_for(lambda: rundir.complete_checkpoints(out) and any(folder.glob(".tmp-ckpt-*")), proc)
    finally:
        proc.kill()
    proc.communicate(timeout=60)
    before = rundir.complete_checkpoints(out)[-1]
    assert before is not None and list(folder.glob(".tmp-ckpt-*"))
    proc = run_cli("eval", out, "--json")  # the half-written save is invisible
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1])["checkpoint"] == str(before)
    resumed = train("--resume", out, "--epochs", str(ckpt_lib.read_meta(before)["epoch"] + 1))
    assert f"resuming {before}" in resumed.stderr
    assert not list(folder.glob(".tmp-ckpt-*"))
    assert (
        metrics.read(out / "metrics.jsonl")[-1]["epoch"] == ckpt_lib.read_meta(before)["epoch"] + 1
    )


def test_non_finite_loss_stops_loudly_and_saves_nothing_bad(tmp_path):
    out = tmp_path / "run"
    proc = train(
        QUICK,
        "--set",
        "optimizer.learning_rate=1e12",
        "--set",
        "optimizer.name=sgd",
        "--epochs",
        "3",
        "--out",
        out,
        ok=False,
    )
    assert proc.returncode == 1
    assert "non-finite training loss" in proc.stderr and "Traceback" not in proc.stderr
    assert not rundir.complete_checkpoints(out)


def test_plot_overlays_two_runs(run4, run2, tmp_path):
    proc = run_cli("plot", run4, run2, "--out", tmp_path / "plots")
    assert proc.returncode == 0, proc.stderr
    written = proc.stdout.split()
    assert [os.path.basename(p) for p in written] == ["loss.png", "accuracy.png", "step_loss.png"]
    assert all(os.path.getsize(p) > 10_000 for p in written)


def test_tfds_source_with_mock_data(tmp_path, cpu8):
    from tensorflow_datasets.testing import mock_data

    from dtcli import recipe as R
    from dtcli import train as T

    recipe = R.load(
        RECIPES / "mnist_core_mlp.yaml",
        R.Overrides(
            (f"data.data_dir={tmp_path}", "model.hidden=[32]", "train.epochs=1")
            + ("data.batch_size=32",),
            mesh="batch=8",
            devices="cpu:8",
        ),
    )
    with mock_data(num_examples=64):
        result = T.train(recipe, out=tmp_path / "run", progress=False)
    assert result.history[-1]["train_examples"] == 64
    assert result.history[-1]["eval_examples"] == 64


def test_user_model_code_beside_the_recipe_trains_and_evaluates_from_anywhere(tmp_path):
    """`model.build` imports from the recipe's folder, recorded in the run, so `dtcli eval` works
    from another directory; a rule that matches nothing is reported."""
    out = tmp_path / "run"
    rules = "{up\\.kernel: [unsharded, model], down\\.kernel: [model, unsharded], nope: [model]}"
    proc = run_cli(
        "train",
        QUICK,
        "--set",
        "model.layers=null",
        "--set",
        "model.build=custom_models:subclassed_mlp",
        "--set",
        f"layouts.rules={rules}",
        "--epochs",
        "2",
        "--out",
        out,
        "--no-progress",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert "warning: recipe key 'layouts.rules.nope' matched no weight" in proc.stderr
    assert f"build_path: {RECIPES}" in (out / "recipe.yaml").read_text()
    result = run_cli("eval", out, "--mesh", "model=8", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    final = metrics.read(out / "metrics.jsonl")[-1]
    assert (
        abs(json.loads(result.stdout.splitlines()[-1])["accuracy"] - final["eval_accuracy"]) <= 1e-6
    )


# --------------------------------------------------------------------------- remote run directories


def test_a_ram_run_directory_trains_evaluates_resumes_and_plots(run4, cli):
    """`ram://` is TensorFlow's in-memory file system: everything of the run goes through
    tf.io.gfile (a local write would not be there). Resumed to 4 epochs it ends as the local
    4-epoch run does; TensorFlow's own latest_checkpoint finds dtcli's checkpoints."""
    import tensorflow as tf

    out = "ram://e2e/q"
    assert cli("train", QUICK, "--epochs", "2", "--out", out, "--no-progress").code == 0
    ev = cli("eval", out, "--json")
    assert ev.code == 0, ev.err
    assert json.loads(ev.out.splitlines()[-1])["checkpoint"] == f"{out}/checkpoints/ckpt-00000046"
    res = cli("train", "--resume", out, "--epochs", "4", "--no-progress")
    assert res.code == 0, res.err
    assert cli("plot", out).code == 0
    names = set(tf.io.gfile.listdir(out))
    assert {"recipe.yaml", "metrics.jsonl", "steps.jsonl", "resumes.jsonl", "train.log"} <= names
    assert {"checkpoints", "tensorboard", "plots"} <= {n.rstrip("/") for n in names}
    assert not any(n.startswith(".") for n in tf.io.gfile.listdir(f"{out}/checkpoints"))
    remote = metrics.read(f"{out}/metrics.jsonl")
    local = metrics.read(run4 / "metrics.jsonl")
    assert [r["epoch"] for r in remote] == [1, 2, 3, 4]
    for key in ("train_loss", "eval_loss", "eval_accuracy", "step"):
        assert remote[-1][key] == pytest.approx(local[-1][key], rel=1e-5), key
    assert (
        tf.train.latest_checkpoint(f"{out}/checkpoints") == f"{out}/checkpoints/ckpt-00000092/ckpt"
    )
    latest = rundir.complete_checkpoints(run4)[-1]
    assert tf.train.latest_checkpoint(str(run4 / "checkpoints")) == str(latest / "ckpt")
    # bad input on a remote run directory: still one line, exit 2
    again = cli("train", QUICK, "--out", out, "--no-progress")
    assert again.code == 2 and "the folder exists and is not empty" in again.err
    gone = cli("eval", "ram://e2e/nothing")
    assert gone.code == 2 and gone.err.startswith("error: CHECKPOINT 'ram://e2e/nothing': no such")
    tf.io.gfile.rmtree("ram://e2e")


def test_a_remote_checkpoint_counts_only_once_its_meta_json_is_written(cli):
    """Object stores cannot rename folders: in place, meta.json written last is the commit."""
    import tensorflow as tf

    from dtcli import storage

    folder = storage.as_path("ram://commit/run/checkpoints")
    (folder / "ckpt-00000010").mkdir(parents=True)
    (folder / "ckpt-00000010" / "ckpt.index").write_bytes(b"x")  # a save cut short
    assert ckpt_lib.complete(folder) == []
    (folder / "ckpt-00000010" / ckpt_lib.META).write_text("{}")
    assert ckpt_lib.complete(folder) == [folder / "ckpt-00000010"]
    tf.io.gfile.rmtree("ram://commit")


def test_storage_paths_behave_like_pathlib_where_dtcli_uses_them(cli):
    from dtcli import storage

    p = storage.as_path("ram://b//runs/x/")
    assert str(p) == "ram://b/runs/x" and p.name == "x" and str(p.parent) == "ram://b/runs"
    assert [str(q) for q in p.parents] == ["ram://b/runs", "ram://b"]
    assert storage.as_path("runs/x") == Path("runs/x") and not storage.is_remote("runs/x")
    assert storage.as_path("file:///tmp/x") == Path("/tmp/x") and not storage.is_remote("file:///x")
    assert not p.exists() and not p.is_dir()
    with pytest.raises(FileNotFoundError):
        p.read_text()
    p.mkdir(parents=True)
    storage.append_line(p / "m.jsonl", "one")
    storage.append_line(p / "m.jsonl", "two")
    assert (p / "m.jsonl").read_text() == "one\ntwo\n" and (p / "m.jsonl").stat().st_size == 8
    storage.write_atomic(p / "m.jsonl", "three\n")
    assert [q.name for q in p.iterdir()] == ["m.jsonl"] and p.glob("*.jsonl") == [p / "m.jsonl"]
    with pytest.raises(OSError):
        p.rmdir()  # not empty
    storage.rmtree(p.parent.parent)
    assert not p.exists()


def test_done_names_the_best_evaluation_and_whether_its_checkpoint_is_kept(tmp_path):
    import io

    from rich.console import Console

    from dtcli.train.console import summary

    history = [
        {"epoch": e, "step": 10 * e, "eval_accuracy": acc, "seconds": 1.0}
        for e, acc in ((1, 0.5), (2, 0.9), (3, 0.8))
    ]
    for kept, said in (
        (
            [tmp_path / "ckpt-00000020", tmp_path / "ckpt-00000030"],
            "its checkpoint ckpt-00000020 is kept",
        ),
        ([tmp_path / "ckpt-00000030"], "no checkpoint of it is kept (train.keep"),
    ):
        out = io.StringIO()
        summary(Console(file=out, width=400), history, 0, kept)
        line = out.getvalue().strip()
        assert line.startswith("done: 3 epochs, 30 steps"), line
        assert "best eval acc 0.9000 in epoch 2 (step 20)" in line and said in line, line
