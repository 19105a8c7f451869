"""`dtcli sweep`: one recipe trained once per trial, each trial a fresh `dtcli train` process
with its own --set overrides and run folder under the sweep's folder, then ranked by a metric.

plan      every check before any trial starts (no TensorFlow): the trials, their recipes, the
          metric, --jobs, the folder
trials    --grid and --random's trials, their overrides and folder names (pure)
ranking   the metrics a recipe writes, --mode, --rank, best first (pure)
slots     --jobs K: cores or GPUs split between the trials at once
runner    the trials' processes: started, relayed, stopped on SIGTERM or Ctrl-C
folder    sweep.json, summary.json, a trial folder's state
figures   the metric against each swept key
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dtcli import tables
from dtcli.errors import Interrupted, TrainingError
from dtcli.sweep import figures, parent, ranking
from dtcli.sweep import folder as folder_lib
from dtcli.sweep.plan import SweepAsk, SweepPlan, make
from dtcli.sweep.runner import DONE, FAILED, REFUSED, Job, Runner, train_argv

__all__ = ["SweepAsk", "SweepPlan", "command", "make", "run"]

PENDING = "pending"  # not run yet (the sweep was stopped first)


def command(
    ask: SweepAsk,
    dry_run: bool = False,
    progress: bool = True,
    summarized: Callable[[Path], None] | None = None,
) -> None:
    """What `dtcli sweep` asks: the sweep checked, then listed (--dry-run) or run.
    `summarized(folder)` once the run wrote summary.json, whatever its outcome (before a
    failed or stopped sweep raises), so that a script finds the folder exactly when it needs
    it."""
    plan = make(ask)
    if dry_run:
        list_trials(plan)
        return
    try:
        run(plan, progress)
    finally:
        if summarized is not None and (plan.out / folder_lib.SUMMARY).is_file():
            summarized(plan.out)


def _console(stderr: bool = True) -> Any:
    from rich.console import Console

    return Console(stderr=stderr, soft_wrap=True, highlight=False)


def list_trials(plan: SweepPlan) -> None:
    """--dry-run: each trial's index, folder, overrides and what its folder holds; writes
    nothing."""
    rows = []
    for trial, recipe in zip(plan.trials, plan.recipes):
        state = folder_lib.trial_state(plan.trial_dir(trial), recipe)
        rows.append([str(trial.index), str(plan.trial_dir(trial)), trial.shown(), _SHOWN[state]])
    columns = [
        tables.Column("trial", right=True),
        tables.Column("folder", "prose"),
        tables.Column("overrides", "prose"),
        tables.Column("state"),
    ]
    tables.print_table(_console(stderr=False), columns, rows, title=f"{len(rows)} trials")


_SHOWN = {"new": "-", "done": "done", "resume": "unfinished (resumes)"}


def run(plan: SweepPlan, progress: bool = True, console: Any = None) -> Path:
    """Run the trials not done yet; summary.json after each ends; the table and plots at the
    end. Raises Interrupted when stopped, TrainingError when a trial failed or was refused."""
    console = console or _console()
    states = {
        t.index: folder_lib.trial_state(plan.trial_dir(t), r)
        for t, r in zip(plan.trials, plan.recipes)
    }

    def say(line: str) -> None:
        console.print(line, markup=False)

    parent_id = None
    if plan.mlflow is not None:
        recorded = (plan.recorded or {}).get(parent.PARENT_KEY)
        parent_id = parent.start(plan.mlflow, plan.out.name, recorded, say)
    folder_lib.write_sweep(
        plan.out, plan.ident, {parent.PARENT_KEY: parent_id} if parent_id else {}
    )
    statuses = {i: DONE if state == "done" else PENDING for i, state in states.items()}
    jobs = [
        Job(t, train_argv(plan.recipe, plan.sets, t, plan.trial_dir(t), resume), resume)
        for t in plan.trials
        if states[t.index] != "done"
        for resume in [states[t.index] == "resume"]
    ]
    for trial in plan.trials:
        if states[trial.index] == "done":
            say(f"sweep: trial {trial.index} ({trial.shown()}): done already")
    last_errors: dict[int, str] = {}

    def ended(trial: Any, status: str, last_error: str) -> None:
        statuses[trial.index] = status
        if last_error:
            last_errors[trial.index] = last_error
        folder_lib.write_summary(plan.out, summary(plan, statuses))

    runner = Runner(jobs, plan.slots, ended, say, relay=progress, env=parent.env(parent_id))
    try:
        runner.run()
    finally:
        parent.end(plan.mlflow, parent_id, _parent_status(statuses, runner.stopped_by), say)
    result = summary(plan, statuses)
    folder_lib.write_summary(plan.out, result)
    show(console, plan, result)
    figures.plot(
        plan.out / folder_lib.PLOTS, plan.metric, plan.keys, result["trials"], plan.log_keys
    )
    _raise_outcome(plan, statuses, last_errors, runner.stopped_by)
    return plan.out


def _parent_status(statuses: dict[int, str], stopped_by: int | None) -> str:
    """The parent MLflow run's end, as MLflow says it."""
    if stopped_by is not None or PENDING in statuses.values():
        return "KILLED"
    return "FINISHED" if all(s == DONE for s in statuses.values()) else "FAILED"


