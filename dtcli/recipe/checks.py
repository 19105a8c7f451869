"""Checks between keys, one function per section, run after every key has its type.

The `data` section's own checks are in data_checks. Nothing here reads a file, looks at the
devices or imports TensorFlow: `dtcli config` runs all of it.
"""

from __future__ import annotations

import dataclasses
import math
import re

from dtcli import devices as devices_lib
from dtcli.devices import MAX_VIRTUAL_CPUS
from dtcli.errors import UsageError
from dtcli.mesh import UNSHARDED, mesh_text, resolve_axes
from dtcli.recipe.batches import check_batches_at_load
from dtcli.recipe.configs import (
    TEXT_SOURCES,
    LayoutConfig,
    ModelConfig,
    OptimizerConfig,
    Recipe,
    TrainConfig,
    TransformerConfig,
)
from dtcli.recipe.data_checks import check_data
from dtcli.recipe.lora_checks import check_lora
from dtcli.recipe.transformer_checks import check_transformer


def check(recipe: Recipe, command: str = "train") -> Recipe:
    """Checks that need more than one key's type; no devices or TensorFlow needed. `command`:
    what runs the recipe (recipe.batches.COMMANDS), whose batches are checked against the mesh.

    The sections are checked in this order, and the first failing check is the error shown."""
    devices_lib.parse(recipe.devices)
    if not 0 <= recipe.seed <= 2**32 - 1:
        raise UsageError(
            f"recipe key 'seed': expected an integer in [0, 2**32 - 1], got {recipe.seed}"
        )
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", recipe.name):
        raise UsageError(
            f"recipe key 'name': expected letters, digits, '_', '.', '-', got {recipe.name!r}"
        )
    _check_mesh(recipe.mesh)
    _check_layouts(recipe.layouts, recipe.mesh)
    _check_devices_mesh(recipe)
    _check_model(recipe.model, recipe.task)
    _check_task(recipe)
    check_lora(recipe)
    check_data(recipe.data)
    # Before the batch's checks: train.accumulate divides data.batch_size there.
    _check_train(recipe.train)
    _check_eval_tasks(recipe)
    check_batches_at_load(recipe, command)
    _check_precision(recipe)
    _check_optimizer(recipe.optimizer)
    o, t = recipe.optimizer, recipe.train
    if o.warmup_steps and o.decay_steps is None and t.steps and o.warmup_steps >= t.steps:
        raise UsageError(
            f"recipe key 'optimizer.warmup_steps': {o.warmup_steps} is not below train.steps "
            f"{t.steps} (the rate would never leave its warmup); use fewer warmup steps"
        )
    return recipe


def _check_mesh(mesh: dict[str, int]) -> None:
    if not mesh:
        raise UsageError("recipe key 'mesh': expected at least one axis, like {batch: 8}")
    fill = [a for a, s in mesh.items() if s == -1]
    if len(fill) > 1:
        raise UsageError(f"recipe key 'mesh': at most one axis may be -1, got {fill}")
    for axis, size in mesh.items():
        if size == 0 or size < -1:
            raise UsageError(
                f"recipe key 'mesh.{axis}': expected a positive size or -1, got {size}"
            )
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", axis) or axis == UNSHARDED:
            raise UsageError(f"recipe key 'mesh.{axis}': not a usable axis name")


def _check_layouts(lay: LayoutConfig, mesh: dict[str, int]) -> None:
    """Every axis the layouts name is in the mesh (the weights are checked once built)."""
    if lay.data_axis not in mesh and lay.data_axis != UNSHARDED:
        raise UsageError(
            f"recipe key 'layouts.data_axis': axis '{lay.data_axis}' is not in the mesh "
            f"{mesh_text(mesh)} (use a mesh axis or 'unsharded')"
        )
    for pattern, dims in lay.rules.items():
        key = f"layouts.rules.{pattern}"
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"recipe key '{key}': not a valid regex ({exc})") from None
        for dim in dims:
            if dim != UNSHARDED and dim not in mesh:
                raise UsageError(
                    f"recipe key '{key}': axis '{dim}' is not in the mesh "
                    f"{mesh_text(mesh)} (expected a mesh axis or 'unsharded')"
                )
        used = [d for d in dims if d != UNSHARDED]
        if len(used) != len(set(used)):
            raise UsageError(f"recipe key '{key}': a mesh axis may shard only one dim, got {dims}")
    if lay.fsdp and lay.data_axis == UNSHARDED:
        raise UsageError(
            "recipe key 'layouts.fsdp': shards weights on the data axis, but layouts.data_axis "
            "is 'unsharded'; name the mesh axis the batch is split along"
        )


