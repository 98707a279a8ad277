"""`convert`: a Keras 3 model, as an object in your Python or as a `.keras` file, to an exact and
readable PyTorch module, checked on the spot.

The conversion is the compiled core (`keras2torch._native`, the same `keras` crate as `cargo xtask
convert`): it writes the module's source, its state dict and a probe (the probe's inputs and the
converter's own output of every node, computed in Burn). A model object is flattened first (its
custom layers re-traced into built-in ones, `keras2torch.flatten`), and the returned module is
compared with the Keras model on random inputs of the model's shapes; a file is compared with the
probe, which needs neither Keras nor TensorFlow.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import tempfile
import uuid
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, Union

import numpy as np

from . import _native
from .flatten import flatten, flatten_file, random_inputs, save_flat

ConversionError = _native.ConversionError  # raised with the converter's message

if TYPE_CHECKING:
    import keras
    import torch

PathLike = Union[str, "os.PathLike[str]"]


def convert(
    model_or_path: keras.Model | PathLike,
    out: PathLike | None = None,
    *,
    imports: Iterable[PathLike] = (),
    shapes: Mapping[str, Sequence[int]] | None = None,
    batch_size: int | None = None,
    check: bool = True,
    tolerance: float = 1e-5,
    seed: int = 0,
    verbose: bool = True,
    keep_memory: bool = True,
) -> torch.nn.Module | None:
    """Converts a Keras model to a PyTorch `nn.Module` computing what Keras computes.

    Args:
        model_or_path: a `keras.Model` (its custom layers are flattened first, with the classes
            your Python has imported), or the path of a `.keras` file.
        out: where to write the module as files: `OUT.py` (the model as one readable
            `nn.Module`), `OUT.safetensors` (its state dict) and `OUT.probe.safetensors`; a
            `.py` suffix is dropped. `None` writes them to a temporary folder.
        imports: for a file whose model has custom layers, the Python files defining their
            classes (the file is flattened with them first; needs Keras).
        shapes: `{input name: sizes without the batch axis}` for sizes the model leaves open and
            its custom layers need while tracing; `batch_size`: a static batch for custom
            layers that build tensors of the batch's size.
        check: compare the module with the Keras model (a model object) or with the converter's
            probe (a file) and raise if any output differs by more than `tolerance` (relative
            where an output exceeds 1 in magnitude).
        verbose: print what was converted and the largest difference.
        keep_memory: as the written module's `load()`, tell glibc's malloc to keep the memory
            torch frees for its next tensors (this process keeps its peak memory; on Linux up to
            1.5x faster training steps at large activations); False leaves malloc as it is.

    Returns:
        The module in eval mode, its weights loaded with `strict=True`; its attribute
        `keras2torch_difference` is the largest difference found by the check, relative
        where an output exceeds 1 (None without one). Without torch installed, returns None once the files are written (`out` given).

    Raises:
        ConversionError: a layer, class or argument the converter does not support (the message
            names the file, the layer and its class), a custom layer that cannot be traced, or a
            check that failed (naming the output and the first node that differs).
    """
    with tempfile.TemporaryDirectory() as scratch:
        keras_model, flat = None, None
        if isinstance(model_or_path, (str, os.PathLike)):
            path = os.fspath(model_or_path)
            if not os.path.exists(path):
                raise FileNotFoundError(f"{path}: no such file")
            if imports:
                path_flat = os.path.join(scratch, "flat.keras")
                report = flatten_file(path, path_flat, imports, shapes, batch_size, seed)
                _refuse_kept(report, path)
                path = path_flat
        else:
            keras_model = model_or_path
            flat, report = flatten(keras_model, shapes=shapes, batch_size=batch_size)
            _refuse_kept(report, getattr(keras_model, "name", "the model"))
            path = os.path.join(scratch, "model.keras")
            save_flat(flat, report, path)
        stem = _stem(out) if out is not None else os.path.join(scratch, "model")
        printout = _native.convert_file(path, stem + ".py")
        if verbose:
            print(printout.rstrip())
        try:
            import torch  # noqa: F401
        except ImportError:
            if out is not None:
                return None
            raise ImportError("torch is needed to return a module; give out= to write the files only") from None
        generated = _import(stem + ".py")
        module = generated.load(keep_memory=keep_memory)
        difference = None
        if check:
            if keras_model is not None:
                difference = _against_keras(module, generated, flat, keras_model, seed)
            else:
                difference = _against_probe(module, generated, stem + ".probe.safetensors")
            if not difference[0] <= tolerance:
                where = _first_node_that_differs(generated, stem + ".probe.safetensors")
                raise ConversionError(
                    f"the torch module differs from {'Keras' if keras_model is not None else 'the probe'} "
                    f"by {difference[0]:.3e} at output {difference[1]!r}{where}"
                )
            if verbose:
                against = "Keras" if keras_model is not None else "the converter's probe"
                print(f"max |torch - {against}| / max(1, |{against}|) = {difference[0]:.3e}")
        module.keras2torch_difference = None if difference is None else difference[0]
        return module


def _stem(out: PathLike) -> str:
    """`out` without a `.py` suffix (the converter adds .py, .safetensors, .probe.safetensors)."""
    out = os.fspath(out)
    stem = out[: -len(".py")] if out.endswith(".py") else out
    os.makedirs(os.path.dirname(os.path.abspath(stem)), exist_ok=True)
    return stem


def _refuse_kept(report, what):
    if report.kept:
        kept = "; ".join(f"{name} ({cls}): {reason}" for name, cls, reason in report.kept)
        raise ConversionError(f"{what}: custom layers that cannot be traced: {kept}")


def _import(path: str) -> Any:
    """The generated module's Python file, imported under a name of its own."""
    name = f"keras2torch_generated_{uuid.uuid4().hex}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _run(module, generated, inputs):
    """The torch module's outputs (a list of numpy arrays) on numpy `inputs` in its input order."""
    import torch

    tensors = [torch.as_tensor(np.asarray(x)).to(generated.INPUT_DTYPES[name]) for name, x in zip(generated.INPUTS, inputs)]
    with torch.no_grad():
        outputs = module(*tensors)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    return [o.double().numpy() for o in outputs]


