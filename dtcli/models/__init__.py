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

from dtcli.layout import (
    WeightInfo,
    WeightPlan,
    apply_fsdp,
    check_fsdp_layers,
    plan_weights,
    replicated,
)
from dtcli.models import core, keras, lora, transformer
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
    arithmetic, so that no TensorFlow model is built (a memory plan before a run). With
    `lora`, the base weights frozen and the adapters laid out after their kernels'
    plans (models.lora)."""
    adapters = adapters_of(recipe, num_classes)
    if not values and recipe.model.transformer is not None:
        weights, initial = transformer.weights(recipe.model.transformer, num_classes), {}
        if adapters:
            weights = lora.with_adapters(weights, adapters, recipe.lora.base_precision)
    else:
        weights, initial = _kind(recipe.model).describe(
            recipe.model,
            input_shape,
            num_classes,
            recipe.seed,
            recipe.task,
            base_compute(recipe),
            adapters,
        )
    plans = _planned(recipe, weights, axes)
    data_axis = recipe.layouts.data_axis
    own = gathers_weights(recipe.model)
    if recipe.layouts.fsdp:
        # Only the Core MLP's layers pad (models/padded.py); dtcli's GPT could, not yet done.
        plans = apply_fsdp(plans, data_axis, axes, gathers=own, pads=recipe.model.api == "core")
    if not own:
        check_fsdp_layers(plans, data_axis, axes)
    return plans, initial


def _planned(recipe: Recipe, weights: list[WeightInfo], axes: dict[str, int]) -> list[WeightPlan]:
    """The layout rules applied to the weights; LoRA's adapters where their kernels are."""

    def by_rules(some: list[WeightInfo]) -> list[WeightPlan]:
        return plan_weights(recipe.layouts.rules, some, axes)

    return lora.with_adapter_plans(weights, by_rules) if recipe.lora else by_rules(weights)


def adapters_of(recipe: Recipe, num_classes: int) -> dict[str, lora.Adapter]:
    """The LoRA adapters of the recipe's GPT by kernel path (models.lora): its `lora.targets`
    checked against the model's weights; none without `lora`."""
    t = recipe.model.transformer
    if recipe.lora is None or t is None:
        return {}
    return lora.adapters(recipe.lora, transformer.weights(t, num_classes))


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
        adapters_of(recipe, num_classes),
    )


def base_compute(recipe: Recipe) -> Compute:
    """How the layers hold their base weights: trainable float32, or (LoRA) frozen and in
    lora.base_precision's dtype."""
    if recipe.lora is None:
        return Compute()
    return Compute(frozen=True, stored=lora.BASE_DTYPES[recipe.lora.base_precision])


def compute_of(recipe: Recipe, plans: list[WeightPlan]) -> Compute:
    """How dtcli's own layers read their weights: gathered off the data axis where a plan
    shards a weight on it (FSDP), in bfloat16 for the matmuls under train.precision bf16;
    a LoRA base frozen (`base_compute`)."""
    axis = recipe.layouts.data_axis
    fsdp = any(axis in p.spec for p in plans)
    base = base_compute(recipe)
    return Compute(
        axis if fsdp else None, recipe.train.precision == "bf16", base.frozen, base.stored
    )


def build_plain(recipe: Recipe, input_shape: tuple[int, ...], num_classes: int) -> Any:
    """The model with plain variables on one device (no mesh), LoRA's adapters included: for
    export."""
    return _kind(recipe.model).plain(
        recipe.model,
        input_shape,
        num_classes,
        base_compute(recipe),
        adapters_of(recipe, num_classes),
    )


def place(value: np.ndarray, variable: Any, mesh: Any) -> Any:
    """A host value for `variable` in its dtype (a LoRA base stored in bfloat16 is cast),
    packed shard by shard onto its layout (each device gets only its own shard; `mesh` None:
    the value as is)."""
    value = np.asarray(value).astype(variable.dtype.as_numpy_dtype, copy=False)
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
