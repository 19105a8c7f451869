"""Every bad input: one line naming the key or argument, exit code 2, no traceback, no run dir.

In-process (the `cli` fixture) on the session's 8 CPUs; one case goes through the installed
console script in a fresh process, to check the exit code reaches the shell.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml
from conftest import RECIPES, dtcli

QUICK = str(RECIPES / "quickstart.yaml")


def recipe_with(tmp_path, edit) -> str:
    raw = yaml.safe_load((RECIPES / "quickstart.yaml").read_text())
    edit(raw)
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return str(path)


def set_rule(pattern, dims):
    return lambda raw: raw["layouts"]["rules"].__setitem__(pattern, dims)


def set_units(units):
    return lambda raw: raw["model"]["layers"][0]["Dense"].__setitem__("units", units)


CASES = {
    "unknown key": (
        [QUICK, "--set", "optimizer.learnig_rate=0.1"],
        r"unknown recipe key 'optimizer.learnig_rate' (did you mean 'learning_rate'?)",
    ),
    "wrong type": (
        [QUICK, "--set", "train.epochs=many"],
        "recipe key 'train.epochs': expected an integer",
    ),
    "mesh product": (
        [QUICK, "--mesh", "batch=4,model=4", "--devices", "cpu:8"],
        "mesh batch=4,model=4: axis sizes multiply to 16, but there are 8 devices",
    ),
    "layout axis missing": (
        set_rule(r"dense_1\.bias", ["tensor"]),
        "recipe key 'layouts.rules.dense_1\\.bias': axis 'tensor' is not in the mesh",
    ),
    "rule rank": (
        set_rule(r"dense_1\.bias", ["model", "unsharded"]),
        "gives 2 dims but weight 'dense_1.bias' has rank 1",
    ),
    "not divisible": (
        set_units(127),
        "has size 127, which does not divide by mesh axis 'model' of size 2",
    ),
    "batch size": (
        [QUICK, "--set", "data.batch_size=30"],
        "recipe key 'data.batch_size': 30 does not divide by the data axis 'batch' of size 4",
    ),
    "missing data path": (
        [QUICK, "--set", "data.source=idx", "--set", "data.path=/no/such/dir"],
        "recipe key 'data.path': '/no/such/dir' is not a folder",
    ),
    "unknown tfds name": (
        [QUICK, "--set", "data.source=tfds", "--set", "data.name=mnistt"],
        "recipe key 'data.name': no TFDS data set named 'mnistt' (did you mean 'mnist'?)",
    ),
    "unparsable set": (
        [QUICK, "--set", "optimizer.learning_rate"],
        "--set 'optimizer.learning_rate': expected KEY.PATH=VALUE",
    ),
    "missing recipe": (["/no/such/recipe.yaml"], "recipe '/no/such/recipe.yaml': no such file"),
    "bad devices": (
        [QUICK, "--devices", "gpu:x"],
        "--devices: expected cpu, cpu:N, gpu, gpu:N (N at least 1), tpu or auto, got 'gpu:x'",
    ),
    "bad mesh arg": ([QUICK, "--mesh", "batch:4"], "--mesh 'batch:4': expected AXIS=SIZE"),
    "mesh axis typo": (
        [QUICK, "--mesh", "batch=4,modle=2"],
        "--mesh: axis 'modle' is named by no layout rule nor layouts.data_axis (did you mean 'model'?)",
    ),
    "unknown option": ([QUICK, "--epoch", "2"], "No such option: --epoch"),
}


def check_one_line_error(result, expected: str) -> None:
    """`result`: the `cli` fixture's Result, or a finished subprocess."""
    if hasattr(result, "returncode"):
        code, stderr = result.returncode, result.stderr
    else:
        code, stderr = result.code, result.err
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, stderr
    assert "Traceback" not in stderr
    assert len(lines) == 1, stderr
    assert lines[0].startswith("error: ")
    assert expected in lines[0]


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_bad_input(case, tmp_path, cli, cpu8):
    args, expected = CASES[case]
    if callable(args):
        args = [recipe_with(tmp_path, args)]
    out = tmp_path / "run"
    check_one_line_error(cli("train", *args, "--out", out), expected)
    assert not out.exists(), "nothing may be left behind"


def test_the_console_script_exits_2_with_one_line(tmp_path):
    out = tmp_path / "run"
    proc = dtcli("train", QUICK, "--set", "optimizer.beta_1=1.5", "--out", out)
    check_one_line_error(proc, "recipe key 'optimizer.beta_1'")
    assert not out.exists()


def test_tfds_not_prepared_offline_says_how_to_prepare(tmp_path, cli, cpu8):
    out = tmp_path / "run"
    proc = cli(
        "train",
        QUICK,
        "--set",
        "data.source=tfds",
        "--set",
        "data.name=mnist",
        "--set",
        f"data.data_dir={tmp_path / 'tfds'}",
        "--out",
        out,
    )
    check_one_line_error(proc, "TFDS data set 'mnist' is not prepared in")
    assert "tfds build mnist --data_dir DIR" in proc.err
    assert not out.exists()


