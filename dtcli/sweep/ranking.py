"""What a sweep ranks by: the metrics a recipe's runs write (metrics.jsonl's keys), which way is
better (`--mode`, by the metric's name unless given), a trial's value (`--rank last|best`) and
the trials best first. Pure: reads no file, imports no TensorFlow."""

from __future__ import annotations

import difflib
import math
import re
from typing import Any

from dtcli.errors import UsageError
from dtcli.recipe import Recipe

MODES = ("min", "max")
RANKS = ("last", "best")
# Words in a metric's name that say which way is better.
_LOWER_IS_BETTER = {"loss", "perplexity", "ppl", "bpb", "error", "err"}
_HIGHER_IS_BETTER = {"accuracy", "acc", "f1", "exact", "mfu", "mcc", "bleu", "rouge"}
_RATES = ("tokens_per_sec", "examples_per_sec", "flops_per_sec_per_device")


def metric_names(recipe: Recipe) -> list[str]:
    """The metrics.jsonl keys a run of `recipe` writes that a sweep can rank by (its counters
    and times aside). A train.eval_tasks metric is `TASK/METRIC`: which metrics a task reports
    is known only once it runs, so any `TASK/...` of a listed task is accepted."""
    names = ["eval_loss", "eval_accuracy", "train_loss", "train_accuracy"]
    if recipe.task == "language_model":
        names += [
            "eval_perplexity",
            "eval_bpb",
            "tokens_per_sec",
            "mfu",
            "flops_per_sec_per_device",
        ]
    else:
        names.append("examples_per_sec")
    return names


def check_metric(metric: str, recipe: Recipe) -> None:
    names = metric_names(recipe)
    if metric in names:
        return
    tasks = recipe.train.eval_tasks.tasks if recipe.train.eval_tasks is not None else ()
    task, sep, name = metric.partition("/")
    if sep and name and task in tasks:
        return
    close = difflib.get_close_matches(metric, names + [f"{t}/METRIC" for t in tasks], n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise UsageError(
        f"--metric {metric!r}: not a metric this recipe's runs write{hint}; expected one of "
        f"{', '.join(names + [f'{t}/METRIC' for t in tasks])}"
    )


def default_mode(metric: str, given: str | None) -> str:
    """--mode as given, else by the metric's name: a loss, perplexity, bpb or error is better
    lower; an accuracy, acc, f1, exact_match, mfu or a rate is better higher."""
    if given is not None:
        if given not in MODES:
            raise UsageError(f"--mode {given!r}: expected min or max")
        return given
    words = set(re.split(r"[^a-z0-9]+", metric.lower()))
    lower = bool(words & _LOWER_IS_BETTER)
    higher = bool(words & _HIGHER_IS_BETTER) or metric.endswith(_RATES)
    if lower != higher:
        return "min" if lower else "max"
    raise UsageError(
        f"--metric {metric!r}: its name does not say whether lower or higher is better; "
        "give --mode min or --mode max"
    )


def check_rank(rank: str) -> None:
    if rank not in RANKS:
        raise UsageError(f"--rank {rank!r}: expected last (the last evaluation) or best")


def value(records: list[dict[str, Any]], metric: str, mode: str, rank: str) -> float | None:
    """A trial's value: the metric at its last evaluation, or the best over its evaluations;
    None when no record holds a finite one."""
    found = [float(r[metric]) for r in records if isinstance(r.get(metric), (int, float))]
    if rank == "last":
        found = found[-1:]
    found = [v for v in found if math.isfinite(v)]
    if not found:
        return None
    return min(found) if mode == "min" else max(found)


def best_first(entries: list[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    """summary.json's trials, best first; those without a value after them, in trial order
    (a stable sort)."""
    sign = 1.0 if mode == "min" else -1.0
    return sorted(
        entries,
        key=lambda e: (e["value"] is None, 0.0 if e["value"] is None else sign * e["value"]),
    )
