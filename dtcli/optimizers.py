"""Optimizers on the mesh: tf-keras' mesh-aware ones for Keras models, DVariable slots for Core.

Both expose `apply(grads, variables, learning_rate)` and an integer step variable
(`iterations`) that lives on the mesh: the Adam bias correction and the learning-rate schedule
read it inside the compiled step, so they advance every call (a Python number there would be
frozen at trace time, as in the seed tutorial).
"""

from __future__ import annotations

import math
import re
from typing import Any

from dtcli.recipe import OptimizerConfig


def learning_rate_at(cfg: OptimizerConfig, step: Any, total_steps: int) -> Any:
    """The learning rate of 0-based optimizer step `step` (a tensor), as nanoGPT schedules it:
    a linear warmup over `warmup_steps` ((step + 1) / (warmup + 1) of the rate), then constant,
    or a cosine from the rate down to `min_learning_rate` at `decay_steps` (default: the run's
    `total_steps`) and that floor after."""
    import tensorflow as tf

    step = tf.cast(step, tf.float32)
    peak = cfg.learning_rate
    warmup = float(cfg.warmup_steps)
    if cfg.schedule == "constant":
        rate = tf.constant(peak, tf.float32) + 0.0 * step
    else:
        decay = float(max(cfg.decay_steps or total_steps, cfg.warmup_steps + 1))
        ratio = tf.clip_by_value((step - warmup) / (decay - warmup), 0.0, 1.0)
        low = cfg.min_learning_rate
        rate = low + 0.5 * (1.0 + tf.cos(math.pi * ratio)) * (peak - low)
    if cfg.warmup_steps:
        rate = tf.where(step < warmup, peak * (step + 1.0) / (warmup + 1.0), rate)
    return rate


# The optimizer state each kind keeps per trainable weight, each a copy of the weight with its
# layout. SGD with and without momentum keep different slots (a resume may not switch).
_SLOTS = {"sgd": ("momentum",), "adam": ("m", "v"), "adamw": ("m", "v")}


def global_norm(grads: list, variables: list) -> Any:
    """sqrt of the sum of squares of every gradient, as tf.linalg.global_norm, with one sum
    over the mesh for all gradients: each device first sums the squares of its own part of
    each gradient (no collective), and these per-device sums, laid out alike whatever each
    gradient's split, are added on each device and summed over the mesh once: one all-reduce
    a step. (Summed once per kind of split, as before 2026-11-27, gpt_fsdp_tp at 2 layers
    paid 2 more all-reduces and 50 more op executions a step per device, among them gathers
    of the like-split kernels it stacked.)"""
    import tensorflow as tf

    layouts = [getattr(variable, "layout", None) for variable in variables]
    if any(layout is None for layout in layouts):  # plain variables
        return tf.sqrt(tf.reduce_sum(tf.stack([tf.reduce_sum(tf.square(g)) for g in grads])))
    parts = [_device_sums(tf.square(g), layout) for g, layout in zip(grads, layouts)]
    return tf.sqrt(tf.reduce_sum(tf.add_n(parts)))


