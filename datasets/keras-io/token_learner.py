"""keras.io "Learning to tokenize in Vision Transformers" (Aritra Roy Gosthipaty, Sayak Paul;
converted to Keras 3 by Muhammad Anas Raza): its `PatchEncoder` layer (`**kwargs` and a complete
`get_config` added so that the model saves and loads), its `mlp`, `token_learner` and
`transformer` functions and its `create_vit_classifier` model as the example writes them, at small
sizes. The model holds the example's augmentation (`Rescaling`, `Resizing`, `RandomCrop`,
`RandomFlip`: a resize to the crop size at inference), `ops.gelu` as the activation of `Dense` and
`Conv2D`, and the `ops.expand_dims`, `*` and `ops.mean` that `token_learner` applies to symbolic
tensors (functional-model operations, not layers).

https://keras.io/examples/vision/token_learner/
"""

import math

import keras
from keras import layers, ops

LAYER_NORM_EPS = 1e-6


@keras.saving.register_keras_serializable(package="token_learner")
class PatchEncoder(layers.Layer):
    def __init__(self, num_patches, projection_dim, **kwargs):
        super().__init__(**kwargs)
        self.num_patches = num_patches
        self.projection_dim = projection_dim
        self.position_embedding = layers.Embedding(input_dim=num_patches, output_dim=projection_dim)

    def call(self, patch):
        positions = ops.expand_dims(ops.arange(start=0, stop=self.num_patches, step=1), axis=0)
        encoded = patch + self.position_embedding(positions)
        return encoded

    def get_config(self):
        config = super().get_config()
        config.update({"num_patches": self.num_patches, "projection_dim": self.projection_dim})
        return config


def mlp(x, dropout_rate, hidden_units):
    # Iterate over the hidden units and
    # add Dense => Dropout.
    for units in hidden_units:
        x = layers.Dense(units, activation=ops.gelu)(x)
        x = layers.Dropout(dropout_rate)(x)
    return x


def token_learner(inputs, number_of_tokens):
    # Layer normalize the inputs.
    x = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)(inputs)  # (B, H, W, C)

    # Applying Conv2D => Reshape => Permute
    attention_maps = keras.Sequential(
        [
            # 3 layers of conv with gelu activation as suggested
            # in the paper.
            layers.Conv2D(filters=number_of_tokens, kernel_size=(3, 3), activation=ops.gelu, padding="same",
                          use_bias=False),
            layers.Conv2D(filters=number_of_tokens, kernel_size=(3, 3), activation=ops.gelu, padding="same",
                          use_bias=False),
            layers.Conv2D(filters=number_of_tokens, kernel_size=(3, 3), activation=ops.gelu, padding="same",
                          use_bias=False),
            # This conv layer will generate the attention maps
            layers.Conv2D(filters=number_of_tokens, kernel_size=(3, 3), activation="sigmoid", padding="same",
                          use_bias=False),
            # Reshape and Permute
            layers.Reshape((-1, number_of_tokens)),  # (B, H*W, num_of_tokens)
            layers.Permute((2, 1)),
        ]
    )(x)  # (B, num_of_tokens, H*W)

    # Reshape the input to align it with the output of the conv block.
    num_filters = inputs.shape[-1]
    inputs = layers.Reshape((1, -1, num_filters))(inputs)  # inputs == (B, 1, H*W, C)

    # Element-Wise multiplication of the attention maps and the inputs
    attended_inputs = ops.expand_dims(attention_maps, axis=-1) * inputs  # (B, num_tokens, H*W, C)

    # Global average pooling the element wise multiplication result.
    outputs = ops.mean(attended_inputs, axis=2)  # (B, num_tokens, C)
    return outputs


def transformer(encoded_patches, num_heads, projection_dim, mlp_units):
    # Layer normalization 1.
    x1 = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)(encoded_patches)

    # Multi Head Self Attention layer 1.
    attention_output = layers.MultiHeadAttention(num_heads=num_heads, key_dim=projection_dim, dropout=0.1)(x1, x1)

    # Skip connection 1.
    x2 = layers.Add()([attention_output, encoded_patches])

    # Layer normalization 2.
    x3 = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)(x2)

    # MLP layer 1.
    x4 = mlp(x3, hidden_units=mlp_units, dropout_rate=0.1)

    # Skip connection 2.
    encoded_patches = layers.Add()([x4, x2])
    return encoded_patches


def build_model(input_shape=(16, 16, 3), num_classes=5, image_size=32, patch_size=8, projection_dim=8,
                num_heads=2, num_layers=2, num_tokens=4, use_token_learner=True):
    """`create_vit_classifier()` (the example's 32 px images resized to 32 + 20 and cropped to 48,
    6 px patches, 128 wide, 4 heads, 4 layers, 10 classes made small: 16 px images resized to
    16 + 20 and cropped to 32, 8 px patches, 8 wide, 2 heads, 2 layers, the TokenLearner after
    block `num_layers // 2` as the example places it, 4 tokens, 5 classes).

    Keras 3.15's `RandomCrop` passes images through unchanged at inference (no crop, no resize),
    so the patch convolution then sees the 36 px resized image: as in the example (52 // 6 == 48 // 6),
    it gives as many patches (36 // 8 == 32 // 8 == 4 a side) as the model was built for."""
    num_patches = (image_size // patch_size) ** 2
    mlp_units = [projection_dim * 2, projection_dim]
    data_augmentation = keras.Sequential(
        [
            layers.Rescaling(1 / 255.0),
            layers.Resizing(input_shape[0] + 20, input_shape[0] + 20),
            layers.RandomCrop(image_size, image_size),
            layers.RandomFlip("horizontal"),
        ],
        name="data_augmentation",
    )

    inputs = layers.Input(shape=input_shape)  # (B, H, W, C)

    # Augment data.
    augmented = data_augmentation(inputs)

    # Create patches and project the pathces.
    projected_patches = layers.Conv2D(
        filters=projection_dim,
        kernel_size=(patch_size, patch_size),
        strides=(patch_size, patch_size),
        padding="VALID",
    )(augmented)
    _, h, w, c = projected_patches.shape
    projected_patches = layers.Reshape((h * w, c))(projected_patches)  # (B, number_patches, projection_dim)

    # Add positional embeddings to the projected patches.
    encoded_patches = PatchEncoder(num_patches=num_patches, projection_dim=projection_dim)(
        projected_patches
    )  # (B, number_patches, projection_dim)
    encoded_patches = layers.Dropout(0.1)(encoded_patches)

    # Iterate over the number of layers and stack up blocks of
    # Transformer.
    for i in range(num_layers):
        # Add a Transformer block.
        encoded_patches = transformer(encoded_patches, num_heads, projection_dim, mlp_units)

        # Add TokenLearner layer in the middle of the
        # architecture. The paper suggests that anywhere
        # between 1/2 or 3/4 will work well.
        if use_token_learner and i == num_layers // 2:
            _, hh, c = encoded_patches.shape
            h = int(math.sqrt(hh))
            encoded_patches = layers.Reshape((h, h, c))(encoded_patches)  # (B, h, h, projection_dim)
            encoded_patches = token_learner(encoded_patches, num_tokens)  # (B, num_tokens, c)

    # Layer normalization and Global average pooling.
    representation = layers.LayerNormalization(epsilon=LAYER_NORM_EPS)(encoded_patches)
    representation = layers.GlobalAvgPool1D()(representation)

    # Classify outputs.
    outputs = layers.Dense(num_classes, activation="softmax")(representation)

    # Create the Keras model.
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model
