"""Tables at a terminal fit its width without breaking a name or a path; anywhere else they are
plain, complete rows, one a line (dtcli.tables, used by plan, doctor and eval)."""

from __future__ import annotations

import io

import pytest
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


CACHE = "/home/someone/.cache/dtcli/xla/tf2.21.0-7c6138384c56e48b"
DOCTOR_CHECKS = [
    doctor.Check("versions", True, "tensorflow 2.21.0, tf-keras 2.21.0"),
    doctor.Check(
        "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION",
        True,
        "'1' (all-reduce combining on; dtcli's steps keep collectives out of their updates)",
    ),
    doctor.Check("DTCLI_XLA_CACHE", True, f"{CACHE}: 2 compiled steps, 27 MB (a one-device run)"),
    doctor.Check("DTENSOR_ENABLE_MULTI_DEVICE_EXPANSION", False, "'1': gives wrong numbers"),
]


def _path_whole_or_broken_after_a_slash(lines: list[str], path: str) -> None:
    """`path` is on one line, or its start ends a line at a '/' and the rest goes on in the
    next line's cell (the box and the indent stripped)."""
    cells = [line.strip("│ ").split("│")[-1].strip() for line in lines]
    start = next(n for n, cell in enumerate(cells) if "/home/" in cell)
    rest = path[path.index("/home/") :]
    piece = cells[start][cells[start].index("/home/") :].split()[0]
    while not piece.startswith(rest):
        assert piece.endswith("/") and rest.startswith(piece), (piece, rest)
        rest, start = rest[len(piece) :], start + 1
        piece = cells[start].split()[0]


def test_doctor_at_80_columns_keeps_the_status_whole_and_breaks_a_path_only_after_a_slash(
    monkeypatch,
):
    monkeypatch.setenv("COLUMNS", "80")  # as a user's 80-column terminal
    text = io.StringIO()
    doctor.render(DOCTOR_CHECKS, Console(file=text, force_terminal=True, color_system=None))
    lines = text.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "status" in lines[1] and "…" not in text.getvalue()  # was cut to "s…"
    for check in DOCTOR_CHECKS:  # a flag's name whole, beside its whole status
        assert any(line.split() == [check.name, check.status] for line in lines), check.name
    _path_whole_or_broken_after_a_slash(lines, CACHE)
    # Side by side where the names, the status and the path's longest part fit (100 columns).
    console, text = terminal(100)
    doctor.render(DOCTOR_CHECKS, console)
    lines = text.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 100
    assert any("┃ status ┃" in line for line in lines) and "…" not in text.getvalue()
    assert CACHE not in text.getvalue()  # 56 characters in a 37-wide column: broken...
    _path_whole_or_broken_after_a_slash(lines, CACHE)  # ... after a '/' (rich: anywhere)


@pytest.mark.parametrize("width", [40, 30])
def test_doctor_narrower_than_a_name_and_its_status_puts_the_status_first_or_above_it(
    width, monkeypatch
):
    """At 40 columns the stacked rows were 55 characters wide (a 47-character name, then its
    status), so the status wrapped onto a line of its own under the name. Now the status leads,
    aligned: beside the name where both fit, else on the line above it; a name longer than the
    terminal is broken after a '_'."""
    monkeypatch.setenv("COLUMNS", str(width))
    text = io.StringIO()
    doctor.render(DOCTOR_CHECKS, Console(file=text, force_terminal=True, color_system=None))
    lines = text.getvalue().splitlines()
    assert max(len(line) for line in lines) <= width, lines
    assert lines[1].split() == ["status", "check"]
    for check in DOCTOR_CHECKS:
        beside = [check.status, check.name] in [line.split() for line in lines]
        above = any(a == check.status and b == check.name for a, b in zip(lines, lines[1:]))
        if len(check.name) > width:  # on the lines below the status, broken after a '_'
            at = next(n for n, line in enumerate(lines) if check.name.startswith(line))
            assert lines[at - 1] == check.status and "_" in lines[at][-1]
            assert "".join(lines[at : at + 2]) == check.name
            continue
        assert beside != above, check.name  # one or the other
        assert beside == (len(check.status.ljust(6)) + 2 + len(check.name) <= width)
    _path_whole_or_broken_after_a_slash(lines, CACHE)


def doctor_rows() -> list[doctor.Check]:
    """The rows `dtcli doctor --devices cpu:8` prints: its own checks, then its probes'."""
    checks = doctor.run("cpu:8", probe=False)
    probes = ["probe: DTensor runtime (fused step)", "probe: dtcli train steps"] + [
        f"probe: dtcli {api} + {optimizer}"
        for api in ("keras", "core")
        for optimizer in ("sgd", "adam", "adamw")
    ]
    detail = "1 device vs batch=4,model=2, 5 steps: max relative weight difference 3.1e-08"
    return checks + [doctor.Check(name, True, detail) for name in probes]


def test_every_doctor_line_fits_every_width_from_30_to_80(cpu8, monkeypatch):
    """At 40 columns a terminal broke `DTENSOR_GPU_USE_NCCL_COMMUNICATI|ON` and `probe: DTensor
    runtime (fused st|ep)`: the stacked row's fit was judged without the status's padding (2
    characters for `ok`, 6 printed), and a name wider than the terminal was printed whole."""
    monkeypatch.setenv("DTENSOR_GPU_USE_NCCL_COMMUNICATION", "1")  # its longer detail
    rows = doctor_rows()
    names = {row.name for row in rows}
    assert "DTENSOR_ENABLE_COMBINE_ALL_REDUCES_OPTIMIZATION" in names and "cpu" in names
    for width in range(30, 81):
        console, text = terminal(width)
        doctor.render(rows, console)
        lines = text.getvalue().splitlines()
        assert max(len(line) for line in lines) <= width, (width, lines)
        shown = " ".join(text.getvalue().split())
        for row in rows:  # whole, or broken at a space or after a '_'
            assert row.name in shown or row.name in shown.replace("_ ", "_"), (width, row.name)


def test_prose_breaks_at_spaces_and_a_long_path_after_a_slash():
    from dtcli.tables import wrap_prose

    assert wrap_prose("a bb ccc", 4) == ["a bb", "ccc"]
    assert wrap_prose("at /a/bb/ccc: x", 9) == ["at /a/bb/", "ccc: x"]
    assert wrap_prose("/averyverylongpart/b", 5) == ["/", "averyverylongpart/", "b"]
    assert wrap_prose("see dir/ /a/bcd/ef", 9) == ["see dir/", "/a/bcd/ef"]


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
