"""Whole Keras 3 models written by the real Keras, for the Keras -> Burn / PyTorch model converter's tests.

Run from the repository root (keras 3.15.1 on tensorflow-cpu 2.21; torch is not needed):

    python3 datasets/keras-models/make_keras_models.py [MODEL ...]   # all, or the functions named

Writes, next to this script (README.md says more, and describes the files' format as observed):

* `timeseries_transformer.keras`: the keras.io "Timeseries classification with a Transformer model"
  (`transformer_encoder` / `build_model` as the tutorial writes them, automatic layer names) at
  input (136, 4), head_size=4, num_heads=2, ff_dim=4, 2 blocks, mlp_units=[8], dropout 0.25/0.4;
* `text_classifier.keras`: int tokens -> Embedding(mask_zero=True) -> self-attention with the implicit
  mask -> Add -> LayerNormalization -> Dense gelu -> Dense -> masked GlobalAveragePooling1D -> softmax;
* `sequential.keras`: a Sequential Conv1D / BatchNormalization / swish / MaxPooling1D / Flatten / Dense;
* `two_in_two_out.keras`: inputs [context_seq, query_seq] (not creation order), outputs in the reverse
  of their layers' order, a shared Dense called twice, cross-attention returning its scores;
* `nested.keras`: a functional sub-model holding a Sequential, inside an outer model, plus a shared layer;
* `zoo_conv`, `zoo_pool`, `zoo_norm`, `zoo_activations`, `zoo_merge`, `zoo_reshape`, `zoo_masks`,
  `zoo_ops`, `zoo_mha`, `zoo_1d`, `zoo_vision`, `zoo_preprocessing`, `zoo_attention_layers`, `zoo_indexing`, `zoo_hub_ops`, `zoo_transpose`, `zoo_recurrent`, `zoo_bidirectional`, `zoo_time_distributed` `.keras`: layer zoo models, each layer at non-default arguments;
* `bench_lstm`, `bench_timeseries`, `bench_forecaster` `.keras`: the benchmark's whole-model rows
  (xtask/python/bench_models.py): an LSTM, keras.io's time-series Transformer at its own sizes, a
  causal forecaster of three blocks of the question's layer, all on [B, 136, 4];
* `<name>.probe.safetensors` for each model above (and for `small` and `timeseries_train`):
  `inputs.<input layer>`, `expected.<output layer>` (Keras' inference output) and every graph node's
  output `nodes.<layer>[@<node>][.<i>]` (sub-models' nodes as `nodes.<sub-model>/<layer>`), with
  `masks.<same key>` (uint8) where the node's output carries a Keras mask;
* refusals: `lambda_layer.keras` (a Lambda layer), `lambda_activation.keras` (a Dense whose activation
  is a lambda: gelu(approximate=True) has no name), `custom_layer.keras` (a registered custom layer),
  and, edited from the valid `small.keras`: `bad_weight_shape.keras`, `missing_weights.keras`,
  `cycle.keras`, `dangling.keras`, `truncated.keras`;
* `timeseries_train.keras` and `timeseries_train.trajectory.safetensors`: the timeseries model at
  dropout 0 trained 3 Adam steps (lr 1e-3, sparse categorical crossentropy), reference in float64;
* `recurrent_train.keras` and `recurrent_train.trajectory.safetensors`: the same for an LSTM ->
  MultiHeadAttention -> GlobalAveragePooling1D -> softmax classifier at [B, 136, 4].

Deterministic: each model clears the Keras session (automatic names restart) and seeds Keras and numpy;
re-running rewrites the same safetensors bytes (the .keras archives hold a save date).
"""

import json
import os
import zipfile

import numpy as np

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import keras  # noqa: E402
from keras import layers, ops  # noqa: E402
from keras.src import backend as kbackend  # noqa: E402  (get_keras_mask)
from keras.src import tree  # noqa: E402
from keras.src.models.functional import Functional, operation_fn  # noqa: E402
from keras.src.ops.function import make_node_key  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BACKEND = keras.backend.backend()


# --------------------------------------------------------------------------------------------
# Recording every node of a functional graph
# --------------------------------------------------------------------------------------------

def node_indices(model):
    """{node key: the node index that the saved config's inbound references use}.

    `serialize_node` counts only the calls that belong to `model`, from 0, for every kind of
    operation. (`input_layers`/`output_layers` differ: there a Functional sub-model's node index
    is one more, see the README.)
    """
    index = {}
    for operation in model.operations:
        kept = 0
        for original, _ in enumerate(operation._inbound_nodes):
            key = make_node_key(operation, original)
            if key in model._nodes:
                index[key] = kept
                kept += 1
    return index


def inner_functional(operation):
    """The Functional graph inside a sub-model (a Sequential keeps one in `_functional`), or None."""
    if isinstance(operation, Functional):
        return operation
    if isinstance(operation, keras.Sequential) and operation._functional is not None:
        return operation._functional
    return None


def to_numpy(x):
    return np.ascontiguousarray(keras.ops.convert_to_numpy(x))


def stored(x):
    """float tensors as float32, integer ones as int32, booleans as uint8."""
    x = to_numpy(x)
    if x.dtype == np.bool_:
        return x.astype(np.uint8)
    if np.issubdtype(x.dtype, np.integer):
        return x.astype(np.int32)
    return x.astype(np.float32)


def walk(model, inputs, prefix, nodes, masks):
    """Run `model`'s graph node by node (as `Functional._run_through_graph` does, in inference mode)
    and record every node's outputs and Keras masks under `nodes.<prefix><name>[@k][.i]`.

    Returns the model's flat outputs.
    """
    index = node_indices(model)
    calls = {}  # operation name -> how many of its calls belong to `model`
    for operation in model.operations:
        calls[operation.name] = sum(
            make_node_key(operation, i) in model._nodes for i in range(len(operation._inbound_nodes)))

    tensor_dict = {id(x): y for x, y in zip(model.inputs, tree.flatten(inputs))}

    def record(operation, k, values):
        names = []
        base = prefix + operation.name
        if k == 0:  # the first call also under the plain name
            names.append(base)
        if calls[operation.name] > 1:
            names.append(f"{base}@{k}")
        flat = tree.flatten(values)
        for name in names:
            for i, value in enumerate(flat):
                key = name if len(flat) == 1 else f"{name}.{i}"
                nodes[key] = stored(value)
                mask = kbackend.get_keras_mask(value)
                if mask is not None:
                    masks[key] = to_numpy(mask).astype(np.uint8)

    for depth in sorted(model._nodes_by_depth, reverse=True):
        for node in model._nodes_by_depth[depth]:
            operation = node.operation
            original = operation._inbound_nodes.index(node)
            k = index[make_node_key(operation, original)]
            if node.is_input:
                record(operation, k, [tensor_dict[id(x)] for x in node.outputs])
                continue
            if any(id(x) not in tensor_dict for x in node.input_tensors):
                raise RuntimeError(f"node {operation.name}@{k} is not computable")
            args, kwargs = node.arguments.fill_in(tensor_dict)
            outputs = operation_fn(operation, training=False)(*args, **kwargs)
            inner = inner_functional(operation)
            if inner is not None:
                # The sub-model's own nodes, on the same (masked) input values.
                inner_out = walk(inner, args[0], f"{prefix}{operation.name}/", nodes, masks)
                for a, b in zip(tree.flatten(outputs), inner_out):
                    assert np.array_equal(to_numpy(a), to_numpy(b)), f"sub-model {operation.name} walk differs"
            record(operation, k, outputs)
            for x, y in zip(node.outputs, tree.flatten(outputs)):
                tensor_dict[id(x)] = y
    return [tensor_dict[id(x)] for x in model.outputs]


# --------------------------------------------------------------------------------------------
# Writing a model and its probe
# --------------------------------------------------------------------------------------------

SAFETENSORS_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32", np.dtype(np.uint8): "U8"}


def save_file(tensors, path, metadata):
    """A safetensors file with its header in sorted-key order, so that re-running rewrites the same bytes
    (`safetensors.numpy.save_file` writes `__metadata__` in hash order)."""
    header, chunks, offset = {"__metadata__": dict(sorted(metadata.items()))}, [], 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        data = array.tobytes()
        header[name] = {"dtype": SAFETENSORS_DTYPES[array.dtype], "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        f.writelines(chunks)
    back = load_file(path)
    assert back.keys() == tensors.keys() and all(np.array_equal(back[k], tensors[k]) for k in tensors)


def fresh(seed):
    """Clear Keras' name counters (automatic names start again at `add`, `dense`, ...) and seed."""
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    return np.random.default_rng(seed)


def randomise(model, rng, scale=0.5):
    """Non-trivial weights everywhere (Keras starts biases, betas and moving means at 0, gammas at 1).

    Moving variances are drawn in [0.5, 2) so that they stay positive.
    """
    for weight in model.weights:
        if weight.path.endswith("moving_variance"):
            value = rng.uniform(0.5, 2.0, size=weight.shape)
        else:
            value = rng.normal(scale=scale, size=weight.shape)
        weight.assign(value.astype(np.float32))


def config_of(path):
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("config.json"))


def tensor_keys(refs):
    """`[[name, node, tensor], ...]` (or one such entry) -> keys, `@<node>` added to repeated names."""
    if refs and isinstance(refs[0], str):
        refs = [refs]
    names = [r[0] for r in refs]
    keys = []
    for name, node, tensor in refs:
        key = name if names.count(name) == 1 else f"{name}@{node}"
        if sum(1 for r in refs if r[0] == name and r[1] == node) > 1:
            key = f"{key}.{tensor}"
        keys.append(key)
    return keys


