"""lm-eval's result files as its CLI writes them (EvaluationTracker): the results JSON
(`results_DATE.json`, or `STEM_DATE.json` for an --output-path ending in .json) and, with
--log-samples, one JSON Lines file of samples per task (`samples_TASK_DATE.jsonl`). Their names
and texts only: where they go and the writing are the caller's (the run directory's rules)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from dtcli import storage


def date_id() -> str:
    """lm-eval's file date: the local time, ':' made '-'."""
    return datetime.now().isoformat().replace(":", "-")


def model_folder(model_name: str) -> str:
    """The folder an --output-path folder holds the results in (lm-eval's sanitized name)."""
    from lm_eval.utils import sanitize_model_name

    return sanitize_model_name(model_name)


def results_json(results: dict[str, Any], indent: int | None = None) -> str:
    """`results` (tasks.evaluate's) as JSON, its samples apart: the results file's text
    (indent 2), or --json's one line."""
    from lm_eval.utils import handle_non_serializable

    shown = {k: v for k, v in results.items() if k != "samples"}
    return json.dumps(shown, indent=indent, default=handle_non_serializable, ensure_ascii=False)


def result_files(results: dict[str, Any], stem: str = "results", when: str = "") -> dict[str, str]:
    """`results` (tasks.evaluate's, `samples` included with log_samples) as lm-eval's files:
    file name -> text, the results first. `stem`: "results", or an --output-path file's stem
    (lm-eval then writes STEM_DATE.json)."""
    from lm_eval.utils import handle_non_serializable

    when = when or date_id()
    files = {f"{stem}_{when}.json": results_json(results, indent=2)}
    for task, samples in (results.get("samples") or {}).items():
        files[f"samples_{task}_{when}.jsonl"] = "".join(
            json.dumps(_sample(s), default=handle_non_serializable, ensure_ascii=False) + "\n"
            for s in samples
        )
    return files


def _sample(sample: dict[str, Any]) -> dict[str, Any]:
    """One logged sample as EvaluationTracker.save_results_samples writes it."""
    from lm_eval.utils import sanitize_list

    sample = dict(sample)
    sample["arguments"] = {
        f"gen_args_{i}": {f"arg_{j}": value for j, value in enumerate(arg)}
        for i, arg in enumerate(sample["arguments"])
    }
    sample["resps"] = sanitize_list(sample["resps"])
    sample["filtered_resps"] = sanitize_list(sample["filtered_resps"])
    sample["target"] = str(sample["target"])
    return sample


def output_place(output_path: str, model_name: str) -> tuple[Any, str]:
    """lm-eval's --output_path: a path ending in .json names the results file (its folder holds
    the samples), anything else is a folder holding a folder per model -> (folder, stem); a
    local folder as a Path, a URL as storage's RemotePath."""
    path = storage.as_path(output_path)
    if path.name.endswith(".json") and path.name != ".json":
        return path.parent, path.name[: -len(".json")]
    return path / model_folder(model_name), "results"
