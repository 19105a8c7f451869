"""`dtcli eval --tasks`: lm-evaluation-harness tasks on a language model's checkpoint, and the
glue under it (dtcli.harness.tasks: seeds, limit, few-shot, metric names, the table; lm-eval's
files as its CLI writes them, into the run directory or where --output-path says).

lm-eval runs offline here: every test that runs it points HF_HOME and the datasets cache at a
temporary folder, with HF_DATASETS_OFFLINE and HF_HUB_OFFLINE set (the `offline` fixture); the
tasks are the local ones in tests/data/lm_tasks, copied first (they read their data from their
own folder)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, env

from dtcli import harness, rundir
from dtcli.harness import output as output_lib
from dtcli.rundir.files import LM_EVAL

# Checked: lm-eval's tables, files, names, seeds and options on a checkpoint; Grappler's rewrites off (conftest.without_grappler).
pytestmark = pytest.mark.usefixtures("without_grappler")

TASKS = ROOT / "tests" / "data" / "lm_tasks"


@pytest.fixture
def offline(tmp_path, monkeypatch) -> Path:
    """lm-eval and datasets offline, their caches in this test's folder -> a copy of the tasks."""
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(home / "datasets"))
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    tasks = tmp_path / "tasks"
    shutil.copytree(TASKS, tasks)
    return tasks


def fake_lm():
    """A TemplateLM whose numbers are a function of the tokens alone: a continuation's log
    likelihood is minus its tokens' sum, so the choice with the smallest character codes wins
    (deterministic, and different from the gold answer on some items)."""
    from lm_eval.api.model import TemplateLM

    class Fake(TemplateLM):
        tokenizer_name = "fake"
        seen: list = []

        @property
        def eot_token_id(self) -> int:
            return 0

        def tok_encode(self, string, **kwargs):
            return [ord(ch) for ch in string]

        def _loglikelihood_tokens(self, requests, **kwargs):
            self.seen.extend(requests)
            return [(-float(sum(cont)) / 100, False) for _, _, cont in requests]

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            return [-float(len(r.args[0])) for r in requests]

        def generate_until(self, requests, disable_tqdm=False):
            return [" speak" for _ in requests]

    return Fake()


def expected_acc(items: list[dict]) -> float:
    """tiny_mc's accuracy under fake_lm: the choice with the smallest code sum, against gold."""
    right = [min(range(len(d["choices"])), key=lambda i: sum(map(ord, d["choices"][i])))
             == d["answer"] for d in items]  # fmt: skip
    return sum(right) / len(right)


def test_evaluate_runs_lm_evals_tasks_with_the_options_given(offline):
    """tasks.evaluate on an LM instance: the limit, the few-shot count and the seeds reach
    lm-eval (its results say so), the accuracy is what the LM's numbers give, the metrics are
    named TASK/METRIC, and the table is lm-eval's."""
    items = [json.loads(line) for line in (offline / "tiny_mc.jsonl").read_text().splitlines()]
    options = harness.TaskOptions(
        tasks=("tiny_mc", "tiny_ppl"), include_path=str(offline), limit=6, num_fewshot=1,
        seed=(5, 6, 7, 8), log_samples=True,
    )  # fmt: skip
    lm = fake_lm()
    results = harness.evaluate(lm, options, model_name="runs/r/checkpoints/ckpt-00000009")
    assert results["n-samples"]["tiny_mc"] == {"original": len(items), "effective": 6}
    assert results["n-shot"]["tiny_mc"] == 1
    config = results["config"]
    assert (config["random_seed"], config["numpy_seed"], config["torch_seed"]) == (5, 6, 7)
    assert config["fewshot_seed"] == 8 and config["limit"] == 6
    assert results["model_name"] == "runs/r/checkpoints/ckpt-00000009"
    # one few-shot example before each question: two questions' text in every context
    contexts = [ctx for (ctx, _), _, _ in lm.seen]
    assert len(contexts) == sum(len(d["choices"]) for d in items[:6])
    assert all(ctx.count("\n\n") >= 1 for ctx in contexts)
    found = harness.metrics(results)
    assert found["tiny_mc/acc"] == pytest.approx(expected_acc(items[:6]))
    assert {"tiny_mc/acc_norm", "tiny_mc/acc_stderr", "tiny_ppl/word_perplexity"} <= set(found)
    assert all("," not in name for name in found)
    assert len(results["samples"]["tiny_mc"]) == 6
    assert set(results["task_hashes"]) == {"tiny_mc", "tiny_ppl"}
    text = harness.table(results)
    header = [cell.strip() for cell in text.splitlines()[0].split("|")]
    assert header[1:6] == ["Tasks", "Version", "Filter", "n-shot", "Metric"]
    assert "|tiny_mc " in text and "acc_norm" in text and "word_perplexity" in text