def summary(plan: SweepPlan, statuses: dict[int, str]) -> dict[str, Any]:
    """summary.json: the trials best first by the metric (a done trial's value; none for the
    others, listed after)."""
    entries = []
    for trial in plan.trials:
        status = statuses[trial.index]
        records = folder_lib.metric_records(plan.trial_dir(trial)) if status == DONE else []
        entries.append(
            {
                "overrides": plan.overrides[trial.index],
                "run_dir": str(plan.trial_dir(trial)),
                "value": ranking.value(records, plan.metric, plan.mode, plan.rank),
                "status": status,
            }
        )
    return {
        "metric": plan.metric,
        "mode": plan.mode,
        "rank": plan.rank,
        "trials": ranking.best_first(entries, plan.mode),
    }


def show(console: Any, plan: SweepPlan, result: dict[str, Any]) -> None:
    """The ranked trials as a table on stderr."""
    columns = [
        tables.Column("#", right=True),
        *(tables.Column(key) for key in plan.keys),
        tables.Column(plan.metric, right=True),
        tables.Column("status"),
        tables.Column("run", "prose", drop=1),
    ]
    rows = []
    for place, entry in enumerate(result["trials"], 1):
        value = "-" if entry["value"] is None else f"{entry['value']:.6g}"
        shown = [str(entry["overrides"].get(key)) for key in plan.keys]
        rows.append([str(place), *shown, value, entry["status"], entry["run_dir"]])
    better = "lower" if plan.mode == "min" else "higher"
    title = f"{plan.metric} ({plan.rank} evaluation, {better} is better)"
    tables.print_table(console, columns, rows, title=title)


def _raise_outcome(
    plan: SweepPlan, statuses: dict[int, str], last_errors: dict[int, str], stopped_by: int | None
) -> None:
    where = plan.out / folder_lib.SUMMARY
    if stopped_by is not None:
        left = sorted(i for i, s in statuses.items() if s != DONE)
        raise Interrupted(
            None,
            None,
            preempted=stopped_by == signal.SIGTERM,
            message=(
                f"sweep {'preempted (SIGTERM)' if stopped_by == signal.SIGTERM else 'interrupted'}"
                f"; trials not done: {', '.join(map(str, left))}; run the same command again to "
                f"finish them (an interrupted trial resumes from its checkpoint); {where}"
            ),
        )
    bad = sorted(i for i, s in statuses.items() if s in (FAILED, REFUSED))
    if bad:
        first = bad[0]
        why = last_errors.get(first, "").removeprefix("error: ")
        raise TrainingError(
            f"{len(bad)} of {len(statuses)} trials failed or were refused (trial {first}: "
            f"{statuses[first]}{': ' + why if why else ''}); the others ran; {where}"
        )