def test_unreadable_recipe(tmp_path, cli):
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00\x01")
    check_one_line_error(cli("train", path), "cannot read it (not UTF-8 text)")


def test_out_folder_that_holds_files_is_not_touched(tmp_path, cli):
    (tmp_path / "keep.txt").write_text("mine")
    proc = cli("train", QUICK, "--out", tmp_path)
    check_one_line_error(proc, "the folder exists and is not empty")
    assert (tmp_path / "keep.txt").read_text() == "mine"


def test_one_line_and_printed_render_an_exception_as_one_line():
    """One rule for every site: the first line of the message (TensorFlow's `.message`, without
    its {{function_node}} framing), at most ONE_LINE_LIMIT characters, the type's name when empty."""
    from dtcli.errors import (
        ONE_LINE_LIMIT,
        Interrupted,
        Preempted,
        TrainingError,
        UsageError,
        one_line,
        printed,
    )

    class OpError(Exception):
        message = "{{function_node __inference_step_12}} Connection reset\n\t [[{{node x}}]]"

    assert one_line(ValueError("  first line\nsecond line ")) == "first line"
    assert one_line(ValueError("x\ny"), named=True) == "ValueError: x"
    assert one_line(ValueError()) == "ValueError"
    assert one_line(ValueError(""), named=True) == "ValueError"
    assert one_line(OpError("ignored"), named=True) == "OpError: Connection reset"
    assert len(one_line(ValueError("y" * 1000))) == ONE_LINE_LIMIT
    corrupt = "corrupted record at 0 (Is this even a TFRecord file?) [Op:ReduceDataset] name: "
    assert one_line(ValueError(corrupt)) == "corrupted record at 0 (Is this even a TFRecord file?)"
    assert printed(UsageError("recipe key 'seed': bad")) == "error: recipe key 'seed': bad"
    assert printed(TrainingError("disk full")) == "error: disk full"
    assert printed(KeyboardInterrupt()) == "error: interrupted"
    assert printed(Preempted("preempted (SIGTERM)")) == "preempted (SIGTERM)"
    assert printed(RuntimeError("boom\nmore")) == "error: RuntimeError: boom"
    stopped = Interrupted(Path("r/checkpoints/ckpt-1"), Path("r"))
    assert printed(stopped) == (
        "interrupted; saved r/checkpoints/ckpt-1; resume with: dtcli train --resume r"
    )


# --------------------------------------------------------------------------- the command line's own


@pytest.mark.parametrize(
    "args, line",
    [
        (["train", QUICK, "--epochs", "abc"], "error: --epochs 'abc': expected an integer"),
        (
            ["train", QUICK, "--grace-period", "soon"],
            "error: --grace-period 'soon': expected a number",
        ),
        (
            ["train", QUICK, "--connect-timeout", "x"],
            "error: --connect-timeout 'x': expected a number",
        ),
        (["launch", QUICK, "--clients", "two"], "error: --clients 'two': expected an integer"),
        (
            ["launch", QUICK, "--clients", "2", "--port", "p"],
            "error: --port 'p': expected an integer",
        ),
        (["generate", "run", "--tokens", "many"], "error: --tokens 'many': expected an integer"),
        (["score", "run", "--stride", "half"], "error: --stride 'half': expected an integer"),
        (["eval", "run", "--batch-size", "1.5"], "error: --batch-size '1.5': expected an integer"),
        (["--show-completion", "tcsh"], "error: --show-completion 'tcsh': expected bash, zsh"),
    ],
)
def test_a_value_an_option_refuses_gets_dtcli_wording(args, line, tmp_path, cli):
    result = cli(*args, cwd=tmp_path)
    assert result.code == 2, result.err
    assert len(result.err_lines) == 1 and result.err_lines[0].startswith(line), result.err
    assert list(tmp_path.iterdir()) == []


COMMANDS = [[], ["train"], ["launch"], ["eval"], ["generate"], ["export"], ["plan"], ["config"]]
COMMANDS += [["doctor"], ["plot"], ["score"]]


@pytest.mark.parametrize("command", COMMANDS, ids=[" ".join(c) or "dtcli" for c in COMMANDS])
def test_h_is_help_and_help_shows_no_bool_placeholder(command, cli):
    short, long = cli(*command, "-h"), cli(*command, "--help")
    assert short.code == long.code == 0, short.err
    assert short.out == long.out and "Usage: dtcli" in short.out
    assert "<bool>" not in long.out


@pytest.mark.parametrize("shell, mark", [("zsh", "#compdef dtcli"), ("bash", "complete -o")])
def test_show_completion_prints_the_shell_asked_for(shell, mark, cli):
    result = cli("--show-completion", shell)
    assert result.code == 0, result.err
    assert mark in result.out and "_DTCLI_COMPLETE" in result.out