def test_metrics_names_every_numeric_metric_without_commas():
    results = {
        "results": {
            "t": {
                "alias": "t", "sample_len": 5, "acc,none": 0.5, "acc_stderr,none": 0.1,
                "exact_match,strict-match": 1.0, "f1,none": "N/A",
            },
        },
        "groups": {"g": {"acc,none": 0.25, "acc_stderr,none": "N/A"}},
    }  # fmt: skip
    assert harness.metrics(results) == {
        "t/acc": 0.5,
        "t/acc_stderr": 0.1,
        "t/exact_match/strict-match": 1.0,
        "g/acc": 0.25,
    }


def test_result_files_are_named_and_written_as_lm_evals_cli_writes_them():
    """output.result_files: results_DATE.json without the samples, one samples_TASK_DATE.jsonl
    per task with lm-eval's argument layout; output_place: a folder holds a folder per model, a
    .json path names the file."""
    results = {
        "results": {"t": {"acc,none": 1.0}},
        "samples": {"t": [{"arguments": [("ctx", " a")], "resps": [[(-1.0, True)]],
                           "filtered_resps": [(-1.0, True)], "target": 0}]},
    }  # fmt: skip
    files = output_lib.result_files(results, when="D")
    assert list(files) == ["results_D.json", "samples_t_D.jsonl"]
    assert json.loads(files["results_D.json"]) == {"results": {"t": {"acc,none": 1.0}}}
    (sample,) = [json.loads(line) for line in files["samples_t_D.jsonl"].splitlines()]
    assert sample["arguments"] == {"gen_args_0": {"arg_0": "ctx", "arg_1": " a"}}
    assert sample["target"] == "0"
    folder, stem = output_lib.output_place("out", "runs/r/checkpoints/ckpt-1")
    assert (str(folder), stem) == ("out/runs__r__checkpoints__ckpt-1", "results")
    folder, stem = output_lib.output_place("out/mine.json", "whatever")
    assert (str(folder), stem) == ("out", "mine")


def test_check_tasks_names_a_recipe_sections_keys(tmp_path):
    """check_tasks for train.eval_tasks names its recipe keys, not the command line's options."""
    from dtcli.errors import UsageError

    options = harness.TaskOptions(tasks=("tiny_mc",), include_path=str(tmp_path / "nope"))
    with pytest.raises(UsageError) as caught:
        harness.check_tasks(options, named="train.eval_tasks")
    assert str(caught.value).startswith(
        f"recipe key 'train.eval_tasks.include_path' '{tmp_path / 'nope'}': no such folder"
    )
    with pytest.raises(UsageError, match="^--include-path '"):
        harness.check_tasks(options)


def test_a_hub_task_offline_is_one_line_naming_it(offline):
    """A task whose data set is on the hub (as lm-eval's own tasks' are), the hub out of reach:
    one line, not datasets' ConnectionError."""
    from dtcli.errors import UsageError

    hub = (offline / "tiny_mc.yaml").read_text().replace("task: tiny_mc", "task: on_hub")
    hub = hub.replace("dataset_path: json", "dataset_path: someone/a_hub_data_set")
    (offline / "on_hub.yaml").write_text(
        hub.replace("custom_dataset: !function local_json.load", "")
    )
    options = harness.TaskOptions(("on_hub",), include_path=str(offline), limit=2)
    with pytest.raises(UsageError) as caught:
        harness.evaluate(fake_lm(), options)
    assert str(caught.value).startswith("--tasks on_hub: cannot fetch a task's data (")
    assert str(caught.value).endswith(
        "offline, only tasks whose data are local or already cached run"
    )


