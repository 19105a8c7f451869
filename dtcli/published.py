"""A published model as `dtcli plan HF_DIR` plans it, before anything is loaded: its config.json
made into the recipe `train` would run (task language_model, model.transformer from the config),
its parameter count as the config implies it, and its safetensors headers checked against the
config. No tensor data, no TensorFlow, no tokenizer: a plan of an 8B model prints in a second.

What the recipe holds where the command line says nothing:
- `data.batch_size`: one sequence per data shard (`batch="data_axis"`: the mesh's data-axis
  size, the smallest batch every data shard has a row of), or one per device (`batch="devices"`:
  `plan --auto`, so that every candidate mesh trains the same batch and their step times
  compare); `--set data.batch_size=B` replaces it;
- `model.transformer.context`: the config's positions (`--set model.transformer.context=N`);
- `layouts.rules`: Megatron's tensor-parallel rules for dtcli's GPT on the mesh's one axis
  other than the data axis, where it has one of more than one device (`--set layouts.rules`
  replaces them); none otherwise (data parallel, FSDP with `--set layouts.fsdp=true`).
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dtcli import devices as devices_lib
from dtcli import mesh as mesh_lib
from dtcli import recipe as recipe_lib
from dtcli.errors import UsageError
from dtcli.hf import config as hf_config
from dtcli.hf import names as hf_names
from dtcli.hf.safetensors_io import INDEX, SINGLE, Entry, ModelFiles
from dtcli.recipe import Overrides, Recipe

MASTER_BYTES = 4  # dtcli trains float32 master weights, whatever dtype the files hold


@dataclass(frozen=True)
class Published:
    """A Hugging Face model folder, read: its config, the tensors it implies, its files'."""

    folder: Path
    model_type: str
    transformer: dict[str, Any]  # the model.transformer keys (hf.config)
    vocab_size: int  # config.json's, the real vocabulary
    parameters: int  # what config.json implies (a tied head once)
    tensors: dict[str, Entry] | None  # the files' headers; None: config only

    @property
    def dtypes(self) -> list[str]:
        return sorted({t.dtype for t in (self.tensors or {}).values()})

    @property
    def file_bytes(self) -> int:
        return sum(t.end - t.begin for t in (self.tensors or {}).values())

    def to_json(self) -> dict[str, Any]:
        return {
            "folder": str(self.folder),
            "model_type": self.model_type,
            "parameters": self.parameters,
            "vocab_size": self.vocab_size,
            "safetensors": None
            if self.tensors is None
            else {
                "tensors": len(self.tensors),
                "dtypes": self.dtypes,
                "bytes": self.file_bytes,
                "agree_with_config": True,  # they were checked: a disagreement is refused
            },
        }


def is_model_folder(path: str) -> bool:
    """Whether `dtcli plan`'s argument names a folder (a published model) rather than a file."""
    return Path(path).is_dir()


def read(folder: str) -> Published:
    """The folder's config.json and safetensors headers, each refused in one line where wrong
    (hf.config: what maps, what is refused)."""
    config = hf_config.read(folder)
    keys = config.transformer
    implied = {m.hf: m.hf_shape for m in hf_names.mappings(config.model_type, keys)}
    tensors = None
    if (config.folder / INDEX).is_file() or (config.folder / SINGLE).is_file():
        tensors = ModelFiles(config.folder).entries
        hf_names.check_tensors(config.model_type, keys, tensors, config.folder)
    parameters = sum(math.prod(shape) for shape in implied.values())
    return Published(config.folder, config.model_type, keys, config.vocab_size, parameters, tensors)


