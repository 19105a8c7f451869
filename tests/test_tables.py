"""Tables at a terminal fit its width without breaking a name or a path; anywhere else they are
plain, complete rows, one a line (dtcli.tables, used by plan, doctor and eval)."""

from __future__ import annotations

import io

from rich.console import Console

from dtcli import doctor
from dtcli.plan import WEIGHT_COLUMNS
from dtcli.tables import Column, print_table

# The tensor-parallel GPT's longest weight paths and rules, as `dtcli plan` shows them.
GPT_ROWS = [
    (
        f"block_{i}.attention.{part}.kernel",
        r"block_\d+\.attention\.(query|key|value)\.kernel",
        "(128, 4, 32)",
        "(-, model, -)",
        "(128, 1, 32)",
        "16,384",
    )
    for i in range(4)
    for part in ("query", "key", "value")
]


def terminal(width: int) -> tuple[Console, io.StringIO]:
    text = io.StringIO()
    return Console(file=text, force_terminal=True, width=width, color_system=None), text


def test_at_80_columns_names_stay_whole_and_droppable_columns_go_first():
    console, text = terminal(80)
    print_table(console, WEIGHT_COLUMNS, GPT_ROWS, title="t", caption="a caption " * 12)
    lines = text.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    for row in GPT_ROWS:  # every path whole, on one line, and its bytes uncut
        assert any(row[0] in line and row[-1] in line for line in lines), row[0]
    header = next(line for line in lines if "weight" in line)
    assert "rule" not in header and "shard " not in header  # dropped: the rule first
    assert "…" not in text.getvalue()
    assert len(lines) == len(GPT_ROWS) + 5 + 2  # title, header and 3 rules; a 2-line caption


def test_a_wide_terminal_shows_every_column_whole():
    console, text = terminal(200)
    print_table(console, WEIGHT_COLUMNS, GPT_ROWS)
    out = text.getvalue()
    assert all(row[1] in out for row in GPT_ROWS)
    assert "rule" in out and "shard" in out


def test_values_are_cut_with_an_ellipsis_only_when_nothing_is_left_to_drop():
    console, text = terminal(40)
    columns = (Column("name", "name"), Column("value"))
    print_table(console, columns, [("a_long_weight_name.kernel", "a value far too long to fit")])
    out = text.getvalue()
    assert "a_long_weight_name.kernel" in out
    assert "…" in out
    assert max(len(line) for line in out.splitlines()) <= 40


def test_a_pipe_gets_plain_complete_rows_one_a_line():
    text = io.StringIO()  # not a terminal
    print_table(Console(file=text, width=40), WEIGHT_COLUMNS, GPT_ROWS, title="t", caption="c")
    lines = text.getvalue().splitlines()
    assert lines[0] == "t" and lines[-1] == "c"
    assert lines[1].split() == ["weight", "rule", "shape", "sharding", "shard", "bytes"]
    assert len(lines) == len(GPT_ROWS) + 3
    for row, line in zip(GPT_ROWS, lines[2:]):
        assert line.startswith(row[0]) and row[1] in line and line.endswith(row[-1])
    assert not any(ch in text.getvalue() for ch in "│┃━…")


def test_doctor_keeps_dtensor_names_whole_at_80_columns():
    checks = [
        doctor.Check(
            "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION", True, "'1' (all-reduce combining on)"
        ),
        doctor.Check("probe: dtcli keras + adamw", True, "1 device vs batch=1,model=2 " * 4),
    ]
    console, text = terminal(80)
    doctor.render(checks, console)
    out = text.getvalue()
    assert "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION" in out
    assert max(len(line) for line in out.splitlines()) <= 80


EVAL_RESULT = {
    "checkpoint": "/home/someone/projects/dtcli/runs/tiny_gpt-20250101-120000/checkpoints/"
    "ckpt-00000400",
    "split": "eval",
    "tokens": 123904,
    "loss": 1.234567891,
    "perplexity": 3.4368,
    "mesh": "batch=4,model=2",
    "devices": "cpu:8",
    "trained_on_mesh": "batch=8",
    "step": 400,
}


def test_eval_keeps_the_checkpoint_path_whole_on_a_line_of_its_own():
    from dtcli.evaluate import render

    console, text = terminal(80)
    render(EVAL_RESULT, console)
    lines = text.getvalue().splitlines()
    assert lines[0] == EVAL_RESULT["checkpoint"]  # longer than 80: the terminal folds it
    assert max(len(line) for line in lines[1:]) <= 80
    assert any("perplexity" in line and "3.436800" in line for line in lines)


def test_eval_piped_is_plain_and_complete():
    from dtcli.evaluate import render

    text = io.StringIO()
    render(EVAL_RESULT, Console(file=text, width=40))
    lines = text.getvalue().splitlines()
    assert lines[0] == EVAL_RESULT["checkpoint"]
    assert lines[1].split() == ["figure", "value"]
    rows = [line.split() for line in lines[2:]]
    assert rows[0] == ["split", "eval"] and ["loss", "1.234568"] in rows
    assert ["trained_on_mesh", "batch=8"] in rows and ["step", "400"] in rows
    assert len(rows) == 8 and not any("─" in line or "│" in line for line in lines)
