"""Small KerasHub models, written by the real keras-hub 0.32.0 on keras 3.15.1, for the
flattener's and the converter's tests: each backbone family the converter reads, and three task
models without their preprocessors.

Run from the repository root (keras-hub 0.32.0, keras 3.15.1 on tensorflow-cpu):

    python3 datasets/keras-hub/make_keras_hub.py [MODEL ...]

For each model: `<model>.keras` (random weights, seeded; 2 layers, hidden 16, vocabulary 50) and
`<model>.probe.safetensors` with `inputs.<input>` (token ids with the second row's last third
padding, its `padding_mask`, segment ids, an encoder-decoder's of each side; images for ViT;
normal audio features for Whisper) and `expected.<output>` (Keras' inference outputs, a dict of
outputs by its keys, as the flattener names them). The models hold KerasHub's own classes, so
they are read through `cargo xtask flatten FILE --import hub.py` (`hub.py` imports keras_hub)
with the sizes the probe's metadata `flatten` names: KerasHub leaves the sequence length open,
and its layers need it while tracing.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np  # noqa: E402
import keras  # noqa: E402
import keras_hub  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
M = keras_hub.models
VOCABULARY, LENGTH, BATCH = 50, 12, 2
FRAMES = 16  # an audio encoder's input frames
TEXT = dict(vocabulary_size=VOCABULARY, num_layers=2, hidden_dim=16, intermediate_dim=32)
DECODER = dict(TEXT, num_query_heads=4, num_key_value_heads=2)


def bert():
    return M.BertBackbone(num_heads=2, max_sequence_length=16, **TEXT)


def gpt2():
    return M.GPT2Backbone(num_heads=2, max_sequence_length=16, **TEXT)


def llama():
    return M.LlamaBackbone(**DECODER)


# model -> a function building it with random weights
MODELS = {
    "bert": bert,
    "distilbert": lambda: M.DistilBertBackbone(num_heads=2, max_sequence_length=16, **TEXT),
    "roberta": lambda: M.RobertaBackbone(num_heads=2, max_sequence_length=16, **TEXT),
    "electra": lambda: M.ElectraBackbone(vocab_size=VOCABULARY, num_layers=2, num_heads=2, hidden_dim=16,
                                         embedding_dim=8, intermediate_dim=32, max_sequence_length=16),
    "albert": lambda: M.AlbertBackbone(num_heads=2, embedding_dim=8, max_sequence_length=16, num_groups=1,
                                       num_inner_repetitions=1, **TEXT),
    "gpt2": gpt2,
    "opt": lambda: M.OPTBackbone(num_heads=2, max_sequence_length=16, **TEXT),
    "llama": llama,
    "mistral": lambda: M.MistralBackbone(sliding_window=6, **DECODER),
    "gemma": lambda: M.GemmaBackbone(head_dim=4, **DECODER),
    "gemma2": lambda: M.GemmaBackbone(head_dim=4, query_head_dim_normalize=False, use_post_ffw_norm=True,
                                      use_post_attention_norm=True, final_logit_soft_cap=30,
                                      attention_logit_soft_cap=50, use_sliding_window_attention=True,
                                      sliding_window_size=6, **DECODER),
    "qwen": lambda: M.QwenBackbone(**DECODER),
    "qwen3": lambda: M.Qwen3Backbone(head_dim=4, **DECODER),
    "phi3": lambda: M.Phi3Backbone(**DECODER),
    "vit": lambda: M.ViTBackbone(image_shape=(16, 16, 3), patch_size=4, num_layers=2, num_heads=2, hidden_dim=16,
                                 mlp_dim=32),
    "bert_text_classifier": lambda: M.BertTextClassifier(backbone=bert(), num_classes=3, preprocessor=None),
    "gpt2_causal_lm": lambda: M.GPT2CausalLM(backbone=gpt2(), preprocessor=None),
    "llama_causal_lm": lambda: M.LlamaCausalLM(backbone=llama(), preprocessor=None),
    # An encoder-decoder: its decoder's causal mask is broadcast over the open batch.
    "bart": lambda: M.BartBackbone(num_heads=2, max_sequence_length=16, **TEXT),
    # Whisper's encoder reads FRAMES log-mel frames (`keras.ops.pad`, `dot_product_attention`).
    "whisper": lambda: M.WhisperBackbone(num_heads=2, num_mels=8, max_encoder_sequence_length=FRAMES,
                                         max_decoder_sequence_length=16, **TEXT),
    # T5's relative attention bias: `take` of a constant [T, T] of buckets.
    "t5": lambda: M.T5Backbone(num_heads=2, **TEXT),
    # Falcon's ALiBi positions: `cumsum` of the padding mask.
    "falcon": lambda: M.FalconBackbone(num_attention_heads=2, **TEXT),
}


def probe_inputs(model, rng):
    """The model's inputs by name: token ids in [1, VOCABULARY) whose second row pads its last
    third (id 0, mask 0), segment ids 0 then 1 (an encoder-decoder's `encoder_`/`decoder_` ids
    and masks alike); images uniform in [0, 1)."""
    inputs = {}
    for tensor in model.inputs:
        name = tensor.name
        if name == "images":
            inputs[name] = rng.uniform(size=(BATCH, *tensor.shape[1:])).astype(np.float32)
            continue
        if name == "encoder_features":
            inputs[name] = rng.normal(size=(BATCH, FRAMES, tensor.shape[-1])).astype(np.float32)
            continue
        mask = np.ones((BATCH, LENGTH), dtype=np.int32)
        mask[1, LENGTH - LENGTH // 3:] = 0
        kind = name.removeprefix("encoder_").removeprefix("decoder_")
        if kind == "token_ids":
            inputs[name] = (rng.integers(1, VOCABULARY, size=(BATCH, LENGTH)) * mask).astype(np.int32)
        elif kind == "padding_mask":
            inputs[name] = mask
        elif kind == "segment_ids":
            inputs[name] = (np.arange(LENGTH)[None, :] >= LENGTH // 2).astype(np.int32).repeat(BATCH, 0) * mask
        else:
            raise ValueError(f"{model.name}: no probe for the input {name}")
    return inputs


def flatten_options(model):
    """`--shape NAME=LENGTH` for every input whose sequence length the model leaves open."""
    options = []
    for tensor in model.inputs:
        if len(tensor.shape) == 2 and tensor.shape[1] is None:
            options += ["--shape", f"{tensor.name}={LENGTH}"]
        elif tensor.name == "encoder_features" and tensor.shape[1] is None:
            options += ["--shape", f"{tensor.name}={FRAMES},{tensor.shape[2]}"]
    return options


def write(name, seed):
    keras.backend.clear_session()
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    model = MODELS[name]()
    for weight in model.weights:  # non-trivial everywhere: norms' scales and biases too
        weight.assign(rng.normal(scale=0.3, size=weight.shape).astype(np.float32))
    path = os.path.join(HERE, f"{name}.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, compile=False)
    inputs = probe_inputs(loaded, rng)
    structure = loaded._inputs_struct
    values = list(inputs.values())
    call = {key: inputs[key] for key in structure} if isinstance(structure, dict) else (values if len(values) > 1 else values[0])
    outputs = loaded(call, training=False)
    if isinstance(outputs, dict):
        named = {key: outputs[key] for key in keras.tree.flatten({key: key for key in outputs})}
    else:
        named = dict(zip(loaded.output_names, keras.tree.flatten(outputs)))
    tensors = {f"inputs.{k}": v for k, v in inputs.items()}
    tensors.update({f"expected.{k}": keras.ops.convert_to_numpy(v).astype(np.float32) for k, v in named.items()})
    metadata = {"flatten": json.dumps(flatten_options(loaded)), "class": type(loaded).__name__}
    save_file(tensors, os.path.join(HERE, f"{name}.probe.safetensors"), metadata=metadata)
    print(f"wrote {name}.keras ({os.path.getsize(path)} bytes) and its probe: outputs {list(named)}")


def main():
    chosen = sys.argv[1:] or list(MODELS)
    unknown = set(chosen) - set(MODELS)
    if unknown:
        raise SystemExit(f"unknown models {sorted(unknown)}; choose from {list(MODELS)}")
    for seed, name in enumerate(MODELS):
        if name in chosen:
            write(name, seed + 1)


if __name__ == "__main__":
    main()
