"""train.eval_tasks: lm-evaluation-harness tasks at each evaluation of a language model, their
metrics in metrics.jsonl, TensorBoard and the plots; the recipe section and its checks; two
clients record what one process computes."""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path

import pytest
import yaml
from conftest import LM_TASKS, RECIPES, dtcli, run_cli, run_python, write_corpus

from dtcli import metrics as metrics_lib
from dtcli import recipe as recipe_lib
from dtcli import rundir

# Checked: metrics equal to the same checkpoint's tasks run here,
# names in TensorBoard and plots; Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")

GPT = RECIPES / "tiny_gpt.yaml"
TP = RECIPES / "tiny_gpt_tensor_parallel.yaml"  # its rules split heads and MLP on `model`
LIMIT = 8
NAMES = ("tiny_mc", "tiny_ppl")
TASKS = f"{{tasks: [{', '.join(NAMES)}], include_path: {LM_TASKS}, limit: {LIMIT}}}"
# In the in-process run tiny_gen too: the KV-cached decoding lowers beside the training steps.
ALL = (*NAMES, "tiny_gen")
ALL_TASKS = f"{{tasks: [{', '.join(ALL)}], include_path: {LM_TASKS}, limit: {LIMIT}}}"
# A GPT small enough to train and evaluate in seconds (its answers matter less than that each
# evaluation's equal the checkpoint's); context 64: tiny_ppl's longest document needs more than
# one window. A checkpoint at every evaluation.
TRAIN = [
    "model.transformer={layers: 1, d_model: 32, heads: 4, mlp_ratio: 2, context: 64}",
    "data.tokenizer=bpe:300",
    "data.batch_size=8",
    "data.eval_batch_size=8",
    "train.steps_per_call=10",
    "train.checkpoint_every=1",
    "train.keep=5",
    "optimizer.learning_rate=1e-2",
    "optimizer.warmup_steps=5",
]
MC = ("tiny_mc/acc", "tiny_mc/acc_norm", "tiny_mc/acc_stderr", "tiny_mc/acc_norm_stderr")
PPL = ("tiny_ppl/word_perplexity", "tiny_ppl/byte_perplexity", "tiny_ppl/bits_per_byte")
OFFLINE = ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE")


def offline_env(folder: Path) -> dict[str, str]:
    """lm-eval (and the datasets library under it) offline, its caches in a test folder."""
    return {
        **dict.fromkeys(OFFLINE, "1"),
        "HF_HOME": str(folder / "hf_home"),
        "HF_DATASETS_CACHE": str(folder / "hf_datasets"),
    }


def sets(*pairs: str) -> list[str]:
    return [x for pair in pairs for x in ("--set", pair)]


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hf")
    with pytest.MonkeyPatch.context() as patch:
        for key, value in offline_env(folder).items():
            patch.setenv(key, value)
        yield


@pytest.fixture(scope="module")
def trained(tmp_path_factory, offline, cpu8):
    """40 steps on batch=4,model=2 (heads and MLP split), evaluated with the tasks at steps 20
    and 40: the harness's forward passes lower beside the live training steps. (A training
    run in this process takes all 8 virtual CPUs: batch=2,model=2 would need a fresh one.)"""
    from dtcli import progress

    folder = tmp_path_factory.mktemp("eval_tasks")
    corpus = write_corpus(folder / "corpus.txt", 40_000)
    out = folder / "run"
    more = ("train.steps=40", "train.eval_every=20", f"train.eval_tasks={ALL_TASKS}")
    args = sets(f"data.path={corpus}", *TRAIN, *more)
    mesh = ("--mesh", "batch=4,model=2", "--devices", "cpu:8")
    heard = Heard()
    logging.getLogger("lm_eval").addHandler(heard)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(progress, "BEAT_EVERY", 0.05)  # a heartbeat line while the tasks run
            r = run_cli("train", TP, *args, *mesh, "--out", out)
    finally:
        logging.getLogger("lm_eval").removeHandler(heard)
    assert r.code == 0, r.err
    # lm-eval's warnings (one per task, each evaluation) stay out of the run's output
    assert [x.getMessage() for x in heard.records if x.levelno >= logging.WARNING] == []
    return out, r