def _check_devices_mesh(recipe: Recipe) -> None:
    """A mesh with a `cpu` device spec without count asks for that many virtual CPUs."""
    spec = devices_lib.parse(recipe.devices)
    if spec.kind not in ("cpu", "auto") or spec.count is not None:
        return
    if any(s == -1 for s in recipe.mesh.values()):
        return
    total = math.prod(recipe.mesh.values())
    if total > MAX_VIRTUAL_CPUS:
        on = "" if spec.kind == "cpu" else " on a machine without GPUs"
        raise UsageError(
            f"recipe key 'mesh': {mesh_text(recipe.mesh)} asks for {total} devices, and devices "
            f"{recipe.devices!r} makes them virtual CPUs{on}; at most {MAX_VIRTUAL_CPUS} "
            "(MAX_VIRTUAL_CPUS: more exhaust memory or hang TensorFlow's start-up)"
        )


def check_mesh_on_devices(recipe: Recipe) -> None:
    """The mesh against the device count its spec fixes without asking the machine (cpu:N,
    gpu:N; `cpu` makes as many as the mesh asks for, one when an axis is -1): what `train`
    refuses once its devices are configured, `config` refuses before. Not part of `check`: a
    session may build a recipe's mesh over fewer devices (`use_devices`, as doctor does)."""
    spec = devices_lib.parse(recipe.devices)
    count = spec.count
    if count is None and spec.kind == "cpu":
        count = 1 if -1 in recipe.mesh.values() else math.prod(recipe.mesh.values())
    if count is not None:
        resolve_axes(recipe.mesh, count)


def _check_model(m: ModelConfig, task: str) -> None:
    other = m.api == "core" or m.layers is not None or m.build is not None
    if task == "classify" and m.transformer is not None and other:
        raise _not_the_gpt(m)
    if m.api == "keras":
        given = [k for k in ("layers", "build", "transformer") if getattr(m, k) is not None]
        if len(given) != 1:
            raise UsageError(
                "recipe key 'model': api keras needs exactly one of 'layers', 'build' or "
                f"'transformer', got {given or 'none'}"
            )
        if m.transformer is not None:
            check_transformer(m.transformer)
        if m.layers is not None and not m.layers:
            raise UsageError("recipe key 'model.layers': expected at least one layer, got []")
        if m.build is not None and not re.fullmatch(r"[\w.]+:\w+", m.build):
            raise UsageError(
                f"recipe key 'model.build': expected 'package.module:function', got {m.build!r}"
            )
    else:
        if m.layers is not None or m.build is not None or m.transformer is not None:
            raise UsageError(
                "recipe key 'model': api core takes 'hidden' and 'activation', "
                "not 'layers', 'build' or 'transformer'"
            )
        # An empty list is allowed: a linear model.
        if not all(h > 0 for h in m.hidden):
            raise UsageError(f"recipe key 'model.hidden': expected positive widths, got {m.hidden}")


def _not_the_gpt(m: ModelConfig) -> UsageError:
    """model.transformer's keys (remat, dropout...) given for another model: they configure
    dtcli's GPT only. Named by the first key given a value of its own."""
    default = TransformerConfig()
    changed = [
        f.name
        for f in dataclasses.fields(TransformerConfig)
        if getattr(m.transformer, f.name) != getattr(default, f.name)
    ]
    key = f"model.transformer.{changed[0]}" if changed else "model.transformer"
    this = (
        "a Core-API MLP (model.api core)"
        if m.api == "core"
        else "a tf-keras layer list (model.layers)"
        if m.layers is not None
        else "a tf-keras model from model.build"
    )
    return UsageError(
        f"recipe key '{key}': model.transformer configures dtcli's GPT (task language_model) "
        f"only, and this classifier is {this}; remove model.transformer"
    )


