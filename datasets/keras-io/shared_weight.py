"""Not a keras.io example: a custom layer with a weight of its own (read in `call`), called twice.
Flattening reads the weight through one `Weight` layer called twice, so the flattened model has
one weight as the original has (two copies would crash Keras on their shared name, and would
train apart).
"""

import keras
from keras import layers


@keras.saving.register_keras_serializable(package="shared_weight")
class Shift(layers.Layer):
    """`x` plus a learned vector."""

    def build(self, input_shape):
        self.shift = self.add_weight(name="shift", shape=(input_shape[-1],), initializer="random_normal")

    def call(self, x):
        return x + self.shift


def build_model(steps=5, features=3):
    inputs = layers.Input((steps, features), name="series")
    shift = Shift(name="shift")
    x = shift(inputs)
    x = layers.Dense(features)(x)
    outputs = shift(x)  # the same layer, the same weight
    return keras.Model(inputs, outputs)


def probe_inputs(rng, batch):
    return {"series": rng.normal(size=(batch, 5, 3)).astype("float32")}
