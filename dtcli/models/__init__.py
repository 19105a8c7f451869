"""Models: tf-keras (layer list or build function) and Core-API MLPs, built on a mesh.

Both kinds are built in two phases so that the result does not depend on the mesh:
1. `describe_*` lists every weight (path, shape, owning layer) without devices. For Keras this
   builds the model once with plain variables on the host, seeded; those values become the initial
   weights. For the Core MLP the shapes are arithmetic.
2. `build_*` creates DVariables with the planned layouts and assigns the host/replicated initial
   values, relaid out onto each weight's layout. DTensor's sharded random ops give different
   numbers on different mesh shapes; this way every mesh starts from the same weights.
"""

from __future__ import annotations

import importlib
import re
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from dtcli.errors import UsageError
from dtcli.layout import UNSHARDED, WeightInfo, WeightPlan, plan_weights, replicated, to_layout
from dtcli.recipe import ModelConfig, Recipe

# Attribute paths tf-keras' LayoutMap skips when mapping variables (src/dtensor/layout_map.py).
_SKIP_ATTRS = (
    "_self_tracked_trackables",
    "_trainable_weights",
    "_non_trainable_weights",
    "_captured_weight_regularizer",
)

_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?")


@dataclass
class Built:
    """A model on the mesh, seen the same way whatever its API."""

    module: Any  # the tf_keras.Model or tf.Module, tracked by checkpoints
    forward: Any  # (x, training) -> logits
    regularization: Any  # () -> scalar tensor, or None when the model has none
    trainable_variables: list
    weights: list[WeightInfo]
    variables: dict[str, Any]  # every weight by its path (the keys the layout rules match)
    # A user's own model (`model.build`) may branch on tensors in Python, which only AutoGraph
    # turns into graph ops; dtcli's own layers never do.
    needs_autograph: bool = False


_KERAS_CALL = re.compile(r"Exception encountered when calling layer ['\"]([^'\"]*)['\"]")


def _message_line(exc: BaseException) -> str:
    """The first line of an exception's message (the type's name when it has none).

    Keras wraps errors raised in a layer's call as "Exception encountered when calling layer 'x'
    ...", the cause on a later line: that line is kept, with the layer's name."""
    text = str(exc)
    if isinstance(exc, KeyError) and exc.args and isinstance(exc.args[0], str):
        text = exc.args[0]  # str(KeyError) is the repr of its message
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    where = ""
    wrapped = _KERAS_CALL.match(lines[0]) if lines else None
    if wrapped and len(lines) > 1:
        where = f" (in layer '{wrapped.group(1)}')"
        lines = lines[1:]
    return f"{lines[0]}{where}" if lines else type(exc).__name__


def _a(noun: str) -> str:
    """'a dict', 'an int'."""
    return f"{'an' if noun[:1].lower() in 'aeiou' else 'a'} {noun}"


def _first_line(exc: BaseException) -> str:
    """`TypeName: first line of the message`, for one-line errors."""
    return f"{type(exc).__name__}: {_message_line(exc)}"


# --------------------------------------------------------------------------- keras


def _numbers(value: Any) -> Any:
    """YAML 1.1 reads 1e-5 as a string; layer arguments that look like numbers become floats."""
    if isinstance(value, str) and _FLOAT.fullmatch(value):
        return float(value)
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


