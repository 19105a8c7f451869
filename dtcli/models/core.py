"""The Core-API MLP (`model.api: core`): a tf.Module of Dense layers over DVariables.

Its weights' shapes are arithmetic (no model is built to list them); kernels start Glorot uniform,
drawn on a replicated layout from the recipe's seed, so every mesh starts from the same weights.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dtcli.errors import UsageError
from dtcli.layout import WeightInfo, WeightPlan, replicated, to_layout
from dtcli.models.base import Built
from dtcli.models.compute import FLOAT32, Compute
from dtcli.recipe import ModelConfig


def weights(cfg: ModelConfig, input_shape: tuple[int, ...], num_classes: int) -> list[WeightInfo]:
    """Every weight of the MLP (path, shape, layer), from the shapes alone."""
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


def _core_module(cfg: ModelConfig, variables: dict[str, Any], compute: Compute = FLOAT32) -> Any:
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
            c = compute
            y = c.result(tf.matmul(c.activation(x), c.weight(self.kernel)))
            return y + c.weight(self.bias, matmul=False)

    class MLP(tf.Module):
        def __init__(self):
            super().__init__(name="mlp")
            self.layers = [Dense(i) for i in range(len(cfg.hidden) + 1)]

        def __call__(self, x: Any, training: bool = False) -> Any:
            for layer in self.layers[:-1]:
                x = activation(layer(x))
            return self.layers[-1](x)

    return MLP()


def describe(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    seed: int,
    task: str = "classify",
    compute: Compute = FLOAT32,
    adapters: Any = None,
) -> tuple[list[WeightInfo], dict[str, np.ndarray]]:
    """The weights, and no initial values: `build` draws them from the seed on the mesh.
    (`compute` and `adapters` are LoRA's, which takes dtcli's GPT only: unused here.)"""
    return weights(cfg, input_shape, num_classes), {}


def build(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    mesh: Any,
    plans: list[WeightPlan],
    initial: dict[str, np.ndarray],
    seed: int,
    compute: Compute = FLOAT32,
    adapters: Any = None,
) -> Built:
    """The MLP's DVariables on the mesh, with the planned layouts, or plain variables on the
    one device (mesh None: an XLA run). (`initial` is empty: see `describe`; no `adapters`.)"""
    variables = {p.weight.path: _variable(p, mesh, seed) for p in plans}
    mlp = _core_module(cfg, variables, compute)
    return Built(
        module=mlp,
        forward=lambda x, training: mlp(x, training=training),
        regularization=None,
        trainable_variables=[variables[p.weight.path] for p in plans],
        weights=[p.weight for p in plans],
        variables=variables,
        api="core",
    )


def _variable(plan: WeightPlan, mesh: Any, seed: int) -> Any:
    """One weight: a kernel drawn from the seed (Glorot uniform, as seed 000), a bias zeros;
    on a mesh drawn on a replicated layout (identical on every mesh), then laid out as
    planned, padded where layouts.fsdp pads it (models/padded.py)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    path, shape = plan.weight.path, plan.weight.shape
    name = path.split(".")[1]
    if path.endswith(".kernel"):
        index = int(path.split(".")[0].split("_")[1])
        limit = float(np.sqrt(6.0 / (shape[0] + shape[1])))
        make = tf.random.stateless_uniform
        args = dict(shape=shape, seed=(seed, index), minval=-limit, maxval=limit)
    else:
        make, args = tf.zeros, {"shape": shape}
    if mesh is None:
        return tf.Variable(make(**args), name=name)
    from dtcli.models import padded

    value = dtensor.call_with_layout(make, replicated(mesh, len(shape)), **args)
    return padded.on_mesh(value, to_layout(plan.spec, mesh), plan.stored_shape, name)


def plain(
    cfg: ModelConfig,
    input_shape: tuple[int, ...],
    num_classes: int,
    compute: Compute = FLOAT32,
    adapters: Any = None,
) -> Any:
    """The MLP with plain variables on one device (no mesh): for export (no LoRA)."""
    import tensorflow as tf

    variables = {
        w.path: tf.Variable(tf.zeros(w.shape), name=w.path.split(".")[1])
        for w in weights(cfg, input_shape, num_classes)
    }
    return _core_module(cfg, variables)
