"""The launcher's view of client 0's progress: a bar at a terminal, plain lines into a pipe;
a piped run's eta; the heartbeat of a process blocked in long work whose output is no
terminal."""

from __future__ import annotations

import io
import re
from types import SimpleNamespace

from conftest import StampedStream
from rich.console import Console

from dtcli import progress

EVENTS = [
    {"event": "start", "title": "step", "total": 40, "done": 0},
    {"event": "update", "done": 10, "stats": "loss 2.5000 acc 0.2000 4,000 tok/s"},
    {"event": "update", "done": 20, "stats": "loss 2.4000 acc 0.2500 4,100 tok/s"},
    {"event": "stop"},
]


def test_a_piped_launcher_prints_client_0s_progress_as_plain_lines(monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_EVERY", 0.0)
    text = io.StringIO()
    bar = progress.LaunchBar(Console(file=text, width=60))  # not a terminal
    for event in EVENTS:
        bar.event(event)
    assert text.getvalue().splitlines() == [
        "[client 0] step 10/40 loss 2.5000 acc 0.2000 4,000 tok/s",
        "[client 0] step 20/40 loss 2.4000 acc 0.2500 4,100 tok/s",
    ]


def test_plain_lines_come_at_most_every_plain_every_seconds(monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_EVERY", 3600.0)
    text = io.StringIO()
    bar = progress.LaunchBar(Console(file=text))
    for event in EVENTS:
        bar.event(event)
    assert text.getvalue() == ""


def test_at_a_terminal_the_launcher_draws_a_bar_not_lines(monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_EVERY", 0.0)
    text = io.StringIO()
    bar = progress.LaunchBar(Console(file=text, force_terminal=True, width=100))
    for event in EVENTS:
        bar.event(event)
    assert "[client 0] step" not in text.getvalue()
    assert "step (client 0)" in text.getvalue()


def test_a_piped_runs_eta_leaves_out_the_first_call_which_compiles(monkeypatch):
    now = [0.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: now[0]))
    text = io.StringIO()
    bar = progress.Bar(Console(file=text), enabled=True, total_steps=100, plain=True)
    bar.start(1, 1, 100)
    now[0] = 300.0  # the first call: 300 s of compiling, then 1 step
    bar.update(1, 4.0, 0.1, 3.0)
    for seconds, done in ((311.0, 11), (322.0, 21)):  # then 10 steps per 11 s
        now[0] = seconds
        bar.update(done, 3.0, 0.2, 50.0)
    assert text.getvalue().splitlines() == [
        "step 1/100 loss 4.0000 | 3 ex/s",  # no eta yet (from the first call: 8h15m)
        "step 11/100 loss 3.0000 | 50 ex/s | eta 1m37s",  # 89 steps at 1.1 s
        "step 21/100 loss 3.0000 | 50 ex/s | eta 1m26s",
    ]


def test_a_blocked_process_says_what_it_does_with_no_gap_over_10_s():
    """A compile inside TensorFlow blocks the main thread: the heartbeat's thread speaks for it
    (here every 0.2 s; a command's default is 9 s, so that no two lines are over 10 s apart)."""
    text = StampedStream()
    console = Console(file=text, width=200)  # not a terminal
    console.print("header")
    with progress.Heartbeat(console, "compiling the training step", every=0.2) as beat:
        # The compile: blocked until the heartbeat spoke 3 times (30 s without it).
        assert text.wait_for(3, "compiling the training step... ")
        beat.now("evaluating")
        assert text.wait_for(1, "evaluating... ")
    console.print("done")
    lines = text.getvalue().splitlines()
    assert lines[0] == "header" and lines[-1] == "done"
    beats = lines[1:-1]
    assert all(
        re.fullmatch(r"(compiling the training step|evaluating)\.\.\. \d+s", x) for x in beats
    )
    assert text.largest_gap() <= 10.0
    assert not beat._thread.is_alive()  # stopped with its block: nothing after "done"


def test_no_heartbeat_at_a_terminal_nor_with_no_progress_nor_on_a_quiet_console():
    consoles = [
        (Console(file=io.StringIO(), force_terminal=True), True),  # a live bar keeps its clock
        (Console(file=io.StringIO()), False),  # --no-progress
        (Console(file=io.StringIO(), quiet=True), True),  # a client other than 0
    ]
    for console, on in consoles:
        with progress.Heartbeat(console, "compiling", every=0.001, on=on) as beat:
            pass
        assert not beat.on and beat._thread is None and console.file.getvalue() == ""


def test_heartbeat_lines_never_land_inside_a_line_of_the_run_or_of_its_log(tmp_path):
    from dtcli import runlog

    text = io.StringIO()
    console = runlog.LoggedConsole(file=text, width=100, soft_wrap=True)
    console.commit(tmp_path / "train.log", "# header")
    with progress.Heartbeat(console, "compiling", every=0.001):  # a beat every millisecond
        for i in range(300):
            console.print(f"line {i} " + "x" * 60, highlight=False)
    for shown in (text.getvalue(), (tmp_path / "train.log").read_text()):
        lines = shown.splitlines()
        mine = [x for x in lines if x.startswith("line ")]
        assert mine == [f"line {i} " + "x" * 60 for i in range(300)]  # whole, in order, all
        others = [x for x in lines if not x.startswith(("line ", "# header"))]
        assert others and all(re.fullmatch(r"compiling\.\.\. \d+s", x) for x in others)


def test_a_launcher_prints_client_0s_heartbeat_where_no_bar_is_live():
    beat = {"event": "beat", "line": "compiling the training step... 10s"}
    text = io.StringIO()
    piped = progress.LaunchBar(Console(file=text, width=100))
    for event in (beat, EVENTS[0], beat, EVENTS[-1]):
        piped.event(event)
    assert text.getvalue().splitlines() == ["[client 0] compiling the training step... 10s"] * 2
    text = io.StringIO()
    drawn = progress.LaunchBar(Console(file=text, force_terminal=True, width=100))
    drawn.event(EVENTS[0])  # its bar is live: its clock says the run is alive
    drawn.event(beat)
    drawn.event(EVENTS[-1])
    assert "compiling the training step" not in text.getvalue()
