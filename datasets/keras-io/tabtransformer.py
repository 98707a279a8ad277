"""keras.io "Structured data learning with TabTransformer" (Khalid Salama): its TabTransformer
classifier (`create_tabtransformer_classifier`, with the example's `create_model_inputs`,
`encode_inputs` and `create_mlp`) as the example writes it, at small sizes, on a few of its
census features. The example has no custom layers: a functional model with a dict of scalar
inputs named by feature, `Embedding`s of the categorical ids, `ops.expand_dims` and `ops.stack`
on symbolic tensors, `MultiHeadAttention` blocks with `Sequential` feed-forwards, a
`LayerNormalization` of the numerical features and a `Sequential` MLP of `BatchNormalization`,
`Dense` (selu) and `Dropout`. As in the example, the `StringLookup`s run in the data pipeline and
the model takes their ids as float32 inputs.

https://keras.io/examples/structured_data/tabtransformer/
"""

from functools import partial

import keras
import numpy as np
from keras import layers, ops

# A few of the example's features (its 5 numerical and 8 categorical), with small vocabularies.
# Chosen so that the names, in the example's order, are also sorted: Keras then takes the inputs
# as a list in that order as well as a dict.
NUMERIC_FEATURE_NAMES = ["age", "hours_per_week"]
CATEGORICAL_FEATURES_WITH_VOCABULARY = {
    "marital_status": [" Divorced", " Married-civ-spouse", " Never-married"],
    "occupation": [" Adm-clerical", " Craft-repair", " Exec-managerial", " Sales"],
    "race": [" Black", " White"],
}
CATEGORICAL_FEATURE_NAMES = list(CATEGORICAL_FEATURES_WITH_VOCABULARY.keys())
FEATURE_NAMES = NUMERIC_FEATURE_NAMES + CATEGORICAL_FEATURE_NAMES


def create_model_inputs():
    inputs = {}
    for feature_name in FEATURE_NAMES:
        if feature_name in NUMERIC_FEATURE_NAMES:
            inputs[feature_name] = layers.Input(
                name=feature_name, shape=(), dtype="float32"
            )
        else:
            inputs[feature_name] = layers.Input(
                name=feature_name, shape=(), dtype="float32"
            )
    return inputs


def encode_inputs(inputs, embedding_dims):
    encoded_categorical_feature_list = []
    numerical_feature_list = []

    for feature_name in inputs:
        if feature_name in CATEGORICAL_FEATURE_NAMES:
            vocabulary = CATEGORICAL_FEATURES_WITH_VOCABULARY[feature_name]
            # Create an embedding layer with the specified dimensions.
            embedding = layers.Embedding(
                input_dim=len(vocabulary), output_dim=embedding_dims
            )

            # Convert the index values to embedding representations.
            encoded_categorical_feature = embedding(inputs[feature_name])
            encoded_categorical_feature_list.append(encoded_categorical_feature)

        else:
            # Use the numerical features as-is.
            numerical_feature = ops.expand_dims(inputs[feature_name], -1)
            numerical_feature_list.append(numerical_feature)

    return encoded_categorical_feature_list, numerical_feature_list


def create_mlp(hidden_units, dropout_rate, activation, normalization_layer, name=None):
    mlp_layers = []
    for units in hidden_units:
        mlp_layers.append(normalization_layer()),
        mlp_layers.append(layers.Dense(units, activation=activation))
        mlp_layers.append(layers.Dropout(dropout_rate))

    return keras.Sequential(mlp_layers, name=name)


