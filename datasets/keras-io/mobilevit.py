"""keras.io "MobileViT: A mobile-friendly Transformer-based model for image classification"
(Sayak Paul): its blocks as the example writes them, with the TensorFlow calls it applies to
symbolic tensors (`tf.nn.swish`, `tf.math.equal`) in their Keras 3 form (`keras.activations.swish`,
`==`), at small sizes. No custom layers: `convert` reads it as it is (N-D attention over the
patch axes).

https://keras.io/examples/vision/mobilevit/
"""

import keras
from keras import layers
from keras.src.applications import imagenet_utils  # correct_pad, which keras.applications does not export

patch_size = 4  # 2x2, for the Transformer blocks.
expansion_factor = 2  # expansion factor for the MobileNetV2 blocks.


def conv_block(x, filters=16, kernel_size=3, strides=2):
    conv_layer = layers.Conv2D(filters, kernel_size, strides=strides, activation=keras.activations.swish, padding="same")
    return conv_layer(x)


def inverted_residual_block(x, expanded_channels, output_channels, strides=1):
    m = layers.Conv2D(expanded_channels, 1, padding="same", use_bias=False)(x)
    m = layers.BatchNormalization()(m)
    m = layers.Activation(keras.activations.swish)(m)

    if strides == 2:
        m = layers.ZeroPadding2D(padding=imagenet_utils.correct_pad(m, 3))(m)
    m = layers.DepthwiseConv2D(3, strides=strides, padding="same" if strides == 1 else "valid", use_bias=False)(m)
    m = layers.BatchNormalization()(m)
    m = layers.Activation(keras.activations.swish)(m)

    m = layers.Conv2D(output_channels, 1, padding="same", use_bias=False)(m)
    m = layers.BatchNormalization()(m)

    if x.shape[-1] == output_channels and strides == 1:
        return layers.Add()([m, x])
    return m


def mlp(x, hidden_units, dropout_rate):
    for units in hidden_units:
        x = layers.Dense(units, activation=keras.activations.swish)(x)
        x = layers.Dropout(dropout_rate)(x)
    return x


def transformer_block(x, transformer_layers, projection_dim, num_heads=2):
    for _ in range(transformer_layers):
        x1 = layers.LayerNormalization(epsilon=1e-6)(x)
        attention_output = layers.MultiHeadAttention(num_heads=num_heads, key_dim=projection_dim, dropout=0.1)(x1, x1)
        x2 = layers.Add()([attention_output, x])
        x3 = layers.LayerNormalization(epsilon=1e-6)(x2)
        x3 = mlp(x3, hidden_units=[x.shape[-1] * 2, x.shape[-1]], dropout_rate=0.1)
        x = layers.Add()([x3, x2])
    return x


def mobilevit_block(x, num_blocks, projection_dim, strides=1):
    local_features = conv_block(x, filters=projection_dim, strides=strides)
    local_features = conv_block(local_features, filters=projection_dim, kernel_size=1, strides=strides)
    num_patches = int((local_features.shape[1] * local_features.shape[2]) / patch_size)
    non_overlapping_patches = layers.Reshape((patch_size, num_patches, projection_dim))(local_features)
    global_features = transformer_block(non_overlapping_patches, num_blocks, projection_dim)
    folded_feature_map = layers.Reshape((*local_features.shape[1:-1], projection_dim))(global_features)
    folded_feature_map = conv_block(folded_feature_map, filters=x.shape[-1], kernel_size=1, strides=strides)
    local_global_features = layers.Concatenate(axis=-1)([x, folded_feature_map])
    local_global_features = conv_block(local_global_features, filters=projection_dim, strides=strides)
    return local_global_features


def build_model(image_size=32, num_classes=5):
    """`create_mobilevit()` (256 px images, widths 16..320 made small: one MobileViT block)."""
    inputs = keras.Input((image_size, image_size, 3))
    x = layers.Rescaling(scale=1.0 / 255)(inputs)
    x = conv_block(x, filters=8)
    x = inverted_residual_block(x, expanded_channels=8 * expansion_factor, output_channels=8)
    x = inverted_residual_block(x, expanded_channels=8 * expansion_factor, output_channels=12, strides=2)
    x = inverted_residual_block(x, expanded_channels=12 * expansion_factor, output_channels=12)
    x = mobilevit_block(x, num_blocks=2, projection_dim=8)
    x = conv_block(x, filters=16, kernel_size=1, strides=1)
    x = layers.GlobalAvgPool2D()(x)
    outputs = layers.Dense(num_classes, activation="softmax")(x)
    return keras.Model(inputs, outputs)
