"""The recipe: one typed, frozen tree loaded from YAML and validated before any TensorFlow work.

Every key has a type; unknown keys are errors that name the full key path and suggest the
closest known key. `--set a.b=value` overrides go through the same type checks as the file.
This module never imports TensorFlow.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union

import yaml

from dtcli import storage
from dtcli.errors import UsageError

UNSHARDED = "unsharded"
# Sources read through tf.data, never held whole in memory.
STREAMED_SOURCES = ("tfds", "tfrecord", "images")
# data.source text: byte-level tokens, one per byte.
BYTE_VOCAB = 256


@dataclass(frozen=True)
class DataConfig:
    """Where examples come from and how they are batched."""

    source: Literal["embedded", "tfds", "idx", "synthetic", "tfrecord", "images", "text"] = (
        "embedded"
    )
    # embedded: the data set's name ("digits"); tfds: the TFDS name ("mnist").
    name: str = "digits"
    # idx: a folder holding MNIST-format IDX files (train-* and/or t10k-*); tfrecord: a glob of
    # training files; images: a folder with one subfolder of images per class.
    path: str | None = None
    # text: a file, a folder (every file in it, sorted, concatenated) or a glob; null: the Python
    # standard library's own source files (a corpus every installation carries).
    # tfrecord: a glob of evaluation files; images: a folder of the same class subfolders;
    # text: files to evaluate on (default: the last data.eval_fraction of data.path's bytes).
    eval_path: str | None = None
    # text: the tokens the model sees per window (default: model.transformer.context); each
    # training window starts at any byte (stride 1), evaluation windows do not overlap.
    context: int | None = None
    eval_fraction: float = 0.1
    # tfrecord: the tf.train.Example features holding the image (bytes) and the class (int64);
    # the image is raw bytes of data.shape in data.dtype, or an encoded PNG/JPEG/GIF/BMP.
    image_key: str = "image"
    label_key: str = "label"
    encoding: Literal["raw", "encoded"] = "raw"
    dtype: Literal["uint8", "float32"] = "uint8"
    # Streamed sources (tfrecord, tfds): records held in the seeded shuffle buffer.
    shuffle_buffer: int = 10_000
    # tfds: split strings, TFDS slicing allowed ("train[:5000]").
    train_split: str = "train"
    eval_split: str = "test"
    data_dir: str | None = None
    download: bool = False
    # idx (and embedded): example index ranges [start, stop) when one file pair serves both.
    train_range: tuple[int, int] | None = None
    eval_range: tuple[int, int] | None = None
    # synthetic: the shape of one example, the class count, the example counts; tfrecord: the
    # shape and classes too; images: [height, width, channels] to decode and resize to.
    shape: tuple[int, ...] = (28, 28, 1)
    classes: int = 10
    count: int = 4096
    eval_count: int = 1024
    # The global batch (all devices together); it must divide by the data axis size.
    batch_size: int = 128
    eval_batch_size: int | None = None
    flatten: bool = True
    shuffle: bool = True
    # In-memory sources (embedded, idx, synthetic): "device" places the training split on the
    # devices once and each step gathers its batch there (no host copy per step); "host"
    # copies each block of batches from the host; "auto" places it when every local device's
    # copy together stays under 1 GiB.
    placement: Literal["auto", "device", "host"] = "auto"


@dataclass(frozen=True)
class LayoutConfig:
    """How tensors are laid out on the mesh."""

    # The mesh axis input batches are sharded along; replicated along the other axes.
    data_axis: str = "batch"
    # Ordered rules: regex over weight paths -> one entry per tensor dim (axis name or unsharded).
    rules: dict[str, list[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class TransformerConfig:
    """dtcli's decoder-only GPT (dtcli.transformer): its weight paths are documented there."""

    layers: int = 4
    d_model: int = 128
    heads: int = 4
    mlp_ratio: int = 4
    context: int = 64
    dropout: float = 0.0
    # The output head is the token embedding's transpose (no weights of its own).
    tie_embeddings: bool = True
    # Biases in the Dense layers and LayerNorms (nanoGPT's default: none).
    bias: bool = False


@dataclass(frozen=True)
class ModelConfig:
    """The model: a tf-keras layer list, build function or transformer, or a Core-API MLP."""

    api: Literal["keras", "core"] = "keras"
    # keras: a list of layers, each `ClassName` or `{ClassName: {arg: value}}`.
    layers: list[Any] | None = None
    # keras: "package.module:function" returning a tf_keras.Model, called with
    # (input_shape, num_classes, **args).
    build: str | None = None
    # The folder `build`'s module is imported from (default: the recipe file's folder, filled in
    # at load so that the resolved recipe in a run directory still finds it).
    build_path: str | None = None
    args: dict[str, Any] = field(default_factory=dict)
    # keras: dtcli's GPT for task language_model.
    transformer: TransformerConfig | None = None
    # core: hidden layer widths and activation; the output layer has one unit per class.
    hidden: list[int] = field(default_factory=lambda: [128])
    activation: Literal["relu", "tanh", "sigmoid", "gelu"] = "relu"