def create_tabtransformer_classifier(
    num_transformer_blocks,
    num_heads,
    embedding_dims,
    mlp_hidden_units_factors,
    dropout_rate,
    use_column_embedding=False,
):
    # Create model inputs.
    inputs = create_model_inputs()
    # encode features.
    encoded_categorical_feature_list, numerical_feature_list = encode_inputs(
        inputs, embedding_dims
    )
    # Stack categorical feature embeddings for the Tansformer.
    encoded_categorical_features = ops.stack(encoded_categorical_feature_list, axis=1)
    # Concatenate numerical features.
    numerical_features = layers.concatenate(numerical_feature_list)

    # Add column embedding to categorical feature embeddings.
    if use_column_embedding:
        num_columns = encoded_categorical_features.shape[1]
        column_embedding = layers.Embedding(
            input_dim=num_columns, output_dim=embedding_dims
        )
        column_indices = ops.arange(start=0, stop=num_columns, step=1)
        encoded_categorical_features = encoded_categorical_features + column_embedding(
            column_indices
        )

    # Create multiple layers of the Transformer block.
    for block_idx in range(num_transformer_blocks):
        # Create a multi-head attention layer.
        attention_output = layers.MultiHeadAttention(
            num_heads=num_heads,
            key_dim=embedding_dims,
            dropout=dropout_rate,
            name=f"multihead_attention_{block_idx}",
        )(encoded_categorical_features, encoded_categorical_features)
        # Skip connection 1.
        x = layers.Add(name=f"skip_connection1_{block_idx}")(
            [attention_output, encoded_categorical_features]
        )
        # Layer normalization 1.
        x = layers.LayerNormalization(name=f"layer_norm1_{block_idx}", epsilon=1e-6)(x)
        # Feedforward.
        feedforward_output = create_mlp(
            hidden_units=[embedding_dims],
            dropout_rate=dropout_rate,
            activation=keras.activations.gelu,
            normalization_layer=partial(
                layers.LayerNormalization, epsilon=1e-6
            ),  # using partial to provide keyword arguments before initialization
            name=f"feedforward_{block_idx}",
        )(x)
        # Skip connection 2.
        x = layers.Add(name=f"skip_connection2_{block_idx}")([feedforward_output, x])
        # Layer normalization 2.
        encoded_categorical_features = layers.LayerNormalization(
            name=f"layer_norm2_{block_idx}", epsilon=1e-6
        )(x)

    # Flatten the "contextualized" embeddings of the categorical features.
    categorical_features = layers.Flatten()(encoded_categorical_features)
    # Apply layer normalization to the numerical features.
    numerical_features = layers.LayerNormalization(epsilon=1e-6)(numerical_features)
    # Prepare the input for the final MLP block.
    features = layers.concatenate([categorical_features, numerical_features])

    # Compute MLP hidden_units.
    mlp_hidden_units = [
        factor * features.shape[-1] for factor in mlp_hidden_units_factors
    ]
    # Create final MLP.
    features = create_mlp(
        hidden_units=mlp_hidden_units,
        dropout_rate=dropout_rate,
        activation=keras.activations.selu,
        normalization_layer=layers.BatchNormalization,
        name="MLP",
    )(features)

    # Add a sigmoid as a binary classifer.
    outputs = layers.Dense(units=1, activation="sigmoid", name="sigmoid")(features)
    model = keras.Model(inputs=inputs, outputs=outputs)
    return model


def build_model(num_transformer_blocks=1, num_heads=2, embedding_dims=8,
                mlp_hidden_units_factors=(2, 1), dropout_rate=0.2):
    """`create_tabtransformer_classifier` as the example calls it (its 3 blocks, 4 heads and
    16-wide embeddings made small; no column embedding, its default)."""
    return create_tabtransformer_classifier(
        num_transformer_blocks=num_transformer_blocks,
        num_heads=num_heads,
        embedding_dims=embedding_dims,
        mlp_hidden_units_factors=list(mlp_hidden_units_factors),
        dropout_rate=dropout_rate,
    )


def probe_inputs(rng, batch):
    """The ids `StringLookup` gives each categorical feature (as the float32 the model takes), and
    numerical features around the census' scale."""
    inputs = {}
    for feature_name, vocabulary in CATEGORICAL_FEATURES_WITH_VOCABULARY.items():
        inputs[feature_name] = rng.integers(0, len(vocabulary), size=(batch,)).astype(np.float32)
    inputs["age"] = rng.normal(40.0, 12.0, size=(batch,)).astype(np.float32)
    inputs["hours_per_week"] = rng.normal(40.0, 10.0, size=(batch,)).astype(np.float32)
    return inputs