def write_model(name, model, inputs, description, custom_objects=None):
    """Save `name.keras`, reload it, and write `name.probe.safetensors` (see the module docstring).

    `inputs`: {input layer name: array}. The nodes are recorded on the reloaded model, whose node
    indices are the saved config's; its outputs must equal the original model's bit for bit.
    """
    path = os.path.join(HERE, f"{name}.keras")
    model.save(path)
    saved = config_of(path)
    config = saved["config"]
    loaded = keras.saving.load_model(path, custom_objects=custom_objects)
    if saved["class_name"] == "Sequential":
        input_names = [config["layers"][0]["config"]["name"]]
        output_names = [config["layers"][-1]["config"]["name"]]
        graph = loaded._functional
    else:
        input_names = tensor_keys(config["input_layers"])
        output_names = tensor_keys(config["output_layers"])
        graph = loaded
    ordered = [inputs[n] for n in input_names]
    call_inputs = ordered[0] if len(ordered) == 1 else ordered
    expected = tree.flatten(model(call_inputs, training=False))
    reloaded = tree.flatten(loaded(call_inputs, training=False))
    nodes, masks = {}, {}
    walked = walk(graph, ordered, "", nodes, masks)
    assert len(expected) == len(output_names) == len(walked), (len(expected), output_names, len(walked))
    for a, b, c, out in zip(expected, reloaded, walked, output_names):
        a, b, c = to_numpy(a), to_numpy(b), to_numpy(c)
        assert np.array_equal(a, b), f"{name}: reloaded model differs on {out}: {np.abs(a - b).max()}"
        assert np.array_equal(a, c), f"{name}: node walk differs on {out}: {np.abs(a - c).max()}"
    tensors = {f"inputs.{n}": np.ascontiguousarray(inputs[n]) for n in input_names}
    tensors.update({f"expected.{n}": stored(x) for n, x in zip(output_names, expected)})
    tensors.update({f"nodes.{k}": v for k, v in nodes.items()})
    tensors.update({f"masks.{k}": v for k, v in masks.items()})
    probe = os.path.join(HERE, f"{name}.probe.safetensors")
    save_file(tensors, probe,
              metadata={"keras_version": keras.__version__, "backend": BACKEND, "description": description})
    size = os.path.getsize(path)
    limit = 600_000 if name.startswith("bench_") else 300_000  # a benchmark row at its example's sizes
    assert size < limit, f"{name}.keras is {size} bytes"
    print(f"wrote {name}.keras ({size} bytes) and its probe: {len(nodes)} nodes, {len(masks)} masks")
    return loaded


# --------------------------------------------------------------------------------------------
# 1. keras.io "Timeseries classification with a Transformer model", at tiny sizes
# --------------------------------------------------------------------------------------------

# `transformer_encoder` and `build_model` as keras-io/examples/timeseries/timeseries_classification_transformer.py
# writes them (automatic layer names; `n_classes` is a global there too).
n_classes = 2


def transformer_encoder(inputs, head_size, num_heads, ff_dim, dropout=0):
    # Attention and Normalization
    x = layers.MultiHeadAttention(
        key_dim=head_size, num_heads=num_heads, dropout=dropout
    )(inputs, inputs)
    x = layers.Dropout(dropout)(x)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    res = x + inputs

    # Feed Forward Part
    x = layers.Conv1D(filters=ff_dim, kernel_size=1, activation="relu")(res)
    x = layers.Dropout(dropout)(x)
    x = layers.Conv1D(filters=inputs.shape[-1], kernel_size=1)(x)
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    return x + res


def build_model(
    input_shape,
    head_size,
    num_heads,
    ff_dim,
    num_transformer_blocks,
    mlp_units,
    dropout=0,
    mlp_dropout=0,
):
    inputs = keras.Input(shape=input_shape)
    x = inputs
    for _ in range(num_transformer_blocks):
        x = transformer_encoder(x, head_size, num_heads, ff_dim, dropout)

    x = layers.GlobalAveragePooling1D(data_format="channels_last")(x)
    for dim in mlp_units:
        x = layers.Dense(dim, activation="relu")(x)
        x = layers.Dropout(mlp_dropout)(x)
    outputs = layers.Dense(n_classes, activation="softmax")(x)
    return keras.Model(inputs, outputs)


TIMESERIES = dict(input_shape=(136, 4), head_size=4, num_heads=2, ff_dim=4, num_transformer_blocks=2,
                  mlp_units=[8])


def timeseries_transformer():
    rng = fresh(1)
    model = build_model(**TIMESERIES, dropout=0.25, mlp_dropout=0.4)
    randomise(model, rng)
    x = rng.normal(size=(2, 136, 4)).astype(np.float32)
    write_model("timeseries_transformer", model, {model.layers[0].name: x},
                "keras.io timeseries Transformer classifier (head_size=4, num_heads=2, ff_dim=4, 2 blocks, mlp [8], "
                "dropout 0.25/0.4), automatic layer names")


# --------------------------------------------------------------------------------------------
# 2. A small text classifier with an implicit padding mask
# --------------------------------------------------------------------------------------------

def padded_tokens(rng, batch, length, pads, vocab=50):
    """Token ids in [1, vocab) with `pads[b]` zeros at the end of row b."""
    tokens = rng.integers(1, vocab, size=(batch, length)).astype(np.int32)
    for row, pad in enumerate(pads):
        if pad:
            tokens[row, length - pad:] = 0
    return tokens


def text_classifier():
    rng = fresh(2)
    tokens = keras.Input((16,), dtype="int32", name="tokens")
    x = layers.Embedding(input_dim=50, output_dim=8, mask_zero=True, name="embedding")(tokens)
    a = layers.MultiHeadAttention(num_heads=2, key_dim=4, name="self_attention")(x, x)
    x = layers.Add(name="residual")([x, a])
    x = layers.LayerNormalization(name="norm")(x)
    x = layers.Dense(16, activation="gelu", name="ffn_up")(x)
    x = layers.Dense(8, name="ffn_down")(x)
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    outputs = layers.Dense(3, activation="softmax", name="classes")(x)
    model = keras.Model(tokens, outputs, name="text_classifier")
    randomise(model, rng)
    write_model("text_classifier", model, {"tokens": padded_tokens(rng, 3, 16, [5, 11, 0])},
                "Embedding(mask_zero) -> self-attention with the implicit mask -> Add -> LayerNorm -> "
                "Dense gelu -> Dense -> masked GlobalAveragePooling1D -> softmax")


# --------------------------------------------------------------------------------------------
# 3. A Sequential model
# --------------------------------------------------------------------------------------------

def sequential():
    rng = fresh(3)
    model = keras.Sequential([
        keras.Input((20, 3), name="signal"),
        layers.Conv1D(6, 3, name="conv"),
        layers.BatchNormalization(momentum=0.8, epsilon=1e-2, name="batch_norm"),
        layers.Activation("swish", name="swish"),
        layers.MaxPooling1D(2, name="max_pool"),
        layers.Flatten(name="flatten"),
        layers.Dense(8, name="dense"),
        layers.Dense(3, activation="softmax", name="probs"),
    ], name="sequential")
    randomise(model, rng)  # BatchNorm: gamma, beta, moving_mean random, moving_variance in [0.5, 2)
    write_model("sequential", model, {"signal": rng.normal(size=(3, 20, 3)).astype(np.float32)},
                "Sequential: Conv1D -> BatchNormalization(momentum=0.8, epsilon=0.01) -> swish -> MaxPooling1D -> "
                "Flatten -> Dense -> Dense softmax")


# --------------------------------------------------------------------------------------------
# 4. Two inputs, two outputs, a shared layer, cross-attention returning its scores
# --------------------------------------------------------------------------------------------

def two_in_two_out():
    rng = fresh(4)
    query_seq = keras.Input((10, 6), name="query_seq")  # created first ...
    context_seq = keras.Input((14, 5), name="context_seq")
    shared = layers.Dense(6, name="shared_proj")
    q = shared(query_seq)  # node 0
    c = shared(layers.Dense(6, name="context_proj")(context_seq))  # node 1: same layer, other tensor
    attended, scores = layers.MultiHeadAttention(num_heads=2, key_dim=3, name="cross_attention")(
        q, c, return_attention_scores=True)
    x = layers.Concatenate(name="concat")([q, attended])
    x = layers.GlobalMaxPooling1D(name="max_pool")(x)
    label_head = layers.Dense(4, activation="softmax", name="label_head")(x)
    # The attention scores, tensor 1 of cross_attention: [B, 2, 10, 14] when run, but Keras records them
    # as [None, 2, 10, 10] (its compute_output_spec uses the query length twice), so reduce the key axis
    # before anything that needs the static shape.
    peak = ops.max(scores, axis=-1)  # [B, 2, 10]
    s = layers.Flatten(name="scores_flat")(peak)
    score_head = layers.Dense(2, name="score_head")(s)
    # ... but listed second; the outputs are listed in the reverse of their layers' order.
    model = keras.Model([context_seq, query_seq], [score_head, label_head], name="two_in_two_out")
    randomise(model, rng)
    inputs = {"query_seq": rng.normal(size=(2, 10, 6)).astype(np.float32),
              "context_seq": rng.normal(size=(2, 14, 5)).astype(np.float32)}
    write_model("two_in_two_out", model, inputs,
                "inputs [context_seq, query_seq] (not creation order), outputs [score_head, label_head]; "
                "shared Dense called twice; cross-attention with return_attention_scores=True")


# --------------------------------------------------------------------------------------------
# 5. Nested models: a functional sub-model holding a Sequential, plus a shared layer
# --------------------------------------------------------------------------------------------

def nested():
    rng = fresh(5)
    mlp = keras.Sequential([
        keras.Input((12, 6), name="mlp_input"),
        layers.Dense(8, activation="relu", name="mlp_hidden"),
        layers.Dense(6, name="mlp_out"),
    ], name="mlp")
    block_in = keras.Input((12, 6), name="block_input")
    h = layers.Dense(6, name="block_proj")(block_in)
    h = mlp(h)
    h = layers.LayerNormalization(name="block_norm")(h)
    block = keras.Model(block_in, h, name="block")

    features = keras.Input((12, 5), name="features")
    shared = layers.Dense(6, activation="tanh", name="shared")
    x = layers.Dense(6, name="embed")(features)
    x = shared(x)       # node 0
    inner = block(x)    # the sub-model, called once
    x = shared(inner)   # node 1
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    head = layers.Dense(3, name="head")(x)
    # The sub-model's output is a model output too: `output_layers` then names it ["block", 1, 0].
    model = keras.Model(features, [head, inner], name="nested")
    randomise(model, rng)
    write_model("nested", model, {"features": rng.normal(size=(2, 12, 5)).astype(np.float32)},
                "functional sub-model `block` (holding Sequential `mlp`) inside an outer model, its output also a "
                "model output; Dense `shared` called before and after the block")


# --------------------------------------------------------------------------------------------
# 6. Layer zoo
# --------------------------------------------------------------------------------------------

