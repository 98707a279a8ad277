#!/usr/bin/env python3
"""The benchmark's whole-model rows: a Keras model file run three ways on the same threads, the
forward pass (inference) and a training step (the mean square of the first output, Adam at
1e-3), in turns, each side in a fresh process per round:

* ours: Burn on flex, reading the .keras file (crates/train/examples/model_step.rs);
* the torch module `cargo xtask convert MODEL --to torch` writes, as its `load()` returns it
  (which tells glibc's malloc to keep freed memory: PyTorch's CPU tensors come from malloc, and
  glibc hands every block above 32 MiB back to the system when it is freed, so that the next
  step faults its pages in again), and again with glibc's default (`load(keep_memory=False)`);
* the real Keras (TensorFlow), `tf.function` as `model.fit` compiles it.

The models (datasets/keras-models/, made by make_keras_models.py): `bench_lstm` (LSTM(64) ->
Dense(4) at [32, 136, 4]), `bench_timeseries` (keras.io's time-series Transformer at its own
sizes at [64, 136, 4]) and `bench_forecaster` (three causal blocks of MultiHeadAttention(6, 4)
at [64, 136, 4]). Prints one Markdown table with each side's median over the rounds and the
processor; `--json` writes the rounds too.

    cargo xtask bench --models [--threads 2]    # builds the Burn side, then runs this script
    python3 xtask/python/bench_models.py [--rounds 3] [--seconds 2] [--threads 2] [--model bench_forecaster]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OURS = os.path.join(ROOT, "target", "debug", "examples", "model_step")
XTASK = os.path.join(ROOT, "target", "debug", "xtask")
MODELS = {"bench_lstm": (32, 136, 4), "bench_timeseries": (64, 136, 4), "bench_forecaster": (64, 136, 4)}
SIDES = ["ours (burn flex)", "torch module", "torch module, glibc's default malloc", "keras (tensorflow)"]


def processor():
    """The processor's model name, as /proc/cpuinfo gives it."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def median_ms(fn, seconds):
    """The median of fn's times in ms over `seconds`, after two untimed calls."""
    fn()
    fn()
    times, start = [], time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < seconds:
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def torch_worker(module_path, shape, threads, seconds, keep_memory=True):
    import importlib.util

    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    spec = importlib.util.spec_from_file_location("converted", module_path)
    converted = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(converted)
    model, x = converted.load(keep_memory=keep_memory), torch.randn(*shape)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def first(outputs):
        return outputs[0] if isinstance(outputs, tuple) else outputs

    def forward():
        model.eval()
        with torch.no_grad():
            first(model(x)).sum().item()

    def train_step():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = (first(model(x)) ** 2).mean()
        loss.backward()
        optimizer.step()
        loss.item()

    return median_ms(forward, seconds), median_ms(train_step, seconds)


def keras_worker(model_path, shape, threads, seconds):
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import keras

    model = keras.saving.load_model(model_path)
    x = tf.constant(np.random.default_rng(0).normal(size=shape).astype(np.float32))
    optimizer = keras.optimizers.Adam(learning_rate=1e-3)

    @tf.function
    def forward_fn(inputs):
        return keras.tree.flatten(model(inputs, training=False))[0]

    @tf.function
    def step_fn(inputs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(keras.tree.flatten(model(inputs, training=True))[0]))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return median_ms(lambda: forward_fn(x).numpy(), seconds), median_ms(lambda: float(step_fn(x).numpy()), seconds)


def run_side(side, name, module_path, args):
    """One side's (forward ms, train step ms) for one model, in a fresh process."""
    shape = MODELS[name]
    model_path = os.path.join(ROOT, "datasets", "keras-models", f"{name}.keras")
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads), TF_CPP_MIN_LOG_LEVEL="3")
    if side == "ours (burn flex)":
        command = [args.ours, model_path, "--seconds", str(args.seconds), "--shape", ",".join(map(str, shape))]
    else:
        kind, path = ("keras", model_path) if side.startswith("keras") else ("torch", module_path)
        if side.endswith("default malloc"):
            kind = "torch-default-malloc"
        command = [sys.executable, __file__, "--worker", kind, path, ",".join(map(str, shape)),
                   "--threads", str(args.threads), "--seconds", str(args.seconds)]
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit(f"{side} on {name} failed:\n{run.stderr[-2000:]}")
    answer = json.loads(run.stdout.strip().splitlines()[-1])
    return answer["forward_ms"], answer["train_step_ms"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="per side, phase and round")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--model", action="append", choices=list(MODELS), help="default: every model")
    parser.add_argument("--json", help="also write every round here")
    parser.add_argument("--ours", default=OURS, help="the model_step binary (default: target/debug/examples/)")
    parser.add_argument("--xtask", default=XTASK, help="the xtask binary (default: target/debug/)")
    parser.add_argument("--worker", nargs=3, metavar=("KIND", "PATH", "SHAPE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        kind, path, shape = args.worker[0], args.worker[1], tuple(int(d) for d in args.worker[2].split(","))
        if kind == "keras":
            forward, train_step = keras_worker(path, shape, args.threads, args.seconds)
        else:
            forward, train_step = torch_worker(path, shape, args.threads, args.seconds, keep_memory=kind == "torch")
        print(json.dumps({"forward_ms": forward, "train_step_ms": train_step}))
        return
    for binary in (args.ours, args.xtask):
        if not os.path.exists(binary):
            raise SystemExit(f"{binary} is missing: run `cargo build --examples --bin xtask` first")
    names = args.model or list(MODELS)
    times = {name: {side: {"forward": [], "train_step": []} for side in SIDES} for name in names}
    with tempfile.TemporaryDirectory() as out:
        modules = {}
        for name in names:
            target = os.path.join(out, name)
            subprocess.run([args.xtask, "convert", os.path.join(ROOT, "datasets", "keras-models", f"{name}.keras"),
                            "--to", "torch", "--out", target], check=True, capture_output=True)
            modules[name] = target + ".py"
        for round_ in range(args.rounds):
            for name in names:
                for side in SIDES:
                    forward, train_step = run_side(side, name, modules[name], args)
                    times[name][side]["forward"].append(forward)
                    times[name][side]["train_step"].append(train_step)
                print(f"round {round_ + 1}, {name}: " + "; ".join(
                    f"{side} {t['forward'][-1]:.1f} / {t['train_step'][-1]:.1f} ms" for side, t in times[name].items()),
                    flush=True)
    print(f"\n{processor()}, {args.threads} threads, median of {args.rounds} rounds of {args.seconds} s (ms):\n")
    print("| model | phase | " + " | ".join(SIDES) + " | torch module / keras | ours / keras |")
    print("|---|---|" + "---:|" * (len(SIDES) + 2))
    for name in names:
        for phase in ["forward", "train_step"]:
            medians = {side: statistics.median(t[phase]) for side, t in times[name].items()}
            keras = medians["keras (tensorflow)"]
            cells = " | ".join(f"{v:.1f}" for v in medians.values())
            print(f"| {name} {list(MODELS[name])} | {phase} | {cells} | {medians['torch module'] / keras:.2f} "
                  f"({medians[SIDES[2]] / keras:.2f} default malloc) | {medians['ours (burn flex)'] / keras:.2f} |")
    if args.json:
        report = {"processor": processor(), "threads": args.threads, "seconds": args.seconds, "rounds": times}
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json + ".tmp", "w") as f:
            json.dump(report, f, indent=1)
        os.replace(args.json + ".tmp", args.json)


if __name__ == "__main__":
    main()