def _device_sums(square: Any, layout: Any) -> Any:
    """The sum of each device's part of `square` (laid out by `layout`), as a tensor of one dim
    per mesh axis, that axis's size, split on it (each device holds its own sum): computed
    on each device with no collective. Where the tensor is not split on an axis, the devices
    along it hold the same part: it counts once, at that axis's index 0 (0 elsewhere)."""
    import numpy as np
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    mesh = layout.mesh
    axes = list(mesh.dim_names)
    # Each split dim of size n on an axis of size k as [k, n / k]: the k slices are the
    # devices' parts (DTensor keeps the outer dim split, so the reshape moves nothing).
    shape, outer, split = [], [], []
    for size, spec in zip(square.shape, layout.sharding_specs):
        if spec in axes:
            k = mesh.dim_size(spec)
            outer.append(len(shape))
            split.append(spec)
            shape += [k, size // k]
        else:
            shape.append(size)
    sums = tf.reduce_sum(
        tf.reshape(square, shape), axis=[d for d in range(len(shape)) if d not in outer]
    )
    if split != sorted(split, key=axes.index):
        sums = tf.transpose(sums, sorted(range(len(split)), key=lambda i: axes.index(split[i])))
    sizes = [mesh.dim_size(axis) if axis in split else 1 for axis in axes]
    sums = tf.reshape(sums, sizes)
    if len(split) < len(axes):
        once = np.zeros([mesh.dim_size(axis) for axis in axes], np.float32)
        once[tuple(slice(None) if axis in split else 0 for axis in axes)] = 1.0
        sums = sums * tf.constant(once)
    return dtensor.relayout(sums, dtensor.Layout(axes, mesh))


def adam_alpha(cfg: OptimizerConfig, lr: Any, step: Any) -> Any:
    """Adam's step size at 1-based step `step` (float32), both bias corrections in it, as
    tf-keras computes it: once per step, shared by every weight's update."""
    import tensorflow as tf

    beta_1_power = tf.pow(tf.constant(cfg.beta_1, tf.float32), step)
    beta_2_power = tf.pow(tf.constant(cfg.beta_2, tf.float32), step)
    return lr * tf.sqrt(1 - beta_2_power) / (1 - beta_1_power)


def adam_update(
    cfg: OptimizerConfig,
    grad: Any,
    variable: Any,
    m: Any,
    v: Any,
    alpha: Any,
    decay: Any = None,
) -> None:
    """One weight's Adam update on its slots m and v, tf-keras' dense update term for term;
    `decay`, AdamW's (weight_decay, rate): the weight less weight * weight_decay * rate first,
    as tf-keras' AdamW decays it. The weight and its slots are each read once and written
    once, the update computed from the values written: on a mesh every read and write is an
    op on every device (gpt_fsdp_tp at 2 layers: 1,457 -> 1,339 op executions a step per
    device, the numbers unchanged to the bit), and no variable is read after its write, which
    DTensor's all-reduce combining pass may reorder (steps/step.py, _as_weights)."""
    adam_update_like(cfg, [grad], [variable], [m], [v], alpha, decay)


def adam_update_like(
    cfg: OptimizerConfig,
    grads: list,
    variables: list,
    ms: list,
    vs: list,
    alpha: Any,
    decay: Any = None,
) -> None:
    """adam_update of like weights at once (the same shape, layout and decay: `like_weights`):
    their values stacked, so each term of the update is one op for all of them, and split
    back into each one's write. Each weight's numbers are adam_update's (the same elementwise
    ops). On a mesh each op runs on every device: gpt_fsdp_tp's 8 blocks hold 24 like query,
    key and value kernels."""
    import tensorflow as tf

    one = len(variables) == 1

    def values(items: list) -> Any:
        return _read(items[0]) if one else tf.stack([_read(item) for item in items])

    grad = values(grads)
    m_new = values(ms)
    m_new = m_new + (grad - m_new) * (1 - cfg.beta_1)
    v_new = values(vs)
    v_new = v_new + (tf.square(grad) - v_new) * (1 - cfg.beta_2)
    weight = values(variables)
    if decay is not None:
        weight = weight - weight * decay[0] * decay[1]
    weight = weight - (m_new * alpha) / (tf.sqrt(v_new) + cfg.epsilon)
    for targets, value in ((ms, m_new), (vs, v_new), (variables, weight)):
        # Split, not unstacked: DTensor has no layout propagation for Unpack.
        parts = [value] if one else tf.split(value, len(targets))
        for target, part in zip(targets, parts):
            target.assign(part if one else tf.reshape(part, target.shape))


def like_weights(variables: list, decayed: list[bool]) -> list[list[int]]:
    """The variables' indices in groups adam_update_like updates at once: on a mesh, those of
    the same shape, layout and decay (`decayed`, each variable's), in order; plain variables
    (a one-device run, which XLA fuses) one each."""
    groups: dict[Any, list[int]] = {}
    for i, (variable, decays) in enumerate(zip(variables, decayed)):
        layout = getattr(variable, "layout", None)
        key = i if layout is None else (tuple(variable.shape), layout.to_string(), decays)
        groups.setdefault(key, []).append(i)
    return list(groups.values())


def _read(variable: Any) -> Any:
    """A variable's value, read once (each use of the variable itself would read it again)."""
    import tensorflow as tf

    return tf.convert_to_tensor(variable)


def slot_names(cfg: OptimizerConfig) -> tuple[str, ...]:
    """The optimizer's slots per trainable weight (Core keys them `v{i}_{name}`)."""
    if cfg.name == "sgd" and not cfg.momentum:
        return ()
    return _SLOTS[cfg.name]


def slots(cfg: OptimizerConfig) -> int:
    """Optimizer state per trainable weight, in copies of the weight (same layout as it)."""
    return len(slot_names(cfg))


# Bytes of the scalar variables an optimizer keeps on every device besides its slots (replicated,
# so each device holds a whole copy): tf-keras' mesh-aware optimizers hold `iterations` (int64)
# and `learning_rate` (a float32 DVariable: not in `optimizer.variables`, but tracked and
# checkpointed); CoreOptimizer holds `iterations` only (its rate is a constant of the step).
_SCALAR_BYTES = {"keras": 8 + 4, "core": 8}


def scalar_bytes(api: str) -> int:
    """Bytes of the optimizer's scalar variables on each device, for a model of kind `api`
    (models.Built.api: the same choice as `make`)."""
    return _SCALAR_BYTES[api]


def decayed(cfg: OptimizerConfig, path: str) -> bool:
    """Whether AdamW decays the weight at `path` (optimizer.no_decay names those it skips)."""
    return cfg.name == "adamw" and not (cfg.no_decay and re.search(cfg.no_decay, path))


class KerasOptimizer:
    """tf_keras.dtensor.experimental.optimizers, always given `mesh=` (without, they run wrong)."""

    def __init__(self, cfg: OptimizerConfig, mesh: Any):
        """`mesh` None (an XLA run): tf-keras' own optimizers on plain variables, the classes
        the DTensor ones derive from (same update, same checkpoint keys)."""
        if mesh is None:
            from tf_keras import optimizers

            on_mesh: dict[str, Any] = {}
        else:
            from tf_keras.dtensor.experimental import optimizers

            on_mesh = {"mesh": mesh}
        self.cfg = cfg
        if cfg.name == "sgd":
            self.impl = optimizers.SGD(
                learning_rate=cfg.learning_rate, momentum=cfg.momentum, **on_mesh
            )
        elif cfg.name == "adam":
            self.impl = optimizers.Adam(
                learning_rate=cfg.learning_rate,
                beta_1=cfg.beta_1,
                beta_2=cfg.beta_2,
                epsilon=cfg.epsilon,
                **on_mesh,
            )
        else:
            self.impl = optimizers.AdamW(
                learning_rate=cfg.learning_rate,
                weight_decay=cfg.weight_decay,
                beta_1=cfg.beta_1,
                beta_2=cfg.beta_2,
                epsilon=cfg.epsilon,
                **on_mesh,
            )

    @property
    def iterations(self) -> Any:
        return self.impl.iterations

    def build(self, variables: list, no_decay: list) -> None:
        """Create the slots now, so a checkpoint restore has them to fill. `no_decay`: the
        variables AdamW leaves undecayed."""
        if no_decay and self.cfg.name == "adamw":
            self.impl.exclude_from_weight_decay(var_list=no_decay)
        self.impl.build(variables)

    def apply(self, grads: list, variables: list, learning_rate: Any = None) -> None:
        """`learning_rate`: this step's rate (a schedule's), read by the update and AdamW's
        decay alike; None keeps the optimizer's own."""
        if learning_rate is not None:
            self.impl.learning_rate = learning_rate
        if self.cfg.name == "sgd" or any(v.constraint is not None for v in variables):
            self.impl.apply_gradients(zip(grads, variables))
        else:
            self._apply_adam(grads, variables)

    def _apply_adam(self, grads: list, variables: list) -> None:
        """tf-keras' Adam / AdamW update on its own slots, term for term, with the scalars
        computed once per step instead of once per weight.

        tf-keras reads the rate and the step and computes the bias corrections for each
        weight, about 12 scalar ops each, every one run on every device of a mesh. Measured
        (bench/variants.py, 120 steps, alternated with the previous code): the first call of
        the tensor-parallel GPT 14.0 -> 12.8 s, of the one-device GPT 9.3 -> 8.6 s; step time
        and eval loss unchanged (the loss equal to the bit). `ResourceApplyAdam`, one kernel
        per weight, gave no faster step and crashed DTensor's lowering (LLVM ERROR: Failed to
        infer result type(s): "tf.Sqrt")."""
        import tensorflow as tf

        impl, cfg = self.impl, self.cfg
        lr = tf.cast(impl.learning_rate, tf.float32)
        alpha = adam_alpha(cfg, lr, tf.cast(impl.iterations + 1, tf.float32))
        decays = cfg.name == "adamw" and cfg.weight_decay
        decayed = [bool(decays) and impl._use_weight_decay(v) for v in variables]
        wd = tf.constant(cfg.weight_decay, tf.float32)
        for group in like_weights(variables, decayed):
            slots = [impl._index_dict[impl._var_key(variables[i])] for i in group]
            adam_update_like(
                cfg,
                [grads[i] for i in group],
                [variables[i] for i in group],
                [impl._momentums[j] for j in slots],
                [impl._velocities[j] for j in slots],
                alpha,
                (wd, lr) if decayed[group[0]] else None,
            )
        impl.iterations.assign_add(1)

    def set_hyperparameters(self, cfg: OptimizerConfig) -> None:
        """After a restore: the recipe's values take effect. tf-keras keeps the learning rate in
        a variable that the checkpoint overwrites; the betas, epsilon, momentum and weight decay
        are Python numbers of this process, taken from the recipe already."""
        self.impl.learning_rate = cfg.learning_rate

    @property
    def trackable(self) -> Any:
        return self.impl


class CoreOptimizer:
    """SGD (momentum), Adam and AdamW on DVariables, with the same update rules as tf-keras."""

    def __init__(self, cfg: OptimizerConfig, mesh: Any):
        import tensorflow as tf
        from tensorflow.experimental import dtensor

        self.cfg = cfg
        self.mesh = mesh  # None: plain variables (an XLA run)
        self.module = tf.Module(name="optimizer")
        if mesh is None:
            zero = tf.zeros((), tf.int64)
        else:
            zero = dtensor.call_with_layout(
                tf.zeros, dtensor.Layout.replicated(mesh, 0), shape=(), dtype=tf.int64
            )
        self.module.iterations = _variable(zero, "iterations", mesh)
        self.module.slots = {}
        self.no_decay: set[int] = set()

    @property
    def iterations(self) -> Any:
        return self.module.iterations

    def build(self, variables: list, no_decay: list) -> None:
        self.no_decay = {id(v) for v in no_decay}
        names = slot_names(self.cfg)
        import tensorflow as tf

        # Slots are tracked in variable order under stable keys, for checkpoints.
        self.module.slots = {}
        for i, var in enumerate(variables):
            for name in names:
                key = f"v{i}_{name}"
                if self.mesh is None:
                    slot = _variable(tf.zeros(var.shape), key, None)
                else:
                    from dtcli.models import padded

                    # The weight's layout, and its padding where FSDP pads it.
                    slot = padded.zeros_like(var, key)
                self.module.slots[key] = slot

    def set_hyperparameters(self, cfg: OptimizerConfig) -> None:
        """Core hyperparameters are this process's recipe values; a checkpoint holds none."""
        self.cfg = cfg

    def apply(self, grads: list, variables: list, learning_rate: Any = None) -> None:
        import tensorflow as tf

        cfg = self.cfg
        slots = self.module.slots
        step = tf.cast(self.module.iterations + 1, tf.float32)
        lr = tf.constant(cfg.learning_rate, tf.float32) if learning_rate is None else learning_rate
        alpha = None if cfg.name == "sgd" else adam_alpha(cfg, lr, step)
        for i, (g, var) in enumerate(zip(grads, variables)):
            if cfg.name == "sgd":
                if cfg.momentum:
                    m = slots[f"v{i}_momentum"]
                    m.assign(cfg.momentum * m - lr * g)
                    var.assign_add(m)
                else:
                    var.assign_sub(lr * g)
                continue
            m, v = slots[f"v{i}_m"], slots[f"v{i}_v"]
            decays = cfg.name == "adamw" and id(var) not in self.no_decay
            adam_update(cfg, g, var, m, v, alpha, (cfg.weight_decay, lr) if decays else None)
        self.module.iterations.assign_add(1)

    @property
    def trackable(self) -> Any:
        return self.module


def _variable(value: Any, name: str, mesh: Any) -> Any:
    """An optimizer state variable: a DVariable on a mesh, a plain one without (mesh None)."""
    import tensorflow as tf
    from tensorflow.experimental import dtensor

    kind = tf.Variable if mesh is None else dtensor.DVariable
    return kind(value, name=name, trainable=False)


def make(api: str, cfg: OptimizerConfig, mesh: Any) -> KerasOptimizer | CoreOptimizer:
    """The optimizer for a model of kind `api` (models.Built.api: "keras" or "core")."""
    return KerasOptimizer(cfg, mesh) if api == "keras" else CoreOptimizer(cfg, mesh)
