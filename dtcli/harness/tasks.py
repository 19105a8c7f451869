"""lm-evaluation-harness tasks: which to run and how (TaskOptions), their names checked before
any model is built, lm-eval's evaluation of an LM, and its results as dtcli shows and logs them.

lm_eval is an optional extra (`pip install 'dtensor-cli[eval]'`): it is imported inside the
functions that use it, never when dtcli is imported. Nothing here imports TensorFlow.
"""

from __future__ import annotations

import difflib
import functools
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtcli.errors import UsageError
from dtcli.harness.local_data import resolve_beside_yaml
from dtcli.harness.quiet import lm_eval_output
from dtcli.harness.task_build import check_built, fetch_refusal, one_line

# lm-eval's own CLI default (--seed 0,1234,1234,1234): Python's random, NumPy, torch, few-shot.
DEFAULT_SEED = (0, 1234, 1234, 1234)
INSTALL = "pip install 'dtensor-cli[eval]'"


@dataclass(frozen=True)
class TaskOptions:
    """lm-eval's options, as its CLI means them: `limit` (per task: a count, or a fraction of
    the task below 1), `num_fewshot` (None: each task's own), `batch_size` (None: the recipe's
    evaluation batch), `seed` (Python's random, NumPy, torch, few-shot sampling)."""

    tasks: tuple[str, ...]
    include_path: str | None = None
    limit: float | None = None
    num_fewshot: int | None = None
    batch_size: int | None = None
    seed: tuple[int, int, int, int] = DEFAULT_SEED
    log_samples: bool = False
    apply_chat_template: bool = False


def require_lm_eval(named: str) -> None:
    """lm_eval importable, or one line naming the option that needs it."""
    try:
        import lm_eval  # noqa: F401
        import lm_eval.api.model  # noqa: F401
    except ImportError:
        raise UsageError(
            f"{named}: needs lm-evaluation-harness, an optional extra: {INSTALL}"
        ) from None