@dataclass(frozen=True)
class OptimizerConfig:
    name: Literal["sgd", "adam", "adamw"] = "adam"
    learning_rate: float = 1e-3
    momentum: float = 0.0
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    weight_decay: float = 0.004
    # adamw: weights whose path this regex finds (re.search) are not decayed, e.g. biases and
    # LayerNorm: '(bias|gamma|beta)$'.
    no_decay: str | None = None
    # The learning rate per step: constant, or cosine (linear warmup over warmup_steps, then a
    # cosine decay to min_learning_rate at decay_steps, default the run's last step).
    schedule: Literal["constant", "cosine"] = "constant"
    warmup_steps: int = 0
    decay_steps: int | None = None
    min_learning_rate: float = 0.0
    # Clip the gradients to this global norm (null: no clipping).
    clip_norm: float | None = None


# The default K of train.steps_per_call, chosen by measurement (bench/throughput.py: on 1 device
# K=16 reached 0.94x the limit loop, K=4 0.69x; on 8 virtual CPUs K=4, 8, 16 were within noise).
STEPS_PER_CALL = 16


@dataclass(frozen=True)
class TrainConfig:
    epochs: int = 1
    # Stop each epoch after this many steps (None: one pass over the training data).
    steps_per_epoch: int | None = None
    # Save a checkpoint every N epochs (0: only at the end) and keep the last K. A train.steps
    # run's epochs are its stretches of eval_every steps: every N evaluations.
    checkpoint_every: int = 1
    keep: int = 3
    # Write the per-step training loss to TensorBoard every N steps.
    log_every: int = 10
    # Training steps per compiled call: K batches go to the mesh as one block and the host reads
    # the step results back once per call. Progress, Ctrl-C and mid-epoch saves happen between
    # calls. A loss that is not finite stops the updates inside the call.
    steps_per_call: int = STEPS_PER_CALL
    # Train this many optimizer steps in all instead of whole epochs, evaluating and
    # checkpointing every eval_every steps (default: once, at the end). Each stretch of
    # eval_every steps reads the start of a new permutation of the training data.
    steps: int | None = None
    eval_every: int | None = None


@dataclass(frozen=True)
class Recipe:
    name: str = "run"
    seed: int = 0
    # classify: one class per example; language_model: the next token at every position.
    task: Literal["classify", "language_model"] = "classify"
    # cpu, cpu:N (N virtual CPUs), gpu, gpu:N, tpu, or auto.
    devices: str = "auto"
    # Ordered named mesh axes; one size may be -1 (the remaining devices).
    mesh: dict[str, int] = field(default_factory=lambda: {"batch": -1})
    layouts: LayoutConfig = field(default_factory=LayoutConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)


# --------------------------------------------------------------------------- type checking


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if tp is int:
        return "an integer"
    if tp is float:
        return "a number"
    if tp is str:
        return "a string"
    if tp is bool:
        return "true or false"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        return " or ".join(_describe(a) for a in inner) + " or null"
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {_describe(args[0]).removeprefix('an ').removeprefix('a ')}s"
        return f"a list of {len(args)} items"
    if origin is list:
        return "a list"
    if origin is dict or tp is dict:
        return "a mapping"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return str(tp)


def _fail(path: str, tp: Any, value: Any) -> UsageError:
    return UsageError(f"recipe key '{path}': expected {_describe(tp)}, got {value!r}")


class _NotFinite(UsageError):
    """A float key holding NaN or infinity (kept apart so `float | None` keeps the message)."""


def _finite(value: Any, path: str) -> float:
    try:
        number = float(value)
    except OverflowError:  # an integer too large for a float
        number = math.inf
    if not math.isfinite(number):
        raise _NotFinite(f"recipe key '{path}': expected a finite number, got {value!r}")
    return number


