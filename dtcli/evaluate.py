"""Evaluating a checkpoint on any mesh: its loss and accuracy on a split, or a language model's
lm-evaluation-harness tasks (--tasks).

A run directory describes itself: each checkpoint's meta.json holds the resolved recipe, so eval
needs nothing but the path. The model is built on the target mesh first and the checkpoint then
restored into it: TensorFlow relays each saved shard out onto the new layouts.

--tasks: the options and the task names are checked before TensorFlow starts; lm-eval's results
are printed and written as its CLI writes them, into RUN_DIR/lm_eval/ (rundir.results: beside the
run while another process writes it), or where --output-path says.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dtcli import checkpoint as ckpt_lib
from dtcli import devices as devices_lib
from dtcli import harness, rundir, storage
from dtcli import progress as progress_lib
from dtcli import recipe as recipe_lib
from dtcli.errors import UsageError
from dtcli.harness.output import output_place, result_files
from dtcli.harness.output import results_json as output_json
from dtcli.recipe import NO_OVERRIDES, Overrides, Recipe
from dtcli.rundir import checkpoint_recipe, find_checkpoint, read_checkpoint, tokenizer_file
from dtcli.rundir.results import results_folder, run_of_checkpoint, write_files
from dtcli.tables import Column, print_table

__all__ = [
    "SPLITS",
    "TasksResult",
    "checkpoint_recipe",
    "check_task_options",
    "evaluate_checkpoint",
    "evaluate_path",
    "evaluate_tasks",
    "find_checkpoint",
    "refuse_task_options",
    "render",
    "results_json",
    "task_options",
    "write_task_results",
]

SPLITS = ("eval", "train")
# What `dtcli eval` prints, in this order (examples for classifiers, tokens and perplexity for
# language models).
SHOWN = (
    "split",
    "examples",
    "tokens",
    "loss",
    "bpb",
    "perplexity",
    "accuracy",
    "mesh",
    "devices",
    "trained_on_mesh",
    "step",
)


def evaluate_path(
    path: Path,
    split: str = "eval",
    overrides: Overrides = NO_OVERRIDES,
    batch_size: int | None = None,
    progress: bool = True,
) -> dict[str, Any]:
    """`dtcli eval`: a checkpoint folder, or a run directory's newest intact checkpoint, on the
    mesh it was trained on or another one. Its files are held open from their verification to
    the restore (rundir.read_checkpoint): a run in training that removes it meanwhile (train.keep)
    takes nothing from under the read, and recipe and weights are one checkpoint's. `progress`:
    where stderr is no terminal, a line every BEAT_EVERY seconds of the work (--no-progress:
    none)."""
    if split not in SPLITS:
        raise UsageError(f"--split {split!r}: expected eval or train")
    devices_key = devices_lib.key_for(overrides.devices)
    what = f"eval: restoring the checkpoint, compiling the step, evaluating the {split} split"
    beat = progress_lib.Heartbeat(progress_lib.stderr_console(), what, on=progress)

    def read(checkpoint: Path, held: Path) -> dict[str, Any]:
        recipe = checkpoint_recipe(held, "eval", overrides, batch_size)
        return evaluate_checkpoint(checkpoint, held, recipe, split, devices_key)

    with beat:
        return read_checkpoint(path, read)


def evaluate_checkpoint(
    checkpoint: Path,
    held: Path,
    recipe: Recipe,
    split: str = "eval",
    devices_key: str = devices_lib.RECIPE_KEY,
    use_devices: int | None = None,
) -> dict[str, Any]:
    """Restore `checkpoint`, read through `held` (the folder checkpoint.held gives, or the
    checkpoint itself), onto `recipe`'s mesh and evaluate it on every example of `split`.
    `use_devices`: the mesh over only the first N devices (session.prepare)."""
    from dtcli import session as session_lib
    from dtcli import steps as steps_lib
    from dtcli.mesh import mesh_text

    if split == "train":  # read as an eval split is: from the host, each example once
        data = dataclasses.replace(recipe.data, placement="host")
        recipe = recipe_lib.replace(recipe, command="eval", data=data)
    splits = (split,) if split == "train" else ("eval",)
    session = session_lib.prepare(
        recipe,
        splits=splits,
        use_devices=use_devices,
        devices_key=devices_key,
        tokenizer_file=tokenizer_file(checkpoint),
        command="eval",
    )
    session_lib.restore_model(session, held)
    meta = ckpt_lib.read_meta(held)
    _, eval_step = steps_lib.make_steps(session)
    feed = session.eval_feed
    if split == "train":
        feed = session_lib.eval_feed(recipe, session.data.train, session.packer)
    result = session_lib.evaluate(session, eval_step, feed)
    return {
        **result,
        "split": split,
        "checkpoint": str(checkpoint),
        "step": meta["step"],
        "mesh": mesh_text(session.axes),
        "devices": session.devices.text,
        "trained_on_mesh": mesh_text(meta["mesh"]),
    }


def render(result: dict[str, Any], console: Any) -> None:
    """The checkpoint's path on a line of its own (a path is never broken), then one row per
    figure (dtcli.tables: at a terminal a table that fits, in a pipe plain rows)."""
    console.print(result["checkpoint"], markup=False, highlight=False, soft_wrap=True)
    rows = [
        (key, f"{result[key]:.6f}" if isinstance(result[key], float) else str(result[key]))
        for key in SHOWN
        if key in result
    ]
    print_table(console, (Column("figure", kind="name"), Column("value")), rows)


# TaskOptions' numbers as `dtcli eval` names them.
TASK_OPTIONS = {"limit": "--limit", "num_fewshot": "--num-fewshot", "batch_size": "--batch-size"}


@dataclass(frozen=True)
class TasksResult:
    results: dict[str, Any]  # lm-eval's (harness.evaluate), samples included with --log-samples
    checkpoint: str
    run_dir: Any  # the run the checkpoint belongs to; None for a checkpoint outside one


def task_options(
    tasks: str,
    include_path: str | None = None,
    limit: float | None = None,
    num_fewshot: int | None = None,
    batch_size: int | None = None,
    seed: str | None = None,
    log_samples: bool = False,
    apply_chat_template: bool = False,
) -> harness.TaskOptions:
    """`dtcli eval --tasks`' options as harness.TaskOptions: the names comma-separated, the
    seed as lm-eval's CLI writes it (harness.parse_seed)."""
    return harness.TaskOptions(
        tasks=tuple(name.strip() for name in tasks.split(",") if name.strip()),
        include_path=include_path,
        limit=limit,
        num_fewshot=num_fewshot,
        batch_size=batch_size,
        seed=harness.DEFAULT_SEED if seed is None else harness.parse_seed(seed),
        log_samples=log_samples,
        apply_chat_template=apply_chat_template,
    )


