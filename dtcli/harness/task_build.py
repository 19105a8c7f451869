"""Each named task built by lm-eval, and its first document made into request text, before any
model is built: a task YAML that parses but is no valid task (no doc_to_text), a data file that
is missing, a hub data set out of reach are one line naming the task and its YAML, not an error
after a checkpoint is restored or a model built. Local tasks take a few hundred milliseconds.
"""

from __future__ import annotations

from typing import Any

from dtcli.errors import UsageError

# what a task YAML must say to turn a document into requests (doc_to_choice: multiple choice)
DOC_STEPS = ("doc_to_text", "doc_to_target")


def check_built(manager: Any, tasks: tuple[str, ...], tasks_arg: str) -> None:
    """Every name in `tasks` (a task, group or tag lm-eval's `manager` knows, or a YAML path)
    built with its data, and every task under it turning its first evaluation document into
    text, a target (and choices); one UsageError line naming `tasks_arg`, the task, its YAML and
    the cause otherwise."""
    for name in tasks:
        entry = manager.task_index.get(name)
        yaml = str(entry.yaml_path) if entry is not None and entry.yaml_path else name
        try:
            built = manager.load([name])
        except ConnectionError as exc:  # what datasets raises for a hub data set it cannot reach
            raise fetch_refusal(tasks_arg, (name,), exc) from None
        except Exception as exc:
            why = _unset_step(entry) or cause(exc)
            raise UsageError(
                f"{tasks_arg}: task {name!r} ({yaml}) cannot be built: {why}"
            ) from None
        for task_name, task in built["tasks"].items():
            _check_first_request(task_name, task, manager.task_index.get(task_name), tasks_arg)


def _unset_step(entry: Any) -> str | None:
    """What a task YAML lacks that lm-eval needs to build it ("its YAML sets no doc_to_text"):
    lm-eval's own error then is a bare TypeError."""
    if entry is None or not entry.yaml_path:
        return None
    from lm_eval.tasks._yaml_loader import load_yaml

    try:
        cfg = load_yaml(entry.yaml_path, resolve_func=False)  # its includes merged
    except Exception:
        return None
    if not isinstance(cfg, dict) or not isinstance(cfg.get("task"), str) or "class" in cfg:
        return None  # a group, or a Python task: no document steps in its YAML
    unset = [step for step in _steps(cfg.get("output_type")) if cfg.get(step) is None]
    return f"its YAML sets no {unset[0]}" if unset else None


def _check_first_request(name: str, task: Any, entry: Any, tasks_arg: str) -> None:
    """The requests of the task's first document (lm-eval's constructor already made its text,
    target and choices): a multiple-choice task without choices fails here, not mid-run."""
    metadata = getattr(getattr(task, "config", None), "metadata", None) or {}
    where = f"{name!r} ({metadata['config_source']})" if "config_source" in metadata else repr(name)
    try:
        doc = next(iter(task.eval_docs))
        task.construct_requests(doc=doc, ctx=task.doc_to_text(doc), metadata=(name, 0, 1))
    except Exception as exc:
        why = _unset_step(entry) or cause(exc)
        raise UsageError(
            f"{tasks_arg}: task {where}: its first document's request fails: {why}"
        ) from None


def _steps(output_type: str | None) -> tuple[str, ...]:
    return (*DOC_STEPS, "doc_to_choice") if output_type == "multiple_choice" else DOC_STEPS


def fetch_refusal(named: str, tasks: tuple[str, ...], exc: Exception) -> UsageError:
    """A task's data that cannot be fetched (a hub data set, offline): one line naming it."""
    return UsageError(
        f"{named} {','.join(tasks)}: cannot fetch a task's data ({cause(exc)}); "
        "offline, only tasks whose data are local or already cached run"
    )


def one_line(exc: Exception) -> str:
    """An exception's message on one line, at most 200 characters; its type where it is empty."""
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def cause(exc: Exception) -> str:
    """one_line's, with the type before it where the message alone would not say what failed."""
    if not str(exc).split() or isinstance(exc, (OSError, ValueError)):
        return one_line(exc)
    return f"{type(exc).__name__}: {one_line(exc)}"
