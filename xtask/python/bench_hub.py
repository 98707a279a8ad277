#!/usr/bin/env python3
"""KerasHub backbones' forward pass: the torch module `cargo xtask convert` writes against Keras
(TensorFlow) itself, on the same threads, in turns, each side in a fresh process per round.

The models are made here by keras-hub 0.32.0 with random weights (seeded): a BERT-like
`BertBackbone` and a Llama-like `LlamaBackbone`, hidden 256, 4 layers, 4 heads (Llama: 2 key/value
heads), intermediate 1024, vocabulary 1000, at sequence 128 and batch 8, half the rows padding
their last quarter. Each is flattened (`python -m keras2torch.flatten`) and converted (`cargo
xtask convert --to torch`); Keras runs the original model under `tf.function`, torch the module
`load()` returns, under `torch.no_grad()`. Prints a Markdown table of the medians and the processor.

    cargo build --bin xtask
    python3 xtask/python/bench_hub.py [--rounds 3] [--seconds 3] [--threads 2] [--model bert]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from bench_models import median_ms, processor  # the same timing and processor name as the model rows

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
XTASK = os.path.join(ROOT, "target", "debug", "xtask")
BATCH, LENGTH, VOCABULARY = 8, 128, 1000
SIZES = dict(vocabulary_size=VOCABULARY, num_layers=4, hidden_dim=256, intermediate_dim=1024)
MODELS = ["bert", "llama"]
SIDES = ["torch module", "keras (tensorflow)"]


def build(name):
    import keras
    import keras_hub

    keras.utils.set_random_seed(0)
    if name == "bert":
        return keras_hub.models.BertBackbone(num_heads=4, max_sequence_length=LENGTH, **SIZES)
    return keras_hub.models.LlamaBackbone(num_query_heads=4, num_key_value_heads=2, **SIZES)


def inputs(names):
    """Token ids, and a padding mask whose odd rows pad their last quarter, by input name."""
    import numpy as np

    rng = np.random.default_rng(0)
    mask = np.ones((BATCH, LENGTH), dtype=np.int32)
    mask[1::2, LENGTH * 3 // 4:] = 0
    values = {"token_ids": rng.integers(1, VOCABULARY, size=(BATCH, LENGTH)).astype(np.int32) * mask,
              "padding_mask": mask, "segment_ids": np.zeros((BATCH, LENGTH), dtype=np.int32)}
    return {name: values[name] for name in names}


def torch_worker(module_path, threads, seconds):
    import importlib.util

    import torch

    torch.set_num_threads(threads)
    spec = importlib.util.spec_from_file_location("converted", module_path)
    converted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(converted)
    model = converted.load()
    values = inputs(converted.INPUTS)
    args = [torch.from_numpy(values[n]).to(converted.INPUT_DTYPES[n]) for n in converted.INPUTS]

    def forward():
        with torch.no_grad():
            outputs = model(*args)
            (outputs[0] if isinstance(outputs, tuple) else outputs).sum().item()

    return median_ms(forward, seconds)


def keras_worker(model_path, threads, seconds):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import keras
    import keras_hub  # noqa: F401  registers KerasHub's classes

    model = keras.saving.load_model(model_path, compile=False)
    values = {k: tf.constant(v) for k, v in inputs([t.name for t in model.inputs]).items()}

    @tf.function
    def forward_fn(x):
        return keras.tree.flatten(model(x, training=False))[0]

    return median_ms(lambda: forward_fn(values).numpy(), seconds)


def prepare(name, out, xtask):
    """The model's .keras and its torch module (flattened, then converted)."""
    model_path = os.path.join(out, f"{name}.keras")
    build(name).save(model_path)
    flat = os.path.join(out, f"{name}.flat.keras")
    shapes = [a for n in ("token_ids", "padding_mask", "segment_ids") for a in ("--shape", f"{n}={LENGTH}")]
    if name != "bert":
        shapes = shapes[:4]
    subprocess.run([sys.executable, "-m", "keras2torch.flatten", model_path, "--out", flat,
                    "--import", os.path.join(ROOT, "datasets", "keras-hub", "hub.py"), *shapes],
                   check=True, capture_output=True, cwd=os.path.join(ROOT, "python"))
    target = os.path.join(out, name)
    subprocess.run([xtask, "convert", flat, "--to", "torch", "--out", target], check=True, capture_output=True)
    return model_path, target + ".py"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0, help="per side and round")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--model", action="append", choices=MODELS, help="default: both")
    parser.add_argument("--xtask", default=XTASK)
    parser.add_argument("--worker", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, path = args.worker
        worker = keras_worker if kind == "keras" else torch_worker
        print(json.dumps({"forward_ms": worker(path, args.threads, args.seconds)}))
        return
    if not os.path.exists(args.xtask):
        raise SystemExit(f"{args.xtask} is missing: run `cargo build --bin xtask` first")
    names = args.model or MODELS
    times = {name: {side: [] for side in SIDES} for name in names}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    with tempfile.TemporaryDirectory() as out:
        files = {name: prepare(name, out, args.xtask) for name in names}
        for round_ in range(args.rounds):
            for name in names:
                for side, (kind, path) in zip(SIDES, [("torch", files[name][1]), ("keras", files[name][0])]):
                    run = subprocess.run([sys.executable, __file__, "--worker", kind, path, "--threads",
                                          str(args.threads), "--seconds", str(args.seconds)],
                                         env=env, capture_output=True, text=True)
                    if run.returncode != 0:
                        raise SystemExit(f"{side} on {name} failed:\n{run.stderr[-2000:]}")
                    times[name][side].append(json.loads(run.stdout.strip().splitlines()[-1])["forward_ms"])
                print(f"round {round_ + 1}, {name}: " + "; ".join(
                    f"{side} {t[-1]:.1f} ms" for side, t in times[name].items()), flush=True)
    print(f"\n{processor()}, {args.threads} threads, forward at batch {BATCH}, sequence {LENGTH}, "
          f"median of {args.rounds} rounds of {args.seconds} s (ms):\n")
    print("| model | " + " | ".join(SIDES) + " | torch module / keras |")
    print("|---|" + "---:|" * (len(SIDES) + 1))
    for name in names:
        medians = [statistics.median(times[name][side]) for side in SIDES]
        print(f"| {name} (hidden 256, 4 layers) | " + " | ".join(f"{m:.1f}" for m in medians)
              + f" | {medians[0] / medians[1]:.2f} |")


if __name__ == "__main__":
    main()
