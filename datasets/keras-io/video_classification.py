"""keras.io "Video Classification with Transformers" (Sayak Paul; converted to Keras 3 by Soumik
Rakshit): its `PositionalEmbedding` (a learned position `Embedding` added to the frame features,
the length read from the input's shape) and `TransformerEncoder` (multi-head self-attention with
dropout, a gelu feed-forward `Sequential`, two `LayerNormalization`s) as the example writes them
(`get_config` added), and the example's classifier (`GlobalMaxPooling1D`, `Dropout`, a softmax
`Dense`), at small sizes. The model reads the precomputed per-frame CNN (DenseNet121) features
`[batch, frames, features]` that the example feeds it; the feature extractor is outside the model.

https://keras.io/examples/vision/video_transformers/
"""

import keras
import numpy as np
from keras import layers


@keras.saving.register_keras_serializable(package="video_classification")
class PositionalEmbedding(layers.Layer):
    def __init__(self, sequence_length, output_dim, **kwargs):
        super().__init__(**kwargs)
        self.position_embeddings = layers.Embedding(
            input_dim=sequence_length, output_dim=output_dim
        )
        self.sequence_length = sequence_length
        self.output_dim = output_dim

    def build(self, input_shape):
        self.position_embeddings.build(input_shape)

    def call(self, inputs):
        # The inputs are of shape: `(batch_size, frames, num_features)`
        inputs = keras.ops.cast(inputs, self.compute_dtype)
        length = keras.ops.shape(inputs)[1]
        positions = keras.ops.arange(start=0, stop=length, step=1)
        embedded_positions = self.position_embeddings(positions)
        return inputs + embedded_positions

    def get_config(self):
        config = super().get_config()
        config.update({"sequence_length": self.sequence_length, "output_dim": self.output_dim})
        return config


@keras.saving.register_keras_serializable(package="video_classification")
class TransformerEncoder(layers.Layer):
    def __init__(self, embed_dim, dense_dim, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.embed_dim = embed_dim
        self.dense_dim = dense_dim
        self.num_heads = num_heads
        self.attention = layers.MultiHeadAttention(
            num_heads=num_heads, key_dim=embed_dim, dropout=0.3
        )
        self.dense_proj = keras.Sequential(
            [
                layers.Dense(dense_dim, activation=keras.activations.gelu),
                layers.Dense(embed_dim),
            ]
        )
        self.layernorm_1 = layers.LayerNormalization()
        self.layernorm_2 = layers.LayerNormalization()

    def call(self, inputs, mask=None):
        attention_output = self.attention(inputs, inputs, attention_mask=mask)
        proj_input = self.layernorm_1(inputs + attention_output)
        proj_output = self.dense_proj(proj_input)
        return self.layernorm_2(proj_input + proj_output)

    def get_config(self):
        config = super().get_config()
        config.update({"embed_dim": self.embed_dim, "dense_dim": self.dense_dim, "num_heads": self.num_heads})
        return config


def build_model(max_seq_length=6, num_features=16, classes=5):
    """`get_compiled_model(train_data.shape[1:])` (its 20 frames of 1024 DenseNet121 features made
    6 of 16; its dense_dim 4, one head and the 5 UCF101 classes as they are), uncompiled."""
    sequence_length = max_seq_length
    embed_dim = num_features
    dense_dim = 4
    num_heads = 1

    inputs = keras.Input(shape=(max_seq_length, num_features), name="frame_features")
    x = PositionalEmbedding(
        sequence_length, embed_dim, name="frame_position_embedding"
    )(inputs)
    x = TransformerEncoder(
        embed_dim, dense_dim, num_heads, name="transformer_layer"
    )(x)
    x = layers.GlobalMaxPooling1D()(x)
    x = layers.Dropout(0.5)(x)
    outputs = layers.Dense(classes, activation="softmax")(x)
    return keras.Model(inputs, outputs)


def probe_inputs(rng, batch, max_seq_length=6, num_features=16):
    """Frame features as normal floats; as the example pads short videos with zero frames (whose
    features it sets to 0), every row but the first ends in all-zero frames."""
    features = rng.normal(size=(batch, max_seq_length, num_features)).astype(np.float32)
    for row in range(1, batch):
        features[row, max_seq_length - 2 * row:] = 0.0
    return {"frame_features": features}
