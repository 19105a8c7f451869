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
    "section_options",
    "check_section",
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


SECTION = "train.eval_tasks"


def section_options(cfg: Any) -> TaskOptions:
    """A recipe's train.eval_tasks (recipe.EvalTasksConfig) as TaskOptions (lm-eval's own
    seeds)."""
    return TaskOptions(
        tasks=tuple(cfg.tasks),
        include_path=cfg.include_path,
        limit=cfg.limit,
        num_fewshot=cfg.num_fewshot,
        batch_size=cfg.batch_size,
    )


def check_section(cfg: Any) -> None:
    """A recipe's train.eval_tasks before TensorFlow starts (`train`, and `launch` once before
    any client): lm_eval installed, every task known and built; one line naming the section's
    keys otherwise. None: no tasks, nothing to check."""
    if cfg is not None:
        check_tasks(section_options(cfg), named=SECTION)