def _coerce(tp: Any, value: Any, path: str) -> Any:
    """Check `value` against the type `tp` and return it in canonical form."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1 and dataclasses.is_dataclass(inner[0]):
            return _build(inner[0], value, path)  # its own errors name the key inside it
        if len(inner) == 1:
            try:
                return _coerce(inner[0], value, path)
            except _NotFinite:
                raise
            except UsageError:
                raise _fail(path, tp, value) from None
        raise _fail(path, tp, value)
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise _fail(path, tp, value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _fail(path, tp, value)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _fail(path, tp, value)
    if tp is float:
        # YAML 1.1 reads `1e-3` (no dot) as a string: accept anything float() parses.
        # NaN and infinity (YAML's .nan/.inf, or strings float() reads) are refused.
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return _finite(value, path)
        if isinstance(value, str):
            try:
                float(value)
            except ValueError:
                pass
            else:
                return _finite(value, path)
        raise _fail(path, tp, value)
    if tp is str:
        if isinstance(value, str):
            return value
        raise _fail(path, tp, value)
    if origin is tuple:
        args = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise _fail(path, tp, value)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise _fail(path, tp, value)
        return tuple(_coerce(a, v, f"{path}[{i}]") for i, (a, v) in enumerate(zip(args, value)))
    if origin is list:
        (item,) = typing.get_args(tp)
        if not isinstance(value, (list, tuple)):
            raise _fail(path, tp, value)
        return [_coerce(item, v, f"{path}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise _fail(path, tp, value)
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise UsageError(f"recipe key '{path}': keys must be strings, got {k!r}")
            out[k] = _coerce(val_tp, v, f"{path}.{k}")
        return out
    raise TypeError(f"unsupported recipe type {tp!r} at {path}")  # a bug in this module


def _build(cls: type, raw: Any, path: str) -> Any:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UsageError(f"recipe key '{path or '<top>'}': expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    for key in raw:
        if key not in names:
            full = f"{path}.{key}" if path else str(key)
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(f"unknown recipe key '{full}'{hint}")
    kwargs = {}
    for name in names:
        if name in raw:
            kwargs[name] = _coerce(hints[name], raw[name], f"{path}.{name}" if path else name)
    return cls(**kwargs)


# --------------------------------------------------------------------------- semantics


def _check(recipe: Recipe) -> Recipe:
    """Checks that need more than one key's type; no devices or TensorFlow needed."""
    from dtcli.devices import parse as parse_devices

    parse_devices(recipe.devices)
    if not 0 <= recipe.seed <= 2**32 - 1:
        raise UsageError(
            f"recipe key 'seed': expected an integer in [0, 2**32 - 1], got {recipe.seed}"
        )
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", recipe.name):
        raise UsageError(
            f"recipe key 'name': expected letters, digits, '_', '.', '-', got {recipe.name!r}"
        )
    if not recipe.mesh:
        raise UsageError("recipe key 'mesh': expected at least one axis, like {batch: 8}")
    fill = [a for a, s in recipe.mesh.items() if s == -1]
    if len(fill) > 1:
        raise UsageError(f"recipe key 'mesh': at most one axis may be -1, got {fill}")
    for axis, size in recipe.mesh.items():
        if size == 0 or size < -1:
            raise UsageError(
                f"recipe key 'mesh.{axis}': expected a positive size or -1, got {size}"
            )
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", axis) or axis == UNSHARDED:
            raise UsageError(f"recipe key 'mesh.{axis}': not a usable axis name")
    lay = recipe.layouts
    if lay.data_axis not in recipe.mesh and lay.data_axis != UNSHARDED:
        raise UsageError(
            f"recipe key 'layouts.data_axis': axis '{lay.data_axis}' is not in the mesh "
            f"{_mesh_text(recipe.mesh)} (use a mesh axis or 'unsharded')"
        )
    for pattern, dims in lay.rules.items():
        key = f"layouts.rules.{pattern}"
        try:
            re.compile(pattern)
        except re.error as exc:
            raise UsageError(f"recipe key '{key}': not a valid regex ({exc})") from None
        for dim in dims:
            if dim != UNSHARDED and dim not in recipe.mesh:
                raise UsageError(
                    f"recipe key '{key}': axis '{dim}' is not in the mesh "
                    f"{_mesh_text(recipe.mesh)} (expected a mesh axis or 'unsharded')"
                )
        used = [d for d in dims if d != UNSHARDED]
        if len(used) != len(set(used)):
            raise UsageError(f"recipe key '{key}': a mesh axis may shard only one dim, got {dims}")
    _check_devices_mesh(recipe)
    _check_model(recipe.model)
    _check_task(recipe)
    _check_data(recipe.data)
    _check_batch_on_mesh(recipe)
    _check_train(recipe.train)
    _check_optimizer(recipe.optimizer)
    o, t = recipe.optimizer, recipe.train
    if o.warmup_steps and o.decay_steps is None and t.steps and o.warmup_steps >= t.steps:
        raise UsageError(
            f"recipe key 'optimizer.warmup_steps': {o.warmup_steps} is not below train.steps "
            f"{t.steps} (the rate would never leave its warmup); use fewer warmup steps"
        )
    return recipe


def _check_devices_mesh(recipe: Recipe) -> None:
    """A mesh with a `cpu` device spec without count asks for that many virtual CPUs."""
    from dtcli.devices import MAX_VIRTUAL_CPUS
    from dtcli.devices import parse as parse_devices

    spec = parse_devices(recipe.devices)
    if spec.kind not in ("cpu", "auto") or spec.count is not None:
        return
    if any(s == -1 for s in recipe.mesh.values()):
        return
    total = math.prod(recipe.mesh.values())
    if total > MAX_VIRTUAL_CPUS:
        on = "" if spec.kind == "cpu" else " on a machine without GPUs"
        raise UsageError(
            f"recipe key 'mesh': {_mesh_text(recipe.mesh)} asks for {total} devices, and devices "
            f"{recipe.devices!r} makes them virtual CPUs{on}; at most {MAX_VIRTUAL_CPUS} "
            "(MAX_VIRTUAL_CPUS: more exhaust memory or hang TensorFlow's start-up)"
        )


