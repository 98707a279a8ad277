"""Model files written by the real Keras 3 (and, later, torch), for `cargo xtask convert`'s tests.

Run from the repository root (import torch before tensorflow if both are used):

    python3 datasets/model-files/make_model_files.py

Writes, next to this script:

* `functional.keras` and `functional.weights.h5`: a functional model with two
  `MultiHeadAttention` layers among other layers: `attn_values` (value_dim != key_dim,
  output_shape set) and `attn_nobias` (use_bias=False, distinct key input);
* `nested.keras`: a model holding a sub-model that holds an attention layer;
* `dense_only.keras`: a model without attention layers (a bad input for `convert`);
* `<file stem>.probe.safetensors`: for each attention layer, a probe `query`, `value` and `key`
  and the real layer's output on them (`<layer>.query`, `<layer>.value`, `<layer>.key`,
  `<layer>.output`), so the tests check our reading without Python.
"""

import json
import os

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
from keras import layers  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
SEQ, FEATURES, PROBE_BATCH = 12, 8, 2


def functional():
    inputs = keras.Input((SEQ, FEATURES), name="tokens")
    memory = keras.Input((SEQ + 3, 5), name="memory")
    x = layers.Dense(FEATURES, name="embed")(inputs)
    a = layers.MultiHeadAttention(num_heads=2, key_dim=4, value_dim=3, output_shape=6, name="attn_values")(x, x)
    a = layers.Dense(FEATURES, name="mix")(a)
    y = layers.LayerNormalization(name="norm")(x + a)
    b = layers.MultiHeadAttention(num_heads=3, key_dim=2, use_bias=False, name="attn_nobias")(y, memory, key=memory)
    outputs = layers.Dense(4, name="head")(b)
    return keras.Model([inputs, memory], outputs, name="two_attention_layers")


def nested():
    inner_in = keras.Input((SEQ, FEATURES))
    inner_out = layers.MultiHeadAttention(num_heads=4, key_dim=2)(inner_in, inner_in)  # h * k = D: torch-exact
    block = keras.Model(inner_in, inner_out, name="block")
    inputs = keras.Input((SEQ, FEATURES))
    x = layers.Dense(FEATURES)(inputs)
    outputs = layers.Dense(2)(block(x))
    return keras.Model(inputs, outputs, name="outer")


def dense_only():
    inputs = keras.Input((SEQ, FEATURES))
    return keras.Model(inputs, layers.Dense(2)(layers.Dense(4)(inputs)), name="no_attention")


def attention_layers(model):
    """Every MultiHeadAttention in `model`, nested models included, by path."""
    found = []
    for layer in model.layers:
        if isinstance(layer, layers.MultiHeadAttention):
            found.append(layer)
        elif isinstance(layer, keras.Model):
            found.extend(attention_layers(layer))
    return found


def probes(model, rng):
    tensors = {}
    for layer in attention_layers(model):
        query_dim = layer.query_dense.kernel.shape[0]
        key_dim_in = layer.key_dense.kernel.shape[0]
        value_dim_in = layer.value_dense.kernel.shape[0]
        query = rng.normal(size=(PROBE_BATCH, SEQ, query_dim)).astype(np.float32)
        value = rng.normal(size=(PROBE_BATCH, SEQ + 3, value_dim_in)).astype(np.float32)
        key = rng.normal(size=(PROBE_BATCH, SEQ + 3, key_dim_in)).astype(np.float32)
        output = layer(query, value, key=key)
        tensors.update({
            f"{layer.name}.query": query,
            f"{layer.name}.value": value,
            f"{layer.name}.key": key,
            f"{layer.name}.output": np.asarray(output, dtype=np.float32),
        })
    return tensors


def randomise(model, rng):
    """Non-trivial weights everywhere (Keras initialises biases to zero)."""
    for weight in model.weights:
        weight.assign(rng.normal(scale=0.5, size=weight.shape).astype(np.float32))


def main():
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(7)
    for stem, build in [("functional", functional), ("nested", nested)]:
        model = build()
        randomise(model, rng)
        model.save(os.path.join(HERE, f"{stem}.keras"))
        if stem == "functional":
            model.save_weights(os.path.join(HERE, f"{stem}.weights.h5"))
        save_file(probes(model, rng), os.path.join(HERE, f"{stem}.probe.safetensors"),
                  metadata={"keras": keras.__version__, "layers": json.dumps([l.name for l in attention_layers(model)])})
        print(f"wrote {stem}.keras ({', '.join(l.name for l in attention_layers(model))})")
    dense_only().save(os.path.join(HERE, "dense_only.keras"))
    print("wrote dense_only.keras (no attention layer)")


if __name__ == "__main__":
    main()
