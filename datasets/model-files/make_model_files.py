"""Model files written by the real Keras 3 and torch, for `cargo xtask convert`'s tests.

Run from the repository root (import torch before tensorflow if both are used):

    python3 datasets/model-files/make_model_files.py

Writes, next to this script:

* `functional.keras` and `functional.weights.h5`: a functional model with two
  `MultiHeadAttention` layers among other layers: `attn_values` (value_dim != key_dim,
  output_shape set) and `attn_nobias` (use_bias=False, distinct key input);
* `nested.keras`: a model holding a sub-model that holds an attention layer;
* `gated.keras`: an attention layer with `use_gate=True` and `sliding_window=3`;
* `torch_packed.pt`: the state dict of a module holding `nn.MultiheadAttention(8, 2)` (packed
  `in_proj_weight`) under `attn.`, among a LayerNorm and a Linear;
* `torch_kdim.pt`: a bare `nn.MultiheadAttention(8, 2, kdim=5, vdim=6, bias=False)` state dict
  (separate `q/k/v_proj_weight`);
* `torch_checkpoint.pt`: a checkpoint dict `{"epoch", "model_state_dict": <torch_packed's>}`;
* `torch_full_module.pt`: `torch.save(module)` of that module, a pickle that names its class
  (read without importing or running it);
* `torch_projected.pt`: the state dict of a module holding the seed's port under `port.`:
  `Linear(4, 24) + nn.MultiheadAttention(24, 6) + Linear(24, 4)` as `proj`, `mha`, `final`;
* `sequential_custom.keras`: a Sequential model whose custom layer holds the attention layer as an
  attribute (no entry in the config's layer lists; found by the weights' layout);
* `dense_only.keras`: a model without attention layers (a bad input for `convert`);
* `axes.keras`: attention over two axes of an image-like input (`attention_axes=(1, 2)` on
  `[B, 3, 4, 6]`), with `axes.probe.safetensors` (`axes.query [2, 3, 4, 6]`, `axes.output`);
* `mixed.keras` and `torch_mixed.pt`: files in which one layer cannot be converted beside layers
  that can, for `convert`'s listing and choosing: `mixed.keras` holds `attn_ok` and `attn_2d_out`
  (`output_shape=(2, 3)`, a multi-axis output this project refuses), with `mixed.probe.safetensors`;
  `torch_mixed.pt` holds `nn.MultiheadAttention(12, 3)` under `wide.`, `nn.MultiheadAttention(10, 2)`
  under `narrow.` (no one `--num-heads` fits both) and `nn.MultiheadAttention(8, 2, add_bias_kv=True)`
  under `biased.` (no Keras counterpart);
* `<file stem>.probe.safetensors`: for each attention layer, a probe `query`, `value` and `key`
  and the real layer's output on them (`<layer>.query`, `<layer>.value`, `<layer>.key`,
  `<layer>.output`), so the tests check our reading without Python.
"""

import json
import os

import numpy as np
import torch  # before tensorflow: the other order aborts here

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


@keras.saving.register_keras_serializable(package="make_model_files")
class TransformerBlock(layers.Layer):
    """A custom layer holding an attention layer, as Keras text models write them."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attention = layers.MultiHeadAttention(num_heads=2, key_dim=3, name="inner_attention")
        self.mix = layers.Dense(FEATURES)

    def call(self, x):
        return self.mix(self.attention(x, x))


def sequential_custom():
    return keras.Sequential([keras.Input((SEQ, FEATURES)), layers.Dense(FEATURES), TransformerBlock(name="block")], name="sequential_custom")


def gated():
    inputs = keras.Input((SEQ, FEATURES))
    outputs = layers.MultiHeadAttention(num_heads=2, key_dim=4, use_gate=True, sliding_window=3, name="gated")(inputs, inputs)
    return keras.Model(inputs, outputs, name="gated_model")


def dense_only():
    inputs = keras.Input((SEQ, FEATURES))
    return keras.Model(inputs, layers.Dense(2)(layers.Dense(4)(inputs)), name="no_attention")


def axes():
    inputs = keras.Input((3, 4, 6))
    outputs = layers.MultiHeadAttention(num_heads=2, key_dim=3, attention_axes=(1, 2), name="axes")(inputs, inputs)
    return keras.Model(inputs, outputs, name="image_attention")


def mixed():
    inputs = keras.Input((SEQ, FEATURES))
    a = layers.MultiHeadAttention(num_heads=2, key_dim=4, name="attn_ok")(inputs, inputs)
    b = layers.MultiHeadAttention(num_heads=2, key_dim=3, output_shape=(2, 3), name="attn_2d_out")(a, a)
    return keras.Model(inputs, [a, b], name="mixed")


class Mixed(torch.nn.Module):
    """Three attention layers that no one reading fits: two head counts, and add_bias_kv."""

    def __init__(self):
        super().__init__()
        self.wide = torch.nn.MultiheadAttention(12, 3, batch_first=True)
        self.narrow = torch.nn.MultiheadAttention(10, 2, batch_first=True)
        self.biased = torch.nn.MultiheadAttention(8, 2, add_bias_kv=True, batch_first=True)


def mixed_files():
    """`mixed.keras`, its probe and `torch_mixed.pt`, from their own generator (the files above do not move)."""
    keras.utils.set_random_seed(13)
    rng = np.random.default_rng(13)
    model = mixed()
    randomise(model, rng)
    model.save(os.path.join(HERE, "mixed.keras"))
    save_file(probes(model, rng), os.path.join(HERE, "mixed.probe.safetensors"),
              metadata={"keras": keras.__version__, "layers": json.dumps([l.name for l in attention_layers(model)])})
    torch.manual_seed(13)
    net = Mixed()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(torch.from_numpy(rng.normal(scale=0.5, size=tuple(p.shape)).astype(np.float32)))
    torch.save(net.state_dict(), os.path.join(HERE, "torch_mixed.pt"))
    print("wrote mixed.keras (attn_ok, attn_2d_out) and torch_mixed.pt (wide., narrow., biased.)")


def attention_layers(model):
    """Every MultiHeadAttention in `model`, nested models and custom layers included."""
    found = []
    for layer in model.layers:
        if isinstance(layer, layers.MultiHeadAttention):
            found.append(layer)
        elif isinstance(layer, keras.Model):
            found.extend(attention_layers(layer))
        elif isinstance(getattr(layer, "attention", None), layers.MultiHeadAttention):
            found.append(layer.attention)
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


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(FEATURES)
        self.attn = torch.nn.MultiheadAttention(FEATURES, 2, batch_first=True)
        self.head = torch.nn.Linear(FEATURES, 3)


class Projected(torch.nn.Module):
    """Linear(in, E) -> nn.MultiheadAttention(E, h) self-attention -> Linear(E, out)."""

    def __init__(self, in_features, embed_dim, num_heads, output_dim):
        super().__init__()
        self.proj = torch.nn.Linear(in_features, embed_dim)
        self.mha = torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)
        self.final = torch.nn.Linear(embed_dim, output_dim)

    def forward(self, x):
        z = self.proj(x)
        return self.final(self.mha(z, z, z, need_weights=False)[0])


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.port = Projected(4, 24, 6, 4)


def torch_probe(mha, name, rng):
    """The probe `<name>.query/key/value` and torch's output on it (`need_weights=False`)."""
    kdim, vdim = mha.kdim, mha.vdim
    query = rng.normal(size=(PROBE_BATCH, SEQ, mha.embed_dim)).astype(np.float32)
    key = rng.normal(size=(PROBE_BATCH, SEQ + 3, kdim)).astype(np.float32)
    value = rng.normal(size=(PROBE_BATCH, SEQ + 3, vdim)).astype(np.float32)
    mha.eval()
    with torch.no_grad():
        output, _ = mha(*(torch.from_numpy(t) for t in (query, key, value)), need_weights=False)
    return {f"{name}.query": query, f"{name}.key": key, f"{name}.value": value, f"{name}.output": np.ascontiguousarray(output.numpy())}  # the output can be a strided view


