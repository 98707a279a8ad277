"""The installed wheel, as a Python user meets it: `keras2torch.convert` on model objects and
files, and the `keras2torch` command, each checked against Keras' own outputs at 1e-5.

Run against the built wheel in a fresh virtual environment (never the source tree), as .ci/run
does: `pip install dist/keras2torch-*.whl torch keras tensorflow-cpu pytest`, then
`python -m pytest python/tests` from the repository root.
"""

import glob
import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

import keras2torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS = os.path.join(ROOT, "datasets", "keras-models")
EXAMPLES = os.path.join(ROOT, "datasets", "keras-io")
HUB = os.path.join(ROOT, "datasets", "keras-hub")
TOLERANCE = 1e-5


def test_the_package_is_the_installed_wheel():
    assert os.path.join(ROOT, "python") not in os.path.dirname(keras2torch.__file__), keras2torch.__file__
    assert "Dense" in keras2torch.supported_classes()


def probed(folder):
    """Every `.keras` in `folder` with a probe made by Keras, by stem."""
    return sorted(os.path.basename(p)[: -len(".probe.safetensors")] for p in glob.glob(os.path.join(folder, "*.probe.safetensors")))


def keras_outputs_of(module, probe_path):
    """The module's outputs on the Keras probe's inputs, against the probe's expected outputs:
    the largest difference, relative where an output exceeds 1 in magnitude (float32 keeps 24
    bits: one ulp of 160, as a Normalization's inverse writes, is 1.5e-5, and torch rounds
    `x * std + mean` one ulp apart from TensorFlow on some processors, an AMD EPYC's)."""
    import torch

    probe = load_file(probe_path)
    converted = sys.modules[type(module).__module__]
    inputs = [torch.as_tensor(probe["inputs." + name]).to(converted.INPUT_DTYPES[name]) for name in converted.INPUTS]
    with torch.no_grad():
        outputs = module(*inputs)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    def difference(ours, expected):
        return float(np.max(np.abs(ours - expected) / np.maximum(1.0, np.abs(expected)), initial=0.0))

    return max(difference(o.double().numpy(), probe["expected." + name].astype(np.float64))
               for name, o in zip(converted.OUTPUTS, outputs))


@pytest.mark.parametrize("stem", [s for s in probed(MODELS) if not s.startswith("bench_")])
def test_a_file_converts_to_a_module_matching_keras(stem, tmp_path):
    module = keras2torch.convert(os.path.join(MODELS, f"{stem}.keras"), out=tmp_path / stem, verbose=False)
    assert not module.training
    assert (tmp_path / f"{stem}.py").exists() and (tmp_path / f"{stem}.safetensors").exists()
    assert module.keras2torch_difference <= TOLERANCE
    assert keras_outputs_of(module, os.path.join(MODELS, f"{stem}.probe.safetensors")) <= TOLERANCE


def load_example(stem):
    """A keras.io example's model, loaded by Keras with the example's own classes."""
    import keras

    spec = importlib.util.spec_from_file_location(stem, os.path.join(EXAMPLES, f"{stem}.py"))
    source = importlib.util.module_from_spec(spec)
    sys.modules[stem] = source
    spec.loader.exec_module(source)
    return keras.saving.load_model(os.path.join(EXAMPLES, f"{stem}.keras"), compile=False)


def flatten_options(stem, folder=EXAMPLES):
    """The model's flattening options (its probe's metadata, as `cargo xtask flatten` takes
    them: `--batch-size N`, `--shape NAME=D1,D2`) as `convert`'s arguments."""
    from safetensors import safe_open

    with safe_open(os.path.join(folder, f"{stem}.probe.safetensors"), "np") as probe:
        words = json.loads((probe.metadata() or {}).get("flatten", "[]"))
    options = {}
    for flag, value in zip(words[::2], words[1::2]):
        if flag == "--batch-size":
            options["batch_size"] = int(value)
        elif flag == "--shape":
            name, sizes = value.split("=")
            options.setdefault("shapes", {})[name] = tuple(int(d) for d in sizes.split(","))
    return options


@pytest.mark.parametrize("stem", [s for s in probed(EXAMPLES) if s != "untraceable"])
def test_a_model_object_with_custom_layers_converts_and_is_checked_against_keras(stem, capsys):
    model = load_example(stem)
    module = keras2torch.convert(model, **flatten_options(stem))
    assert "max |torch - Keras| / max(1, |Keras|) =" in capsys.readouterr().out
    assert module.keras2torch_difference <= TOLERANCE


@pytest.mark.parametrize("stem", probed(HUB))
def test_a_keras_hub_model_converts_to_a_module_matching_keras(stem, capsys):
    import keras
    import keras_hub  # noqa: F401  registers KerasHub's classes

    model = keras.saving.load_model(os.path.join(HUB, f"{stem}.keras"), compile=False)
    module = keras2torch.convert(model, **flatten_options(stem, HUB))
    assert "max |torch - Keras| / max(1, |Keras|) =" in capsys.readouterr().out
    assert module.keras2torch_difference <= TOLERANCE
    assert keras_outputs_of(module, os.path.join(HUB, f"{stem}.probe.safetensors")) <= TOLERANCE


def test_the_written_module_keeps_freed_memory_where_the_c_library_is_glibc(tmp_path):
    # keep_memory=False: convert leaves malloc alone; the module's own function is what load() calls.
    module = keras2torch.convert(os.path.join(MODELS, "small.keras"), out=tmp_path / "small", verbose=False,
                                 keep_memory=False)
    converted = sys.modules[type(module).__module__]
    try:
        glibc = os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc")
    except (AttributeError, OSError, ValueError):
        glibc = False
    assert converted.keep_freed_memory() is glibc


