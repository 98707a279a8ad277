"""Small versions of keras.io's attention examples, written by the real Keras, for the flattener's
and the converter's tests (and `masked_pooling`, a case of the flattener's own).

Run from the repository root (keras 3.15.1 on tensorflow-cpu):

    python3 datasets/keras-io/make_keras_io.py [EXAMPLE ...]

For each example module here (its custom layers and `build_model` as keras.io writes them):
`<example>.keras` (random weights, seeded) and `<example>.probe.safetensors` with `inputs.<input>`
and `expected.<output>` (Keras' inference outputs, keyed by the model's output names); images are
uniform in 0-255, token ids uniform with padding, and an example module may give its own inputs
by name with `probe_inputs(rng, batch)` (float features, several kinds of input). The
custom-layer examples are read through `cargo xtask flatten FILE --import <example>.py`; the
flattening options each needs are in `EXAMPLES` (the test reads them from the probe's metadata).
"""

import importlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import keras  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# example -> (seed, batch of the probe, flatten options as command-line arguments)
EXAMPLES = {
    "text_classification": (1, 3, []),
    "vision_transformer": (3, 2, []),
    "named_entity_recognition": (4, 2, []),
    "compact_convolutional_transformer": (6, 2, []),
    "english_to_spanish": (5, 3, ["--shape", "encoder_inputs=9"]),
    "object_detection_vit": (7, 2, []),
    "mobilevit": (8, 2, []),
    "masked_pooling": (9, 3, []),  # not keras.io's: a custom compute_mask read by built-in layers
    "miniature_gpt": (10, 2, ["--batch-size", "2"]),  # its causal mask is tiled to the batch
    "tabtransformer": (11, 3, []),
    "token_learner": (12, 2, []),
    "video_classification": (13, 2, []),
    "bert_mlm": (14, 2, []),
    "untraceable": (15, 2, []),  # not keras.io's: a layer the flattener must keep, with the reason
    "shared_weight": (16, 2, []),  # not keras.io's: a custom layer's own weight, the layer called twice
}

# Examples whose custom layers the flattener must keep (and `convert` refuse), with the reason.
KEPT = {
    "untraceable": "BranchOnValue: ValueError: A KerasTensor is symbolic",
}


def write(name):
    seed, batch, flatten_options = EXAMPLES[name]
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    module = importlib.import_module(name)
    model = module.build_model()
    for weight in model.trainable_weights:  # adapted statistics stay as adapted
        weight.assign(rng.normal(scale=0.3, size=weight.shape).astype(np.float32))
    path = os.path.join(HERE, f"{name}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    inputs = {}
    # A subclassed model has no `inputs`: its one input, as the flattener names it, from its build.
    specs = [(t.name, t.shape, t.dtype) for t in loaded.inputs] if getattr(loaded, "inputs", None) else [
        ("input", loaded.get_build_config()["input_shape"], "float32")
    ]
    if hasattr(module, "probe_inputs"):  # inputs that are neither images nor token ids, by name
        inputs = module.probe_inputs(rng, batch)
    for input_name, full_shape, dtype in specs:
        if input_name in inputs:
            continue
        shape = [batch] + [d if d is not None else 9 for d in full_shape[1:]]
        if len(shape) == 4:  # images, 0-255 as the examples feed them
            inputs[input_name] = rng.uniform(0, 255, size=shape).astype(dtype)
            continue
        vocab = next(l.input_dim for l in loaded._flatten_layers() if isinstance(l, keras.layers.Embedding))
        ids = rng.integers(1, vocab, size=shape).astype(dtype)
        for row in range(1, shape[0]):  # padding (id 0) at the end of every row but the first
            ids[row, shape[1] - 2 * row:] = 0
        inputs[input_name] = ids
    ordered = [inputs[input_name] for input_name, _, _ in specs]
    if isinstance(getattr(loaded, "_inputs_struct", None), dict):  # a model built on a dict of inputs
        call = {key: inputs[tensor.name] for key, tensor in loaded._inputs_struct.items()}
    else:
        call = ordered[0] if len(ordered) == 1 else ordered
    outputs = keras.tree.flatten(loaded(call, training=False))
    tensors = {f"inputs.{k}": v for k, v in inputs.items()}
    # A subclassed model names no outputs; the flattener calls them `output` / `output_<i>`.
    names = getattr(loaded, "output_names", None) or (
        ["output"] if len(outputs) == 1 else [f"output_{i}" for i in range(len(outputs))]
    )
    tensors.update({f"expected.{n}": np.asarray(o) for n, o in zip(names, outputs)})
    metadata = {"keras_version": keras.__version__, "flatten": json.dumps(flatten_options),
                "source": f"{name}.py"}
    if name in KEPT:
        metadata["kept"] = KEPT[name]
    # The classes of the example's own that `convert` must refuse (without any, it reads the file
    # as it is): a functional model of its own class that keeps `Functional.call` (keras.io's
    # `MaskedLanguageModel`, for its loss) is its saved graph, and converts.
    from keras.src.models.functional import Functional

    def graph_only(layer):
        return isinstance(layer, Functional) and type(layer).call is Functional.call

    own = [l for l in [loaded, *loaded._flatten_layers()]
           if not type(l).__module__.startswith("keras.") and not graph_only(l)]
    metadata["custom_classes"] = ",".join(sorted({type(l).__name__ for l in own}))
    save_file(tensors, os.path.join(HERE, f"{name}.probe.safetensors"), metadata=metadata)
    print(f"wrote {name}.keras ({os.path.getsize(path)} bytes) and its probe: outputs {names}")


def main():
    chosen = sys.argv[1:] or list(EXAMPLES)
    for name in chosen:
        write(name)


if __name__ == "__main__":
    main()
