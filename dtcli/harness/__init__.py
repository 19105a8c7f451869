"""lm-evaluation-harness over a dtcli session: a language model's session behind lm-eval's LM
interface (model.py), and the tasks it runs (tasks.py). lm_eval is an optional extra, imported
only inside the functions that need it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dtcli.harness.tasks import (
    DEFAULT_SEED,
    TaskOptions,
    check_tasks,
    check_values,
    evaluate,
    metrics,
    parse_seed,
    require_lm_eval,
    table,
)

__all__ = [
    "DEFAULT_SEED",
    "TaskOptions",
    "check_tasks",
    "check_values",
    "evaluate",
    "metrics",
    "parse_seed",
    "require_lm_eval",
    "run_tasks",
    "table",
]


def run_tasks(
    session: Any,
    options: TaskOptions,
    model_name: str | None = None,
    run_dir: Path | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """`options`' tasks run by lm-eval on `session` (a language model's, its weights in place):
    lm-eval's results dict (tasks.evaluate). `model_name`: what the results call the model.
    `run_dir`: the run the weights come from (its chat template for --apply-chat-template, an
    imported model's end-of-sequence ids). `progress` false: no progress bars of lm-eval's."""
    from dtcli.harness.model import SessionLM

    lm = SessionLM(session, options.batch_size, run_dir=run_dir)
    return evaluate(lm, options, model_name, progress=progress)
