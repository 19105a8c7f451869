"""User model code for `model.build` (a recipe names it as `custom_models:functional_mlp`).

dtcli calls `build(input_shape, num_classes, **model.args)` inside the LayoutMap scope and needs
back a tf_keras.Model. Layout rules match the weight paths: `<layer name>.kernel` for Functional
models, the attribute path (`up.kernel`) for subclassed ones. `dtcli plan` lists them.
"""

from __future__ import annotations

import tf_keras


def functional_mlp(input_shape, num_classes, hidden=128):
    inputs = tf_keras.Input(shape=input_shape)
    x = tf_keras.layers.Dense(hidden, activation="relu", name="up")(inputs)
    outputs = tf_keras.layers.Dense(num_classes, name="down")(x)
    return tf_keras.Model(inputs, outputs)


class MLP(tf_keras.Model):
    def __init__(self, hidden, num_classes):
        super().__init__()
        self.up = tf_keras.layers.Dense(hidden, activation="relu")
        self.down = tf_keras.layers.Dense(num_classes)

    def call(self, x, training=False):
        return self.down(self.up(x))


def subclassed_mlp(input_shape, num_classes, hidden=128):
    return MLP(hidden, num_classes)
