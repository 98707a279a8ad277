#!/usr/bin/env python3
"""Check exported safetensors files against the REAL libraries.

    python3 xtask/python/check_export.py FILE [FILE...]

Each FILE is a safetensors file in the fixture format of datasets/reference/FORMAT.md, as written by
`cargo xtask export --format keras|torch` or `cargo xtask convert --to keras|projected|torch`:

* `config.framework == "keras"`: the weights are loaded BY NAME into a real
  `keras.layers.MultiHeadAttention`, which is then called on the stored probe inputs (default call, with
  `key`, `attention_mask` and `use_causal_mask` when present). When the config names a
  `weights_h5` beside the file (`cargo xtask convert --to keras`), that file is also loaded with
  `keras.Model.load_weights` into a model holding the layer and checked the same way, and so is
  the `keras_archive` it names, opened by `keras.saving.load_model`.
* `config.framework == "torch"` and `config.kind == "projected"`: the weights are loaded with
  `load_state_dict(strict=True)` into `Linear(in,E) -> nn.MultiheadAttention(E,h,batch_first=True)
  -> optional Linear(E,out)`, run in eval mode with `need_weights=False`.
* `config.framework == "torch"` without a kind (`cargo xtask convert --to torch`): a bare
  `nn.MultiheadAttention(embed_dim, num_heads, kdim, vdim, bias, batch_first=True)` loaded with
  `load_state_dict(strict=True)`, called on `inputs.query/key/value`; its output and head-averaged
  weights are compared.

Everything runs in float32, as a user would. The result is compared with `outputs.output` at
`config.tolerance` (absolute, max over all elements). Prints one line per file
(`PASS|FAIL <file> <library> max_abs_err=<e> tol=<t>`) and a summary; exits 1 when any file fails or
cannot be read.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# torch (and torch._dynamo) MUST be imported before tensorflow/keras: the other order aborts with an
# LLVM error in this environment.
import torch  # noqa: E402
import torch._dynamo  # noqa: E402,F401

import json  # noqa: E402

import numpy as np  # noqa: E402
from safetensors.numpy import load_file  # noqa: E402
from safetensors import safe_open  # noqa: E402

# Tensors that are probe data, not weights.
DATA_PREFIXES = ("inputs.", "outputs.", "intermediates.")


class ExportError(Exception):
    """A file that cannot be checked (unreadable, malformed, weights that do not fit)."""


def read_export(path):
    try:
        with safe_open(path, "np") as f:
            metadata = f.metadata() or {}
        tensors = load_file(path)
    except Exception as e:  # noqa: BLE001 - any reading problem is reported with the file name
        raise ExportError(f"cannot read safetensors file: {e}") from e
    if "config" not in metadata:
        raise ExportError('no __metadata__["config"]')
    try:
        config = json.loads(metadata["config"])
    except json.JSONDecodeError as e:
        raise ExportError(f'__metadata__["config"] is not JSON: {e}') from e
    if not isinstance(config, dict):
        raise ExportError('__metadata__["config"] is not a JSON object')
    return config, tensors


def need(config, key):
    if key not in config:
        raise ExportError(f"config has no {key!r}")
    return config[key]


def need_tensor(tensors, key):
    if key not in tensors:
        raise ExportError(f"missing tensor {key!r}")
    return tensors[key]


def weights_of(tensors):
    return {k: v for k, v in tensors.items() if not k.startswith(DATA_PREFIXES)}


def max_abs_err(actual, expected):
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    if actual.shape != expected.shape:
        raise ExportError(f"output shape {actual.shape} != stored outputs.output shape {expected.shape}")
    if not np.all(np.isfinite(expected)):
        raise ExportError("stored outputs.output has non-finite values")
    if actual.size == 0:
        return 0.0
    if not np.all(np.isfinite(actual)):
        return float("inf")
    return float(np.max(np.abs(actual - expected)))


# ----------------------------------------------------------------------------------------------------
# Keras
# ----------------------------------------------------------------------------------------------------

_keras = None


def keras_modules():
    global _keras
    if _keras is None:
        import tensorflow as tf
        import keras

        _keras = (tf, keras)
    return _keras


def keras_var_name(layer, var):
    """`multi_head_attention/query/kernel` -> `query.kernel`."""
    path = getattr(var, "path", None) or var.name
    path = path.split(":")[0]
    parts = path.split("/")
    if parts and parts[0] == layer.name:
        parts = parts[1:]
    return ".".join(parts)


def attention_axes(config):
    """The layer's `attention_axes` (None: Keras' default), as the tuple Keras takes."""
    axes = config.get("attention_axes")
    return None if axes is None else tuple(int(a) for a in axes)


def check_keras(config, tensors, folder):
    tf, keras = keras_modules()
    num_heads = int(need(config, "num_heads"))
    key_dim = int(need(config, "key_dim"))
    value_dim = config.get("value_dim")
    use_bias = bool(need(config, "use_bias"))
    output_shape = config.get("output_shape")
    use_causal_mask = bool(config.get("use_causal_mask", False))

    query = need_tensor(tensors, "inputs.query").astype(np.float32)
    value = need_tensor(tensors, "inputs.value").astype(np.float32)
    expected = need_tensor(tensors, "outputs.output")
    call = {}
    if "inputs.key" in tensors:
        call["key"] = tf.constant(tensors["inputs.key"].astype(np.float32))
    if "inputs.attention_mask" in tensors:
        call["attention_mask"] = tf.constant(tensors["inputs.attention_mask"].astype(bool))
    if use_causal_mask:
        call["use_causal_mask"] = True

    layer = keras.layers.MultiHeadAttention(
        num_heads=num_heads,
        key_dim=key_dim,
        value_dim=None if value_dim is None else int(value_dim),
        use_bias=use_bias,
        output_shape=None if output_shape is None else int(output_shape),
        dropout=float(config.get("dropout", 0.0) or 0.0),
        use_gate=bool(config.get("use_gate", False)),
        sliding_window=config.get("sliding_window"),
        attention_axes=attention_axes(config),
        dtype="float32",
    )
    q = tf.constant(query)
    v = tf.constant(value)
    layer(q, v, **call)  # builds the variables

    file_weights = weights_of(tensors)
    used = set()
    for var in layer.weights:
        name = keras_var_name(layer, var)
        if name not in file_weights:
            raise ExportError(f"layer variable {name!r} has no tensor in the file")
        w = file_weights[name]
        if tuple(w.shape) != tuple(var.shape):
            raise ExportError(f"{name}: file shape {tuple(w.shape)} != layer shape {tuple(var.shape)}")
        var.assign(w.astype(np.float32))
        used.add(name)
    unused = sorted(set(file_weights) - used)
    if unused:
        raise ExportError(f"file weights not used by the layer: {unused}")

    out = layer(q, v, **call)
    err = max_abs_err(np.asarray(out), expected)
    library = f"keras-{keras.__version__}/tf-{tf.__version__}"
    if config.get("weights_h5"):
        err = max(err, check_keras_weights_h5(config, tensors, os.path.join(folder, config["weights_h5"])))
        library += " (+ .weights.h5 by Model.load_weights)"
    if config.get("keras_archive"):
        err = max(err, check_keras_archive(tensors, os.path.join(folder, config["keras_archive"])))
        library += " (+ .keras by load_model)"
    return library, err


def check_keras_archive(tensors, path):
    """The `.keras` archive named in the config, opened by `keras.saving.load_model` and called
    on the probe as `model([query, value, key])`."""
    tf, keras = keras_modules()
    try:
        model = keras.saving.load_model(path)
    except Exception as e:  # noqa: BLE001 - report which file Keras refused
        raise ExportError(f"keras.saving.load_model({path}) failed: {e}") from e
    query, value = tensors["inputs.query"], tensors["inputs.value"]
    key = tensors.get("inputs.key", value)
    out = model([query.astype(np.float32), value.astype(np.float32), key.astype(np.float32)])
    return max_abs_err(np.asarray(out), tensors["outputs.output"])


def check_keras_weights_h5(config, tensors, path):
    """The `.weights.h5` named in the config, loaded by `keras.Model.load_weights` into a model
    that holds the layer, `keras.Model([query, value, key], MultiHeadAttention(...)(...))`."""
    tf, keras = keras_modules()
    query, value = tensors["inputs.query"], tensors["inputs.value"]
    key = tensors.get("inputs.key", value)
    output_shape = config.get("output_shape")
    inputs = [keras.Input(shape=(None,) * (x.ndim - 2) + (x.shape[-1],)) for x in (query, value, key)]
    layer = keras.layers.MultiHeadAttention(
        num_heads=int(config["num_heads"]),
        key_dim=int(config["key_dim"]),
        value_dim=None if config.get("value_dim") is None else int(config["value_dim"]),
        use_bias=bool(config["use_bias"]),
        output_shape=None if output_shape is None else int(output_shape),
        use_gate=bool(config.get("use_gate", False)),
        sliding_window=config.get("sliding_window"),
        attention_axes=attention_axes(config),
    )
    model = keras.Model(inputs, layer(inputs[0], inputs[1], key=inputs[2]))
    try:
        model.load_weights(path)
    except Exception as e:  # noqa: BLE001 - report which file Keras refused
        raise ExportError(f"keras.Model.load_weights({path}) failed: {e}") from e
    out = model([query.astype(np.float32), value.astype(np.float32), key.astype(np.float32)])
    return max_abs_err(np.asarray(out), tensors["outputs.output"])


# ----------------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------------


class Projected(torch.nn.Module):
    """Linear(in, E) -> nn.MultiheadAttention(E, h, batch_first=True) self-attention -> optional Linear(E, out)."""

    def __init__(self, in_features, embed_dim, num_heads, output_dim, bias, dropout=0.0):
        super().__init__()
        self.proj = torch.nn.Linear(in_features, embed_dim, bias=bias)
        self.mha = torch.nn.MultiheadAttention(embed_dim, num_heads, bias=bias, dropout=dropout, batch_first=True)
        self.final = None if output_dim is None else torch.nn.Linear(embed_dim, output_dim, bias=bias)

    def forward(self, x):
        z = self.proj(x)
        y = self.mha(z, z, z, need_weights=False)[0]
        return y if self.final is None else self.final(y)


def torch_state_dict_name(name):
    if name.startswith(("proj.", "final.")):
        return name
    return "mha." + name


def check_torch_mha(config, tensors):
    """A bare `nn.MultiheadAttention` state dict (`cargo xtask convert --to torch`)."""
    embed_dim = int(need(config, "embed_dim"))
    kdim, vdim = config.get("kdim"), config.get("vdim")
    mha = torch.nn.MultiheadAttention(
        embed_dim,
        int(need(config, "num_heads")),
        bias=bool(config.get("bias", True)),
        kdim=None if kdim is None else int(kdim),
        vdim=None if vdim is None else int(vdim),
        dropout=float(config.get("dropout", 0.0) or 0.0),
        batch_first=True,
    )
    state = {k: torch.from_numpy(v.astype(np.float32)) for k, v in weights_of(tensors).items()}
    try:
        mha.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ExportError(f"load_state_dict(strict=True) failed: {e}") from e
    mha.eval()
    query, key, value = (torch.from_numpy(need_tensor(tensors, f"inputs.{n}").astype(np.float32)) for n in ("query", "key", "value"))
    with torch.no_grad():
        out, weights = mha(query, key, value)
    err = max_abs_err(out.numpy(), need_tensor(tensors, "outputs.output"))
    if "outputs.attention_weights" in tensors:
        err = max(err, max_abs_err(weights.numpy(), tensors["outputs.attention_weights"]))
    return f"torch-{torch.__version__}", err


def check_torch(config, tensors):
    kind = config.get("kind")
    if kind is None:
        return check_torch_mha(config, tensors)
    if kind != "projected":
        raise ExportError(f"torch export kind {kind!r} is not supported (expected 'projected' or none)")
    output_dim = config.get("output_dim")
    model = Projected(
        int(need(config, "in_features")),
        int(need(config, "embed_dim")),
        int(need(config, "num_heads")),
        None if output_dim is None else int(output_dim),
        bool(config.get("bias", True)),
        float(config.get("dropout", 0.0) or 0.0),
    )
    state = {torch_state_dict_name(k): torch.from_numpy(v.astype(np.float32)) for k, v in weights_of(tensors).items()}
    try:
        model.load_state_dict(state, strict=True)
    except RuntimeError as e:
        raise ExportError(f"load_state_dict(strict=True) failed: {e}") from e
    model.eval()
    x = torch.from_numpy(need_tensor(tensors, "inputs.x").astype(np.float32))
    expected = need_tensor(tensors, "outputs.output")
    with torch.no_grad():
        out = model(x)
    return f"torch-{torch.__version__}", max_abs_err(out.numpy(), expected)


# ----------------------------------------------------------------------------------------------------


def check_file(path):
    config, tensors = read_export(path)
    tol = float(need(config, "tolerance"))
    framework = need(config, "framework")
    if framework == "keras":
        library, err = check_keras(config, tensors, os.path.dirname(os.path.abspath(path)))
    elif framework == "torch":
        library, err = check_torch(config, tensors)
    else:
        raise ExportError(f"unknown config.framework {framework!r}")
    return library, err, tol


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    passed = failed = 0
    for path in argv[1:]:
        if path.endswith(".bpk.probe.safetensors"):
            # The probe beside a burnpack holds no weights: the .bpk is checked in Burn.
            print(f"SKIP {path}: the probe of a burnpack (no weights to load here)", flush=True)
            continue
        try:
            library, err, tol = check_file(path)
        except ExportError as e:
            print(f"FAIL {path}: {e}", flush=True)
            failed += 1
            continue
        except Exception as e:  # noqa: BLE001 - keep checking the other files, name the broken one
            print(f"FAIL {path}: {type(e).__name__}: {e}", flush=True)
            failed += 1
            continue
        ok = err <= tol
        print(f"{'PASS' if ok else 'FAIL'} {path} {library} max_abs_err={err:.3e} tol={tol:g}", flush=True)
        if ok:
            passed += 1
        else:
            failed += 1
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
