"""The launcher's view of client 0's progress: a bar at a terminal, plain lines into a pipe."""

from __future__ import annotations

import io
from types import SimpleNamespace

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