def test_a_layer_that_cannot_be_traced_is_refused_by_name():
    model = load_example("untraceable")
    with pytest.raises(keras2torch.ConversionError, match=r"branch_on_value \(BranchOnValue\)"):
        keras2torch.convert(model)


def test_a_damaged_or_unsupported_file_raises_with_the_file_and_the_layer(tmp_path):
    with pytest.raises(keras2torch.ConversionError, match="truncated.keras"):
        keras2torch.convert(os.path.join(MODELS, "truncated.keras"), out=tmp_path / "t")
    with pytest.raises(keras2torch.ConversionError, match=r"lambda.*Lambda"):
        keras2torch.convert(os.path.join(MODELS, "lambda_layer.keras"), out=tmp_path / "l")
    assert not (tmp_path / "t.py").exists() and not (tmp_path / "l.py").exists()


def test_the_command_converts_a_file_and_refuses_a_bad_one(tmp_path):
    model = os.path.join(MODELS, "text_classifier.keras")
    run = subprocess.run(["keras2torch", model, "-o", str(tmp_path / "port")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "max |torch - the converter's probe| / max(1, |the converter's probe|) =" in run.stdout
    assert (tmp_path / "port.py").exists()
    bad = subprocess.run(["keras2torch", os.path.join(MODELS, "custom_layer.keras"), "-o", str(tmp_path / "bad")],
                         capture_output=True, text=True)
    assert bad.returncode == 1 and "custom layer" in bad.stderr and "flatten" in bad.stderr, bad.stderr
    assert not (tmp_path / "bad.py").exists()


def test_the_command_flattens_custom_layers_with_the_users_classes(tmp_path):
    example = os.path.join(EXAMPLES, "text_classification")
    run = subprocess.run(["keras2torch", example + ".keras", "-o", str(tmp_path / "port"), "--import", example + ".py"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "port.py").exists()


def built_attention(num_heads, key_dim, width=4, steps=136):
    import keras

    layer = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=key_dim)
    x = np.random.default_rng(1).normal(size=(2, steps, width)).astype(np.float32)
    layer(x, x)
    return layer


def test_the_questions_layer_converts_exactly_and_to_the_popular_port_with_its_final_linear():
    layer = built_attention(num_heads=6, key_dim=4)  # the question: [B, 136, 4] in, 4 features out
    exact = keras2torch.convert_layer(layer, verbose=False)
    assert exact.keras2torch_difference <= TOLERANCE
    port = keras2torch.convert_layer(layer, "projected", verbose=False)
    assert port.keras2torch_difference <= TOLERANCE
    assert type(port).__name__ == "Projected" and port.final is not None  # Linear(4, 24), MHA(24, 6), Linear(24, 4)
    assert sum(int(np.prod(w.shape)) for w in layer.weights) == 460
    assert sum(p.numel() for p in port.parameters()) == 2520 + 100  # the popular answer's, and Linear(24, 4)


def test_a_bare_multihead_attention_only_where_keras_sizes_allow_one():
    with pytest.raises(keras2torch.ConversionError, match="cannot be exact"):
        keras2torch.convert_layer(built_attention(num_heads=6, key_dim=4), "torch", verbose=False)
    bare = keras2torch.convert_layer(built_attention(num_heads=2, key_dim=2), "torch", verbose=False)
    assert type(bare).__name__ == "MultiheadAttention" and bare.keras2torch_difference <= TOLERANCE


def test_a_layer_of_a_file_converts_by_name_and_a_torch_file_needs_the_head_count(tmp_path):
    path = os.path.join(ROOT, "datasets", "model-files", "functional.keras")
    port = keras2torch.convert_layer(path, "projected", layer="attn_values", out=tmp_path / "values", verbose=False)
    assert port.keras2torch_difference <= TOLERANCE and (tmp_path / "values.safetensors").exists()
    with pytest.raises(keras2torch.ConversionError, match="self-attention on one input"):  # widths 8/5/5
        keras2torch.convert_layer(path, "projected", layer="attn_nobias", out=tmp_path / "nobias", verbose=False)
    with pytest.raises(ValueError, match="layer object"):
        keras2torch.convert_layer(path, "exact")
    checkpoint = os.path.join(ROOT, "datasets", "model-files", "torch_checkpoint.pt")
    with pytest.raises(keras2torch.ConversionError, match="num-heads|num_heads|head count"):
        keras2torch.convert_layer(checkpoint, "projected", out=tmp_path / "ckpt", verbose=False)


def test_the_command_converts_one_layer_of_a_file(tmp_path):
    path = os.path.join(ROOT, "datasets", "model-files", "functional.keras")
    run = subprocess.run(["keras2torch", path, "--layer", "attn_values", "-o", str(tmp_path / "attn")],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "largest |source - converted| on the probe" in run.stdout
    refused = subprocess.run(["keras2torch", path, "--layer", "attn_nobias", "-o", str(tmp_path / "x")],
                             capture_output=True, text=True)
    assert refused.returncode == 1 and "cannot be exact" in refused.stderr, refused.stderr


def test_a_file_converts_where_neither_keras_nor_tensorflow_can_be_imported(tmp_path):
    script = (
        "import sys\n"
        "sys.modules['keras'] = sys.modules['tensorflow'] = None  # importing either now fails\n"
        "import keras2torch\n"
        f"module = keras2torch.convert({os.path.join(MODELS, 'text_classifier.keras')!r}, out={str(tmp_path / 'port')!r})\n"
        "assert module.keras2torch_difference <= 1e-5\n"
        "assert 'keras' not in sys.modules or sys.modules['keras'] is None\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "max |torch - the converter's probe| / max(1, |the converter's probe|) =" in run.stdout