def _largest(ours, theirs, names):
    """(largest difference, the output it is in) over every output: |ours - theirs|, relative
    where |theirs| exceeds 1. float32 keeps 24 bits, so one ulp of an output near 160 is 1.5e-5
    and near 1e9 is 64, and two libraries can round `x * std + mean` an ulp apart (torch and
    TensorFlow on an AMD EPYC): an absolute bound would refuse such a model on one processor
    and pass it on another."""
    worst = (0.0, names[0] if names else "")
    for name, a, b in zip(names, ours, theirs):
        b = np.asarray(b, dtype=np.float64)
        difference = float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b)), initial=0.0))
        if not difference <= worst[0]:
            worst = (difference, name)
    return worst


def _against_keras(module, generated, flat, keras_model, seed):
    """The module against the Keras model on random inputs of the model's shapes (token ids for
    the inputs an `Embedding` reads, their second halves padding so that masks matter)."""
    import keras

    inputs = random_inputs(flat, seed=seed)
    structure = getattr(keras_model, "_inputs_struct", None)
    if isinstance(structure, dict):  # a model built on a dict of inputs is called with one
        names = [t.name for t in flat.inputs]
        call = {key: inputs[names.index(tensor.name)] for key, tensor in structure.items()}
    else:
        call = inputs if len(inputs) > 1 else inputs[0]
    expected = [keras.ops.convert_to_numpy(y) for y in keras.tree.flatten(keras_model(call, training=False))]
    return _largest(_run(module, generated, inputs), expected, list(generated.OUTPUTS))


def _against_probe(module, generated, probe_path):
    """The module against the converter's probe (its inputs, and Burn's outputs)."""
    from safetensors.numpy import load_file

    probe = load_file(probe_path)
    inputs = [probe["inputs." + name] for name in generated.INPUTS]
    expected = [probe["expected." + name] for name in generated.OUTPUTS]
    return _largest(_run(module, generated, inputs), expected, list(generated.OUTPUTS))


def _first_node_that_differs(generated, probe_path):
    """`; first node that differs: ...` from the generated module's own check, or nothing."""
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        generated.check(probe_path)
    line = next((l for l in printed.getvalue().splitlines() if l.startswith("first node that differs")), None)
    return f"; {line}" if line else ""


FORMS = ("exact", "projected", "torch")