def test_the_task_index_is_built_once_for_the_check_and_every_evaluation(offline, monkeypatch):
    """check_tasks then evaluate (at each evaluation of a training run) share one TaskManager
    per include path: lm-eval's own index takes seconds to build."""
    import lm_eval.tasks

    from dtcli.harness import tasks as tasks_lib

    built = []
    real = lm_eval.tasks.TaskManager

    def counted(*args, **kwargs):
        built.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(lm_eval.tasks, "TaskManager", counted)
    tasks_lib._manager.cache_clear()
    options = harness.TaskOptions(("tiny_ppl",), include_path=str(offline), limit=1)
    harness.check_tasks(options)
    for _ in range(2):
        harness.evaluate(fake_lm(), options)
    assert built == [{"include_path": str(offline), "include_defaults": False}]


def test_without_lm_eval_eval_tasks_says_how_to_install_it(monkeypatch, tmp_path, cli):
    """lm_eval's import failing (an install without the extra): one line naming --tasks and the
    extra, exit 2, before any checkpoint is read (there is none here)."""
    import builtins

    real = builtins.__import__

    def no_lm_eval(name, *args, **kwargs):
        if name == "lm_eval" or name.startswith("lm_eval."):
            raise ImportError(f"No module named {name!r}")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_lm_eval)
    r = cli("eval", tmp_path / "nothing", "--tasks", "tiny_mc")
    assert r.code == 2 and r.out == ""
    assert r.err_lines == [
        "error: --tasks: needs lm-evaluation-harness, an optional extra: "
        "pip install 'dtensor-cli[eval]'"
    ]


def test_dtcli_and_eval_help_never_import_lm_eval():
    """lm_eval is imported where tasks run only: not by dtcli's modules, nor `dtcli eval --help`."""
    code = (
        "import sys\n"
        "import dtcli.cli.app, dtcli.evaluate, dtcli.harness, dtcli.harness.output\n"
        "from dtcli.cli import run\n"
        "code = run(['eval', '--help'])\n"
        "print(code, 'lm_eval' in sys.modules, 'tensorflow' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env()
    )
    assert "--tasks" in proc.stdout and "--include-path" in proc.stdout, proc.stderr
    assert proc.stdout.split()[-3:] == ["0", "False", "False"], proc.stdout[-300:]


# --------------------------------------------------------------------------- the command


