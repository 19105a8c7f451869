"""`dtcli plot` reads metrics files only: no TensorFlow, clear messages for missing or damaged
files, and one figure per metric overlaying the runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import ROOT, dtcli, env

from dtcli.errors import UsageError
from dtcli.plot import plot_runs


def fake_run(folder, epochs=3, truncated=False, steps=True):
    folder.mkdir(parents=True)
    lines = [
        json.dumps(
            {
                "epoch": e,
                "step": 10 * e,
                "train_loss": 1.0 / e,
                "eval_loss": 1.2 / e,
                "train_accuracy": 1 - 0.1 / e,
                "eval_accuracy": 1 - 0.2 / e,
                "examples_per_sec": 1000.0,
            }
        )
        for e in range(1, epochs + 1)
    ]
    text = "\n".join(lines) + "\n"
    if truncated:
        text += '{"epoch": 4, "step": 40, "train_lo'
    (folder / "metrics.jsonl").write_text(text)
    if steps:
        (folder / "steps.jsonl").write_text(
            "".join(json.dumps({"step": s, "loss": 2.0 / s}) + "\n" for s in range(1, 31))
        )
    return folder


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    run = fake_run(tmp_path / "a", truncated=True)
    warnings = []
    written = plot_runs([run], tmp_path / "plots", warn=warnings.append)
    assert [p.name for p in written] == ["loss.png", "accuracy.png", "step_loss.png"]
    assert warnings == [
        f"warning: {run / 'metrics.jsonl'}: line 4 is not a complete JSON record; skipped"
    ]


def test_missing_or_empty_metrics_are_clear_errors(tmp_path):
    with pytest.raises(UsageError, match="no such folder"):
        plot_runs([tmp_path / "nope"], tmp_path / "plots")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"no metrics.jsonl \(has this run finished an epoch\?\)"):
        plot_runs([tmp_path / "empty"], tmp_path / "plots")
    (tmp_path / "empty" / "metrics.jsonl").write_text('{"epo')
    with pytest.raises(UsageError, match="holds no complete records"):
        plot_runs([tmp_path / "empty"], tmp_path / "plots", warn=lambda m: None)
    with pytest.raises(UsageError, match="--metric 'speed': expected one of"):
        plot_runs([fake_run(tmp_path / "b")], tmp_path / "plots", ["speed"])


def test_cli_overlays_runs_without_importing_tensorflow(tmp_path):
    a, b = fake_run(tmp_path / "a"), fake_run(tmp_path / "b", epochs=5, steps=False)
    code = (
        "import sys; from dtcli.cli import main; sys.argv = ['dtcli', 'plot', "
        f"{str(a)!r}, {str(b)!r}, '--out', {str(tmp_path / 'plots')!r}]\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "print('tensorflow' in sys.modules)"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env()
    )
    lines = proc.stdout.split()
    assert lines[-1] == "False", "plot imported TensorFlow"
    assert [p.rsplit("/", 1)[-1] for p in lines[:-1]] == [
        "loss.png",
        "accuracy.png",
        "step_loss.png",
    ]
    assert proc.stderr == ""


def test_cli_error_is_one_line(tmp_path):
    proc = dtcli("plot", tmp_path / "missing")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"error: RUN_DIR {str(tmp_path / 'missing')!r}: no such folder"
    ]


def test_a_metric_no_run_recorded_names_those_they_have_and_writes_nothing(tmp_path):
    run = fake_run(tmp_path / "a")
    with pytest.raises(UsageError) as info:
        plot_runs([run], tmp_path / "plots", ["loss", "perplexity"])
    assert str(info.value) == (
        "--metric perplexity: no run here recorded it; they have loss, accuracy, "
        "examples_per_sec, step_loss"
    )
    assert not (tmp_path / "plots").exists()
    with pytest.raises(UsageError, match="--metric grad_norm: no run here recorded it"):
        plot_runs([fake_run(tmp_path / "b", steps=False)], tmp_path / "plots", ["grad_norm"])


def test_json_lines_without_the_expected_fields_say_which_field(tmp_path):
    run = fake_run(tmp_path / "a", epochs=1)
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 20, "train_loss": 0.5}\n[1, 2]\n')
    warnings = []
    written = plot_runs([run], tmp_path / "plots", ["loss"], warn=warnings.append)
    assert [p.name for p in written] == ["loss.png"]
    assert warnings == [
        f"warning: {run / 'metrics.jsonl'}: 2 lines (the first: line 2 has no 'epoch'); skipped"
    ]
    (run / "metrics.jsonl").write_text('{"a": 1}\n')
    warnings.clear()
    with pytest.raises(UsageError, match="holds no complete records"):
        plot_runs([run], tmp_path / "plots", warn=warnings.append)
    assert warnings == [f"warning: {run / 'metrics.jsonl'}: line 1 has no 'epoch'; skipped"]