def torch_files(rng):
    torch.manual_seed(7)
    block = Block()
    bare = torch.nn.MultiheadAttention(FEATURES, 2, kdim=5, vdim=6, bias=False, batch_first=True)
    for module in (block, bare):
        with torch.no_grad():
            for p in module.parameters():
                p.copy_(torch.from_numpy(rng.normal(scale=0.5, size=tuple(p.shape)).astype(np.float32)))
    torch.save(block.state_dict(), os.path.join(HERE, "torch_packed.pt"))
    torch.save(bare.state_dict(), os.path.join(HERE, "torch_kdim.pt"))
    torch.save({"epoch": 3, "model_state_dict": block.state_dict()}, os.path.join(HERE, "torch_checkpoint.pt"))
    torch.save(block, os.path.join(HERE, "torch_full_module.pt"))
    net = Net()
    with torch.no_grad():  # scale 0.2: outputs of order 1, so float32 rounding stays far below 1e-5
        for p in net.parameters():
            p.copy_(torch.from_numpy(rng.normal(scale=0.2, size=tuple(p.shape)).astype(np.float32)))
    torch.save(net.state_dict(), os.path.join(HERE, "torch_projected.pt"))
    x = rng.normal(size=(PROBE_BATCH, SEQ, 4)).astype(np.float32)
    net.eval()
    with torch.no_grad():
        port_output = np.ascontiguousarray(net.port(torch.from_numpy(x)).numpy())
    probe = {**torch_probe(block.attn, "attn", rng), **torch_probe(bare, "bare", rng), "port.x": x, "port.output": port_output}
    save_file(probe, os.path.join(HERE, "torch.probe.safetensors"), metadata={"torch": torch.__version__})
    print("wrote torch_packed.pt, torch_kdim.pt, torch_checkpoint.pt, torch_full_module.pt, torch_projected.pt")


def main():
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(7)
    for stem, build in [("functional", functional), ("nested", nested), ("sequential_custom", sequential_custom), ("gated", gated)]:
        model = build()
        randomise(model, rng)
        model.save(os.path.join(HERE, f"{stem}.keras"))
        if stem == "functional":
            model.save_weights(os.path.join(HERE, f"{stem}.weights.h5"))
        save_file(probes(model, rng), os.path.join(HERE, f"{stem}.probe.safetensors"),
                  metadata={"keras": keras.__version__, "layers": json.dumps([l.name for l in attention_layers(model)])})
        print(f"wrote {stem}.keras ({', '.join(l.name for l in attention_layers(model))})")
    torch_files(rng)
    dense_only().save(os.path.join(HERE, "dense_only.keras"))
    print("wrote dense_only.keras (no attention layer)")
    # Its own generator, so that adding it moved none of the files above.
    rng = np.random.default_rng(11)
    model = axes()
    randomise(model, rng)
    model.save(os.path.join(HERE, "axes.keras"))
    query = rng.normal(size=(PROBE_BATCH, 3, 4, 6)).astype(np.float32)
    output = np.asarray(model(query), dtype=np.float32)
    save_file({"axes.query": query, "axes.output": output}, os.path.join(HERE, "axes.probe.safetensors"),
              metadata={"keras": keras.__version__, "layers": json.dumps(["axes"])})
    print("wrote axes.keras (attention_axes=(1, 2))")
    mixed_files()


if __name__ == "__main__":
    main()