def parse_seed(text: str, named: str = "--seed") -> tuple[int, int, int, int]:
    """lm-eval CLI's --seed: one integer for all four seeds, or four separated by commas."""
    parts = [p.strip() for p in str(text).split(",")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        values = []
    if len(values) == 1:
        values *= 4
    if len(values) != 4 or any(v < 0 for v in values):
        raise UsageError(
            f"{named} {text!r}: expected one integer >= 0 for all four seeds (Python's random, "
            "NumPy, torch, few-shot sampling) or four separated by commas, like 0,1234,1234,1234"
        )
    return (values[0], values[1], values[2], values[3])


def check_values(options: TaskOptions, named: dict[str, str]) -> None:
    """The numbers in `options`, each named as its caller calls it (`named`: field -> option or
    recipe key): a limit above 0, a few-shot count and a batch of at least 0 and 1."""
    limit = options.limit
    if limit is not None and (not math.isfinite(limit) or limit <= 0):
        raise UsageError(
            f"{named['limit']} {limit:g}: expected a count of examples per task (>= 1) or a "
            "fraction of each task (0 < limit < 1)"
        )
    if options.num_fewshot is not None and options.num_fewshot < 0:
        raise UsageError(f"{named['num_fewshot']} {options.num_fewshot}: expected 0 or more")
    if options.batch_size is not None and options.batch_size < 1:
        raise UsageError(f"{named['batch_size']} {options.batch_size}: expected 1 or more")


# (tasks, include path) whose tasks check_tasks built in this process: built once, not again at
# each evaluation of a training run nor by a command's second check
_BUILT: set[tuple[tuple[str, ...], str | None]] = set()


def check_tasks(options: TaskOptions, named: str = "--tasks", progress: bool = False) -> None:
    """Every task name known to lm-eval (the include path's first; lm-eval's own index, which
    takes seconds to build, only for names the include path lacks) and its YAML parsed: one line
    for an unknown name (with up to 5 close ones), a YAML that does not parse (naming the file),
    an include path that is no folder. Then each task built with its data and its first document
    made into text (task_build.check_built), once per process: one line naming the task, its
    YAML and the cause otherwise. `progress`: datasets' bars while the data load, at a
    terminal."""
    require_lm_eval(named)
    # an option names itself; a recipe section (train.eval_tasks) names its keys
    tasks_arg = named if named.startswith("--") else f"recipe key '{named}.tasks'"
    include_arg = (
        "--include-path" if named.startswith("--") else f"recipe key '{named}.include_path'"
    )
    if not options.tasks:
        raise UsageError(f"{tasks_arg}: expected at least one task name")
    include = _include_folder(options.include_path, include_arg)
    manager = _known(options.tasks, include, tasks_arg, include_arg)
    if (options.tasks, include) in _BUILT:
        return
    # bars at a terminal only (a hub data set's download takes minutes): a refusal is one line
    with lm_eval_output(progress and sys.stderr.isatty(), prints=False):
        check_built(manager, options.tasks, tasks_arg)
    _BUILT.add((options.tasks, include))


def _known(tasks: tuple[str, ...], include: str | None, tasks_arg: str, include_arg: str) -> Any:
    """The TaskManager that knows every name in `tasks` (_manager_for's choice); one line for
    the first name none knows."""
    manager = _manager_for(tasks, include)
    missing = _missing(tasks, manager)
    if not missing:
        return manager
    name = missing[0]
    broken = _broken_yaml(include) if include else []
    if broken:
        path, reason = broken[0]
        raise UsageError(
            f"{tasks_arg}: task {name!r} not found; the task file {str(path)!r} does not parse "
            f"({reason})"
        )
    close = difflib.get_close_matches(name, manager.all_tasks, n=5, cutoff=0.6)
    where = f" in {include_arg} {include} or lm-eval's tasks" if include else " in lm-eval's tasks"
    hint = f"; close: {', '.join(close)}" if close else ""
    raise UsageError(f"{tasks_arg}: unknown task {name!r} (not found{where}){hint}")


def _include_folder(include_path: str | None, arg: str) -> str | None:
    if include_path is None:
        return None
    path = Path(include_path)
    if not path.is_dir():
        what = "no such folder" if not path.exists() else "not a folder"
        raise UsageError(f"{arg} {include_path!r}: {what}; expected a folder of task YAML files")
    return str(path)


@functools.lru_cache(maxsize=4)
def _manager(include: str | None, defaults: bool) -> Any:
    """One TaskManager per (include path, defaults) in a process: check_tasks, then evaluate at
    every evaluation of a training run, index lm-eval's 14,000 tasks once (~4 s). Its tasks'
    relative data files are read from beside their YAML (local_data)."""
    from lm_eval.tasks import TaskManager

    return resolve_beside_yaml(TaskManager(include_path=include, include_defaults=defaults))


def _missing(tasks: tuple[str, ...], manager: Any) -> list[str]:
    """The names neither the manager's index nor a YAML file path gives (lm-eval takes both)."""
    missing = []
    for name in tasks:
        if name in manager.task_index:
            continue
        if name.endswith((".yaml", ".yml")) and Path(name).is_file():
            _parse_task_file(Path(name))
            continue
        missing.append(name)
    return missing


def _parse_task_file(path: Path) -> None:
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        load_yaml(path, resolve_func=False)
    except Exception as exc:  # yaml's errors and lm-eval's include errors alike
        raise UsageError(f"the task file {str(path)!r} does not parse ({one_line(exc)})") from None


def _broken_yaml(include: str) -> list[tuple[Path, str]]:
    """The YAML files under `include` that lm-eval's index skipped as unparseable."""
    from lm_eval.tasks._yaml_loader import load_yaml

    broken = []
    for path in sorted(Path(include).glob("**/*.yaml")):
        try:
            load_yaml(path, resolve_func=False)  # an include base without `task:` is fine
        except Exception as exc:
            broken.append((path, one_line(exc)))
    return broken


def task_manager(options: TaskOptions) -> Any:
    """lm-eval's TaskManager for `options.tasks` (the one check_tasks chose and built them
    with: the same include path, as a folder's path names it, so the same cached manager)."""
    include = None if options.include_path is None else str(Path(options.include_path))
    return _manager_for(options.tasks, include)


def _manager_for(tasks: tuple[str, ...], include: str | None) -> Any:
    """The include path's TaskManager alone when it holds every task (indexing lm-eval's
    14,000 tasks takes seconds), else one with lm-eval's own too."""
    if include is not None:
        only = _manager(include, defaults=False)
        if not _missing(tasks, only):
            return only
    return _manager(include, defaults=True)


def evaluate(
    lm: Any,
    options: TaskOptions,
    model_name: str | None = None,
    named: str = "--tasks",
    progress: bool = True,
) -> dict[str, Any]:
    """lm_eval.simple_evaluate of the LM instance `lm` on `options`: lm-eval's results dict as
    its CLI saves it (the run's configuration, task hashes and times included; `samples` too with
    log_samples). `model_name`: what the results call the model (lm-eval's `model_name`, which
    names the folder under an --output-path), the checkpoint's path. A task whose data cannot be
    fetched (a hub task offline) is one line naming `named`. Whatever lm-eval prints goes to
    stderr; `progress` false: no progress bars (quiet.lm_eval_output)."""
    from lm_eval.loggers import EvaluationTracker

    tracker = EvaluationTracker()
    try:
        with lm_eval_output(progress):
            results = _simple_evaluate(lm, options, tracker, model_name)
    except ConnectionError as exc:  # what datasets raises for a hub data set it cannot reach
        raise fetch_refusal(named, options.tasks, exc) from None
    return _as_saved(dict(results), tracker)


def _simple_evaluate(
    lm: Any, options: TaskOptions, tracker: Any, model_name: str | None
) -> dict[str, Any]:
    import lm_eval

    model_args = {"path": model_name} if model_name else ""
    random_seed, numpy_seed, torch_seed, fewshot_seed = options.seed
    return lm_eval.simple_evaluate(
        model=lm,
        model_args=model_args,
        tasks=list(options.tasks),
        num_fewshot=options.num_fewshot,
        batch_size=options.batch_size,
        limit=options.limit,
        log_samples=options.log_samples,
        evaluation_tracker=tracker,
        apply_chat_template=options.apply_chat_template,
        task_manager=task_manager(options),
        random_seed=random_seed,
        numpy_random_seed=numpy_seed,
        torch_random_seed=torch_seed,
        fewshot_random_seed=fewshot_seed,
    )


def _as_saved(results: dict[str, Any], tracker: Any) -> dict[str, Any]:
    """What lm-eval's EvaluationTracker.save_results_aggregated adds before it writes."""
    from dataclasses import asdict

    from lm_eval.utils import hash_string

    tracker.general_config_tracker.log_end_time()
    hashes = {}
    for task, samples in (results.get("samples") or {}).items():
        joined = "".join(s["doc_hash"] + s["prompt_hash"] + s["target_hash"] for s in samples)
        hashes[task] = hash_string(joined)
    results["task_hashes"] = hashes
    results.update(asdict(tracker.general_config_tracker))
    return results


def metrics(results: dict[str, Any]) -> dict[str, float]:
    """Each numeric metric of each task and group as "TASK/METRIC" (filter "none") or
    "TASK/METRIC/FILTER": lm-eval's "METRIC,FILTER" keys without their comma, which metrics.jsonl,
    TensorBoard and `dtcli plot --metric` take as names. Non-numbers ("N/A") are left out."""
    found: dict[str, float] = {}
    for section in ("results", "groups"):
        for task, values in (results.get(section) or {}).items():
            for key, value in values.items():
                if "," not in key or isinstance(value, bool):
                    continue  # alias, name, sample counts: not metrics
                if not isinstance(value, (int, float)):
                    continue
                metric, _, filter_name = key.partition(",")
                parts = [task, metric] if filter_name == "none" else [task, metric, filter_name]
                found["/".join(p.replace(",", "_") for p in parts)] = float(value)
    return found


def table(results: dict[str, Any]) -> str:
    """lm-eval's own tables (tasks, then groups where there are any), as its CLI prints them."""
    from lm_eval.utils import make_table

    text = make_table(results)
    if results.get("groups"):
        text += "\n" + make_table(results, "groups")
    return text