def _check_task(recipe: Recipe) -> None:
    """A language model needs token windows and a model that predicts every position."""
    d, m = recipe.data, recipe.model
    if recipe.task == "language_model":
        if d.source not in TEXT_SOURCES:
            raise UsageError(
                f"recipe key 'data.source': task language_model reads text, token shards or "
                f"instruction data, got {d.source!r} (set data.source: text, tokens or jsonl)"
            )
        if d.name != "digits" and (d.path is not None or d.eval_path is not None):
            raise UsageError(
                f"recipe key 'data.name': {d.name!r} names a TFDS text data set, and "
                "data.path/data.eval_path name files; give one or the other"
            )
        if m.api != "keras" or m.layers is not None:
            raise UsageError(
                "recipe key 'model': task language_model needs model.transformer or a "
                "model.build language model (api keras)"
            )
        if d.context is None:
            raise UsageError(
                "recipe key 'data.context': a model.build language model needs the window "
                "length (tokens per example)"
            )
        t = m.transformer
        if d.packing and t is None:
            raise UsageError(
                "recipe key 'data.packing': packed windows (ids, segments and positions, "
                "[3, context]) are read by dtcli's GPT (model.transformer) only, and this "
                "model is model.build's; set data.packing: false"
            )
        if t is not None and d.context > t.context:
            raise UsageError(
                f"recipe key 'data.context': windows of {d.context} tokens are longer than "
                f"model.transformer.context {t.context}"
            )
        return
    if d.source in TEXT_SOURCES:
        raise UsageError(
            f"recipe key 'task': data.source {d.source} trains a language model; set task: "
            "language_model"
        )
    if m.transformer is not None:
        raise UsageError(
            "recipe key 'task': model.transformer is a language model; set task: language_model"
        )


# The most epochs or steps a run may count: far more than any run trains, and every counter of
# steps (the optimizer's, the data position, TensorBoard's) holds it.
MAX_COUNT = 2**31 - 1


def _check_train(t: TrainConfig) -> None:
    for key in ("epochs", "steps"):
        value = getattr(t, key)
        if value is not None and value > MAX_COUNT:
            raise UsageError(
                f"recipe key 'train.{key}': expected at most 2**31 - 1 ({MAX_COUNT:,}), "
                f"got {value:,}"
            )
    if t.epochs < 1:
        raise UsageError(f"recipe key 'train.epochs': expected an integer >= 1, got {t.epochs}")
    if t.steps_per_epoch is not None and t.steps_per_epoch < 1:
        raise UsageError(
            "recipe key 'train.steps_per_epoch': expected an integer >= 1 or null, "
            f"got {t.steps_per_epoch}"
        )
    if not 1 <= t.steps_per_call <= 1000:
        raise UsageError(
            "recipe key 'train.steps_per_call': expected an integer from 1 to 1000, "
            f"got {t.steps_per_call}"
        )
    for key in ("steps", "eval_every"):
        value = getattr(t, key)
        if value is not None and value < 1:
            raise UsageError(
                f"recipe key 'train.{key}': expected an integer >= 1 or null, got {value}"
            )
    if t.eval_every is not None and t.steps is None:
        raise UsageError(
            "recipe key 'train.eval_every': counts steps of a train.steps run; set train.steps "
            "too (an epochs run evaluates after each epoch)"
        )
    if not 1 <= t.accumulate <= 1024:
        raise UsageError(
            "recipe key 'train.accumulate': expected an integer from 1 to 1024 (micro-batches "
            f"per optimizer step, a divisor of data.batch_size), got {t.accumulate}"
        )
    for key, low in (("checkpoint_every", 0), ("keep", 1), ("log_every", 1)):
        value = getattr(t, key)
        if value < low:
            raise UsageError(f"recipe key 'train.{key}': expected an integer >= {low}, got {value}")


