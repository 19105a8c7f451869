"""tf-keras models (a layer list, a recipe's `model.build` function or dtcli's transformer).

Built in two phases so that the result does not depend on the mesh (see models/__init__.py):
`describe` builds the model once on the host with plain, seeded variables, whose values become the
initial weights; `build` makes it again under a LayoutMap and assigns those values, relaid out.
What the model is (a layer list, `model.build`, the transformer) is keras_recipe.py's to say.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dtcli.errors import UsageError
from dtcli.layout import UNSHARDED, WeightInfo, WeightPlan, replicated, to_layout
from dtcli.models.base import Built, first_line, with_article
from dtcli.models.keras_recipe import make_model
from dtcli.recipe import ModelConfig

# Attribute paths tf-keras' LayoutMap skips when mapping variables (src/dtensor/layout_map.py).
_SKIP_ATTRS = (
    "_self_tracked_trackables",
    "_trainable_weights",
    "_non_trainable_weights",
    "_captured_weight_regularizer",
)


def _is_layer_graph(model: Any) -> bool:
    import tf_keras

    return isinstance(model, tf_keras.Sequential) or getattr(model, "_is_graph_network", False)


def keras_variables(model: Any) -> list[tuple[str, Any, str]]:
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
            f"failed ({first_line(exc)})"
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
            f"recipe key 'model': the model returns {with_article(type(output).__name__)}, "
            f"expected one (batch, {num_classes}) tensor of logits"
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


def describe(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    task: str = "classify",
    compute: Any = None,
    adapters: Any = None,
) -> tuple[list[WeightInfo], dict[str, np.ndarray]]:
    """Build the model once on the host: its weights and (seeded) initial values. `compute`
    and `adapters`: a LoRA GPT's frozen base and adapters (models.lora).

    The model is called once on zeros, so a model that does not fit the data (its output is not
    (batch, num_classes) logits) is refused here, before anything trains."""
    import tensorflow as tf
    import tf_keras

    tf_keras.utils.set_random_seed(seed)
    with tf.device("/CPU:0"):
        model = make_model(cfg, input_shape, num_classes, compute, adapters)
        x = tf.zeros((1, *input_shape))
        output = _ensure_built(model, input_shape, x)
        if output is None:
            output = _call_model(model, input_shape, x)
    check_output(output, num_classes, input_shape if task == "language_model" else ())
    infos, values = [], {}
    for path, var, owner in keras_variables(model):
        shape = tuple(var.shape)
        if 0 in shape:  # a layer of 0 units: it would train, and then fail to save
            key = "model.build" if cfg.build else "model.layers"
            raise UsageError(
                f"recipe key '{key}': weight '{path}' has shape {list(shape)}, with a dim of "
                "size 0 (a layer with 0 units or filters?)"
            )
        infos.append(WeightInfo(path, shape, owner, var.trainable, var.dtype.name))
        values[path] = var.numpy()
    return infos, values


def build(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    mesh: Any,
    plans: list[WeightPlan],
    initial: dict[str, np.ndarray] | None,
    seed: int,
    compute: Any = None,
    adapters: Any = None,
) -> Built:
    """The model on `mesh` with the planned layouts, or with plain variables on the one device
    (mesh None: an XLA run), starting from `initial` either way (None: the caller assigns every
    weight itself, as an import of published weights does, tensor by tensor). `adapters`:
    LoRA's (models.lora), whose checkpoints hold them alone (`Built.saved`)."""
    import tensorflow as tf
    import tf_keras

    from dtcli.models import lora

    tf_keras.utils.set_random_seed(seed)
    model = _on_mesh(cfg, input_shape, num_classes, mesh, plans, compute, adapters)
    variables = keras_variables(model)
    if [p for p, _, _ in variables] != [p.weight.path for p in plans]:
        raise RuntimeError("the model built on the mesh has other weights than the host model")
    for path, var, _ in variables if initial is not None else ():
        var.assign(initial[path] if mesh is None else on_layout(initial[path], var.layout, mesh))
    by_path = {path: var for path, var, _ in variables}

    def regularization() -> Any:
        return tf.add_n(model.losses) if model.losses else None

    return Built(
        module=model,
        forward=lambda x, training: model(x, training=training),
        regularization=regularization if model.losses else None,
        trainable_variables=list(model.trainable_variables),
        weights=[p.weight for p in plans],
        variables=by_path,
        api="keras",
        needs_autograph=cfg.build is not None,  # (the transformer is dtcli's: no branches)
        saved={"lora": lora.tracker(by_path)} if adapters else None,
    )


def _on_mesh(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    mesh: Any,
    plans: list[WeightPlan],
    compute: Any,
    adapters: Any,
) -> Any:
    """The model built (its variables made) under a LayoutMap of the plans, or plainly."""
    import tensorflow as tf
    import tf_keras
    from tensorflow.experimental import dtensor

    if mesh is None:
        model = make_model(cfg, input_shape, num_classes, compute, adapters)
        _ensure_built(model, input_shape, tf.zeros((1, *input_shape)))
        return model
    layout_map = tf_keras.dtensor.experimental.LayoutMap(mesh=mesh)
    for plan in plans:
        # Exact paths: LayoutMap tries an exact key before regexes, so the map is the plan.
        layout_map[plan.weight.path] = to_layout(plan.spec, mesh)
    with layout_map.scope():
        model = make_model(cfg, input_shape, num_classes, compute, adapters)
    x = dtensor.copy_to_mesh(tf.zeros((1, *input_shape)), replicated(mesh, 1 + len(input_shape)))
    _ensure_built(model, input_shape, x)
    return model


def plain(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    compute: Any = None,
    adapters: Any = None,
) -> Any:
    """The model with plain variables on one device (no mesh): for export. `compute` and
    `adapters`: a LoRA GPT's frozen base and adapters."""
    import tensorflow as tf

    model = make_model(cfg, input_shape, num_classes, compute, adapters)
    _ensure_built(model, input_shape, tf.zeros((1, *input_shape)))
    return model


def on_layout(value: Any, layout: Any, mesh: Any) -> Any:
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