def zoo_conv():
    rng = fresh(6)
    x = keras.Input((16, 4), name="signal")
    outputs = [
        layers.Conv1D(6, 3, strides=2, padding="valid", name="conv_strided_valid")(x),
        layers.Conv1D(6, 4, padding="same", name="conv_same_even")(x),
        layers.Conv1D(5, 4, strides=3, padding="same", name="conv_same_strided")(x),
        layers.Conv1D(6, 3, padding="causal", dilation_rate=2, name="conv_causal_dilated")(x),
        layers.Conv1D(6, 3, groups=2, padding="same", name="conv_groups")(x),
        layers.Conv1D(5, 3, data_format="channels_first", name="conv_channels_first")(
            layers.Permute((2, 1), name="to_channels_first")(x)),
        layers.Conv1D(6, 3, use_bias=False, activation="tanh", name="conv_nobias_tanh")(x),
    ]
    model = keras.Model(x, outputs, name="zoo_conv")
    randomise(model, rng)
    write_model("zoo_conv", model, {"signal": rng.normal(size=(2, 16, 4)).astype(np.float32)},
                "Conv1D: strides=2 valid; even kernel same; strides=3 same; causal dilation 2; groups=2; "
                "channels_first; use_bias=False with tanh")


def zoo_pool():
    rng = fresh(7)
    x = keras.Input((15, 4), name="signal")
    xt = layers.Permute((2, 1), name="to_channels_first")(x)  # [B, 4, 15]
    outputs = [
        layers.MaxPooling1D(pool_size=3, strides=2, padding="same", name="max_same")(x),
        layers.MaxPooling1D(pool_size=2, name="max_valid")(x),
        layers.AveragePooling1D(pool_size=2, padding="valid", name="avg_valid")(x),
        layers.AveragePooling1D(pool_size=3, strides=2, padding="same", name="avg_same")(x),
        layers.AveragePooling1D(pool_size=4, strides=1, padding="same", name="avg_same_even")(x),
        layers.MaxPooling1D(pool_size=2, data_format="channels_first", name="max_channels_first")(xt),
        layers.AveragePooling1D(pool_size=3, strides=2, padding="same", data_format="channels_first",
                                name="avg_same_channels_first")(xt),
        layers.GlobalAveragePooling1D(keepdims=True, name="gap_keepdims")(x),
        layers.GlobalMaxPooling1D(data_format="channels_first", name="gmp_channels_first")(xt),
        layers.GlobalAveragePooling1D(data_format="channels_first", name="gap_channels_first")(xt),
    ]
    model = keras.Model(x, outputs, name="zoo_pool")
    write_model("zoo_pool", model, {"signal": rng.normal(size=(2, 15, 4)).astype(np.float32)},
                "Max/AveragePooling1D valid and same (same average excludes pads), channels_first variants, "
                "GlobalAveragePooling1D(keepdims=True), GlobalMax/AveragePooling1D(channels_first)")


def zoo_norm():
    rng = fresh(8)
    x = keras.Input((6, 8), name="features")
    outputs = [
        layers.LayerNormalization(axis=-1, epsilon=1e-2, center=False, name="ln_no_center")(x),
        layers.LayerNormalization(scale=False, name="ln_no_scale")(x),
        layers.LayerNormalization(rms_scaling=True, name="ln_rms")(x),
        layers.LayerNormalization(axis=[1, 2], name="ln_axes_1_2")(x),
        layers.BatchNormalization(axis=1, momentum=0.9, epsilon=0.01, center=False, name="bn_axis1")(x),
        layers.BatchNormalization(name="bn_default_axis")(x),
    ]
    model = keras.Model(x, outputs, name="zoo_norm")
    randomise(model, rng)
    x = (rng.normal(size=(3, 6, 8)) * 2.0 + 0.5).astype(np.float32)
    write_model("zoo_norm", model, {"features": x},
                "LayerNormalization (center=False eps 1e-2, scale=False, rms_scaling=True, axis=[1,2]), "
                "BatchNormalization(axis=1, momentum 0.9, eps 0.01, center=False) and default, random stats")


ACTIVATIONS = ["relu", "gelu", "silu", "swish", "tanh", "sigmoid", "softmax", "log_softmax", "elu", "selu",
               "softplus", "softsign", "hard_sigmoid", "hard_silu", "leaky_relu", "relu6", "mish", "exponential",
               "linear"]


def zoo_activations():
    rng = fresh(9)
    x = keras.Input((4, 10), name="values")
    outputs = [layers.Activation(name, name=f"act_{name}")(x) for name in ACTIVATIONS]
    outputs += [
        layers.Dense(5, activation="gelu", name="dense_gelu")(x),
        layers.ReLU(max_value=2.0, negative_slope=0.1, threshold=0.5, name="relu_layer")(x),
        layers.LeakyReLU(negative_slope=0.2, name="leaky_relu_layer")(x),
        layers.PReLU(shared_axes=[1], name="prelu")(x),
        layers.ELU(alpha=0.5, name="elu_layer")(x),
        layers.Softmax(axis=1, name="softmax_axis1")(x),
        layers.Identity(name="identity")(x),
    ]
    model = keras.Model(x, outputs, name="zoo_activations")
    randomise(model, rng)  # PReLU alpha [1, 10] and the Dense
    write_model("zoo_activations", model, {"values": rng.uniform(-4, 4, size=(2, 4, 10)).astype(np.float32)},
                "one Activation per built-in name, Dense(gelu), ReLU/LeakyReLU/PReLU/ELU/Softmax/Identity layers "
                "at non-default arguments; inputs uniform in [-4, 4]")


def zoo_merge():
    rng = fresh(10)
    a = keras.Input((5, 4), name="a")
    b = keras.Input((5, 4), name="b")
    c = keras.Input((5, 4), name="c")
    outputs = [
        layers.Add(name="add3")([a, b, c]),
        layers.Subtract(name="subtract")([a, b]),
        layers.Multiply(name="multiply3")([a, b, c]),
        layers.Average(name="average")([a, b]),
        layers.Maximum(name="maximum3")([a, b, c]),
        layers.Minimum(name="minimum")([a, b]),
        layers.Concatenate(axis=1, name="concat_axis1")([a, b]),
        layers.Concatenate(axis=-1, name="concat_last")([a, b, c]),
    ]
    model = keras.Model([a, b, c], outputs, name="zoo_merge")
    inputs = {n: rng.normal(size=(2, 5, 4)).astype(np.float32) for n in "abc"}
    write_model("zoo_merge", model, inputs, "Add, Subtract, Multiply, Average, Maximum, Minimum, Concatenate on 2-3 inputs")


def zoo_reshape():
    rng = fresh(11)
    x3 = keras.Input((6, 4), name="seq")
    x4 = keras.Input((3, 4, 2), name="grid")
    flat = layers.Flatten(name="flatten")(x4)
    outputs = [
        flat,
        layers.Reshape((3, -1), name="reshape")(x3),
        layers.Permute((2, 1), name="permute")(x3),
        layers.RepeatVector(3, name="repeat")(flat),
        layers.Dense(5, name="dense_3d")(x3),
        layers.Dense(3, name="dense_4d")(x4),
        layers.EinsumDense("abc,cd->abd", output_shape=(None, 5), bias_axes="d", name="einsum_abd")(x3),
        layers.EinsumDense("abc,cde->abde", output_shape=(None, 2, 3), bias_axes="de", name="einsum_bias_de")(x3),
    ]
    model = keras.Model([x3, x4], outputs, name="zoo_reshape")
    randomise(model, rng)
    inputs = {"seq": rng.normal(size=(2, 6, 4)).astype(np.float32),
              "grid": rng.normal(size=(2, 3, 4, 2)).astype(np.float32)}
    write_model("zoo_reshape", model, inputs,
                "Flatten, Reshape((3, -1)), Permute((2, 1)), RepeatVector, Dense on rank 3 and 4, EinsumDense "
                "abc,cd->abd (bias d) and abc,cde->abde (bias de)")


def zoo_masks():
    rng = fresh(12)
    tokens = keras.Input((8,), dtype="int32", name="tokens")
    frames = keras.Input((8, 4), name="frames")
    e = layers.Embedding(20, 6, mask_zero=True, name="embedding")(tokens)
    f = layers.Masking(mask_value=0.0, name="masking")(frames)
    f = layers.Dense(6, name="frames_dense")(f)          # passes the mask
    f = layers.LayerNormalization(name="frames_norm")(f)  # passes the mask
    x = layers.Add(name="merge")([e, f])                  # mask: logical_or of both
    x = layers.Dropout(0.3, name="dropout")(x)
    x = layers.SpatialDropout1D(0.2, name="spatial_dropout")(x)
    x = layers.GaussianNoise(0.1, name="gaussian_noise")(x)
    x = layers.GaussianDropout(0.2, name="gaussian_dropout")(x)
    attn = layers.MultiHeadAttention(num_heads=2, key_dim=3, name="self_attention")(x, x)  # implicit masks
    causal = layers.MultiHeadAttention(num_heads=2, key_dim=3, name="causal_attention")(
        attn, attn, use_causal_mask=True)
    summed = attn + causal                                 # an operator: drops masks
    avg = layers.GlobalAveragePooling1D(name="avg_pool")(causal)
    avg_unmasked = layers.GlobalAveragePooling1D(name="avg_pool_unmasked")(summed)
    mx = layers.GlobalMaxPooling1D(name="max_pool")(causal)  # ignores masks
    scores = layers.Dense(1, name="score")(attn)
    keep = ops.expand_dims(ops.not_equal(tokens, 0), axis=-1)  # [B, 8, 1]
    weights = layers.Softmax(axis=1, name="masked_softmax")(scores, mask=keep)
    pooled = ops.sum(weights * attn, axis=1)
    head = layers.Dense(2, name="head")(pooled)
    model = keras.Model([tokens, frames], [avg, avg_unmasked, mx, head], name="zoo_masks")
    randomise(model, rng)
    frames_value = rng.normal(size=(3, 8, 4)).astype(np.float32)
    frames_value[0, 6:] = 0.0   # all-zero timesteps: masked by Masking
    frames_value[1, 2] = 0.0
    frames_value[1, 5:] = 0.0
    tokens_value = padded_tokens(rng, 3, 8, [3, 5, 0], vocab=20)
    write_model("zoo_masks", model, {"tokens": tokens_value, "frames": frames_value},
                "Embedding(mask_zero) + Masking branches merged by Add; Dropout/SpatialDropout1D/GaussianNoise/"
                "GaussianDropout; MHA with implicit masks and use_causal_mask; `+` drops masks; masked "
                "GlobalAveragePooling1D; GlobalMaxPooling1D; Softmax with an explicit mask")


