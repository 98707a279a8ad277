#!/usr/bin/env python3
"""The benchmark's recurrent row: LSTM(64, return_sequences=True) -> Dense(4) on [32, 136, 4],
forward pass and training step (MSE, Adam 1e-3), ours (Burn on flex, through the Keras file
datasets/keras-models/bench_lstm.keras and crates/train/examples/recurrent_step.rs) in turns with
torch's nn.LSTM + nn.Linear and, where TensorFlow is installed, the real Keras layers, all on the
same threads. Prints one Markdown table with each side's median over the rounds, ours / fastest
reference, and the processor.

    cargo build --examples && python3 xtask/python/bench_recurrent.py [--rounds 3] [--seconds 2] [--threads 2]
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OURS = os.path.join(ROOT, "target", "debug", "examples", "recurrent_step")
MODEL = os.path.join(ROOT, "datasets", "keras-models", "bench_lstm.keras")
SHAPE = (32, 136, 4)
UNITS = 64


def processor():
    """The processor's model name, as lscpu gives it."""
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


def torch_side(threads):
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)

    class LstmHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(SHAPE[2], UNITS, batch_first=True)
            self.head = torch.nn.Linear(UNITS, SHAPE[2])

        def forward(self, x):
            return self.head(self.lstm(x)[0])

    model, x = LstmHead(), torch.randn(*SHAPE)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

    def forward():
        model.eval()
        with torch.no_grad():
            model(x).sum().item()

    def train_step():
        model.train()
        optimizer.zero_grad(set_to_none=True)
        loss = ((model(x) - x) ** 2).mean()
        loss.backward()
        optimizer.step()
        loss.item()

    return forward, train_step


def keras_side(threads):
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    import keras
    import numpy as np

    model = keras.saving.load_model(MODEL)
    x = tf.constant(np.random.default_rng(0).normal(size=SHAPE).astype(np.float32))
    optimizer = keras.optimizers.Adam(learning_rate=1e-3)

    @tf.function
    def forward_fn(inputs):
        return model(inputs, training=False)

    @tf.function
    def step_fn(inputs):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(inputs, training=True) - inputs))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return (lambda: forward_fn(x).numpy()), (lambda: float(step_fn(x).numpy()))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0, help="per side, phase and round")
    parser.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    args = parser.parse_args()
    if not os.path.exists(OURS):
        raise SystemExit(f"{OURS} is missing: run `cargo build --examples` first")
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    sides = {"torch nn.LSTM": torch_side(args.threads)}  # torch before tensorflow: importing it after aborts
    try:
        sides["keras LSTM (tensorflow)"] = keras_side(args.threads)
    except ImportError:
        pass
    times = {name: {"forward": [], "train_step": []} for name in ["ours (burn flex)", *sides]}
    for round_ in range(args.rounds):
        out = subprocess.run([OURS, MODEL, "--seconds", str(args.seconds), "--shape", ",".join(map(str, SHAPE))],
                             env=env, capture_output=True, text=True, check=True).stdout
        ours = json.loads(out.strip().splitlines()[-1])
        times["ours (burn flex)"]["forward"].append(ours["forward_ms"])
        times["ours (burn flex)"]["train_step"].append(ours["train_step_ms"])
        for name, (forward, train_step) in sides.items():
            times[name]["forward"].append(median_ms(forward, args.seconds))
            times[name]["train_step"].append(median_ms(train_step, args.seconds))
        print(f"round {round_ + 1}: " + "; ".join(
            f"{name} {t['forward'][-1]:.2f} / {t['train_step'][-1]:.2f} ms" for name, t in times.items()), flush=True)
    print(f"\n{processor()}, {args.threads} threads, LSTM({UNITS}, return_sequences=True) -> Dense({SHAPE[2]}) on "
          f"{list(SHAPE)}, median of {args.rounds} rounds of {args.seconds} s (ms):\n")
    print("| phase | " + " | ".join(times) + " | ours / fastest reference |")
    print("|---|" + "---:|" * (len(times) + 1))
    for phase in ["forward", "train_step"]:
        medians = {name: statistics.median(t[phase]) for name, t in times.items()}
        fastest = min(v for k, v in medians.items() if not k.startswith("ours"))
        cells = " | ".join(f"{v:.2f}" for v in medians.values())
        print(f"| {phase} | {cells} | {medians['ours (burn flex)'] / fastest:.1f} |")


if __name__ == "__main__":
    main()