def _keras_layers(cfg: ModelConfig) -> list:
    import tf_keras
    from tf_keras.src.utils.generic_utils import to_snake_case

    layers, counts = [], {}
    for i, entry in enumerate(cfg.layers or []):
        key = f"model.layers[{i}]"
        if isinstance(entry, str):
            name, args = entry, {}
        elif isinstance(entry, dict) and len(entry) == 1:
            name, args = next(iter(entry.items()))
            args = args or {}
        else:
            raise UsageError(
                f"recipe key '{key}': expected a layer name or {{LayerName: {{args}}}}"
            )
        if not isinstance(args, dict):
            raise UsageError(f"recipe key '{key}.{name}': expected a mapping of layer arguments")
        cls = getattr(tf_keras.layers, str(name), None)
        if not (isinstance(cls, type) and issubclass(cls, tf_keras.layers.Layer)):
            import difflib

            known = [n for n in dir(tf_keras.layers) if n[:1].isupper()]
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            raise UsageError(f"recipe key '{key}': unknown tf-keras layer {name!r}{hint}")
        args = _numbers(dict(args))
        # Names must not depend on how many layers this process made before (Keras' counters):
        # they are the keys the layout rules match.
        base = to_snake_case(name)
        args.setdefault("name", f"{base}_{counts.get(base, 0)}")
        counts[base] = counts.get(base, 0) + 1
        try:
            layers.append(cls(**args))
        except (TypeError, ValueError) as exc:
            raise UsageError(f"recipe key '{key}.{name}': {_message_line(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - a layer's constructor may raise anything
            raise UsageError(f"recipe key '{key}.{name}': {_first_line(exc)}") from None
    return layers


def _keras_model(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> Any:
    import tf_keras

    tf_keras.backend.reset_uids()
    # Dropout and other random layers need tf.random.Generator under DTensor.
    tf_keras.backend.experimental.enable_tf_random_generator()
    if cfg.build is not None:
        module_name, fn_name = cfg.build.split(":")
        for folder in (cfg.build_path, "."):
            if folder and folder not in sys.path:
                sys.path.insert(0, folder)  # user code beside the recipe, or in the cwd
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            raise UsageError(
                f"recipe key 'model.build': cannot load {cfg.build!r} ({_message_line(exc)})"
            ) from None
        except Exception as exc:  # noqa: BLE001 - user code may raise anything at import
            raise UsageError(
                f"recipe key 'model.build': cannot load {cfg.build!r} (importing {module_name} "
                f"raised {_first_line(exc)})"
            ) from None
        try:
            fn = getattr(module, fn_name)
        except AttributeError as exc:
            raise UsageError(
                f"recipe key 'model.build': cannot load {cfg.build!r} ({_message_line(exc)})"
            ) from None
        if not callable(fn):
            raise UsageError(
                f"recipe key 'model.build': {cfg.build} is {_a(type(fn).__name__)}, "
                "expected a function"
            )
        model = _call_build(fn, cfg, input_shape, num_classes)
        if not isinstance(model, tf_keras.Model):
            # Keras 3 (`import keras`) has no DTensor support on TensorFlow.
            keras3 = type(model).__module__.split(".")[0] == "keras"
            hint = " (a Keras 3 model: build it with tf_keras, or tf.keras)" if keras3 else ""
            raise UsageError(
                f"recipe key 'model.build': {cfg.build} returned {type(model).__name__}, "
                f"expected a tf_keras.Model{hint}"
            )
        return model
    if cfg.transformer is not None:
        from dtcli import transformer

        return transformer.build(cfg.transformer, num_classes)
    layers = _keras_layers(cfg)
    try:
        return tf_keras.Sequential(
            [tf_keras.Input(shape=input_shape, name="inputs"), *layers], name="model"
        )
    except Exception as exc:  # noqa: BLE001 - Keras raises many types for layers that do not fit
        import tensorflow as tf

        if isinstance(exc, tf.errors.OpError):
            raise  # TensorFlow's runtime failed, not the recipe: reported as such, exit 1
        why = _message_line(exc) if isinstance(exc, (TypeError, ValueError)) else _first_line(exc)
        raise UsageError(
            f"recipe key 'model.layers': the layers do not fit together ({why})"
        ) from None


def _call_build(fn: Any, cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> Any:
    """Call the recipe's build function: arguments it does not take name model.args, anything
    it raises names model.build; one line either way."""
    import inspect

    args = (input_shape, num_classes)
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and the like: no signature to check
        signature = None
    if signature is not None:
        try:
            signature.bind(*args, **cfg.args)
        except TypeError as exc:
            raise UsageError(
                f"recipe key 'model.args': {cfg.build} rejected them ({_message_line(exc)})"
            ) from None
    try:
        return fn(*args, **cfg.args)
    except TypeError as exc:
        if signature is None:
            raise UsageError(
                f"recipe key 'model.args': {cfg.build} rejected them ({_message_line(exc)})"
            ) from None
        raise UsageError(
            f"recipe key 'model.build': {cfg.build} raised {_first_line(exc)}"
        ) from None
    except Exception as exc:  # noqa: BLE001 - user code may raise anything
        raise UsageError(
            f"recipe key 'model.build': {cfg.build} raised {_first_line(exc)}"
        ) from None


def _is_layer_graph(model: Any) -> bool:
    import tf_keras

    return isinstance(model, tf_keras.Sequential) or getattr(model, "_is_graph_network", False)


def _keras_variables(model: Any) -> list[tuple[str, Any, str]]:
    """(path, variable, owning layer class) with the keys tf-keras' LayoutMap uses."""
    import tensorflow as tf

    def walk(obj: Any, prefix: str) -> list[tuple[str, Any, str]]:
        out = []
        for path, var in obj._flatten(
            predicate=lambda o: isinstance(o, tf.Variable), with_path=True
        ):
            if any(a in path for a in _SKIP_ATTRS):
                continue
            owner = obj
            for part in path[:-1]:
                owner = owner[part] if isinstance(part, int) else getattr(owner, part)
            out.append((prefix + ".".join(str(p) for p in path), var, type(owner).__name__))
        return out

    if _is_layer_graph(model):
        found = []
        for layer in model.layers:
            found += walk(layer, layer.name + ".")
    else:
        found = walk(model, "")
    seen, unique = set(), []
    for path, var, owner in found:
        if id(var) not in seen:  # one variable reachable by two paths counts once
            seen.add(id(var))
            unique.append((path, var, owner))
    return unique


def _call_model(model: Any, input_shape: tuple[int, ...], x: Any) -> Any:
    try:
        return model(x, training=False)
    except Exception as exc:  # noqa: BLE001 - a model's call may raise anything
        raise UsageError(
            f"recipe key 'model': calling the model on a batch of shape {(1, *input_shape)} "
            f"failed ({_first_line(exc)})"
        ) from None


def _ensure_built(model: Any, input_shape: tuple[int, ...], x: Any) -> Any:
    """Call the model once if it has no weights yet; its output then, else None."""
    if not model.built or not model.weights:
        return _call_model(model, input_shape, x)
    return None


def check_output(output: Any, num_classes: int, input_shape: tuple[int, ...] = ()) -> None:
    """The model must give (batch, num_classes) logits for a batch of one example; a language
    model (`input_shape` (time,) of tokens) (batch, time, vocab) logits."""
    shape = getattr(output, "shape", None)
    if input_shape and shape is not None:
        dims = tuple(None if d is None else int(d) for d in shape)
        want = (1, input_shape[0], num_classes)
        if dims != want:
            raise UsageError(
                f"recipe key 'model': a language model must give (batch, time, vocab) = {want} "
                f"logits for a batch of 1 window of {input_shape[0]} tokens, got {dims}"
            )
        return
    if shape is None:
        raise UsageError(
            f"recipe key 'model': the model returns {_a(type(output).__name__)}, expected one "
            f"(batch, {num_classes}) tensor of logits"
        )
    dims = tuple(None if d is None else int(d) for d in shape)
    expected = f"expected (batch, {num_classes}) logits"
    if len(dims) != 2 or dims[0] != 1:
        hint = ""
        if len(dims) > 2:
            hint = " (an MLP fed unflattened images? set data.flatten: true or add a Flatten layer)"
        raise UsageError(
            f"recipe key 'model': the model's output has shape {dims} for a batch of 1 but the "
            f"data has {num_classes} classes: {expected}{hint}"
        )
    if dims[1] != num_classes:
        raise UsageError(
            f"recipe key 'model': the model's last layer gives {dims[1]} outputs but the data "
            f"has {num_classes} classes: {expected} (give the last layer {num_classes} units)"
        )


def describe_keras(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    task: str = "classify",
) -> tuple[list[WeightInfo], dict[str, np.ndarray]]:
    """Build the model once on the host: its weights and (seeded) initial values.

    The model is called once on zeros, so a model that does not fit the data (its output is not
    (batch, num_classes) logits) is refused here, before anything trains."""
    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    with tf.device("/CPU:0"):
        model = _keras_model(cfg, input_shape, num_classes)
        x = tf.zeros((1, *input_shape))
        output = _ensure_built(model, input_shape, x)
        if output is None:
            output = _call_model(model, input_shape, x)
    check_output(output, num_classes, input_shape if task == "language_model" else ())
    infos, values = [], {}
    for path, var, owner in _keras_variables(model):
        shape = tuple(var.shape)
        if 0 in shape:  # a layer of 0 units: it would train, and then fail to save
            key = "model.build" if cfg.build else "model.layers"
            raise UsageError(
                f"recipe key '{key}': weight '{path}' has shape {list(shape)}, with a dim of "
                "size 0 (a layer with 0 units or filters?)"
            )
        infos.append(WeightInfo(path, shape, owner, var.trainable))
        values[path] = var.numpy()
    return infos, values


def build_keras(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    mesh: Any,
    plans: list[WeightPlan],
    initial: dict[str, np.ndarray],
    seed: int,
) -> Built:
    import tensorflow as tf
    import tf_keras
    from tensorflow.experimental import dtensor

    layout_map = tf_keras.dtensor.experimental.LayoutMap(mesh=mesh)
    for plan in plans:
        # Exact paths: LayoutMap tries an exact key before regexes, so the map is the plan.
        layout_map[plan.weight.path] = to_layout(plan.spec, mesh)
    tf_keras.utils.set_random_seed(seed)
    with layout_map.scope():
        model = _keras_model(cfg, input_shape, num_classes)
    x = dtensor.copy_to_mesh(tf.zeros((1, *input_shape)), replicated(mesh, 1 + len(input_shape)))
    _ensure_built(model, input_shape, x)
    variables = _keras_variables(model)
    if [p for p, _, _ in variables] != [p.weight.path for p in plans]:
        raise RuntimeError("the model built on the mesh has other weights than the host model")
    for path, var, _ in variables:
        var.assign(_on_layout(initial[path], var.layout, mesh))

    def regularization() -> Any:
        return tf.add_n(model.losses) if model.losses else None

    return Built(
        module=model,
        forward=lambda x, training: model(x, training=training),
        regularization=regularization if model.losses else None,
        trainable_variables=list(model.trainable_variables),
        weights=[p.weight for p in plans],
        variables={path: var for path, var, _ in variables},
        needs_autograph=cfg.build is not None,  # (the transformer is dtcli's: no branches)
    )


def _on_layout(value: Any, layout: Any, mesh: Any) -> Any:
    """A host value (the same on every mesh) as a DTensor with `layout`: each local device's
    shard cut on the host and packed (no relayout, which DTensor compiles per shape and layout:
    measured ~0.1 s of the quick start's start-up for its four weights)."""
    from tensorflow.experimental import dtensor

    value = np.asarray(value)
    shards = []
    for location in mesh.local_device_locations():
        index = []
        for dim, axis in enumerate(layout.sharding_specs):
            if axis == UNSHARDED:
                index.append(slice(None))
            else:
                size = value.shape[dim] // mesh.dim_size(axis)
                index.append(slice(location[axis] * size, (location[axis] + 1) * size))
        shards.append(value[tuple(index)])
    return dtensor.pack(shards, layout)


# --------------------------------------------------------------------------- core API


def describe_core(
    cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int
) -> list[WeightInfo]:
    if len(input_shape) != 1:
        raise UsageError(
            f"recipe key 'model.api': the core MLP takes flat inputs, got examples of shape "
            f"{list(input_shape)} (set data.flatten: true)"
        )
    widths = [input_shape[0], *cfg.hidden, num_classes]
    infos = []
    for i, (n_in, n_out) in enumerate(zip(widths, widths[1:])):
        infos.append(WeightInfo(f"dense_{i}.kernel", (n_in, n_out), "Dense"))
        infos.append(WeightInfo(f"dense_{i}.bias", (n_out,), "Dense"))
    return infos


def _core_module(cfg: ModelConfig, variables: dict[str, Any]) -> Any:
    """The Core MLP as a tf.Module over given variables (DVariables on a mesh, or plain ones).

    Its tracked structure (layers/N/kernel, layers/N/bias) is the same either way, so a checkpoint
    written on a mesh restores into the plain module (export) and vice versa.
    """
    import tensorflow as tf

    activation = {
        "relu": tf.nn.relu,
        "tanh": tf.nn.tanh,
        "sigmoid": tf.nn.sigmoid,
        "gelu": tf.nn.gelu,
    }[cfg.activation]

    class Dense(tf.Module):
        def __init__(self, index: int):
            super().__init__(name=f"dense_{index}")
            self.kernel = variables[f"dense_{index}.kernel"]
            self.bias = variables[f"dense_{index}.bias"]

        def __call__(self, x: Any) -> Any:
            return tf.matmul(x, self.kernel) + self.bias

    class MLP(tf.Module):
        def __init__(self):
            super().__init__(name="mlp")
            self.layers = [Dense(i) for i in range(len(cfg.hidden) + 1)]

        def __call__(self, x: Any, training: bool = False) -> Any:
            for layer in self.layers[:-1]:
                x = activation(layer(x))
            return self.layers[-1](x)

    return MLP()


def build_core(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    mesh: Any,
    plans: list[WeightPlan],
    seed: int,
) -> Built:
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    variables = {}
    for plan in plans:
        path, shape = plan.weight.path, plan.weight.shape
        layout = to_layout(plan.spec, mesh)
        if path.endswith(".kernel"):
            index = int(path.split(".")[0].split("_")[1])
            limit = float(np.sqrt(6.0 / (shape[0] + shape[1])))  # Glorot uniform, as seed 000
            # Drawn on a replicated layout (identical on every mesh), then relaid out.
            value = dtensor.call_with_layout(
                tf.random.stateless_uniform,
                replicated(mesh, 2),
                shape=shape,
                seed=(seed, index),
                minval=-limit,
                maxval=limit,
            )
            value = dtensor.relayout(value, layout)
        else:
            value = dtensor.call_with_layout(tf.zeros, layout, shape=shape)
        variables[path] = dtensor.DVariable(value, name=path.split(".")[1])
    mlp = _core_module(cfg, variables)
    return Built(
        module=mlp,
        forward=lambda x, training: mlp(x, training=training),
        regularization=None,
        trainable_variables=[variables[p.weight.path] for p in plans],
        weights=[p.weight for p in plans],
        variables=variables,
    )


def build_plain(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> Any:
    """The model with plain variables on one device (no mesh): for export."""
    import tensorflow as tf

    if cfg.api == "keras":
        model = _keras_model(cfg, input_shape, num_classes)
        _ensure_built(model, input_shape, tf.zeros((1, *input_shape)))
        return model
    variables = {
        w.path: tf.Variable(tf.zeros(w.shape), name=w.path.split(".")[1])
        for w in describe_core(cfg, input_shape, num_classes)
    }
    return _core_module(cfg, variables)


def host_weights(built: Built, mesh: Any) -> dict[str, np.ndarray]:
    """Every weight gathered to the host as one numpy array, keyed by its path."""
    from tensorflow.experimental import dtensor

    values = {}
    for path, var in built.variables.items():
        full = dtensor.relayout(var.read_value(), replicated(mesh, len(var.shape)))
        values[path] = dtensor.unpack(full)[0].numpy()
    return values


def weight_plans(
    recipe: Recipe, input_shape: tuple[int, ...], num_classes: int, axes: dict[str, int]
) -> tuple[list[WeightPlan], dict]:
    """Weights of the model and where each lives; Keras initial values come with them."""
    if recipe.model.api == "keras":
        weights, initial = describe_keras(
            recipe.model, input_shape, num_classes, recipe.seed, recipe.task
        )
    else:
        weights, initial = describe_core(recipe.model, input_shape, num_classes), {}
    return plan_weights(recipe.layouts.rules, weights, axes), initial