def copy_run(lm_run: Path, tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(lm_run, run)
    return run


def numbers(results: dict) -> dict[str, float]:
    return harness.metrics(results)


def test_eval_tasks_prints_lm_evals_table_and_writes_its_files_into_the_run(
    offline, lm_run, tmp_path, cli
):
    """The table as lm-eval prints it; the results file and one samples file per task
    (--log-samples) in RUN_DIR/lm_eval/ as lm-eval names them, said on stderr; then --json and
    --output-path FOLDER: the same numbers on stdout and in FOLDER/MODEL/results_DATE.json."""
    run = copy_run(lm_run, tmp_path)
    task_args = ("--tasks", "tiny_mc,tiny_ppl", "--include-path", offline, "--limit", "8")
    r = cli("eval", run, *task_args, "--log-samples", "--no-progress")
    assert r.code == 0, r.err
    assert "|tiny_mc " in r.out and "acc_norm" in r.out and "bits_per_byte" in r.out
    files = sorted(p.name for p in (run / LM_EVAL).iterdir())
    assert len(files) == 3 and files[0].startswith("results_") and files[0].endswith(".json")
    assert [f.split("_2")[0] for f in files[1:]] == ["samples_tiny_mc", "samples_tiny_ppl"]
    results = json.loads((run / LM_EVAL / files[0]).read_text())
    assert f"results: {run / LM_EVAL / files[0]}" in r.err
    assert "samples" not in results and results["n-samples"]["tiny_mc"]["effective"] == 8
    assert results["model_name"].startswith(str(run / "checkpoints" / "ckpt-"))
    mc = [json.loads(line) for line in (run / LM_EVAL / files[1]).read_text().splitlines()]
    assert len(mc) == 8  # one request a choice, each (context, continuation), as lm-eval logs it
    assert len(mc[0]["arguments"]) == len(mc[0]["doc"]["choices"])
    assert mc[0]["arguments"]["gen_args_0"]["arg_0"] == mc[0]["doc"]["question"]
    # the table's accuracy is the file's
    acc = numbers(results)["tiny_mc/acc"]
    row = next(line for line in r.out.splitlines() if "|acc " in line)
    assert f"{acc:.4f}" in row

    out = tmp_path / "out"
    again = cli("eval", run, *task_args, "--json", "--output-path", out, "--no-progress")
    assert again.code == 0, again.err
    printed = json.loads(again.out.strip().splitlines()[-1])
    (written,) = out.glob("*/results_*.json")
    assert written.parent.name == output_lib.model_folder(results["model_name"])
    assert numbers(printed) == numbers(json.loads(written.read_text())) == numbers(results)
    assert len(list((run / LM_EVAL).iterdir())) == 3  # the run's own files alone


def test_apply_chat_template_without_a_template_is_refused_before_the_restore(
    offline, lm_run, cli, monkeypatch
):
    """--apply-chat-template on a run with no chat template: refused from the run's files,
    before a weight is read (a large model's restore is no wait for a refusal)."""
    from dtcli.session import restore

    def no_restore(*args, **kwargs):
        raise AssertionError("restored before the refusal")

    monkeypatch.setattr(restore, "restored_session", no_restore)
    r = cli(
        "eval", lm_run, "--tasks", "tiny_gen", "--include-path", offline,
        "--apply-chat-template", "--no-progress",
    )  # fmt: skip
    assert r.code == 2 and r.out == ""
    assert r.err_lines[-1].startswith("error: --apply-chat-template: this run was trained")
    assert "restored before" not in r.err


def test_eval_tasks_writes_beside_a_run_another_process_is_writing(offline, lm_run, tmp_path, cli):
    """While another process holds the run's lock (a run in training), the results go into
    RUN_DIR-lm_eval beside it, said so on stderr, and the run is left as it was; a refusal
    after the restore (--apply-chat-template on a run without a template) writes nothing."""
    from conftest import snapshot

    run = copy_run(lm_run, tmp_path)
    lock = rundir.Lock(run, "--out")  # as train holds it: a lock of its own open file
    try:
        before = snapshot(run)
        # a run without a chat template: refused in one line once restored, nothing written
        refused = cli(
            "eval", run, "--tasks", "tiny_mc", "--include-path", offline, "--limit", "2",
            "--apply-chat-template", "--no-progress",
        )  # fmt: skip
        assert refused.code == 2 and refused.out == ""
        assert refused.err_lines[-1].startswith("error: --apply-chat-template: this run was")
        assert snapshot(run) == before and not (tmp_path / f"run-{LM_EVAL}").exists()
        r = cli(
            "eval", run, "--tasks", "tiny_mc", "--include-path", offline, "--limit", "4",
            "--json", "--no-progress",
        )  # fmt: skip
        after = snapshot(run)
    finally:
        lock.release()
    assert r.code == 0, r.err
    assert after == before
    beside = tmp_path / f"run-{LM_EVAL}"
    (written,) = beside.glob("results_*.json")
    assert "is being written by another dtcli process" in r.err and str(beside) in r.err
    assert numbers(json.loads(written.read_text())) == numbers(json.loads(r.out.splitlines()[-1]))


# --------------------------------------------------------------------------- a user's task files


def yes_no_task(folder: Path, name: str = "my_yesno", data_files: str = "{test: my.jsonl}") -> Path:
    """A task written as lm-eval's guide writes one: `dataset_path: json` and relative
    data_files (4 documents beside the YAML) -> its folder."""
    folder.mkdir(parents=True, exist_ok=True)
    docs = [{"q": f"Is {n} even?", "label": n % 2} for n in range(4)]
    (folder / "my.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / f"{name}.yaml").write_text(
        f"task: {name}\ndataset_path: json\ndataset_kwargs:\n  data_files: {data_files}\n"
        "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{q}}'\n"
        "doc_to_choice: ['yes', 'no']\ndoc_to_target: label\n"
        "metric_list:\n  - metric: acc\nmetadata:\n  version: 1.0\n"
    )
    return folder


def test_relative_data_files_resolve_against_the_yamls_folder():
    """A string, list or dict of them; absolute paths, URLs and a hub data set's files kept."""
    from dtcli.harness.local_data import resolve_data_files

    here = Path("/tasks/mine")
    cfg = {"dataset_path": "json", "dataset_kwargs": {"data_files": {
        "test": "t.jsonl", "validation": ["a/v1.jsonl", "/abs/v2.jsonl"],
        "train": "https://host/x.jsonl",
    }}}  # fmt: skip
    resolve_data_files(cfg, here)
    assert cfg["dataset_kwargs"]["data_files"] == {
        "test": "/tasks/mine/t.jsonl",
        "validation": ["/tasks/mine/a/v1.jsonl", "/abs/v2.jsonl"],
        "train": "https://host/x.jsonl",
    }
    one = {"dataset_path": "csv", "dataset_kwargs": {"data_files": "d.csv"}}
    resolve_data_files(one, here)
    assert one["dataset_kwargs"]["data_files"] == "/tasks/mine/d.csv"
    by_dir = {"dataset_path": "json", "dataset_kwargs": {"data_dir": "d", "data_files": "x"}}
    resolve_data_files(by_dir, here)
    assert by_dir["dataset_kwargs"] == {"data_dir": "/tasks/mine/d", "data_files": "x"}
    hub = {"dataset_path": "someone/data", "dataset_kwargs": {"data_files": "x.jsonl"}}
    resolve_data_files(hub, here)
    assert hub["dataset_kwargs"]["data_files"] == "x.jsonl"


def test_a_task_reads_its_relative_data_files_from_any_working_directory(
    offline, tmp_path, monkeypatch
):
    """Run from a folder other than the task's, the data files are the ones beside the YAML
    (datasets alone reads them against the working directory: FileNotFoundError)."""
    tasks = yes_no_task(tmp_path / "mine")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    options = harness.TaskOptions(("my_yesno",), include_path=str(tasks))
    harness.check_tasks(options)
    results = harness.evaluate(fake_lm(), options)
    assert results["n-samples"]["my_yesno"] == {"original": 4, "effective": 4}
    # fake_lm picks the choice with the smaller code sum, " no": right on the odd numbers
    assert harness.metrics(results)["my_yesno/acc"] == 0.5
    # include paths relative to the working directory, and tasks whose custom_dataset makes
    # their files absolute itself (tests/data/lm_tasks, copied to tasks/)
    monkeypatch.chdir(tmp_path)
    for name, include in (("my_yesno", "mine"), ("tiny_mc", "tasks")):
        options = harness.TaskOptions((name,), include_path=include, limit=2)
        harness.check_tasks(options)
        assert harness.evaluate(fake_lm(), options)["n-samples"][name]["effective"] == 2


@pytest.mark.parametrize(
    "yaml_text, cause",
    [
        (  # parses, but no prompt: lm-eval's own error is a bare TypeError
            "task: bad\ndataset_path: json\ndataset_kwargs: {data_files: {test: my.jsonl}}\n"
            "output_type: multiple_choice\ntest_split: test\ndoc_to_choice: ['yes', 'no']\n"
            "doc_to_target: label\n",
            "cannot be built: its YAML sets no doc_to_text",
        ),
        (
            "task: bad\ndataset_path: json\ndataset_kwargs: {data_files: {test: gone.jsonl}}\n"
            "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{q}}'\n"
            "doc_to_choice: ['yes', 'no']\ndoc_to_target: label\n",
            "cannot be built: Unable to find '{folder}/gone.jsonl'",
        ),
        (  # builds (lm-eval tests choices only where a YAML gives them); no request
            "task: bad\ndataset_path: json\ndataset_kwargs: {data_files: {test: my.jsonl}}\n"
            "output_type: multiple_choice\ntest_split: test\ndoc_to_text: '{{q}}'\n"
            "doc_to_target: label\n",
            "its first document's request fails: its YAML sets no doc_to_choice",
        ),
    ],
    ids=["no doc_to_text", "data file missing", "no choices"],
)
def test_check_tasks_builds_each_task_and_names_its_yaml_and_the_cause(
    offline, tmp_path, yaml_text, cause
):
    """No TensorFlow, no model: a task that cannot be built or cannot make its first document's
    request is one line naming the task, its YAML and why; nothing of lm-eval's on stdout."""
    import io
    from contextlib import redirect_stdout

    from dtcli.errors import UsageError

    folder = yes_no_task(tmp_path / "t")
    (folder / "bad.yaml").write_text(yaml_text)
    printed = io.StringIO()
    with pytest.raises(UsageError) as caught, redirect_stdout(printed):
        harness.check_tasks(harness.TaskOptions(("bad",), include_path=str(folder)))
    line = str(caught.value)
    assert "\n" not in line and line.startswith(f"--tasks: task 'bad' ({folder / 'bad.yaml'})")
    assert cause.format(folder=folder) in line, line
    assert printed.getvalue() == ""


def loud_task(folder: Path) -> None:
    """A task in `folder` (a copy of tests/data/lm_tasks) whose prompt function prints, and
    whose data come through a `custom_dataset` (lm-eval then hints at its --metadata option)."""
    (folder / "loud_prompt.py").write_text(
        "def text(doc):\n    print('PRINTED BY A TASK')\n    return doc['question']\n"
    )
    loud = (folder / "tiny_mc.yaml").read_text().replace("task: tiny_mc", "task: loud")
    (folder / "loud.yaml").write_text(
        loud.replace("doc_to_text: question", "doc_to_text: !function loud_prompt.text")
    )


def test_lm_evals_own_output_stays_off_stdout_and_out_of_the_way(
    offline, tmp_path, monkeypatch, capfd
):
    """While lm-eval runs (outside any git checkout, progress off): what it prints goes to
    stderr, no tqdm bar, no --metadata hint (its other warnings still log), no `fatal: not a git
    repository` from its `git describe`, whose place in the results holds dtcli's version."""
    import logging

    from dtcli import __version__
    from dtcli.harness.quiet import lm_eval_output

    loud_task(offline)
    monkeypatch.chdir(tmp_path)
    no_git = subprocess.run(["git", "rev-parse"], capture_output=True, cwd=tmp_path)
    assert no_git.returncode != 0  # the test's folder is in no git checkout
    options = harness.TaskOptions(("loud",), include_path=str(offline), limit=3)
    results = harness.evaluate(fake_lm(), options, progress=False)
    assert results["git_hash"] == f"dtcli {__version__}"
    # not torch's collect_env (nor a torch import to seed it): what scored is dtcli
    assert results["pretty_env_info"].startswith(f"dtcli {__version__}, TensorFlow ")
    assert results["config"]["torch_seed"] == 1234  # --seed's third value still recorded
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    logger = logging.getLogger("lm_eval.api.task")
    logger.addHandler(handler)
    try:
        with lm_eval_output(progress=False):
            logger.warning("a real warning")
            logger.warning("t: Custom kwargs can be passed to `--metadata` in console")
    finally:
        logger.removeHandler(handler)
    assert [r.getMessage() for r in seen] == ["a real warning"]
    out, err = capfd.readouterr()
    assert out == ""
    assert "PRINTED BY A TASK" in err
    assert "fatal:" not in err and "Custom kwargs" not in err
    assert "Tokenizing inputs" not in err and "it/s]" not in err, err[-500:]


def test_eval_tasks_json_is_one_line_on_stdout_whatever_lm_eval_prints(
    offline, lm_run, tmp_path, cli
):
    """--json --no-progress with a task whose prompt function prints: stdout is exactly the
    results' one JSON line; the print, and no progress bar, on stderr."""
    loud_task(offline)
    run = copy_run(lm_run, tmp_path)
    r = cli(
        "eval", run, "--tasks", "loud", "--include-path", offline, "--limit", "2", "--json",
        "--no-progress",
    )  # fmt: skip
    assert r.code == 0, r.err
    (line,) = r.out.splitlines()
    assert json.loads(line)["n-samples"]["loud"]["effective"] == 2
    assert "PRINTED BY A TASK" in r.err
    assert "Tokenizing inputs" not in r.err and "it/s]" not in r.err, r.err[-500:]
