"""Models: tf-keras (layer list, `model.build` function or dtcli's transformer) and Core-API MLPs,
built on a mesh.

Both kinds are built in two phases so that the result does not depend on the mesh:
1. `describe` lists every weight (path, shape, owning layer) without devices. For Keras this
   builds the model once with plain variables on the host, seeded; those values become the initial
   weights. For the Core MLP the shapes are arithmetic.
2. `build` creates DVariables with the planned layouts and assigns the host/replicated initial
   values, relaid out onto each weight's layout. DTensor's sharded random ops give different
   numbers on different mesh shapes; this way every mesh starts from the same weights.

`model.api` is read in one place, `_kind`: keras.py makes every Keras model (keras_recipe.py
chooses between the layer list, `model.build` and the transformer), core.py the MLP. None of
them, nor transformer.py, imports TensorFlow at import time (gpt_layers.py does, and only
transformer.build imports it), so `dtcli plan` and `dtcli config` stay free of it until a model
is built.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np

from dtcli.layout import WeightPlan, apply_fsdp, check_fsdp_layers, plan_weights, replicated
from dtcli.models import core, keras, transformer
from dtcli.models.base import Built
from dtcli.models.compute import Compute
from dtcli.models.keras import check_output
from dtcli.recipe import ModelConfig, Recipe

__all__ = [
    "Built",
    "build",
    "build_plain",
    "check_output",
    "describe_core",
    "describe_keras",
    "host_value",
    "host_weights",
    "place",
    "transformer",
    "weight_plans",
]

describe_keras = keras.describe
describe_core = core.weights


def _kind(cfg: ModelConfig) -> ModuleType:
    """The module that describes and builds this recipe's model (both give the same functions)."""
    return keras if cfg.api == "keras" else core


def weight_plans(
    recipe: Recipe,
    input_shape: tuple[int, ...],
    num_classes: int,
    axes: dict[str, int],
    values: bool = True,
) -> tuple[list[WeightPlan], dict]:
    """Weights of the model and where each lives; Keras initial values come with them.
    `values=False`: the plans alone (no initial values), dtcli's transformer described by
    arithmetic, so that no TensorFlow model is built (a memory plan before a run)."""
    if not values and recipe.model.transformer is not None:
        weights, initial = transformer.weights(recipe.model.transformer, num_classes), {}
    else:
        weights, initial = _kind(recipe.model).describe(
            recipe.model, input_shape, num_classes, recipe.seed, recipe.task
        )
    plans = plan_weights(recipe.layouts.rules, weights, axes)
    data_axis = recipe.layouts.data_axis
    own = gathers_weights(recipe.model)
    if recipe.layouts.fsdp:
        # Only the Core MLP's layers pad (models/padded.py); dtcli's GPT could, not yet done.
        plans = apply_fsdp(plans, data_axis, axes, gathers=own, pads=recipe.model.api == "core")
    if not own:
        check_fsdp_layers(plans, data_axis, axes)
    return plans, initial


def gathers_weights(cfg: ModelConfig) -> bool:
    """Whether the model's layers gather FSDP-sharded weights to their compute layout
    (models.compute): dtcli's own GPT and Core MLP, not tf-keras layer lists or user models."""
    return cfg.api == "core" or cfg.transformer is not None


def build(
    recipe: Recipe,
    input_shape: tuple[int, ...],
    num_classes: int,
    mesh: Any,
    plans: list[WeightPlan],
    initial: dict[str, np.ndarray] | None,
) -> Built:
    """The recipe's model on `mesh`, its weights laid out as `plans` (from `weight_plans`) and
    starting from `initial` (Keras; None: left for the caller to assign, `place`) or the seed
    (Core)."""
    return _kind(recipe.model).build(
        recipe.model,
        input_shape,
        num_classes,
        mesh,
        plans,
        initial,
        recipe.seed,
        compute_of(recipe, plans),
    )


def compute_of(recipe: Recipe, plans: list[WeightPlan]) -> Compute:
    """How dtcli's own layers read their weights: gathered off the data axis where a plan
    shards a weight on it (FSDP), in bfloat16 for the matmuls under train.precision bf16."""
    axis = recipe.layouts.data_axis
    fsdp = any(axis in p.spec for p in plans)
    return Compute(axis if fsdp else None, recipe.train.precision == "bf16")


def build_plain(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> Any:
    """The model with plain variables on one device (no mesh): for export."""
    return _kind(cfg).plain(cfg, input_shape, num_classes)


def place(value: np.ndarray, variable: Any, mesh: Any) -> Any:
    """A host value for `variable`, packed shard by shard onto its layout (each device gets
    only its own shard; `mesh` None: the value as is)."""
    return value if mesh is None else keras.on_layout(value, variable.layout, mesh)


def host_weights(built: Built, mesh: Any) -> dict[str, np.ndarray]:
    """Every weight gathered to the host as one numpy array, keyed by its path (`mesh` None:
    plain variables)."""
    return {path: host_value(var, mesh) for path, var in built.variables.items()}


def host_value(variable: Any, mesh: Any) -> np.ndarray:
    """A variable (a weight or an optimizer slot) gathered to the host at its own shape: a
    padded one without its padding (models/padded.py). `mesh` None: a plain variable."""
    from tensorflow.experimental import dtensor

    if mesh is None:
        return variable.numpy()
    full = dtensor.relayout(variable.read_value(), replicated(mesh, len(variable.shape)))
    value = dtensor.unpack(full)[0].numpy()
    shape = getattr(variable, "unpadded_shape", value.shape)
    return value[tuple(slice(0, n) for n in shape)]
