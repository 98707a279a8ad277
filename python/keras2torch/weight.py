"""`Weight`: a weight that a custom layer's `call` reads, as a node of the flattened graph.

Tracing a `call` that reads the layer's own variable (`self.position_embeddings`, a class
token) would record the variable's current value as a constant, and the flattened model could
no longer train it. The flattener gives `call` a `Weight` node's output in its place: a layer
holding the variable's value as its own weight `value`, whose call returns it (its input only
ties the node to the graph). `cargo xtask convert` and `predict` read it as a weight; Keras
reads a flattened file holding one after `import keras2torch.weight`.
"""

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="keras2torch")
class Weight(keras.layers.Layer):
    """`value` (of `shape`), whatever the input; trainable as the variable it stands for."""

    def __init__(self, shape, **kwargs):
        super().__init__(**kwargs)
        self.shape = tuple(int(d) for d in shape)
        self.value = self.add_weight(name="value", shape=self.shape, initializer="zeros", trainable=self.trainable)
        self.built = True

    def call(self, anchor):
        return ops.convert_to_tensor(self.value)

    def compute_output_spec(self, anchor):
        return keras.KerasTensor(self.shape, dtype=self.value.dtype)

    def get_config(self):
        return {**super().get_config(), "shape": list(self.shape)}

    @classmethod
    def standing_for(cls, variable, name):
        """The layer holding `variable`'s value, for a layer being traced (each call of it is a
        node of the flattened graph)."""
        layer = cls(variable.shape, name=name, trainable=variable.trainable, dtype=variable.dtype)
        layer.value.assign(variable)
        return layer