def _check_batch_on_mesh(recipe: Recipe) -> None:
    """The batches divide by the data axis, checked here wherever its size is known without the
    devices (a fixed size, or -1 with a device count), so that `config` and every command refuse
    it before TensorFlow starts; the session checks it again once the devices are known."""
    from dtcli.devices import parse as parse_devices
    from dtcli.mesh import check_batch

    axis = recipe.layouts.data_axis
    if axis == UNSHARDED:
        return
    axes = dict(recipe.mesh)
    if axes[axis] == -1:
        count = parse_devices(recipe.devices).count
        known = math.prod(s for s in axes.values() if s != -1)
        if count is None or count % known:
            return  # the device count is checked against the mesh once the devices are known
        axes[axis] = count // known
    for key in ("batch_size", "eval_batch_size"):
        batch = getattr(recipe.data, key)
        if batch:
            check_batch(axes, axis, batch, f"data.{key}")


def _check_model(m: ModelConfig) -> None:
    if m.api == "keras":
        given = [k for k in ("layers", "build", "transformer") if getattr(m, k) is not None]
        if len(given) != 1:
            raise UsageError(
                "recipe key 'model': api keras needs exactly one of 'layers', 'build' or "
                f"'transformer', got {given or 'none'}"
            )
        if m.transformer is not None:
            _check_transformer(m.transformer)
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


def _check_transformer(t: TransformerConfig) -> None:
    for key in ("layers", "d_model", "heads", "mlp_ratio", "context"):
        if getattr(t, key) < 1:
            raise UsageError(
                f"recipe key 'model.transformer.{key}': expected an integer >= 1, "
                f"got {getattr(t, key)}"
            )
    if t.d_model % t.heads:
        raise UsageError(
            f"recipe key 'model.transformer.heads': d_model {t.d_model} does not divide into "
            f"{t.heads} heads (expected a divisor of d_model)"
        )
    if not 0 <= t.dropout < 1:
        raise UsageError(
            f"recipe key 'model.transformer.dropout': expected a number in [0, 1), got {t.dropout}"
        )