def recipe_for(
    published: Published,
    overrides: Overrides,
    batch: Literal["data_axis", "devices"] = "data_axis",
    devices_key: str = devices_lib.RECIPE_KEY,
) -> tuple[dict, Recipe, list[str]]:
    """The raw recipe (what --auto's candidates start from), the Recipe and the lines that say
    what it assumed (the module's docstring): the config's model, the command line's --set,
    --mesh and --devices over it. `batch` (no --set data.batch_size): one row per data shard,
    or one per device."""
    raw: dict[str, Any] = {
        "name": _name(published.folder),
        "task": "language_model",
        "model": {"transformer": copy.deepcopy(published.transformer)},
        "data": {"source": "text"},
    }
    raw = overrides.apply(raw)
    data_axis = _data_axis(raw)
    count = device_count(raw, devices_key)
    axes = mesh_lib.resolve_axes(dict(raw.get("mesh") or {"batch": -1}), count)
    said = []
    if "batch_size" not in raw["data"]:
        rows = count if batch == "devices" else mesh_lib.data_shards(axes, data_axis)
        raw["data"]["batch_size"] = rows
        per = (
            "device, the same for every candidate so that their step times compare"
            if batch == "devices"
            else f"shard of the data axis '{data_axis}'"
        )
        said.append(
            f"data.batch_size {rows}: one sequence per {per} (--set data.batch_size=B for another)"
        )
    model_axes = [a for a, n in axes.items() if a != data_axis and n > 1]
    layouts = raw.setdefault("layouts", {})
    if batch == "data_axis" and not layouts.get("rules") and len(model_axes) == 1:
        from dtcli.models.transformer import tensor_parallel_rules

        gated = published.transformer.get("activation") == "swiglu"
        layouts["rules"] = tensor_parallel_rules(model_axes[0], gated)
        said.append(
            f"layouts.rules: Megatron tensor parallel on '{model_axes[0]}' (heads, the MLP's "
            "hidden units, the embeddings' features; --set layouts.rules for others)"
        )
    return raw, recipe_lib.from_mapping(raw), said


def _data_axis(raw: dict) -> str:
    layouts = raw.get("layouts") or {}
    return layouts.get("data_axis") or recipe_lib.LayoutConfig().data_axis


def device_count(raw: dict, key: str) -> int:
    """The devices to plan for, from --devices KIND:N or the mesh's sizes: the devices are
    never looked at (a plan for gpu:8 on a machine without one)."""
    spec = devices_lib.parse(str(raw.get("devices", "auto")), key)
    wanted = mesh_lib.device_count_for(dict(raw.get("mesh") or {"batch": -1}))
    if spec.count is None and wanted is None:
        raise UsageError(
            f"{'--devices' if key.startswith('--') else key}: a plan of a published model "
            "needs the device count: give --devices KIND:N (gpu:8) or a --mesh of sizes"
        )
    return spec.count or wanted


def planned_devices(raw: dict, key: str) -> devices_lib.Devices:
    """The devices as the plan names them, unconfigured: kind `auto` where none is given."""
    kind = devices_lib.parse(str(raw.get("devices", "auto")), key).kind
    return devices_lib.Devices(kind.upper(), device_count(raw, key))


def shapes(recipe: Recipe, published: Published) -> tuple[tuple[int, ...], int]:
    """The model's input window and vocabulary, as `data.describe` would give them: the
    context, and the config's vocabulary rounded up as dtcli rounds a tokenizer's."""
    from dtcli.data.tokenizer import model_vocab

    return (int(recipe.data.context or recipe.model.transformer.context),), model_vocab(
        published.vocab_size
    )


def _name(folder: Path) -> str:
    """A recipe name from the folder's (recipe names are letters, digits, '_', '.', '-')."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", folder.resolve().name) or "published"


def header_lines(folder_json: dict[str, Any] | None, assumed: Sequence[str]) -> list[str]:
    """What a published model's folder holds (`Published.to_json`) and what its plan assumed:
    the lines `dtcli plan HF_DIR` prints above its tables (none for a recipe: None)."""
    if folder_json is None:
        return []
    files = folder_json["safetensors"]
    held = (
        "no safetensors files (config.json alone)"
        if files is None
        else f"safetensors: {files['tensors']} tensors in {'/'.join(files['dtypes'])}, "
        f"{files['bytes']:,} B, every shape as config.json implies"
    )
    return [
        f"{folder_json['model_type']} from {folder_json['folder']}: "
        f"{folder_json['parameters']:,} parameters as config.json implies; {held}; trained "
        "here as float32 master weights (4 B each)",
        *(f"assumed: {line}" for line in assumed),
    ]