def refuse_task_options(given: dict[str, Any]) -> None:
    """lm-eval's options (option -> value; None or False: not given) without --tasks: one line,
    as they would change nothing."""
    for name, value in given.items():
        if value is not None and value is not False:
            raise UsageError(f"{name}: only with --tasks (lm-evaluation-harness tasks)")


def check_task_options(
    options: harness.TaskOptions,
    output_path: str | None,
    split: str | None,
    progress: bool = False,
) -> None:
    """Everything --tasks can refuse without the model, before TensorFlow starts (the tasks
    built with their data: `progress`, datasets' bars meanwhile)."""
    harness.require_lm_eval("--tasks")
    if split is not None:
        raise UsageError(
            f"--split {split}, --tasks: do not combine; --tasks runs the tasks instead of the "
            "split's loss and accuracy"
        )
    harness.check_values(options, TASK_OPTIONS)
    if output_path is not None:
        folder, _ = output_place(output_path, "model")
        # the .json file's folder, or the folder holding a folder per model
        rundir.check_output_folder(
            folder if output_path.endswith(".json") else folder.parent, "--output-path"
        )
    harness.check_tasks(options, progress=progress)


def evaluate_tasks(
    path: Path | str,
    options: harness.TaskOptions,
    overrides: Overrides = NO_OVERRIDES,
    output_path: str | None = None,
    progress: bool = True,
    split: str | None = None,
) -> TasksResult:
    """`dtcli eval --tasks`: lm-eval's tasks on a checkpoint folder or a run directory's newest
    intact checkpoint, restored on the mesh it was trained on or another one; the options
    checked first (`split`: --split, which --tasks refuses). `progress`: as evaluate_path's."""
    check_task_options(options, output_path, split, progress)
    devices_key = devices_lib.key_for(overrides.devices)
    what = "eval: restoring the checkpoint, running lm-eval's tasks"
    beat = progress_lib.Heartbeat(progress_lib.stderr_console(), what, on=progress)

    def read(checkpoint: Path, held: Path) -> TasksResult:
        from dtcli.session.restore import restored_session

        recipe = checkpoint_recipe(held, "eval", overrides, options.batch_size)
        run_dir = run_of_checkpoint(checkpoint)
        if run_dir is None and output_path is None and options.log_samples:
            raise UsageError(
                f"--log-samples: CHECKPOINT {str(path)!r} is not inside a run directory, so "
                "the samples have no place of their own; give --output-path"
            )
        if recipe.task != "language_model":
            raise UsageError(
                f"CHECKPOINT {str(path)!r}: --tasks needs a language model (task "
                f"language_model); this run's task is {recipe.task}"
            )
        if options.apply_chat_template:  # before any weight is read
            from dtcli.harness.model import check_chat_template

            check_chat_template(recipe, run_dir)
        session = restored_session(checkpoint, held, recipe, "eval", None, devices_key)
        results = harness.run_tasks(session, options, str(checkpoint), run_dir, progress)
        return TasksResult(results, str(checkpoint), run_dir)

    with beat:
        return read_checkpoint(storage.as_path(path), read)


def write_task_results(result: TasksResult, output_path: str | None) -> list[str]:
    """lm-eval's files (the results, the samples) where --output-path says, else into the run
    directory (rundir.results_folder) -> lines for stderr: where they went, and why there."""
    if output_path is not None:
        folder, stem = output_place(output_path, result.checkpoint)
        note, arg = None, "--output-path"
    elif result.run_dir is not None:
        (folder, note), stem, arg = results_folder(result.run_dir), "results", "RUN_DIR"
    else:
        return [
            "note: the checkpoint is outside a run directory: no results file written "
            "(give --output-path for one)"
        ]
    files = result_files(result.results, stem)
    written = write_files(folder, files, arg)
    return [*([note] if note else []), f"results: {written[0]}"]


def results_json(result: TasksResult) -> str:
    """--json: lm-eval's results as the results file holds them (its samples apart), one line."""
    return output_json(result.results)
