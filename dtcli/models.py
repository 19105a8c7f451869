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
from dtcli.layout import WeightInfo, WeightPlan, replicated, to_layout
from dtcli.recipe import ModelConfig

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
            raise UsageError(f"recipe key '{key}.{name}': {exc}") from None
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
            fn = getattr(importlib.import_module(module_name), fn_name)
        except (ImportError, AttributeError) as exc:
            raise UsageError(
                f"recipe key 'model.build': cannot load {cfg.build!r} ({exc})"
            ) from None
        try:
            model = fn(input_shape, num_classes, **cfg.args)
        except TypeError as exc:
            raise UsageError(
                f"recipe key 'model.args': {cfg.build} rejected them ({exc})"
            ) from None
        if not isinstance(model, tf_keras.Model):
            raise UsageError(
                f"recipe key 'model.build': {cfg.build} returned {type(model).__name__}, "
                "expected a tf_keras.Model"
            )
        return model
    layers = _keras_layers(cfg)
    try:
        return tf_keras.Sequential(
            [tf_keras.Input(shape=input_shape, name="inputs"), *layers], name="model"
        )
    except (TypeError, ValueError) as exc:
        raise UsageError(
            f"recipe key 'model.layers': the layers do not fit together ({exc})"
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


def _ensure_built(model: Any, input_shape: tuple[int, ...], x: Any) -> None:
    if not model.built or not model.weights:
        try:
            model(x, training=False)
        except (TypeError, ValueError) as exc:
            raise UsageError(f"recipe key 'model': calling the model failed ({exc})") from None


def describe_keras(
    cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int, seed: int
) -> tuple[list[WeightInfo], dict[str, np.ndarray]]:
    """Build the model once on the host: its weights and (seeded) initial values."""
    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    with tf.device("/CPU:0"):
        model = _keras_model(cfg, input_shape, num_classes)
        _ensure_built(model, input_shape, tf.zeros((1, *input_shape)))
    infos, values = [], {}
    for path, var, owner in _keras_variables(model):
        infos.append(WeightInfo(path, tuple(var.shape), owner, var.trainable))
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
    )


def _on_layout(value: Any, layout: Any, mesh: Any) -> Any:
    """A host value (the same on every mesh) as a DTensor with `layout`."""
    from tensorflow.experimental import dtensor

    full = dtensor.copy_to_mesh(value, replicated(mesh, len(layout.sharding_specs)))
    return dtensor.relayout(full, layout)


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
