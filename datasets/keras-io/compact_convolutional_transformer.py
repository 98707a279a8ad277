"""keras.io "Compact Convolutional Transformers" (Sayak Paul), its custom layers in the shape the
example gives them (`get_config` added), at small sizes. Its `PositionEmbedding` reads its own
weight in `call`, which tracing would freeze into a constant: the flattener keeps that layer and
names it, and `convert` then refuses it by name.

https://keras.io/examples/vision/cct/
"""

import keras
from keras import layers


@keras.saving.register_keras_serializable(package="compact_convolutional_transformer")
class CCTTokenizer(layers.Layer):
    def __init__(self, kernel_size=3, stride=1, padding=1, pooling_kernel_size=3, pooling_stride=2,
                 num_conv_layers=2, num_output_channels=(8, 8), **kwargs):
        super().__init__(**kwargs)
        self.config_args = dict(kernel_size=kernel_size, stride=stride, padding=padding,
                                pooling_kernel_size=pooling_kernel_size, pooling_stride=pooling_stride,
                                num_conv_layers=num_conv_layers, num_output_channels=list(num_output_channels))
        # This is our tokenizer.
        self.conv_model = keras.Sequential()
        for i in range(num_conv_layers):
            self.conv_model.add(
                layers.Conv2D(num_output_channels[i], kernel_size, stride, padding="valid", use_bias=False,
                              activation="relu", kernel_initializer="he_normal")
            )
            self.conv_model.add(layers.ZeroPadding2D(padding))
            self.conv_model.add(layers.MaxPooling2D(pooling_kernel_size, pooling_stride, "same"))

    def call(self, images):
        outputs = self.conv_model(images)
        # After passing the images through our mini-network the spatial dimensions
        # are flattened to form sequences.
        reshaped = keras.ops.reshape(
            outputs,
            (-1, keras.ops.shape(outputs)[1] * keras.ops.shape(outputs)[2], keras.ops.shape(outputs)[-1]),
        )
        return reshaped

    def get_config(self):
        return {**super().get_config(), **self.config_args}


@keras.saving.register_keras_serializable(package="compact_convolutional_transformer")
class PositionEmbedding(keras.layers.Layer):
    def __init__(self, sequence_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        if sequence_length is None:
            raise ValueError("`sequence_length` must be an Integer, received `None`.")
        self.sequence_length = int(sequence_length)
        self.initializer = keras.initializers.get(initializer)

    def get_config(self):
        config = super().get_config()
        config.update({"sequence_length": self.sequence_length,
                       "initializer": keras.initializers.serialize(self.initializer)})
        return config

    def build(self, input_shape):
        feature_size = input_shape[-1]
        self.position_embeddings = self.add_weight(
            name="embeddings", shape=[self.sequence_length, feature_size], initializer=self.initializer,
            trainable=True,
        )
        super().build(input_shape)

    def call(self, inputs, start_index=0):
        shape = keras.ops.shape(inputs)
        feature_length = shape[-1]
        sequence_length = shape[-2]
        # trim to match the length of the input sequence, which might be less
        # than the sequence_length of the layer.
        position_embeddings = keras.ops.convert_to_tensor(self.position_embeddings)
        position_embeddings = keras.ops.slice(position_embeddings, (start_index, 0), (sequence_length, feature_length))
        return keras.ops.broadcast_to(position_embeddings, shape)

    def compute_output_shape(self, input_shape):
        return input_shape


def build_model(image_size=16, projection_dim=8, num_heads=2):
    """A CCT tokenizer, its learned position embedding, one transformer block and a head."""
    inputs = layers.Input((image_size, image_size, 3))
    encoded_patches = CCTTokenizer(num_output_channels=(8, projection_dim))(inputs)
    sequence_length = encoded_patches.shape[1]
    encoded_patches += PositionEmbedding(sequence_length=sequence_length)(encoded_patches)
    x1 = layers.LayerNormalization(epsilon=1e-5)(encoded_patches)
    attention_output = layers.MultiHeadAttention(num_heads=num_heads, key_dim=projection_dim, dropout=0.1)(x1, x1)
    x2 = layers.Add()([attention_output, encoded_patches])
    representation = layers.LayerNormalization(epsilon=1e-5)(x2)
    pooled = layers.GlobalAveragePooling1D()(representation)
    logits = layers.Dense(5)(pooled)
    return keras.Model(inputs=inputs, outputs=logits)