def _check_eval_tasks(recipe: Recipe) -> None:
    """train.eval_tasks' values (the task names themselves are lm-eval's to know: dtcli.train
    asks it before TensorFlow starts, as this layer has no lm-eval)."""
    tasks = recipe.train.eval_tasks
    if tasks is None:
        return
    key = "recipe key 'train.eval_tasks"
    if recipe.task != "language_model":
        raise UsageError(
            f"{key}': lm-evaluation-harness tasks score a language model's text; this recipe's "
            f"task is {recipe.task} (remove train.eval_tasks)"
        )
    if recipe.data.packing:
        raise UsageError(
            f"{key}': the training model takes packed windows (data.packing: true) and the "
            "tasks one sequence a row; run dtcli eval RUN --tasks on its checkpoints instead"
        )
    if not tasks.tasks:
        raise UsageError(f"{key}.tasks': expected a non-empty list of task names, got []")
    for i, name in enumerate(tasks.tasks):
        if not name.strip() or "," in name:
            raise UsageError(
                f"{key}.tasks[{i}]': expected a task name (one a list item, no commas), "
                f"got {name!r}"
            )
    if tasks.include_path is not None and not tasks.include_path.strip():
        raise UsageError(f"{key}.include_path': expected a folder of task YAMLs or null, got ''")
    if tasks.limit is not None and tasks.limit <= 0:
        raise UsageError(
            f"{key}.limit': expected a number > 0 (N documents per task, or below 1 a "
            f"fraction of them) or null, got {tasks.limit:g}"
        )
    for name, low in (("num_fewshot", 0), ("batch_size", 1)):
        value = getattr(tasks, name)
        if value is not None and value < low:
            raise UsageError(f"{key}.{name}': expected an integer >= {low} or null, got {value}")


def _check_precision(recipe: Recipe) -> None:
    """bf16 compute is cast inside dtcli's own models (tf-keras' mixed precision fails under a
    LayoutMap), so a layer list or a user's model.build cannot take it."""
    m = recipe.model
    if recipe.train.precision == "bf16" and m.api == "keras" and m.transformer is None:
        raise UsageError(
            "recipe key 'train.precision': bf16 runs inside dtcli's own models "
            "(model.transformer, or model.api core); this model is a tf-keras "
            f"{'model.build function' if m.build else 'layer list'}: use float32"
        )


def _check_optimizer(o: OptimizerConfig) -> None:
    # Finiteness is checked by _coerce for every float key.
    rules = (
        ("learning_rate", o.learning_rate > 0, "a positive number"),
        ("beta_1", 0 <= o.beta_1 < 1, "a number in [0, 1)"),
        ("beta_2", 0 <= o.beta_2 < 1, "a number in [0, 1)"),
        ("epsilon", o.epsilon > 0, "a positive number"),
        ("momentum", 0 <= o.momentum <= 1, "a number in [0, 1]"),
        ("weight_decay", o.weight_decay >= 0, "a number >= 0"),
    )
    rules += (
        ("warmup_steps", o.warmup_steps >= 0, "an integer >= 0"),
        ("decay_steps", o.decay_steps is None or o.decay_steps >= 1, "an integer >= 1 or null"),
        (
            "min_learning_rate",
            0 <= o.min_learning_rate <= o.learning_rate,
            f"a number from 0 to optimizer.learning_rate ({o.learning_rate})",
        ),
        ("clip_norm", o.clip_norm is None or o.clip_norm > 0, "a positive number or null"),
    )
    for key, ok, expected in rules:
        if not ok:
            raise UsageError(
                f"recipe key 'optimizer.{key}': expected {expected}, got {getattr(o, key)!r}"
            )
    if o.schedule == "cosine" and o.decay_steps is not None and o.warmup_steps >= o.decay_steps:
        raise UsageError(
            f"recipe key 'optimizer.warmup_steps': {o.warmup_steps} is not below "
            f"optimizer.decay_steps {o.decay_steps} (the decay follows the warmup)"
        )
    if o.no_decay is not None:
        if o.name != "adamw":
            raise UsageError(
                f"recipe key 'optimizer.no_decay': only adamw decays weights, got optimizer "
                f"{o.name!r}"
            )
        try:
            re.compile(o.no_decay)
        except re.error as exc:
            raise UsageError(
                f"recipe key 'optimizer.no_decay': not a valid regex ({exc})"
            ) from None
