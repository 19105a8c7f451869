"""`train.eval_tasks`: a language model's lm-evaluation-harness tasks, checked before TensorFlow
starts and run after each evaluation on every client (each computes the same requests in the
same order; client 0's writer records the metrics).

lm_eval is an optional extra: it is imported here only when a recipe names tasks.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dtcli.recipe import EvalTasksConfig, Recipe

# The loop's records: the seconds the tasks took (beside the training's own `seconds`).
SECONDS = "eval_tasks_seconds"


def check(recipe: Recipe) -> None:
    """lm_eval installed, every task name known to it (the include path's YAMLs parse) and
    every task built with its data: one line naming train.eval_tasks otherwise. No TensorFlow."""
    from dtcli import harness

    harness.check_section(recipe.train.eval_tasks)


class TaskRunner:
    """The tasks of one run's loop: one SessionLM for all its evaluations, so that its forward
    passes trace and lower once, not at each evaluation. `run_dir`: the run's folder (its
    tokenizer's chat template and end-of-sequence ids, as eval reads them)."""

    def __init__(self, session: Any, cfg: EvalTasksConfig, run_dir: Path) -> None:
        from dtcli import harness

        self.session, self.run_dir = session, run_dir
        self.options = harness.section_options(cfg)
        self._lm: Any = None

    def __call__(self) -> dict[str, float]:
        """The tasks' metrics on the session's weights now (TASK/METRIC), and their seconds."""
        from dtcli import harness
        from dtcli.harness import tasks as harness_tasks
        from dtcli.harness.model import SessionLM

        if self._lm is None:
            self._lm = SessionLM(self.session, self.options.batch_size, run_dir=self.run_dir)
        start = time.perf_counter()
        with _quiet_loggers():
            results = harness_tasks.evaluate(self._lm, self.options, progress=False)
        return {**harness.metrics(results), SECONDS: time.perf_counter() - start}


@contextlib.contextmanager
def _quiet_loggers() -> Iterator[None]:
    """lm-eval's and datasets' warnings, at every evaluation, would fill the run's output
    between its epoch lines: only their errors while the tasks run (their progress bars are off:
    evaluate's progress=False)."""
    loggers = [logging.getLogger(name) for name in ("lm_eval", "datasets")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