def _check_task(recipe: Recipe) -> None:
    """A language model needs token windows and a model that predicts every position."""
    d, m = recipe.data, recipe.model
    if recipe.task == "language_model":
        if d.source != "text":
            raise UsageError(
                f"recipe key 'data.source': task language_model reads text, got {d.source!r} "
                "(set data.source: text)"
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
        if t is not None and d.context > t.context:
            raise UsageError(
                f"recipe key 'data.context': windows of {d.context} tokens are longer than "
                f"model.transformer.context {t.context}"
            )
        return
    if d.source == "text":
        raise UsageError(
            "recipe key 'task': data.source text trains a language model; set task: language_model"
        )
    if m.transformer is not None:
        raise UsageError(
            "recipe key 'task': model.transformer is a language model; set task: language_model"
        )


def tfds_installed() -> bool:
    """Whether tensorflow-datasets can be imported (an optional extra), without importing it."""
    import importlib.util

    return importlib.util.find_spec("tensorflow_datasets") is not None


def _physical_memory() -> int | None:
    """Bytes of physical memory, or None where the platform does not say."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


# The embedded digits (the UCI 8x8 digits shipped in dtcli/assets, see data._embedded): the first
# 4/5 train unless ranges are given.
EMBEDDED_DIGITS = 1797


def _known_train_count(d: DataConfig) -> int | None:
    """The training examples the recipe gives, when known without reading any file."""
    if d.source == "synthetic":
        return d.count
    if d.train_range is not None and d.source in ("embedded", "idx"):
        return d.train_range[1] - d.train_range[0]
    if d.source == "embedded":
        return EMBEDDED_DIGITS * 4 // 5 if d.eval_range is None else EMBEDDED_DIGITS // 2
    return None  # IDX files without a range, TFDS splits: see data.check_batch_fits


def _check_data(d: DataConfig) -> None:
    for key in ("batch_size", "count", "eval_count"):
        value = getattr(d, key)
        if value <= 0:
            raise UsageError(f"recipe key 'data.{key}': expected a positive integer, got {value}")
    if d.eval_batch_size is not None and d.eval_batch_size <= 0:
        raise UsageError(
            f"recipe key 'data.eval_batch_size': expected a positive integer or null, "
            f"got {d.eval_batch_size}"
        )
    if d.classes < 2:
        raise UsageError(f"recipe key 'data.classes': expected an integer >= 2, got {d.classes}")
    if not d.shape or not all(n > 0 for n in d.shape):
        raise UsageError(
            f"recipe key 'data.shape': expected at least one dim, each a positive integer, "
            f"got {list(d.shape)}"
        )
    if d.source == "idx" and not d.path:
        raise UsageError("recipe key 'data.path': source idx needs the folder of IDX files")
    if d.source in ("tfrecord", "images"):
        what = "a glob of TFRecord files" if d.source == "tfrecord" else "a folder of class folders"
        for key in ("path", "eval_path"):
            if not getattr(d, key):
                raise UsageError(f"recipe key 'data.{key}': source {d.source} needs {what}")
    if d.context is not None and d.context < 1:
        raise UsageError(f"recipe key 'data.context': expected an integer >= 1, got {d.context}")
    tfds_key = (
        "data.source"
        if d.source == "tfds"
        else "data.name"
        if d.source == "text" and d.path is None and d.name != "digits"
        else None
    )
    if tfds_key is not None and not tfds_installed():
        raise UsageError(
            f"recipe key '{tfds_key}': TFDS data sets need the tfds extra, which is not "
            "installed: pip install 'dtensor-cli[tfds]'"
        )
    if not 0 < d.eval_fraction < 1:
        raise UsageError(
            f"recipe key 'data.eval_fraction': expected a number in (0, 1), got {d.eval_fraction}"
        )
    if d.placement == "device" and d.source == "text":
        raise UsageError(
            "recipe key 'data.placement': source text gathers its windows on the host (a few "
            "bytes a step); use auto or host"
        )
    if d.placement == "device" and d.source in STREAMED_SOURCES:
        raise UsageError(
            f"recipe key 'data.placement': device needs an in-memory source (embedded, idx, "
            f"synthetic); source {d.source} is streamed, never held whole (use auto or host)"
        )
    if d.shuffle_buffer <= 0:
        raise UsageError(
            f"recipe key 'data.shuffle_buffer': expected a positive integer, got {d.shuffle_buffer}"
        )
    for key in ("train_range", "eval_range"):
        rng = getattr(d, key)
        if rng is not None and not 0 <= rng[0] < rng[1]:
            raise UsageError(
                f"recipe key 'data.{key}': expected [start, stop) with 0 <= start < stop, "
                f"got {list(rng)}"
            )
    known = _known_train_count(d)
    if known is not None and d.batch_size > known:
        raise UsageError(
            f"recipe key 'data.batch_size': {d.batch_size} is more than the {known} training "
            f"examples of data.source {d.source}; use a batch of at most {known}"
        )
    memory = _physical_memory()
    if not memory:
        return
    half = memory // 2
    if d.source == "synthetic":
        example = math.prod(d.shape)
        total = (d.count + d.eval_count) * example * 4
        if total > half:
            key = "data.eval_count" if d.eval_count > d.count else "data.count"
            raise UsageError(
                f"recipe key '{key}': synthetic data of {d.count} train + {d.eval_count} eval "
                f"examples (data.count, data.eval_count) of shape {list(d.shape)} (data.shape) "
                f"needs {_gib(total)} of host memory, more than half of this machine's "
                f"{_gib(memory)}"
            )
        weights = example * d.classes * 4  # the linear map that makes the labels
        if weights > half:
            raise UsageError(
                f"recipe key 'data.classes': {d.classes} classes of examples of shape "
                f"{list(d.shape)} need {_gib(weights)} of host memory to label, more than half "
                f"of this machine's {_gib(memory)}"
            )
    elif d.source in ("tfrecord", "images"):
        example = math.prod(d.shape)
    elif d.source == "text":
        example = d.context or 1
    else:
        example = 64 if d.source == "embedded" else 28 * 28
    for key in ("batch_size", "eval_batch_size"):
        size = getattr(d, key)
        if size is not None and size * example * 4 > half:
            raise UsageError(
                f"recipe key 'data.{key}': a batch of {size} examples of {example} values needs "
                f"{_gib(size * example * 4)} of host memory, more than half of this machine's "
                f"{_gib(memory)}"
            )


def _check_train(t: TrainConfig) -> None:
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
    for key, low in (("checkpoint_every", 0), ("keep", 1), ("log_every", 1)):
        value = getattr(t, key)
        if value < low:
            raise UsageError(f"recipe key 'train.{key}': expected an integer >= {low}, got {value}")


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


def _mesh_text(mesh: dict[str, int]) -> str:
    return ",".join(f"{a}={s}" for a, s in mesh.items())


# --------------------------------------------------------------------------- loading


def parse_mesh_arg(text: str) -> dict[str, int]:
    """`batch=4,model=2` -> {"batch": 4, "model": 2} (the --mesh argument)."""
    mesh: dict[str, int] = {}
    for part in text.split(","):
        name, sep, size = part.strip().partition("=")
        name = name.strip()
        if not sep or not name:
            raise UsageError(
                f"--mesh {text!r}: expected AXIS=SIZE[,AXIS=SIZE...], like batch=4,model=2"
            )
        if name in mesh:
            raise UsageError(f"--mesh {text!r}: axis '{name}' appears twice")
        if not size.strip():
            raise UsageError(
                f"--mesh {text!r}: axis '{name}' has no size (expected {name}=SIZE, "
                "a positive integer or -1)"
            )
        try:
            value = int(size)
        except ValueError:
            raise UsageError(f"--mesh {text!r}: size of axis '{name}' must be an integer") from None
        if value == 0 or value < -1:
            raise UsageError(
                f"--mesh {text!r}: size of axis '{name}' must be a positive integer or -1, "
                f"got {value}"
            )
        mesh[name] = value
    return mesh


def _with_layout_axes(axes: dict[str, int], layouts: Any) -> dict[str, int]:
    """A --mesh that leaves out axes the layout rules name gets them with size 1.

    So `--mesh batch=8` runs a tensor-parallel recipe data-parallel (its `model` rules shard
    nothing), and a checkpoint evaluates on any mesh. In the recipe file itself, an axis the
    mesh lacks is still an error (most likely a typo).
    """
    named: list[str] = []
    if isinstance(layouts, dict):
        data_axis = layouts.get("data_axis", "batch")
        named.append(data_axis if isinstance(data_axis, str) else "")
        rules = layouts.get("rules") or {}
        if isinstance(rules, dict):
            for dims in rules.values():
                if isinstance(dims, list):
                    named += [d for d in dims if isinstance(d, str)]
    else:
        named.append("batch")
    out = dict(axes)
    used = [a for a in named if a and a != UNSHARDED]
    for axis in axes:
        close = difflib.get_close_matches(axis, [a for a in used if a not in axes], n=1)
        if axis not in used and close:
            raise UsageError(
                f"--mesh: axis '{axis}' is named by no layout rule nor layouts.data_axis "
                f"(did you mean '{close[0]}'?)"
            )
    for axis in used:
        if axis not in out:
            out[axis] = 1
    return out


class _DuplicateKey(Exception):
    """A mapping in the YAML text names one key twice (PyYAML would keep the last silently)."""

    def __init__(self, path: str, first: int, second: int):
        super().__init__(path)
        self.path, self.first, self.second = path, first, second


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing a key that appears twice in one mapping."""

    def construct_document(self, node: yaml.Node) -> Any:
        _check_unique_keys(node, "", set())
        return super().construct_document(node)


def _check_unique_keys(node: yaml.Node, path: str, seen: set[int]) -> None:
    if id(node) in seen:  # an alias to a node already walked (or a recursive structure)
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                name = f"{path}.{key.value}" if path else str(key.value)
                line = key.start_mark.line + 1
                if (key.tag, key.value) in first:
                    raise _DuplicateKey(name, first[(key.tag, key.value)], line)
                first[(key.tag, key.value)] = line
                _check_unique_keys(value, name, seen)
            else:
                _check_unique_keys(value, path, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_unique_keys(item, f"{path}[{i}]", seen)


def _load_yaml(text: str) -> Any:
    """Parse YAML like yaml.safe_load, raising _DuplicateKey for a key given twice."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: plain data only


def apply_set(raw: dict, assignment: str) -> None:
    """Apply one `--set key.path=value` to the raw recipe mapping (value parsed as YAML)."""
    key, sep, text = assignment.partition("=")
    parts = key.strip().split(".")
    if not sep or not key.strip() or any(not p for p in parts):
        raise UsageError(
            f"--set {assignment!r}: expected KEY.PATH=VALUE, like optimizer.learning_rate=3e-4"
        )
    try:
        value = _load_yaml(text) if text.strip() else None
    except _DuplicateKey as dup:
        inner = dup.path if dup.path.startswith("[") else f".{dup.path}"
        raise UsageError(
            f"--set {assignment!r}: key '{key.strip()}{inner}' appears twice"
        ) from None
    except (yaml.YAMLError, ValueError, OverflowError):
        raise UsageError(f"--set {assignment!r}: the value is not valid YAML") from None
    node = raw
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise UsageError(f"--set {assignment!r}: '{'.'.join(parts[: i + 1])}' is not a mapping")
        node = child
    node[parts[-1]] = value


def from_mapping(raw: dict | None) -> Recipe:
    """Validate a raw mapping into a Recipe (raises UsageError naming the key at fault)."""
    return _check(_resolve(_build(Recipe, raw, "")))


def _resolve(recipe: Recipe) -> Recipe:
    """Fill in values other keys imply (the resolved recipe in a run directory records them)."""
    d, t, m = recipe.data, recipe.train, recipe.model
    if d.source == "text" and d.context is None and m.transformer is not None:
        d = dataclasses.replace(d, context=m.transformer.context)
    if t.steps is not None and t.steps >= 1:
        # train.steps replaces epochs: the run is stretches of eval_every steps, each a
        # (possibly partial) epoch of its own permutation.
        every = min(t.eval_every or t.steps, t.steps)
        if every >= 1:
            t = dataclasses.replace(
                t, eval_every=every, epochs=-(-t.steps // every), steps_per_epoch=every
            )
    return dataclasses.replace(recipe, data=d, train=t)


def _read_file(p: Any) -> dict:
    """One recipe file as a raw mapping, exactly as written (no base, no ${VAR} yet)."""
    if p.is_dir():
        raise UsageError(f"recipe {str(p)!r}: is a folder, expected a recipe file")
    if not p.is_file():
        raise UsageError(f"recipe {str(p)!r}: no such file")
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"recipe {str(p)!r}: cannot read it ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise UsageError(f"recipe {str(p)!r}: cannot read it (not UTF-8 text)") from None
    try:
        raw = _load_yaml(text)
    except _DuplicateKey as dup:
        raise UsageError(
            f"recipe {str(p)!r}: key '{dup.path}' appears twice (lines {dup.first} and "
            f"{dup.second})"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(f"recipe {str(p)!r}: not valid YAML{where}") from None
    except (ValueError, OverflowError) as exc:  # a scalar YAML resolves but cannot build
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"recipe {str(p)!r}: not valid YAML ({first})") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise UsageError(f"recipe {str(p)!r}: expected a mapping at the top level")
    return raw


# ${NAME} or ${NAME:-default}; $${ writes a literal ${.
_ENV_REF = re.compile(r"\$\$\{|\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}|\$\{[^}]*\}?")


def _interpolate(
    value: Any,
    path: str,
    where: str,
    environ: typing.Mapping[str, str],
    inside: frozenset[int] = frozenset(),
) -> Any:
    """Replace ${NAME} / ${NAME:-default} in the string values of a raw recipe. A value that is
    one reference and nothing else is read as a YAML scalar (`batch_size: ${BATCH}` gives an
    integer)."""
    if isinstance(value, (dict, list)):
        if id(value) in inside:
            raise UsageError(
                f"recipe {where}: key '{path or '<top>'}': a YAML alias refers to a mapping or "
                "list that contains it (the value would never end)"
            )
        inside = inside | {id(value)}
    if isinstance(value, dict):
        return {
            k: _interpolate(v, f"{path}.{k}" if path else str(k), where, environ, inside)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            _interpolate(v, f"{path}[{i}]", where, environ, inside) for i, v in enumerate(value)
        ]
    if not isinstance(value, str) or "${" not in value:
        return value

    def substitute(match: re.Match) -> str:
        if match.group(0) == "$${":
            return "${"
        name, default = match.group(1), match.group(2)
        if default is not None and "${" in default:
            raise UsageError(
                f"recipe {where}: key '{path}': a default holding another reference "
                f"({match.group(0)}...) is not supported; give a plain default"
            )
        if name is None:
            raise UsageError(
                f"recipe {where}: key '{path}': {match.group(0)!r} is not a variable reference; "
                "expected ${NAME} or ${NAME:-default} (write $${ for a literal ${)"
            )
        if name in environ:
            return environ[name]
        if default is not None:
            return default
        raise UsageError(
            f"recipe {where}: key '{path}': environment variable {name} is not set "
            f"(set it, or give a default: ${{{name}:-VALUE}})"
        )

    text = _ENV_REF.sub(substitute, value)
    whole = _ENV_REF.fullmatch(value)
    if whole is not None and whole.group(1) is not None:
        try:
            if not text.strip():
                return text  # an empty value stays an empty string, not null
            parsed = _load_yaml(text)
        except (yaml.YAMLError, _DuplicateKey, ValueError, OverflowError):
            return text
        # Only scalars: a variable holding "{a: 1}" stays a string, not a new subtree.
        return parsed if not isinstance(parsed, (dict, list)) else text
    return text


# Mappings whose order means something (axis order, first matching rule) are replaced whole.
_REPLACED_WHOLE = {"mesh", "layouts.rules"}


def _merge(base: dict, child: dict, path: str = "") -> dict:
    """The child's keys over the base's: mappings merge key by key (except the ordered ones),
    anything else is replaced."""
    out = dict(base)
    for key, value in child.items():
        name = f"{path}.{key}" if path else str(key)
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            if name not in _REPLACED_WHOLE:
                value = _merge(out[key], value, name)
        out[key] = value
    return out


def read_raw(
    path: str | Path,
    environ: typing.Mapping[str, str] | None = None,
    _chain: tuple[Path, ...] = (),
) -> dict:
    """Read a recipe file as a raw mapping (no validation yet): its `base:` files merged under
    it (a base path is relative to the file naming it), then ${NAME} references filled from
    the environment."""
    env = os.environ if environ is None else environ
    p = storage.as_path(path)
    raw = _read_file(p)
    where = repr(str(p))
    raw = _interpolate(raw, "", where, env)
    model = raw.get("model")
    if isinstance(model, dict) and model.get("build") and "build_path" not in model:
        # model.build names a module next to the file that names it (a base's own folder).
        model["build_path"] = str(p.resolve().parent)
    if "base" not in raw:
        return raw
    base = raw.pop("base")
    if not isinstance(base, str) or not base.strip():
        raise UsageError(
            f"recipe {where}: key 'base': expected the path of another recipe file, got {base!r}"
        )
    base_path = storage.as_path(base)
    if not base_path.is_absolute():
        base_path = p.parent / base
    here = p.resolve()
    chain = (*_chain, here)
    if base_path.resolve() in chain:
        names = " -> ".join(str(c.name) for c in (*chain, base_path.resolve()))
        raise UsageError(f"recipe {where}: key 'base': the base chain loops ({names})")
    if not base_path.is_file():
        what = "is a folder, not a recipe file:" if base_path.is_dir() else "no such file"
        raise UsageError(f"recipe {where}: key 'base': {what} {str(base_path)!r}")
    return _merge(read_raw(base_path, env, chain), raw)


def load(
    path: str | Path | dict,
    sets: list[str] | tuple[str, ...] = (),
    mesh: str | None = None,
    devices: str | None = None,
    epochs: int | None = None,
) -> Recipe:
    """Load a recipe (a file, or a raw mapping), apply command-line overrides, validate it all."""
    raw = copy.deepcopy(path) if isinstance(path, dict) else read_raw(path)
    for assignment in sets:
        apply_set(raw, assignment)
    model = raw.get("model")
    if not isinstance(path, dict) and isinstance(model, dict) and model.get("build"):
        # A --set model.build=... names a module next to the recipe given.
        model.setdefault("build_path", str(storage.as_path(path).resolve().parent))
    if mesh is not None:
        raw["mesh"] = _with_layout_axes(parse_mesh_arg(mesh), raw.get("layouts"))
        if devices is None and isinstance(raw.get("devices"), str):
            # A new mesh without --devices: the device count follows the mesh ("cpu:8" -> "cpu").
            raw["devices"] = raw["devices"].split(":")[0]
    if devices is not None:
        from dtcli.devices import parse as parse_devices

        parse_devices(devices, "--devices")
        raw["devices"] = devices
    if epochs is not None:
        raw.setdefault("train", {})
        if not isinstance(raw["train"], dict):
            raise UsageError("recipe key 'train': expected a mapping")
        if raw["train"].get("steps") is not None:
            raise UsageError(
                "--epochs: this recipe counts train.steps (the total); use --set train.steps=N"
            )
        raw["train"]["epochs"] = epochs
    return from_mapping(raw)


def to_mapping(recipe: Recipe) -> dict:
    """The recipe as plain YAML-ready data (tuples become lists)."""
    return _plain(dataclasses.asdict(recipe))


def dump(recipe: Recipe) -> str:
    """The recipe as YAML that loads back to the same recipe (a literal ${ is written $${)."""

    def escape(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: escape(v) for k, v in value.items()}
        if isinstance(value, list):
            return [escape(v) for v in value]
        return value.replace("${", "$${") if isinstance(value, str) else value

    return yaml.safe_dump(escape(to_mapping(recipe)), sort_keys=False)


def _type_schema(tp: Any) -> dict[str, Any]:
    origin = typing.get_origin(tp)
    if tp is Any:
        return {}
    if tp is bool:
        return {"type": "boolean"}
    if tp is int:
        return {"type": "integer"}
    if tp is float:
        # YAML 1.1 reads 1e-3 as a string; the loader accepts any string float() parses.
        return {"anyOf": [{"type": "number"}, {"type": "string", "pattern": _FLOAT_PATTERN}]}
    if tp is str:
        return {"type": "string"}
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin in (Union, types.UnionType):
        inner = [a for a in typing.get_args(tp) if a is not type(None)]
        options = [_type_schema(a) for a in inner] + [{"type": "null"}]
        return {"anyOf": options}
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _type_schema(args[0])}
        return {
            "type": "array",
            "prefixItems": [_type_schema(a) for a in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if origin is list:
        return {"type": "array", "items": _type_schema(typing.get_args(tp)[0])}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type_schema(typing.get_args(tp)[1])}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        instance = tp()
        properties = {}
        for f in dataclasses.fields(tp):
            prop = _type_schema(hints[f.name])
            default = getattr(instance, f.name)
            if not dataclasses.is_dataclass(default):
                prop["default"] = _plain(default)
            properties[f.name] = prop
        return {"type": "object", "properties": properties, "additionalProperties": False}
    raise TypeError(f"unsupported recipe type {tp!r}")  # a bug in this module


_FLOAT_PATTERN = r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$"


def _plain(value: Any) -> Any:
    """Mappings and sequences as dicts and lists, all the way down."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def schema() -> dict[str, Any]:
    """The recipe's JSON schema (draft 2020-12), for editors and for checking recipes elsewhere.
    The loader checks more than types (mesh arithmetic, ranges); `dtcli config` runs all of it."""
    out = _type_schema(Recipe)
    out["properties"]["base"] = {
        "type": "string",
        "description": "Another recipe file this one extends (relative to this file); "
        "mappings merge key by key, other values are replaced.",
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "dtcli recipe",
        **out,
    }


def fingerprint(recipe: Recipe) -> str:
    """A hash of the validated recipe (after overrides): clients of one run must agree on it."""
    import hashlib

    return hashlib.sha256(dump(recipe).encode()).hexdigest()


def replace(recipe: Recipe, **changes: Any) -> Recipe:
    """A copy of the recipe with top-level fields changed, re-validated."""
    return _check(dataclasses.replace(recipe, **changes))
