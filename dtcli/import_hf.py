"""`dtcli import-hf HF_DIR --out RUN_DIR`: a Hugging Face model folder as a dtcli run directory.

The run directory holds what a trained run's does for eval, generate, score, export and plan: a
recipe (task language_model, text data in the model's own tokenizer, `model.transformer` from
config.json), the tokenizer (RUN_DIR/tokenizer.json), the weights as its step-0 checkpoint, and
the model's other Hugging Face files under RUN_DIR/hf/ (tokenizer_config.json with the chat
template, generation_config.json with the end-of-sequence ids, special_tokens_map.json, the
source config.json), which an export carries out again.

Everything that can be refused is checked before TensorFlow starts (config.json, every tensor's
name and shape, the tokenizer). The model is then built on the mesh (--mesh, --devices, layout
rules by --set) and each tensor read, mapped and packed onto its layout one at a time; the run
is written into a hidden folder beside --out and renamed into place once complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from dtcli import checkpoint as ckpt_lib
from dtcli import progress as progress_lib
from dtcli import recipe as recipe_lib
from dtcli import rundir
from dtcli.errors import cleaned_up_on_stop
from dtcli.hf import config as hf_config
from dtcli.hf import tokenizer_files
from dtcli.hf.safetensors_io import ModelFiles
from dtcli.recipe import NO_OVERRIDES, Overrides, Recipe


def import_hf(
    hf_dir: str | Path,
    out: str | Path,
    context: int | None = None,
    overrides: Overrides = NO_OVERRIDES,
    progress: bool = True,
) -> Path:
    """`dtcli import-hf`: returns the run directory written."""
    from dtcli.models import hf_weights

    hf = hf_config.read(hf_dir, "HF_DIR", context)
    files = ModelFiles(hf.folder)
    by_name = hf_weights.check_files(hf, files)
    tokenizer_files.check(hf.folder, hf.vocab_size)
    out = rundir.check_new_local_folder(Path(out), "import-hf")
    recipe = recipe_lib.load(_raw_recipe(hf, out), overrides, command="export")
    what = f"import-hf: reading {len(by_name)} tensors onto the mesh, writing the checkpoint"
    with _hidden_folder(out) as tmp:
        with progress_lib.Heartbeat(progress_lib.stderr_console(), what, on=progress):
            tokenizer_files.copy_in(hf.folder, tmp)
            _write_checkpoint(tmp, recipe, hf, files, by_name, overrides)
            (tmp / rundir.RECIPE).write_text(recipe_lib.dump(recipe))
        if out.exists():
            out.rmdir()  # an empty folder given as --out (checked)
        tmp.rename(out)
    return out


# The hidden folder an import writes beside --out until it is complete: .OUT.import-PID.
_HIDDEN = ".{name}.import-{pid}"


@contextlib.contextmanager
def _hidden_folder(out: Path) -> Iterator[Path]:
    """The folder the run is written into, removed on any failure, Ctrl-C or SIGTERM. SIGTERM
    (a scheduler's stop) is raised as errors.Preempted (one line, exit 143): Python's default
    handler would end the process without a clean-up, leaving the folder behind. A folder an
    earlier import to the same --out left when it was killed (its process is gone) is removed
    first, and stderr says so."""
    _remove_stale(out)
    tmp = out.parent / _HIDDEN.format(name=out.name, pid=os.getpid())
    stopped = _PREEMPTED.format(out=str(out))
    with cleaned_up_on_stop(stopped, lambda: shutil.rmtree(tmp, ignore_errors=True)):
        tmp.mkdir(parents=True)
        yield tmp


_PREEMPTED = "preempted (SIGTERM); import-hf stopped and wrote nothing to --out {out!r}"


def _remove_stale(out: Path) -> None:
    """Remove the hidden folders of imports to `out` whose process is gone (killed: SIGKILL,
    a lost machine), saying so; one of a live process is another import's, left alone."""
    pattern = _HIDDEN.format(name=out.name, pid="*")
    for found in sorted(out.parent.glob(pattern)) if out.parent.is_dir() else []:
        pid = found.name.rsplit("-", 1)[1]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        shutil.rmtree(found, ignore_errors=True)
        print(
            f"note: removed {found}, left by an import-hf to the same --out that did not finish "
            f"(process {pid} is gone)",
            file=sys.stderr,
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _raw_recipe(hf: hf_config.HfConfig, out: Path) -> dict[str, Any]:
    """The run's recipe: the model from config.json, text data in the run's own tokenizer."""
    return {
        "name": out.name,
        "task": "language_model",
        "model": {"transformer": dict(hf.transformer)},
        # The run's folder holds its tokenizer.json (read first by every command anyway).
        "data": {"source": "text", "tokenizer": str(out.resolve())},
    }


@dataclass(frozen=True)
class Target:
    """The model an import fills: built on the recipe's mesh, no weight set yet."""

    built: Any  # models.Built
    mesh: Any  # None: plain variables on one device
    axes: dict[str, int]
    devices: str  # the resolved devices, as the run's recipe records them
    input_shape: tuple[int, ...]
    vocab: int  # the model's (rounded) vocabulary


def build_target(recipe: Recipe, tokenizer: Path, devices_key: str) -> Target:
    """The recipe's model on its mesh with every weight left for the caller to assign (no
    initial values computed on the host); bench/import_hf.py measures its memory."""
    from dtcli import data as data_lib
    from dtcli import devices as devices_lib
    from dtcli import mesh as mesh_lib
    from dtcli import models

    count = mesh_lib.device_count_for(recipe.mesh)
    devices = devices_lib.configure(recipe.devices, count, devices_key)
    axes = mesh_lib.resolve_axes(recipe.mesh, devices.count)
    data = data_lib.no_data(recipe.data, tokenizer, recipe.model.real_vocab)
    shape, vocab = data.input_shape, data.num_classes
    plans, _ = models.weight_plans(recipe, shape, vocab, axes, values=False)
    mesh = mesh_lib.build_mesh(axes, devices.device_type)
    built = models.build(recipe, shape, vocab, mesh, plans, None)
    return Target(built, mesh, axes, devices.text, shape, vocab)


def _write_checkpoint(
    run: Path,
    recipe: Recipe,
    hf: hf_config.HfConfig,
    files: ModelFiles,
    by_name: dict[str, str],
    overrides: Overrides,
) -> None:
    """The model built on the recipe's mesh, each weight set from the folder, saved as the
    step-0 checkpoint of the run at `run`."""
    from dtcli import devices as devices_lib
    from dtcli import models
    from dtcli.models import hf_weights

    key = devices_lib.key_for(overrides.devices)
    t = build_target(recipe, run / rundir.TOKENIZER, key)
    hf_weights.assign(t.built, hf, files, by_name, lambda v, var: models.place(v, var, t.mesh))
    resolved = recipe_lib.replace(recipe, command="export", mesh=t.axes, devices=t.devices)
    meta = _meta(resolved, t.built, t.input_shape, t.vocab, files.dtype())
    saver = ckpt_lib.Checkpointer(run / rundir.CHECKPOINTS, {"model": t.built.module}, keep=1)
    saver.save(0, meta)


def _meta(
    recipe: Recipe, built: Any, shape: tuple[int, ...], vocab: int, dtype: str
) -> dict[str, Any]:
    """The step-0 checkpoint's meta.json, as a trained run's (train.loop.checkpoint_meta)."""
    import tensorflow as tf
    import tf_keras

    import dtcli

    return {
        "step": 0,
        "epoch": 0,
        "epoch_state": {
            "epoch": 0,
            "batch": 0,
            "loss_sum": 0.0,
            "correct": 0.0,
            "count": 0.0,
            "seconds": 0.0,
            "compile_seconds": 0.0,
        },
        "mesh": recipe.mesh,
        "devices": recipe.devices,
        "time": datetime.now().isoformat(timespec="seconds"),
        "versions": {
            "dtcli": dtcli.__version__,
            "tensorflow": tf.__version__,
            "tf_keras": tf_keras.__version__,
        },
        "pid": os.getpid(),
        "recipe": recipe_lib.to_mapping(recipe),
        "weights": {w.path: list(w.shape) for w in built.weights},
        "input_shape": list(shape),
        "num_classes": vocab,
        # The dtype the weights were published in: an export writes them in it again.
        "hf_dtype": dtype,
        # The model alone (checkpoint.weights_only): a resume starts a new optimizer.
        "weights_only": True,
    }