def zoo_ops():
    rng = fresh(13)
    x = keras.Input((4, 6), name="x")
    y = keras.Input((4, 6), name="y")
    arith = (x + y) * (x - y) / (ops.abs(y) + 1.0)
    power = x ** 2 + (-y)
    compare = ops.logical_or(ops.logical_and(ops.greater(x, y), ops.not_equal(x, 0.0)),
                             ops.logical_not(ops.less_equal(y, 0.5)))
    compare = ops.logical_or(compare, ops.equal(ops.round(x), 1.0))
    picked = ops.where(compare, x, y)
    as_float = ops.cast(compare, "float32")
    mm = ops.matmul(x, ops.transpose(y, axes=(0, 2, 1)))                 # [B, 4, 4]
    cat = ops.concatenate([x, y], axis=1)                                  # [B, 8, 6]
    flat = ops.reshape(cat, (-1, 48))                                      # [B, 48]
    squeezed = ops.squeeze(ops.expand_dims(x, 1), axis=1)
    reduced = ops.mean(x, axis=1, keepdims=True) + ops.sum(y, axis=-1, keepdims=True) + ops.max(x, axis=2, keepdims=True)
    unary = ops.exp(ops.tanh(x)) + ops.sqrt(ops.abs(y)) + ops.square(x) + ops.sigmoid(y) + ops.relu(x)
    bounds = ops.maximum(x, y) - ops.minimum(x, 0.25)
    scalars = x * 2.0 + (1.0 - y)
    outputs = [arith, power, picked, as_float, mm, flat, squeezed, reduced, unary, bounds, scalars]
    model = keras.Model([x, y], outputs, name="zoo_ops")
    inputs = {"x": rng.uniform(-2, 2, size=(2, 4, 6)).astype(np.float32),
              "y": rng.uniform(-2, 2, size=(2, 4, 6)).astype(np.float32)}
    inputs["x"][0, 0, :3] = 0.0  # not_equal(x, 0) matters
    inputs["x"][1, 1, :2] = 1.0  # equal(round(x), 1) matters
    write_model("zoo_ops", model, inputs,
                "keras.ops and Python operators on symbolic tensors, recorded as operation nodes")


def zoo_mha():
    rng = fresh(14)
    q = keras.Input((5, 6), name="query")
    v = keras.Input((7, 4), name="value")
    mask = keras.Input((5, 7), dtype="int32", name="attention_mask")
    grid = keras.Input((3, 4, 6), name="grid")
    outputs = [
        layers.MultiHeadAttention(num_heads=2, key_dim=3, value_dim=5, output_shape=7, use_bias=False,
                                  name="mha_values")(q, v, attention_mask=mask),
        layers.MultiHeadAttention(num_heads=3, key_dim=2, name="mha_key")(q, v, key=layers.Dense(3, name="key_proj")(v)),
        layers.MultiHeadAttention(num_heads=2, key_dim=2, attention_axes=(2,), name="mha_axes")(grid, grid),
        layers.MultiHeadAttention(num_heads=2, key_dim=3, name="mha_causal")(q, q, use_causal_mask=True),
    ]
    model = keras.Model([q, v, mask, grid], outputs, name="zoo_mha")
    randomise(model, rng)
    mask_value = (rng.uniform(size=(2, 5, 7)) > 0.3).astype(np.int32)
    mask_value[0, 1] = 0  # a query row that sees no key
    inputs = {"query": rng.normal(size=(2, 5, 6)).astype(np.float32),
              "value": rng.normal(size=(2, 7, 4)).astype(np.float32),
              "attention_mask": mask_value,
              "grid": rng.normal(size=(2, 3, 4, 6)).astype(np.float32)}
    write_model("zoo_mha", model, inputs,
                "MultiHeadAttention: value_dim/output_shape/use_bias=False with an attention_mask input (one fully "
                "masked row), distinct key, attention_axes=(2,) on rank 4, use_causal_mask")


def zoo_axial():
    """Axial attention: MultiHeadAttention over each position axis of rank-4, rank-5 and rank-6
    inputs, alone, in pairs and by Keras' default (`attention_axes=None`: every axis between the
    batch and the features; not at rank 6, whose scores TensorFlow's softmax cannot take), as an
    image or video model attends row by row and column by column."""
    rng = fresh(21)
    image = keras.Input((6, 8, 5), name="image")
    video = keras.Input((3, 4, 5, 6), name="video")
    volume = keras.Input((2, 3, 2, 3, 4), name="volume")

    def attention(x, axes, name, heads=2, size=3):
        return layers.MultiHeadAttention(num_heads=heads, key_dim=size, attention_axes=axes, name=name)(x, x)

    rows = attention(image, [2], "row_attention")
    columns = attention(rows, [1], "column_attention")
    outputs = [
        columns,
        attention(image, None, "image_attention"),
        attention(image, [-2], "negative_axis_attention"),
        attention(video, [1], "time_attention"),
        attention(video, [2], "height_attention"),
        attention(video, [3], "width_attention"),
        attention(video, [1, 3], "time_width_attention"),
        attention(video, None, "video_attention"),
        attention(volume, [2, 4], "volume_pair_attention"),
        attention(volume, [3], "volume_axis_attention"),
    ]
    model = keras.Model([image, video, volume], outputs, name="zoo_axial")
    randomise(model, rng)
    inputs = {"image": rng.normal(size=(2, 6, 8, 5)).astype(np.float32),
              "video": rng.normal(size=(2, 3, 4, 5, 6)).astype(np.float32),
              "volume": rng.normal(size=(2, 2, 3, 2, 3, 4)).astype(np.float32)}
    write_model("zoo_axial", model, inputs,
                "MultiHeadAttention over each axis of rank-4, rank-5 and rank-6 inputs, pairs of axes, and "
                "attention_axes=None (every position axis) at ranks 4 and 5")


# --------------------------------------------------------------------------------------------
# 7. Files that a converter must refuse
# --------------------------------------------------------------------------------------------

