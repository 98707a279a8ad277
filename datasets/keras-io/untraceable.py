"""Not a keras.io example: a custom layer that the flattener must keep, with the reason.
`BranchOnValue.call` branches in Python on a tensor's value, which a symbolic tensor does not
have: tracing fails, the flattener names the layer and the line, keeps it, and `convert`
refuses it by name. (Keras itself runs it eagerly, and builds the model by
`compute_output_shape`.)
"""

import keras
from keras import layers, ops


@keras.saving.register_keras_serializable(package="untraceable")
class BranchOnValue(layers.Layer):
    """`x`, negated where the whole batch sums below zero: Python control flow on a value."""

    def call(self, x):
        if ops.convert_to_numpy(ops.sum(x)) < 0:
            return -x
        return x

    def compute_output_shape(self, input_shape):
        return input_shape


def build_model(steps=6, features=4):
    inputs = layers.Input((steps, features), name="series")
    x = layers.Dense(features)(inputs)
    x = BranchOnValue()(x)
    outputs = layers.GlobalAveragePooling1D()(x)
    return keras.Model(inputs, outputs)


def probe_inputs(rng, batch):
    return {"series": rng.normal(size=(batch, 6, 4)).astype("float32")}