class Heard(logging.Handler):
    """The log records a logger passed on."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def restored_metrics(
    checkpoint: Path, mesh: str, use_devices: int, names: tuple[str, ...] = NAMES
) -> dict[str, float]:
    """harness.run_tasks on a checkpoint restored as `dtcli eval` restores it."""
    from dtcli import devices, harness
    from dtcli.recipe import Overrides
    from dtcli.session.restore import restored_session

    key = devices.key_for("cpu:8")
    recipe = rundir.checkpoint_recipe(checkpoint, "eval", Overrides(mesh=mesh, devices="cpu:8"))
    session = restored_session(checkpoint, checkpoint, recipe, "eval", use_devices, key)
    options = harness.TaskOptions(tasks=names, include_path=str(LM_TASKS), limit=float(LIMIT))
    return harness.metrics(harness.run_tasks(session, options))


def test_each_evaluation_records_the_tasks_as_its_checkpoint_scores_them(trained):
    out, r = trained
    records = metrics_lib.read(out / "metrics.jsonl")
    assert [x["step"] for x in records] == [20, 40]
    for record in records:
        for key in (*MC, *PPL, "tiny_gen/exact_match"):
            assert key in record and math.isfinite(record[key]), (key, record)
        assert not [k for k in record if "," in k]
        assert 0 <= record["tiny_mc/acc"] <= 1 and record["tiny_ppl/word_perplexity"] > 1
        assert record["eval_tasks_seconds"] > 0
        checkpoint = out / "checkpoints" / f"ckpt-{record['step']:08d}"
        # tiny_gen's decoding compiles in seconds: compared at the last step alone
        names = ALL if record is records[-1] else NAMES
        expected = restored_metrics(checkpoint, "batch=4,model=2", 8, names)
        tasks = {k: v for k, v in record.items() if k.split("/")[0] in names}
        assert set(tasks) == set(expected)
        for key, value in expected.items():
            assert tasks[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key
    # the weights changed between the evaluations, and the tasks saw it
    assert records[0]["tiny_ppl/word_perplexity"] != records[1]["tiny_ppl/word_perplexity"]
    lines = [x for x in r.err.splitlines() if x.startswith("step ") and "eval loss" in x]
    assert len(lines) == 2 and all(" | tiny_mc/acc " in x for x in lines), lines
    assert "running lm-eval tasks" in r.err
    # no progress bar of lm-eval's (or datasets') between the loop's lines
    assert "Tokenizing inputs" not in r.err and "it/s]" not in r.err, r.err[-500:]


def test_tensorboard_holds_the_task_metrics_under_their_names(trained):
    import tensorflow as tf

    out, _ = trained
    tags: dict[str, list[int]] = {}
    for path in sorted((out / "tensorboard").rglob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(event.step)
    for key in (*MC, *PPL):
        assert tags.get(key) == [20, 40], (key, sorted(tags))


def test_the_plots_draw_task_metrics(trained, tmp_path, cli):
    out, _ = trained
    # the run's own plots, drawn at its end: the tasks' metrics beside the loss
    assert {"tiny_mc-acc.png", "tiny_ppl-word_perplexity.png"} <= {
        p.name for p in (out / "plots").iterdir()
    }
    r = cli("plot", out, "--metric", "tiny_mc/acc_norm", "--out", tmp_path / "p")
    assert r.code == 0, r.err
    assert [Path(x).name for x in r.out.split()] == ["tiny_mc-acc_norm.png"]
    assert (tmp_path / "p" / "tiny_mc-acc_norm.png").read_bytes()[:4] == b"\x89PNG"
    r = cli("plot", out, "--metric", "tiny_mc/f1", "--out", tmp_path / "q")
    assert r.code == 2 and "tiny_mc/f1" in r.err and "tiny_mc/acc_norm" in r.err, r.err
    assert not (tmp_path / "q").exists()


# ---------------------------------------------------------------- the recipe (no TensorFlow)


def test_the_section_loads_with_its_include_path_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "tasks").mkdir()
    section = "train.eval_tasks={tasks: [tiny_mc], include_path: tasks, limit: 0.5}"
    recipe = recipe_lib.load(GPT, [section, "optimizer.warmup_steps=0"])
    cfg = recipe.train.eval_tasks
    assert cfg == recipe_lib.EvalTasksConfig(("tiny_mc",), str(tmp_path / "tasks"), 0.5)
    # recipe.yaml loads back to the same recipe from anywhere (a resume, another client)
    monkeypatch.chdir(Path(__file__).parent)
    assert recipe_lib.load(yaml.safe_load(recipe_lib.dump(recipe))) == recipe
    schema = recipe_lib.schema()["properties"]["train"]["properties"]["eval_tasks"]
    assert schema["default"] is None
    assert set(schema["anyOf"][0]["properties"]) == {
        "tasks",
        "include_path",
        "limit",
        "num_fewshot",
        "batch_size",
    }


def test_a_resume_may_change_the_tasks(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    recipe = recipe_lib.load(GPT)
    (run / rundir.RECIPE).write_text(recipe_lib.dump(recipe))
    section = f"train.eval_tasks={{tasks: [tiny_mc], include_path: {LM_TASKS}}}"
    resumed = rundir.resume_recipe(run, recipe_lib.Overrides((section,)))
    assert resumed.train.eval_tasks.tasks == ("tiny_mc",)


def test_without_lm_eval_the_recipe_is_refused_before_the_run_starts(tmp_path, monkeypatch, cli):
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if not installed
    out = tmp_path / "run"
    r = cli("train", GPT, *sets(f"train.eval_tasks={TASKS}"), "--out", out)
    assert r.code == 2, r.err
    assert r.err_lines == [
        "error: train.eval_tasks: needs lm-evaluation-harness, an optional extra: "
        "pip install 'dtensor-cli[eval]'"
    ]
    assert not out.exists()


def test_the_task_names_are_checked_before_tensorflow_starts(tmp_path):
    """In a fresh process: the refusal comes with no TensorFlow imported and no run folder."""
    section = f"train.eval_tasks={{tasks: [tiny_mc], include_path: {tmp_path / 'f'}}}"
    (tmp_path / "f").write_text("x")
    out = tmp_path / "run"
    code = f"""
        import json, sys
        from dtcli import cli
        code = cli.run(["train", {str(GPT)!r}, "--set", {section!r}, "--out", {str(out)!r}])
        print(json.dumps([code, "tensorflow" in sys.modules]))
    """
    assert run_python(code) == [2, False]
    assert not out.exists()


# ---------------------------------------------------------------- several clients


@pytest.mark.slow
def test_two_clients_record_what_one_process_computes(tmp_path, offline, cpu8):
    """`dtcli launch --clients 2` (4 virtual CPUs each, batch=8): every client runs the tasks,
    client 0 records them; they equal the tasks run on its checkpoint in this process."""
    corpus = write_corpus(tmp_path / "corpus.txt", 20_000)
    out = tmp_path / "run"
    small = "model.transformer={layers: 1, d_model: 16, heads: 2, mlp_ratio: 2, context: 64}"
    more = ("train.steps=10", f"train.eval_tasks={TASKS}", small)
    args = sets(f"data.path={corpus}", *TRAIN, *more)
    env = offline_env(tmp_path)
    proc = dtcli(
        "launch", "--clients", "2", "--devices-per-client", "cpu:4",
        GPT, *args, "--mesh", "batch=8", "--out", out, timeout=600, extra_env=env,
    )  # fmt: skip
    assert proc.code == 0, proc.err[-3000:]
    (record,) = metrics_lib.read(out / "metrics.jsonl")
    expected = restored_metrics(out / "checkpoints" / "ckpt-00000010", "batch=8", 8)
    assert {k: v for k, v in record.items() if "/" in k}.keys() == expected.keys()
    for key, value in expected.items():
        assert record[key] == pytest.approx(value, rel=1e-5, abs=1e-5), key


# ---------------------------------------------------------------- records, TensorBoard, plots


def test_task_metrics_keep_their_names_in_tensorboard_and_the_plots(tmp_path):
    """A run's records with task metrics (as the loop writes them), drawn with no TensorFlow:
    each task metric its own figure by default (standard errors on request), file names safe."""
    from dtcli import plot

    assert metrics_lib.tensorboard_tag("tiny_mc/acc") == "tiny_mc/acc"
    assert metrics_lib.tensorboard_tag("train_x/acc") == "train_x/acc"
    assert metrics_lib.tensorboard_tag("eval_loss") == "eval/loss"
    run = tmp_path / "run"
    run.mkdir()
    records = [
        {
            "epoch": e,
            "step": 10 * e,
            "train_loss": 3.0 / e,
            "eval_loss": 3.1 / e,
            "eval_accuracy": 0.1 * e,
            "eval_perplexity": 20.0 / e,
            "tiny_mc/acc": 0.25 * e,
            "tiny_mc/acc_stderr": 0.1,
            "gsm/exact_match/strict match": 0.1 * e,
        }
        for e in (1, 2)
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    written = {p.name for p in plot.plot_runs([run], tmp_path / "p")}
    assert {"tiny_mc-acc.png", "gsm-exact_match-strict-match.png"} <= written
    assert not [name for name in written if "stderr" in name]
    (path,) = plot.plot_runs([run], tmp_path / "q", ["tiny_mc/acc_stderr"])
    assert path.name == "tiny_mc-acc_stderr.png"