@keras.saving.register_keras_serializable(package="make_keras_models")
class ScaleShift(layers.Layer):
    """A custom layer: x * scale + shift, per feature."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(input_shape[-1],), initializer="ones", name="scale")
        self.shift = self.add_weight(shape=(input_shape[-1],), initializer="zeros", name="shift")

    def call(self, x):
        return x * self.scale + self.shift


def zoo_1d():
    rng = fresh(15)
    x = keras.Input((7, 3), name="signal")
    outputs = [
        layers.UpSampling1D(size=3, name="up_3")(x),
        layers.ZeroPadding1D(padding=(1, 2), name="pad_1_2")(x),
        layers.ZeroPadding1D(padding=2, data_format="channels_first", name="pad_channels_first")(x),
        layers.Cropping1D(cropping=(2, 1), name="crop_2_1")(x),
        layers.Cropping1D(cropping=(1, 0), name="crop_1_0")(x),
        layers.DepthwiseConv1D(3, depth_multiplier=2, padding="same", name="depthwise_same_m2")(x),
        layers.DepthwiseConv1D(2, strides=2, use_bias=False, data_format="channels_first",
                               name="depthwise_strided_channels_first")(layers.Permute((2, 1))(x)),
        layers.SeparableConv1D(4, 3, depth_multiplier=2, padding="same", activation="tanh", name="separable_same")(x),
        layers.SeparableConv1D(5, 2, dilation_rate=2, name="separable_dilated")(x),
    ]
    model = keras.Model(x, outputs, name="zoo_1d")
    randomise(model, rng)
    write_model("zoo_1d", model, {"signal": rng.normal(size=(2, 7, 3)).astype(np.float32)},
                "1-D resampling: UpSampling1D(3), ZeroPadding1D((1, 2)) and (2, channels_first), Cropping1D((2, 1)) "
                "and ((1, 0)); DepthwiseConv1D (same, depth 2; strided channels_first) and SeparableConv1D (same "
                "tanh, dilated)")


def zoo_vision():
    rng = fresh(16)
    x = keras.Input((9, 8, 3), name="image")
    xt = layers.Permute((3, 1, 2), name="to_channels_first")(x)  # [B, 3, 9, 8]
    outputs = [
        layers.Conv2D(4, 3, strides=2, padding="same", name="conv_strided_same")(x),
        layers.Conv2D(4, (2, 3), padding="same", name="conv_same_even")(x),
        layers.Conv2D(4, 3, dilation_rate=2, name="conv_dilated_valid")(x),
        layers.Conv2D(6, 3, groups=3, padding="same", activation="relu", name="conv_groups_relu")(x),
        layers.Conv2D(5, (3, 2), strides=(2, 1), use_bias=False, name="conv_nobias_strides_2_1")(x),
        layers.Conv2D(4, 3, padding="same", data_format="channels_first", name="conv_channels_first")(xt),
        layers.DepthwiseConv2D(3, depth_multiplier=2, padding="same", name="depthwise_same_m2")(x),
        layers.DepthwiseConv2D((2, 2), strides=2, use_bias=False, name="depthwise_strided")(x),
        layers.SeparableConv2D(5, 3, depth_multiplier=2, padding="same", activation="tanh", name="separable_same")(x),
        layers.SeparableConv2D(4, (3, 2), strides=2, name="separable_strided")(x),
        layers.MaxPooling2D((3, 3), strides=2, padding="same", name="max_same")(x),
        layers.MaxPooling2D(name="max_valid")(x),
        layers.AveragePooling2D((2, 3), padding="same", name="avg_same")(x),
        layers.AveragePooling2D(3, strides=1, padding="same", name="avg_same_stride_1")(x),
        layers.MaxPooling2D(2, data_format="channels_first", name="max_channels_first")(xt),
        layers.GlobalAveragePooling2D(name="gap")(x),
        layers.GlobalMaxPooling2D(keepdims=True, name="gmp_keepdims")(x),
        layers.GlobalAveragePooling2D(data_format="channels_first", name="gap_channels_first")(xt),
        layers.ZeroPadding2D(((1, 2), (0, 3)), name="pad")(x),
        layers.ZeroPadding2D(2, data_format="channels_first", name="pad_channels_first")(xt),
        layers.Cropping2D(((1, 2), (2, 0)), name="crop")(x),
        layers.Cropping2D(1, data_format="channels_first", name="crop_channels_first")(xt),
        layers.UpSampling2D((2, 3), name="up_nearest")(x),
        layers.UpSampling2D(2, interpolation="bilinear", name="up_bilinear")(x),
        layers.UpSampling2D((3, 2), interpolation="bilinear", data_format="channels_first",
                            name="up_bilinear_channels_first")(xt),
        ops.image.extract_patches(x, 3, strides=2, padding="same"),
        ops.image.extract_patches(x, (2, 3), strides=1, dilation_rate=2),
        ops.image.extract_patches(xt, 2, data_format="channels_first"),
    ]
    model = keras.Model(x, outputs, name="zoo_vision")
    randomise(model, rng)
    write_model("zoo_vision", model, {"image": rng.normal(size=(2, 9, 8, 3)).astype(np.float32)},
                "Conv2D (strides, even kernel, dilation, groups, channels_first), DepthwiseConv2D, "
                "SeparableConv2D, Max/AveragePooling2D valid and same, GlobalAverage/MaxPooling2D, "
                "ZeroPadding2D, Cropping2D, UpSampling2D nearest and bilinear, ops.image.extract_patches "
                "(same with strides, dilated, channels_first)")


def zoo_preprocessing():
    rng = fresh(17)
    images = rng.uniform(0, 255, size=(2, 10, 12, 3)).astype(np.float32)
    x = keras.Input((10, 12, 3), name="image")
    f = keras.Input((6, 4), name="features")
    xt = layers.Permute((3, 1, 2), name="to_channels_first")(x)
    adapted = layers.Normalization(axis=-1, name="norm_adapted")
    adapted.adapt(images)
    adapted_hw = layers.Normalization(axis=(1, 2), invert=True, name="norm_adapted_invert_hw")
    adapted_hw.adapt(images[:, :, :, :1].repeat(3, axis=3) / 100.0)
    groups = [
        layers.GroupNormalization(groups=2, name="group_norm_2"),
        layers.GroupNormalization(groups=3, axis=1, center=False, epsilon=1e-2, name="group_norm_axis_1"),
        layers.GroupNormalization(groups=-1, name="instance_norm"),
    ]
    outputs = [
        layers.Rescaling(1.0 / 255, offset=-0.5, name="rescale")(x),
        layers.Rescaling([0.5, 2.0, -1.0], offset=0.25, name="rescale_per_channel")(x),
        adapted(x),
        adapted_hw(x),
        layers.Normalization(mean=[100.0, 120.0, 140.0], variance=[400.0, 900.0, 1e-16], name="norm_given")(x),
        layers.Normalization(axis=None, mean=2.0, variance=4.0, invert=True, name="norm_scalar_invert")(x),
        layers.Resizing(6, 7, name="resize_down")(x),
        layers.Resizing(15, 16, interpolation="nearest", name="resize_nearest_up")(x),
        layers.Resizing(7, 5, interpolation="nearest", name="resize_nearest_down")(x),
        layers.Resizing(8, 8, crop_to_aspect_ratio=True, name="resize_crop_aspect")(x),
        layers.Resizing(9, 5, data_format="channels_first", name="resize_channels_first")(xt),
        layers.CenterCrop(6, 8, name="center_crop")(x),
        layers.CenterCrop(12, 6, name="center_crop_smaller")(x),
        layers.RandomFlip(name="random_flip")(x),
        layers.RandomRotation(0.2, name="random_rotation")(x),
        layers.RandomZoom(0.3, name="random_zoom")(x),
        layers.RandomContrast(0.5, name="random_contrast")(x),
        layers.RandomTranslation(0.1, 0.2, name="random_translation")(x),
        layers.RandomBrightness(0.2, name="random_brightness")(x),
        layers.RandomCrop(5, 6, name="random_crop")(x),
        layers.UnitNormalization(name="unit_norm")(f),
        layers.UnitNormalization(axis=[1, 2], name="unit_norm_1_2")(f),
    ] + [g(f) for g in groups]
    model = keras.Model([x, f], outputs, name="zoo_preprocessing")
    for g in groups:
        for weight in g.weights:
            weight.assign(rng.normal(scale=0.5, size=weight.shape).astype(np.float32))
    write_model("zoo_preprocessing", model,
                {"image": images, "features": rng.normal(size=(2, 6, 4)).astype(np.float32)},
                "Rescaling (scalar, per channel), Normalization (adapted, adapted over (1, 2) inverted, given, "
                "scalar inverted), Resizing (bilinear down, nearest up and down, crop_to_aspect_ratio, "
                "channels_first), CenterCrop (crop, smaller image), the Random* augmentations at inference, "
                "UnitNormalization, GroupNormalization (2 groups, axis 1, instance)")


def zoo_attention_layers():
    rng = fresh(18)
    tokens = keras.Input((6,), dtype="int32", name="tokens")
    frames = keras.Input((5, 4), name="frames")
    embedded = layers.Embedding(30, 4, mask_zero=True, name="embed")(tokens)  # masked [B, 6, 4]
    outputs = [
        layers.Attention(name="dot")([frames, embedded]),
        layers.Attention(use_scale=True, name="dot_scaled_key")([frames, embedded, embedded]),
        layers.Attention(score_mode="concat", use_scale=True, name="concat_scaled")([embedded, frames]),
        layers.Attention(name="self_causal")([embedded, embedded], use_causal_mask=True),
        layers.AdditiveAttention(name="additive")([frames, embedded]),
        layers.AdditiveAttention(use_scale=False, name="additive_unscaled_masked_query")([embedded, frames]),
    ]
    output, scores = layers.Attention(name="dot_scores")([embedded, frames], return_attention_scores=True)
    outputs += [output, scores]
    model = keras.Model([tokens, frames], outputs, name="zoo_attention_layers")
    randomise(model, rng)
    ids = padded_tokens(rng, 2, 6, [2, 0], vocab=30)
    write_model("zoo_attention_layers", model,
                {"tokens": ids, "frames": rng.normal(size=(2, 5, 4)).astype(np.float32)},
                "Attention (dot, use_scale with a key, concat, causal, returned scores) and AdditiveAttention "
                "(scaled, unscaled), with Embedding masks on the query and the value")


def zoo_indexing():
    rng = fresh(19)
    x = keras.Input((4, 6), name="x")
    y = keras.Input((4, 6), name="y")
    parts = ops.unstack(x, axis=1)
    pieces = ops.split(x, [2, 5], axis=2)
    halves = ops.split(y, 2, axis=1)
    outputs = [
        ops.stack([x, y], axis=1),
        ops.stack([x, y, x], axis=-1),
        parts[0], parts[3],
        pieces[0], pieces[1], pieces[2],
        halves[1],
        ops.tile(x, (1, 2, 1)),
        ops.tile(x, (3, 1)),
        x[:, 1],
        x[:, 1:3, ::2],
        x[..., -1],
        x[:, None, 2],
        x[:, -3:, 1:-1],
        ops.take(x, [0, 2, 5], axis=2),
        ops.take(x, 1, axis=1),
        ops.broadcast_to(ops.expand_dims(x[:, 0], 1), (2, 3, 6)),
    ]
    model = keras.Model([x, y], outputs, name="zoo_indexing")
    write_model("zoo_indexing", model,
                {"x": rng.normal(size=(2, 4, 6)).astype(np.float32), "y": rng.normal(size=(2, 4, 6)).astype(np.float32)},
                "stack, unstack, split (indices, sections), tile (aligned, shorter), x[...] (integers, slices with "
                "steps and negative bounds, ellipsis, new axis), take (list, scalar), broadcast_to")


def zoo_hub_ops():
    """The operations KerasHub's models call: pad (Whisper's `Padder`), take by a 2-D constant
    (T5's relative position buckets) and by a tensor, cumsum (Falcon's ALiBi), and
    dot_product_attention (grouped key heads, a mask with a fully hidden row, is_causal)."""
    rng = fresh(30)
    x = keras.Input((4, 6), name="x")
    ids = keras.Input((3, 2), dtype="int32", name="ids")  # in [-6, 6): negative ones from the end
    query = keras.Input((5, 4, 8), name="query")  # [B, T, N, H]
    key = keras.Input((7, 2, 8), name="key")  # [B, S, K, H]: two query heads per key head
    value = keras.Input((7, 2, 3), name="value")
    keep = keras.Input((1, 5, 7), dtype="int32", name="keep")  # [B, 1, T, S]
    bias = keras.Input((4, 5, 7), name="bias")  # [B, N, T, S]
    buckets = ops.convert_to_tensor(np.array([[0, 3, 1], [-1, 2, 2]], dtype="int32"))  # a __tensor__
    mask = ops.cast(keep, "bool")
    outputs = [
        ops.pad(x, [[0, 0], [1, 1], [0, 0]]),
        ops.pad(x, [[0, 0], [2, 0], [1, 3]], constant_values=1.5),
        ops.take(x, buckets, axis=1),  # [B, 2, 3, 6]
        ops.take(x, [[5, -2], [0, 1]], axis=-1),  # [B, 4, 2, 2]
        ops.take(x, ids, axis=2),  # [B, 4, B, 3, 2]
        ops.take(x, ids),  # [B, 3, 2]
        ops.cumsum(x, axis=1),
        ops.cumsum(ids, axis=-1),
        ops.cumsum(x, axis=2, dtype="int32"),
        ops.cumsum(ops.greater(x, 0.0), axis=1),
        ops.cumsum(x),
        ops.dot_product_attention(query, key, value, mask=mask),
        ops.dot_product_attention(query, query, query, is_causal=True),
        ops.dot_product_attention(query, key, value, bias=bias, mask=mask, scale=0.5, is_causal=True),
        ops.dot_product_attention(query, key, value, bias=bias),
    ]
    model = keras.Model([x, ids, query, key, value, keep, bias], outputs, name="zoo_hub_ops")
    keep_value = (rng.uniform(size=(2, 1, 5, 7)) > 0.3).astype(np.int32)
    keep_value[0, 0, 1] = 0  # a query row that sees no key: Keras' finite fill attends to all alike
    keep_value[1, 0, 0] = 0  # and under the causal mask too
    inputs = {"x": rng.uniform(-2, 2, size=(2, 4, 6)).astype(np.float32),
              "ids": rng.integers(-6, 6, size=(2, 3, 2)).astype(np.int32),
              "query": rng.normal(size=(2, 5, 4, 8)).astype(np.float32),
              "key": rng.normal(size=(2, 7, 2, 8)).astype(np.float32),
              "value": rng.normal(size=(2, 7, 2, 3)).astype(np.float32),
              "keep": keep_value,
              "bias": rng.normal(size=(2, 4, 5, 7)).astype(np.float32)}
    write_model("zoo_hub_ops", model, inputs,
                "pad (constant, constant_values), take (2-D constant tensor and list, int tensor indices on an axis "
                "and flattened, negative indices and axis), cumsum (float, int, dtype, bool, flattened), "
                "dot_product_attention (grouped heads, mask with fully hidden rows, is_causal, bias, scale)")


def zoo_shared_values():
    """Operation nodes that repeat a value, as a flattened graph records Keras' implicit masks:
    the same comparison twice, casts to the dtype a value has, and a cast that changes it."""
    rng = fresh(29)
    ids = keras.Input((6,), dtype="int32", name="ids")
    x = layers.Embedding(20, 8, name="embed")(ids)
    keep = ops.not_equal(ids, 0)  # [B, T], bool
    again = ops.not_equal(ids, 0)  # the same comparison, a node of its own
    pairs = ops.logical_and(ops.cast(keep, "bool")[:, :, None], ops.cast(again, "bool")[:, None, :])
    y = layers.MultiHeadAttention(num_heads=2, key_dim=4, name="mha")(x, x, attention_mask=pairs)
    weights = ops.cast(ops.cast(keep, "int32"), "float32")[:, :, None]  # two casts that change it
    pooled = ops.sum(y * weights, axis=1) / ops.sum(ops.cast(again, "float32"), axis=1, keepdims=True)
    model = keras.Model(ids, pooled, name="zoo_shared_values")
    randomise(model, rng)
    write_model("zoo_shared_values", model, {"ids": padded_tokens(rng, 3, 6, [2, 0, 4], vocab=20)},
                "a comparison recorded twice and casts to bool of booleans (computed once in the torch "
                "module), int and float casts, into an attention mask and a masked mean")


def zoo_transpose():
    rng = fresh(20)
    image = keras.Input((5, 4, 3), name="image")
    signal = keras.Input((7, 3), name="signal")
    image_t = layers.Permute((3, 1, 2), name="image_channels_first")(image)
    outputs = [
        layers.Conv2DTranspose(4, 3, strides=2, padding="same", name="t2d_same_s2")(image),
        layers.Conv2DTranspose(4, (2, 3), strides=(2, 1), name="t2d_valid")(image),
        layers.Conv2DTranspose(4, 2, strides=3, name="t2d_valid_kernel_below_stride")(image),
        layers.Conv2DTranspose(4, 3, strides=2, padding="same", output_padding=1, name="t2d_output_padding")(image),
        layers.Conv2DTranspose(4, 3, dilation_rate=2, padding="same", activation="relu", name="t2d_dilated")(image),
        layers.Conv2DTranspose(4, 4, strides=2, padding="same", use_bias=False, name="t2d_even_kernel")(image),
        layers.Conv2DTranspose(4, 3, strides=2, data_format="channels_first", name="t2d_channels_first")(image_t),
        layers.Conv1DTranspose(5, 3, strides=2, padding="same", name="t1d_same")(signal),
        layers.Conv1DTranspose(5, 4, strides=3, name="t1d_valid")(signal),
        layers.Conv1DTranspose(5, 3, strides=2, output_padding=1, name="t1d_output_padding")(signal),
    ]
    model = keras.Model([image, signal], outputs, name="zoo_transpose")
    randomise(model, rng)
    write_model("zoo_transpose", model,
                {"image": rng.normal(size=(2, 5, 4, 3)).astype(np.float32),
                 "signal": rng.normal(size=(2, 7, 3)).astype(np.float32)},
                "Conv2DTranspose (same/valid, strides, kernel below stride, output_padding, dilation, even kernel, "
                "channels_first) and Conv1DTranspose (same, valid, output_padding)")


def zoo_recurrent():
    rng = fresh(21)
    frames = keras.Input((7, 3), name="frames")
    tokens = keras.Input((6,), dtype="int32", name="tokens")
    masked = layers.Masking(mask_value=0.0, name="masking")(frames)        # interior and trailing masked steps
    embedded = layers.Embedding(20, 3, mask_zero=True, name="embed")(tokens)
    sequences = layers.LSTM(5, return_sequences=True, name="lstm_seq")(masked)
    pooled = layers.GlobalAveragePooling1D(name="pool")(sequences)          # the mask goes on with sequences
    gru_out, gru_state = layers.GRU(4, return_sequences=True, return_state=True, name="gru_states")(masked)
    gru_v1 = layers.GRU(3, reset_after=False, go_backwards=True, activation="relu",
                        recurrent_activation="hard_sigmoid", name="gru_v1")(embedded)
    rnn_relu = layers.SimpleRNN(2, activation="relu", use_bias=False, return_sequences=True, name="rnn_relu")(frames)
    backward = layers.LSTM(3, go_backwards=True, return_sequences=True, zero_output_for_mask=True,
                           unit_forget_bias=False, name="lstm_backward_zero")(masked)
    plain, plain_h, plain_c = layers.LSTM(4, return_state=True, name="lstm_plain")(frames)
    initial = layers.SimpleRNN(4, name="rnn_initial")(masked, initial_state=[gru_state])
    gru_plain = layers.GRU(2, name="gru_plain")(frames)
    model = keras.Model([frames, tokens], [pooled, gru_out, gru_state, gru_v1, rnn_relu, backward, plain, plain_h,
                                           plain_c, initial, gru_plain], name="zoo_recurrent")
    randomise(model, rng)
    frames_value = rng.normal(size=(3, 7, 3)).astype(np.float32)
    frames_value[0, 5:] = 0.0   # trailing padding
    frames_value[1, 2] = 0.0    # an interior masked step
    frames_value[1, 4] = 0.0
    frames_value[2, 0] = 0.0    # the first step masked
    tokens_value = padded_tokens(rng, 3, 6, [2, 0, 4], vocab=20)
    tokens_value[1, 3] = 0       # an interior padded token
    write_model("zoo_recurrent", model, {"frames": frames_value, "tokens": tokens_value},
                "LSTM, GRU (reset_after true and false) and SimpleRNN: return_sequences, return_state, "
                "go_backwards, zero_output_for_mask, initial_state, relu/hard_sigmoid activations, no bias; "
                "masks from Masking (interior, trailing and first steps) and Embedding(mask_zero)")


def zoo_bidirectional():
    rng = fresh(22)
    frames = keras.Input((6, 3), name="frames")
    masked = layers.Masking(mask_value=0.0, name="masking")(frames)
    concat = layers.Bidirectional(layers.LSTM(3, return_sequences=True), name="bi_concat")(masked)
    pooled = layers.GlobalAveragePooling1D(name="pool")(concat)             # the mask goes on
    summed = layers.Bidirectional(layers.GRU(2), merge_mode="sum", name="bi_sum")(masked)
    separate = layers.Bidirectional(layers.SimpleRNN(2, return_sequences=True), merge_mode=None,
                                    name="bi_none")(masked)
    mul, *states = layers.Bidirectional(layers.LSTM(2, return_state=True), merge_mode="mul",
                                        name="bi_mul_states")(frames)
    ave = layers.Bidirectional(layers.GRU(3, return_sequences=True), merge_mode="ave",
                               backward_layer=layers.GRU(3, return_sequences=True, go_backwards=True,
                                                         reset_after=False, activation="relu"),
                               name="bi_ave_own_backward")(masked)
    initial = layers.Bidirectional(layers.LSTM(2), name="bi_initial")(masked, initial_state=states)
    # Unmasked: torch's own bidirectional modules.
    plain_concat = layers.Bidirectional(layers.LSTM(2, return_sequences=True), name="bi_plain_concat")(frames)
    plain_ave = layers.Bidirectional(layers.GRU(2, return_sequences=True), merge_mode="ave",
                                     name="bi_plain_gru_ave")(frames)
    plain_rnn = layers.Bidirectional(layers.SimpleRNN(2, activation="relu"), merge_mode=None,
                                     name="bi_plain_rnn_none")(frames)
    model = keras.Model(frames, [pooled, summed, separate[0], separate[1], mul, *states, ave, initial,
                                 plain_concat, plain_ave, *plain_rnn], name="zoo_bidirectional")
    randomise(model, rng)
    frames_value = rng.normal(size=(3, 6, 3)).astype(np.float32)
    frames_value[0, 4:] = 0.0   # trailing padding
    frames_value[1, 1] = 0.0    # an interior masked step
    frames_value[2, 0] = 0.0    # the first step masked
    write_model("zoo_bidirectional", model, {"frames": frames_value},
                "Bidirectional around LSTM, GRU and SimpleRNN: merge modes concat, sum, None, mul, ave; "
                "return_sequences and not; return_state; a backward_layer of its own (reset_after=False, "
                "relu); initial_state; masks from Masking at interior, trailing and first steps; unmasked ones "
                "(torch's own bidirectional modules)")


def zoo_time_distributed():
    rng = fresh(23)
    frames = keras.Input((5, 3), name="frames")
    clips = keras.Input((4, 6, 2), name="clips")          # [B, T, L, C]: a short signal per step
    masked = layers.Masking(mask_value=0.0, name="masking")(frames)
    sequences = layers.LSTM(4, return_sequences=True, name="lstm")(masked)
    tagged = layers.TimeDistributed(layers.Dense(3, activation="softmax"), name="td_dense")(sequences)
    pooled = layers.GlobalAveragePooling1D(name="pool")(tagged)             # the mask goes on
    convolved = layers.TimeDistributed(layers.Conv1D(3, 3, padding="same", activation="relu"),
                                       name="td_conv")(clips)               # [B, 4, 6, 3]
    flat = layers.TimeDistributed(layers.Flatten(), name="td_flatten")(convolved)  # [B, 4, 18]
    normed = layers.TimeDistributed(layers.LayerNormalization(), name="td_norm")(flat)
    model = keras.Model([frames, clips], [tagged, pooled, normed], name="zoo_time_distributed")
    randomise(model, rng)
    frames_value = rng.normal(size=(2, 5, 3)).astype(np.float32)
    frames_value[0, 3:] = 0.0
    frames_value[1, 1] = 0.0
    write_model("zoo_time_distributed", model,
                {"frames": frames_value, "clips": rng.normal(size=(2, 4, 6, 2)).astype(np.float32)},
                "TimeDistributed over Dense (softmax, after a masked LSTM: the mask goes on), Conv1D on "
                "[B, T, L, C], Flatten and LayerNormalization")


def bench_lstm():
    """The recurrent row of the benchmark: LSTM(64, return_sequences=True) -> Dense(4) at
    [B, 136, 4] (crates/train/examples/model_step.rs, xtask/python/bench_models.py)."""
    rng = fresh(24)
    inputs = keras.Input((136, 4), name="series")
    x = layers.LSTM(64, return_sequences=True, name="lstm")(inputs)
    outputs = layers.Dense(4, name="head")(x)
    model = keras.Model(inputs, outputs, name="bench_lstm")
    randomise(model, rng, scale=0.1)
    write_model("bench_lstm", model, {"series": rng.normal(size=(2, 136, 4)).astype(np.float32)},
                "the benchmark's recurrent row: LSTM(64, return_sequences=True) -> Dense(4) at [B, 136, 4]")


def bench_timeseries():
    """A whole-model row of the benchmark: keras.io's time-series Transformer at the example's own
    sizes (head_size=256, num_heads=4, ff_dim=4, 4 blocks, mlp_units=[128], dropout 0.25/0.4) on
    [B, 136, 4] (xtask/python/bench_models.py)."""
    rng = fresh(25)
    model = build_model((136, 4), head_size=256, num_heads=4, ff_dim=4, num_transformer_blocks=4,
                        mlp_units=[128], dropout=0.25, mlp_dropout=0.4)
    randomise(model, rng, scale=0.1)
    write_model("bench_timeseries", model, {model.layers[0].name: rng.normal(size=(2, 136, 4)).astype(np.float32)},
                "the benchmark's keras.io time-series Transformer at the example's sizes on [B, 136, 4]")


def bench_forecaster():
    """A whole-model row of the benchmark: a causal forecaster on [B, 136, 4], three pre-norm blocks
    of the question's layer (MultiHeadAttention(num_heads=6, key_dim=4), use_causal_mask) and a
    Dense(16, gelu) -> Dense(4) feed-forward, dropout 0.1, a Dense(1) forecast per step."""
    rng = fresh(26)
    inputs = keras.Input((136, 4), name="series")
    x = inputs
    for _ in range(3):
        y = layers.LayerNormalization(epsilon=1e-6)(x)
        y = layers.MultiHeadAttention(num_heads=6, key_dim=4, dropout=0.1)(y, y, use_causal_mask=True)
        x = x + layers.Dropout(0.1)(y)
        y = layers.LayerNormalization(epsilon=1e-6)(x)
        y = layers.Dense(16, activation="gelu")(y)
        y = layers.Dense(4)(y)
        x = x + layers.Dropout(0.1)(y)
    outputs = layers.Dense(1, name="forecast")(x)
    model = keras.Model(inputs, outputs, name="bench_forecaster")
    randomise(model, rng, scale=0.1)
    write_model("bench_forecaster", model, {"series": rng.normal(size=(2, 136, 4)).astype(np.float32)},
                "the benchmark's causal forecaster: 3 pre-norm blocks of MultiHeadAttention(6, 4) causal on [B, 136, 4]")


def custom_dense():
    """`custom_dense.keras`: a user's class named `Dense` (a subclass doubling keras' Dense), which
    a reader must refuse as a custom layer, not read as keras.layers.Dense."""

    @keras.saving.register_keras_serializable(package="make_keras_models")
    class Dense(layers.Dense):
        def call(self, inputs):
            return super().call(inputs) * 2.0

    rng = fresh(27)
    x = keras.Input((4,), name="values")
    model = keras.Model(x, Dense(2, name="doubled")(x), name="custom_dense")
    randomise(model, rng)
    model.save(os.path.join(HERE, "custom_dense.keras"))
    keras.saving.get_custom_objects().pop("make_keras_models>Dense")
    print("wrote custom_dense.keras")


DROPOUT_DRAWS = 20000


def recurrent_dropout():
    """`recurrent_dropout.keras` and `recurrent_dropout.stats.safetensors`: recurrent layers with
    dropout and recurrent_dropout in training. Keras' random masks cannot be reproduced, but their
    law can: the probe input tiled DROPOUT_DRAWS times along the batch (each row draws its own
    masks) gives each output element's mean and standard deviation over that many draws, which
    depend on the rates, the scale 1 / (1 - rate), and which steps and gates share a mask."""
    rng = fresh(25)
    inputs = keras.Input((5, 2), name="series")
    outputs = [
        layers.SimpleRNN(3, dropout=0.4, recurrent_dropout=0.3, return_sequences=True, name="rnn")(inputs),
        layers.LSTM(3, dropout=0.5, return_sequences=True, name="lstm_inputs")(inputs),        # implementation 2
        layers.LSTM(3, dropout=0.3, recurrent_dropout=0.4, return_sequences=True, name="lstm_both")(inputs),  # 1
        layers.GRU(3, recurrent_dropout=0.5, return_sequences=True, name="gru_recurrent")(inputs),
        layers.GRU(3, dropout=0.2, recurrent_dropout=0.3, reset_after=False, return_sequences=True,
                   name="gru_v1")(inputs),
    ]
    model = keras.Model(inputs, outputs, name="recurrent_dropout")
    randomise(model, rng, scale=0.6)
    x = rng.normal(size=(4, 5, 2)).astype(np.float32)
    write_model("recurrent_dropout", model, {"series": x},
                "SimpleRNN, LSTM (implementation 2 and 1) and GRU (reset_after true and false) with dropout and "
                "recurrent_dropout; inference probe (dropout is the identity there)")
    tiled = np.tile(x, (DROPOUT_DRAWS, 1, 1))  # [N * 4, 5, 2]: row n * 4 + b is draw n of row b
    draws = model(tiled, training=True)
    tensors = {"inputs.series": x}
    for layer, out in zip(["rnn", "lstm_inputs", "lstm_both", "gru_recurrent", "gru_v1"], draws):
        out = np.asarray(out, dtype=np.float64).reshape(DROPOUT_DRAWS, *x.shape[:2], -1)
        tensors[f"mean.{layer}"] = out.mean(axis=0).astype(np.float32)
        tensors[f"std.{layer}"] = out.std(axis=0).astype(np.float32)
    save_file(tensors, os.path.join(HERE, "recurrent_dropout.stats.safetensors"),
              metadata={"keras_version": keras.__version__, "backend": BACKEND, "draws": str(DROPOUT_DRAWS),
                        "description": "per output element: mean and std over the draws of Keras' training-mode "
                                       "call on the probe input tiled along the batch"})
    print("wrote recurrent_dropout.stats.safetensors")


def small_model():
    """The valid model that the malformed archives are edited from."""
    x = keras.Input((4,), name="features")
    h = layers.Dense(5, activation="relu", name="hidden")(x)
    return keras.Model(x, layers.Dense(2, name="out")(h), name="small")


def load_error(path, **kwargs):
    """The first line of the error Keras raises loading `path`, or None if it loads."""
    try:
        keras.saving.load_model(path, **kwargs)
    except Exception as error:  # noqa: BLE001 - any refusal will do; we record it
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        message = lines[0][:200]
        if message.endswith(":") and len(lines) > 1:  # the useful part is on the next line
            message += " " + lines[1][:160]
        return f"{type(error).__name__}: {message}"
    return None


def rewrite_config(source, target, edit):
    """Copy the archive `source` to `target`, with `edit(config)` applied to config.json."""
    with zipfile.ZipFile(source) as archive:
        members = [(info, archive.read(info.filename)) for info in archive.infolist()]
    with zipfile.ZipFile(target, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for info, data in members:
            if info.filename == "config.json":
                config = json.loads(data)
                edit(config["config"])
                data = json.dumps(config).encode()
            archive.writestr(info, data)


def layer_entry(config, name):
    return next(layer for layer in config["layers"] if layer["name"] == name)


def ref(name, node=0, tensor=0, shape=(None, 5)):
    return {"class_name": "__keras_tensor__",
            "config": {"shape": list(shape), "dtype": "float32", "keras_history": [name, node, tensor]}}


def refusals():
    rng = fresh(20)
    errors = {}

    x = keras.Input((4,), name="values")
    h = layers.Dense(3, name="dense")(x)
    h = layers.Lambda(lambda t: t * 2.0, name="double")(h)
    model = keras.Model(x, layers.Dense(2, name="head")(h), name="lambda_layer")
    randomise(model, rng)
    model.save(os.path.join(HERE, "lambda_layer.keras"))

    x = keras.Input((4,), name="values")
    h = layers.Dense(3, activation=lambda t: keras.activations.gelu(t, approximate=True), name="dense_gelu_tanh")(x)
    model = keras.Model(x, layers.Dense(2, name="head")(h), name="lambda_activation")
    randomise(model, rng)
    model.save(os.path.join(HERE, "lambda_activation.keras"))

    x = keras.Input((4,), name="values")
    h = ScaleShift(name="scale_shift")(layers.Dense(3, name="dense")(x))
    model = keras.Model(x, layers.Dense(2, name="head")(h), name="custom_layer")
    randomise(model, rng)
    model.save(os.path.join(HERE, "custom_layer.keras"))

    base = small_model()
    randomise(base, rng)
    write_model("small", base, {"features": rng.normal(size=(2, 4)).astype(np.float32)},
                "Dense(5, relu) -> Dense(2): the valid model the malformed archives are edited from")
    source = os.path.join(HERE, "small.keras")

    def bad_weight_shape(config):  # config says 3 units, model.weights.h5 holds a [5, 2] kernel
        layer_entry(config, "out")["config"]["units"] = 3

    def missing_weights(config):  # a Dense layer that model.weights.h5 knows nothing of
        extra = json.loads(json.dumps(layer_entry(config, "out")))
        extra["name"] = extra["config"]["name"] = "extra"
        extra["config"]["units"] = 3
        extra["build_config"]["input_shape"] = [None, 2]
        extra["inbound_nodes"] = [{"args": [ref("out", shape=(None, 2))], "kwargs": {}}]
        config["layers"].append(extra)
        config["output_layers"] = [["extra", 0, 0]]

    def cycle(config):  # hidden <- out <- hidden
        layer_entry(config, "hidden")["inbound_nodes"] = [{"args": [ref("out", shape=(None, 2))], "kwargs": {}}]

    def dangling(config):  # out <- a layer that does not exist
        layer_entry(config, "out")["inbound_nodes"] = [{"args": [ref("ghost")], "kwargs": {}}]

    for name, edit in [("bad_weight_shape", bad_weight_shape), ("missing_weights", missing_weights),
                       ("cycle", cycle), ("dangling", dangling)]:
        rewrite_config(source, os.path.join(HERE, f"{name}.keras"), edit)
    with open(source, "rb") as f:
        data = f.read()
    with open(os.path.join(HERE, "truncated.keras"), "wb") as f:
        f.write(data[:len(data) // 2])

    # As a reader that does not hold the class sees it:
    keras.saving.get_custom_objects().pop("make_keras_models>ScaleShift")
    for name in ["lambda_layer", "lambda_activation", "custom_layer", "bad_weight_shape", "missing_weights",
                 "cycle", "dangling", "truncated"]:
        errors[name] = load_error(os.path.join(HERE, f"{name}.keras"))
    errors["lambda_layer (safe_mode=False)"] = load_error(os.path.join(HERE, "lambda_layer.keras"), safe_mode=False)
    for name, error in errors.items():
        print(f"  keras.saving.load_model({name}): {error or 'loads'}")
    return errors


# --------------------------------------------------------------------------------------------
# 8. A training trajectory of the timeseries model (dropout 0)
# --------------------------------------------------------------------------------------------

TRAIN_STEPS, TRAIN_BATCH = 3, 4
ADAM = dict(learning_rate=1e-3)


def train(model, xs, ys, dtype):
    """The reference loop: `optimizer.apply` on GradientTape gradients, one batch per step.

    Returns (losses before each update, grads of step 0, weights after step 1, final weights), keyed by
    `variable.path`.
    """
    import tensorflow as tf  # the backend; GradientTape is its autodiff

    optimizer = keras.optimizers.Adam(**ADAM)
    loss_fn = keras.losses.SparseCategoricalCrossentropy()  # probabilities in, mean over the batch
    variables = model.trainable_variables
    losses, grads0, step1 = [], None, None
    for step in range(len(xs)):
        with tf.GradientTape() as tape:
            probs = model(xs[step].astype(dtype), training=True)
            loss = loss_fn(ys[step], probs)
        grads = tape.gradient(loss, variables)
        losses.append(float(loss))
        if step == 0:
            grads0 = {v.path: np.asarray(g, dtype=np.float64) for v, g in zip(variables, grads)}
        optimizer.apply(grads, variables)
        if step == 0:
            step1 = {v.path: np.asarray(v, dtype=np.float64) for v in variables}
    final = {v.path: np.asarray(v, dtype=np.float64) for v in variables}
    return losses, grads0, step1, final, optimizer


def timeseries_train():
    trajectory("timeseries_train", lambda: build_model(**TIMESERIES, dropout=0.0, mlp_dropout=0.0), 30,
               "keras.io timeseries Transformer classifier (dropout 0) trained for 3 Adam steps, one new batch "
               "per step", {**TIMESERIES, "dropout": 0.0, "mlp_dropout": 0.0, "n_classes": n_classes})


def lstm_attention_classifier():
    """A time-series classifier with attention on a recurrent layer: LSTM -> self-attention ->
    masked-free average pooling -> softmax, at the question's [B, 136, 4]."""
    inputs = keras.Input((136, 4), name="series")
    x = layers.LSTM(8, return_sequences=True, name="lstm")(inputs)
    x = layers.MultiHeadAttention(num_heads=2, key_dim=4, name="attention")(x, x)
    x = layers.GlobalAveragePooling1D(name="pool")(x)
    outputs = layers.Dense(n_classes, activation="softmax", name="classes")(x)
    return keras.Model(inputs, outputs, name="lstm_attention_classifier")