def convert_layer(
    layer_or_path: keras.layers.MultiHeadAttention | PathLike,
    form: str = "exact",
    *,
    layer: str | None = None,
    num_heads: int | None = None,
    out: PathLike | None = None,
    check: bool = True,
    tolerance: float = 1e-5,
    seed: int = 0,
    verbose: bool = True,
) -> torch.nn.Module | None:
    """Converts one `keras.layers.MultiHeadAttention` to PyTorch.

    Args:
        layer_or_path: the layer (built: called once), or a model file holding it (`.keras`,
            `.weights.h5`, or a torch `.pt` / `.pth` state dict; give `layer=` to choose among
            several and `num_heads=` for a torch file).
        form: "exact", Keras' layer as torch code that computes what Keras computes, for every
            argument (a layer object only); "projected", the popular port `Linear(D, h*k) +
            nn.MultiheadAttention(h*k, h) + Linear(h*k, D)` with the exact weight mapping, where
            it is exact (self-attention); "torch", a bare `nn.MultiheadAttention`, where Keras'
            sizes allow one. A form that cannot express the layer raises with the reason.
        out: where to write the files (`OUT.py`, and `OUT.safetensors` for the forms
            "projected" and "torch"); `None` writes them to a temporary folder.
        check: compare the module with the Keras layer on random inputs (a layer object) and
            raise if it differs by more than `tolerance`; the converter itself checks what it
            wrote against the source layer in every case.

    Returns:
        The module in eval mode, its weights loaded with `strict=True`, with
        `keras2torch_difference` (the largest difference from Keras, or the converter's own
        check for a file); None without torch once the files are written.
    """
    if form not in FORMS:
        raise ValueError(f"form={form!r}: one of {', '.join(FORMS)}")
    if isinstance(layer_or_path, (str, os.PathLike)):
        if form == "exact":
            raise ValueError('form="exact" takes a layer object; for a file, `convert(path)` converts the whole model')
        with tempfile.TemporaryDirectory() as scratch:
            stem = out if out is not None else os.path.join(scratch, "layer")
            return _convert_layer_file(os.fspath(layer_or_path), form, layer, num_heads, stem, verbose)
    mha = layer_or_path
    model, inputs = _single_layer_model(mha)
    if form == "exact":
        return convert(model, out=out, check=check, tolerance=tolerance, seed=seed, verbose=verbose)
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, "layer.keras")
        model.save(path)
        stem = out if out is not None else os.path.join(scratch, "layer")
        module = _convert_layer_file(path, form, mha.name, None, stem, verbose)
        if module is None or not check:
            return module
        difference = _layer_against_keras(module, form, mha, inputs, seed)
        if not difference <= tolerance:
            raise ConversionError(f"the {form} module differs from the Keras layer {mha.name} by {difference:.3e}")
        if verbose:
            print(f"max |torch - Keras| = {difference:.3e}")
        module.keras2torch_difference = difference
        return module


def _single_layer_model(mha):
    """A functional model of `mha` alone, on inputs of the shapes it was built with."""
    import keras

    built = (mha.get_build_config() or {}).get("shapes_dict", {}) if getattr(mha, "built", False) else {}
    shapes = [built.get(name) for name in ("query_shape", "value_shape", "key_shape")]
    if shapes[0] is None or shapes[1] is None:
        raise ValueError(f"{mha.name}: the layer is not built; call it once on inputs of its shapes first")
    query, value = (keras.Input(tuple(s[1:]), name=n) for s, n in zip(shapes[:2], ("query", "value")))
    inputs = [query, value]
    if shapes[2] is not None and tuple(shapes[2]) != tuple(shapes[1]):
        inputs.append(keras.Input(tuple(shapes[2][1:]), name="key"))
    output = mha(query, value, key=inputs[2] if len(inputs) > 2 else None)
    return keras.Model(inputs, output, name=f"{mha.name}_alone"), inputs


def _convert_layer_file(path, form, layer, num_heads, out, verbose):
    """One layer of the file `path` converted to `form` by the compiled core, written at `out`
    (a stem: `OUT.safetensors` and `OUT.py`) and its module loaded; None without torch."""
    stem = _stem(out)
    printout, difference, written = _native.convert_layer_file(path, form, layer=layer, num_heads=num_heads,
                                                                out=stem + ".safetensors")
    if verbose:
        print(printout.rstrip())
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    source = next(str(p) for p in written if str(p).endswith(".py"))
    module = _import(source).load()
    module.keras2torch_difference = difference
    return module


def _layer_against_keras(module, form, mha, inputs, seed):
    """The largest difference between the torch module and the Keras layer on random inputs (one
    sequence used as query, key and value for the projected port, which is self-attention)."""
    import keras
    import torch

    rng = np.random.default_rng(seed)
    shape = [2] + [d if d is not None else 8 for d in inputs[0].shape[1:]]
    x = rng.normal(size=shape).astype(np.float32)
    if form == "projected":
        expected = keras.ops.convert_to_numpy(mha(x, x, training=False))
        with torch.no_grad():
            got = module(torch.as_tensor(x)).numpy()
    else:
        values = [rng.normal(size=[2] + [d if d is not None else 8 for d in t.shape[1:]]).astype(np.float32) for t in inputs]
        query, value = values[0], values[1]
        key = values[2] if len(values) > 2 else value
        expected = keras.ops.convert_to_numpy(mha(query, value, key=key, training=False))
        with torch.no_grad():
            got = module(torch.as_tensor(query), torch.as_tensor(key), torch.as_tensor(value), need_weights=False)[0].numpy()
    return float(np.max(np.abs(got.astype(np.float64) - expected)))
