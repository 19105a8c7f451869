"""Optimizers on the mesh: tf-keras' mesh-aware ones for Keras models, DVariable slots for Core.

Both expose `apply(grads, variables)` and an integer step variable (`iterations`) that lives on
the mesh: the Adam bias correction reads it inside the compiled step, so it advances every call
(a Python number there would be frozen at trace time, as in the seed tutorial).
"""

from __future__ import annotations

from typing import Any

from dtcli.recipe import OptimizerConfig


class KerasOptimizer:
    """tf_keras.dtensor.experimental.optimizers, always given `mesh=` (without, they run wrong)."""

    def __init__(self, cfg: OptimizerConfig, mesh: Any):
        from tf_keras.dtensor.experimental import optimizers

        if cfg.name == "sgd":
            self.impl = optimizers.SGD(
                learning_rate=cfg.learning_rate, momentum=cfg.momentum, mesh=mesh
            )
        elif cfg.name == "adam":
            self.impl = optimizers.Adam(
                learning_rate=cfg.learning_rate,
                beta_1=cfg.beta_1,
                beta_2=cfg.beta_2,
                epsilon=cfg.epsilon,
                mesh=mesh,
            )
        else:
            self.impl = optimizers.AdamW(
                learning_rate=cfg.learning_rate,
                weight_decay=cfg.weight_decay,
                beta_1=cfg.beta_1,
                beta_2=cfg.beta_2,
                epsilon=cfg.epsilon,
                mesh=mesh,
            )

    @property
    def iterations(self) -> Any:
        return self.impl.iterations

    def build(self, variables: list) -> None:
        """Create the slots now, so a checkpoint restore has them to fill."""
        self.impl.build(variables)

    def apply(self, grads: list, variables: list) -> None:
        self.impl.apply_gradients(zip(grads, variables))

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
        self.mesh = mesh
        self.module = tf.Module(name="optimizer")
        self.module.iterations = dtensor.DVariable(
            dtensor.call_with_layout(
                tf.zeros, dtensor.Layout.replicated(mesh, 0), shape=(), dtype=tf.int64
            ),
            name="iterations",
            trainable=False,
        )
        self.module.slots = {}

    @property
    def iterations(self) -> Any:
        return self.module.iterations

    def build(self, variables: list) -> None:
        names = {
            "sgd": ["momentum"] if self.cfg.momentum else [],
            "adam": ["m", "v"],
            "adamw": ["m", "v"],
        }[self.cfg.name]
        import tensorflow as tf
        from tensorflow.experimental import dtensor

        # Slots are tracked in variable order under stable keys, for checkpoints.
        self.module.slots = {}
        for i, var in enumerate(variables):
            for name in names:
                key = f"v{i}_{name}"
                self.module.slots[key] = dtensor.DVariable(
                    dtensor.call_with_layout(tf.zeros, var.layout, shape=var.shape),
                    trainable=False,
                    name=key,
                )

    def set_hyperparameters(self, cfg: OptimizerConfig) -> None:
        """Core hyperparameters are this process's recipe values; a checkpoint holds none."""
        self.cfg = cfg

    def apply(self, grads: list, variables: list) -> None:
        import tensorflow as tf

        cfg = self.cfg
        slots = self.module.slots
        step = tf.cast(self.module.iterations + 1, tf.float32)
        lr = tf.constant(cfg.learning_rate, tf.float32)
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
            if cfg.name == "adamw":
                var.assign_sub(var * cfg.weight_decay * lr)
            alpha = lr * tf.sqrt(1.0 - tf.pow(cfg.beta_2, step)) / (1.0 - tf.pow(cfg.beta_1, step))
            m.assign_add((g - m) * (1.0 - cfg.beta_1))
            v.assign_add((tf.square(g) - v) * (1.0 - cfg.beta_2))
            var.assign_sub((m * alpha) / (tf.sqrt(v) + cfg.epsilon))
        self.module.iterations.assign_add(1)

    @property
    def trackable(self) -> Any:
        return self.module


def make(api: str, cfg: OptimizerConfig, mesh: Any) -> KerasOptimizer | CoreOptimizer:
    return KerasOptimizer(cfg, mesh) if api == "keras" else CoreOptimizer(cfg, mesh)