def test_config_refuses_what_train_refuses_before_devices(tmp_path, cli):
    mismatch = ("--mesh", "batch=4,model=4", "--devices", "cpu:8")
    trained = cli("train", QUICK, *mismatch, "--out", tmp_path / "run")
    configured = cli("config", QUICK, *mismatch)
    assert trained.code == configured.code == 2, configured.out
    assert configured.err_lines == trained.err_lines
    assert "axis sizes multiply to 16, but there are 8 devices" in configured.err
    assert configured.out == "" and not (tmp_path / "run").exists()


@pytest.mark.parametrize("command", [["plan", QUICK], ["config", QUICK]])
def test_a_closed_pipe_ends_quietly_with_exit_0(command):
    """`dtcli plan RECIPE | head -1`: the reader is gone before dtcli writes a byte."""
    import subprocess
    import sys

    from conftest import ROOT, env

    proc = subprocess.Popen(
        [sys.executable, "-m", "dtcli.cli", *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=env(),
    )
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert err == ""


def test_a_closed_stderr_pipe_does_not_stop_or_remove_the_run(tmp_path):
    """`dtcli train ... 2>&1 | head -1`: the reader of the progress lines goes away while the
    run trains; the run goes on to its end (train.log has it all), exit 0, nothing removed."""
    import subprocess
    import sys

    from conftest import ROOT, env

    out = tmp_path / "run"
    args = [
        "--epochs",
        "2",
        "--set",
        "train.steps_per_epoch=3",
        "--set",
        "train.checkpoint_every=1",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "dtcli.cli", "train", QUICK, *args, "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env=env(),
    )
    proc.stdout.readline()  # the first line, then the reader is gone (as `| head -1`)
    proc.stdout.close()
    assert proc.wait(timeout=600) == 0
    assert sorted(p.name for p in (out / "checkpoints").glob("ckpt-*")) == [
        "ckpt-00000003",
        "ckpt-00000006",
    ]
    assert "done:" in (out / "train.log").read_text()


@pytest.mark.parametrize("debug", [False, True])
def test_a_ctrl_c_before_training_handles_it_says_interrupted_and_exits_130(
    debug, monkeypatch, cli
):
    """A Ctrl-C during the plan's own work (as during an import or a session's build) reaches
    Typer, which returns 130 without a word: dtcli says it was interrupted."""
    from dtcli import plan as plan_lib

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(plan_lib, "make_report", interrupted)
    r = cli("plan", RECIPES / "quickstart.yaml", *(["--debug"] if debug else []))
    assert r.returncode == 130
    assert r.stderr.strip().splitlines()[-1] == "error: interrupted"
    if not debug:
        assert "Traceback" not in r.stderr


@pytest.mark.parametrize("debug", [False, True])
def test_an_unexpected_error_is_one_line_and_only_without_debug_asks_for_it(
    debug, monkeypatch, cli
):
    """Issue 43: with --debug the traceback is shown, and the last line said all the same to
    run again with --debug."""
    from dtcli import plan as plan_lib

    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(plan_lib, "make_report", broken)
    r = cli("plan", RECIPES / "quickstart.yaml", *(["--debug"] if debug else []))
    assert r.returncode == 1
    hint = "its traceback is above" if debug else "run again with --debug for the traceback"
    assert r.stderr.strip().splitlines()[-1] == f"error: RuntimeError: a bug (unexpected; {hint})"
    assert ("Traceback" in r.stderr) == debug


def test_a_ctrl_c_that_tensorflow_wraps_in_a_system_error_is_a_ctrl_c(monkeypatch, cli):
    """A Ctrl-C raised while TensorFlow's C++ calls back into Python (a tensor's __array__)
    reaches the command as a SystemError caused by the KeyboardInterrupt (one-device generate
    went 'unexpected', exit 1): it says interrupted and exits 130, as any Ctrl-C."""
    from dtcli import plan as plan_lib

    def interrupted_in_c(*args, **kwargs):
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise SystemError(
                "<built-in method __array__> returned a result with an exception set"
            ) from exc

    monkeypatch.setattr(plan_lib, "make_report", interrupted_in_c)
    r = cli("plan", RECIPES / "quickstart.yaml")
    assert r.returncode == 130, r.stderr
    assert "unexpected" not in r.stderr and "SystemError" not in r.stderr


def test_a_ctrl_c_while_the_command_line_imports_says_interrupted_and_exits_130(
    monkeypatch, capsys
):
    """The console script's first ~0.3 s import typer, rich and the commands: a Ctrl-C there
    (here: raised by that import) is the same one line and 130, not Python's traceback."""
    import dtcli.cli

    class Interrupting:
        def __getattr__(self, name):
            raise KeyboardInterrupt

    monkeypatch.setitem(sys.modules, "dtcli.cli.entry", Interrupting())
    with pytest.raises(SystemExit) as exited:
        dtcli.cli.main()
    assert exited.value.code == 130
    assert capsys.readouterr().err == "error: interrupted\n"