def recurrent_train():
    trajectory("recurrent_train", lstm_attention_classifier, 31,
               "LSTM(8) -> MultiHeadAttention(2 heads, key_dim 4) -> GlobalAveragePooling1D -> Dense softmax "
               "at [B, 136, 4], trained for 3 Adam steps, one new batch per step",
               {"lstm_units": 8, "num_heads": 2, "key_dim": 4, "n_classes": n_classes})


def trajectory(case, make_model, seed, description, model_config):
    """`<case>.keras` and `<case>.trajectory.safetensors`: the model `make_model()` builds, its
    weights drawn with `seed`, trained 3 Adam steps by the reference loop in float64 (and float32,
    and compile + train_on_batch, for the drift between them)."""
    rng = fresh(seed)
    model = make_model()
    randomise(model, rng, scale=0.3)
    xs = rng.normal(size=(TRAIN_STEPS, TRAIN_BATCH, 136, 4)).astype(np.float32)
    ys = rng.integers(0, n_classes, size=(TRAIN_STEPS, TRAIN_BATCH)).astype(np.int32)
    write_model(case, model, {model.layers[0].name: xs[0, :2]},
                f"{description}: the start of {case}.trajectory.safetensors")
    init = {v.path: np.asarray(v) for v in model.trainable_variables}

    # float32, the real Keras fit path: compile + train_on_batch (loss returned = before the update)
    keras_losses = []
    model.compile(optimizer=keras.optimizers.Adam(**ADAM), loss="sparse_categorical_crossentropy")
    for step in range(TRAIN_STEPS):
        keras_losses.append(float(model.train_on_batch(xs[step], ys[step])))
    fit_final = {v.path: np.asarray(v, dtype=np.float64) for v in model.trainable_variables}

    # float32, the reference loop
    fresh(seed)
    model32 = make_model()
    for v in model32.trainable_variables:
        v.assign(init[v.path])
    losses32, grads32, step1_32, final32, _ = train(model32, xs, ys, np.float32)

    # float64, the reference: the same architecture with floatx float64, float32 weights and data cast up
    fresh(seed)
    keras.config.set_floatx("float64")
    try:
        model64 = make_model()
        assert all(v.dtype == "float64" for v in model64.weights)
        for v in model64.trainable_variables:
            v.assign(init[v.path].astype(np.float64))
        losses, grads0, step1, final, optimizer = train(model64, xs, ys, np.float64)
        optimizer_config = optimizer.get_config()
    finally:
        keras.config.set_floatx("float32")

    names = sorted(init)
    assert names == sorted(final) and len(names) == len(model.trainable_variables)
    drift = {
        "loss_max_abs": max(abs(a - b) for a, b in zip(losses, losses32)),
        "loss_per_step": [a - b for a, b in zip(losses32, losses)],
        "final_max_abs": max(float(np.abs(final32[n] - final[n]).max()) for n in names),
        "step1_max_abs": max(float(np.abs(step1_32[n] - step1[n]).max()) for n in names),
        "grads0_max_abs": max(float(np.abs(grads32[n] - grads0[n]).max()) for n in names),
        "compile_train_on_batch_loss_max_abs": max(abs(a - b) for a, b in zip(keras_losses, losses32)),
        "compile_train_on_batch_final_max_abs": max(float(np.abs(fit_final[n] - final32[n]).max()) for n in names),
    }
    tensors = {"data.x": xs, "data.y": ys, "expected.loss": np.array(losses, dtype=np.float32)}
    for prefix, values in [("init", init), ("grads0", grads0), ("step1", step1), ("final", final)]:
        tensors.update({f"{prefix}.{n}": np.ascontiguousarray(values[n], dtype=np.float32) for n in names})
    import tensorflow as tf
    config = {
        "case": case,
        "framework": "keras", "framework_version": keras.__version__,
        "backend": BACKEND, "backend_version": tf.__version__,
        "description": description,
        "model_file": f"{case}.keras",
        "model": {**model_config,
                  "init": f"every trainable weight N(0, 0.3^2) (numpy default_rng({seed})), biases included"},
        "steps": TRAIN_STEPS, "batch": TRAIN_BATCH, "seq_len": 136, "input_dim": 4,
        "data": "x ~ N(0, 1) float32 [N, B, 136, 4]; y uniform in {0, 1} int32 [N, B]; step i uses data.x[i], data.y[i]",
        "loss": "sparse_categorical_crossentropy",
        "loss_formula": "mean over the batch of -log(clip(p[b, y_b], 1e-7, 1 - 1e-7)), p = the model's softmax "
                        "output (keras.losses.SparseCategoricalCrossentropy(), from_logits=False, "
                        "reduction sum_over_batch_size)",
        "loss_timing": "expected.loss[i] is computed with the weights before update i",
        "optimizer": {"name": "adam", "hyperparameters": optimizer_config,
                      "formula": "t = i + 1; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; "
                                 "lr_t = lr sqrt(1 - b2^t) / (1 - b1^t); w -= lr_t m / (sqrt(v) + eps) "
                                 "(Keras 3 Adam, amsgrad False, no weight decay)",
                      "driver": "GradientTape gradients of the loss above, then optimizer.apply(grads, "
                                "model.trainable_variables); model(x, training=True)"},
        "precision": "float64 reference: keras.config.set_floatx('float64'), the same architecture rebuilt, "
                     "the float32 init and data cast up exactly; stored rounded to float32",
        "expected_loss_float64": losses,
        "f32_drift": drift,
        "compile_train_on_batch_losses_f32": keras_losses,
        "weight_names": names,
    }
    path = os.path.join(HERE, f"{case}.trajectory.safetensors")
    save_file(tensors, path, metadata={"keras_version": keras.__version__, "backend": BACKEND,
                                       "description": config["description"], "config": json.dumps(config)})
    print(f"wrote {case}.trajectory.safetensors: losses {losses}, f32 drift {drift}")


MODELS = [
    timeseries_transformer,
    text_classifier,
    sequential,
    two_in_two_out,
    nested,
    zoo_conv,
    zoo_pool,
    zoo_norm,
    zoo_activations,
    zoo_merge,
    zoo_reshape,
    zoo_masks,
    zoo_ops,
    zoo_mha,
    zoo_axial,
    zoo_1d,
    zoo_vision,
    zoo_preprocessing,
    zoo_attention_layers,
    zoo_indexing,
    zoo_hub_ops,
    zoo_shared_values,
    zoo_transpose,
    zoo_recurrent,
    zoo_bidirectional,
    zoo_time_distributed,
    bench_lstm,
    bench_timeseries,
    bench_forecaster,
    custom_dense,
    recurrent_dropout,
    refusals,
    timeseries_train,
    recurrent_train,
]


def main():
    """Every model, or those named on the command line (`zoo_1d refusals`)."""
    import sys

    chosen = sys.argv[1:]
    unknown = set(chosen) - {m.__name__ for m in MODELS}
    if unknown:
        raise SystemExit(f"unknown models {sorted(unknown)}; choose from {[m.__name__ for m in MODELS]}")
    for make in MODELS:
        if not chosen or make.__name__ in chosen:
            make()


if __name__ == "__main__":
    main()
