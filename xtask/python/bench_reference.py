#!/usr/bin/env python3
"""Reference side of the attention benchmark: PyTorch and TensorFlow/Keras on the same problem.

    python3 xtask/python/bench_reference.py [--threads 2] [--quick] [--json OUT] [--only torch|tensorflow]

Problem (defaults = the project's seed shape): x [batch=32, seq_len=136, features=4] -> [32, 136, 4],
MSE loss against fixed random targets, Adam lr 1e-3. Models:

* torch `keras_style_sdpa`: the Keras MultiHeadAttention function written in torch: q/k/v
  Linear(F -> h*k), split heads, `F.scaled_dot_product_attention`, output Linear(h*k -> F).
* torch `keras_style_manual`: the same, with an explicit `softmax(q k^T * scale) v`.
* torch `projected_mha`: Linear(F, h*k) -> nn.MultiheadAttention(h*k, h, batch_first=True)
  (need_weights=False) -> Linear(h*k, F).
* tensorflow `keras_mha`: the real `keras.layers.MultiHeadAttention(h, k)` self-attention, forward and
  train step each wrapped in `tf.function(jit_compile=False)`; `keras_mha_xla` is the same with
  `jit_compile=True` (left out, with a note in `errors`, if XLA fails).

Phases: `forward` (inference: torch eval + no_grad, Keras training=False) and `train_step` (forward,
backward, optimizer step). After warm-up, each rep is timed with time.perf_counter, with the result
pulled to the host (`.item()` / `.numpy()`) inside the timed region. Reported: median, p10, p90 (ms) and
samples/s = batch / median.

Peak memory: for each framework, a fresh child process (importing only that framework) builds the
model(s) and runs 20 train steps of `keras_style_sdpa` (torch) / `keras_mha` (tensorflow) and reports its
own ru_maxrss.

The JSON written by --json:
  {"python", "torch", "tensorflow", "keras", "threads", "warmup", "reps",
   "shape": {"batch", "seq_len", "features", "heads", "key_dim"},
   "results": [{"framework", "model", "phase", "median_ms", "p10_ms", "p90_ms", "samples_per_s", "params"}],
   "peak_rss_mb": {"torch", "tensorflow"}, "errors": [...], "loadavg_start": [...], "loadavg_end": [...]}

Timings are only meaningful on otherwise idle cores: with 2 threads on 2 busy cores, torch's OpenMP
threads were measured up to 20x slower (TensorFlow's own thread pool much less so). The script warns
when the load average is high at the start and stores the load averages in the JSON.
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

SEED = 20240611
RSS_TRAIN_STEPS = 20


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch and TensorFlow (default 2)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=136)
    p.add_argument("--features", type=int, default=4)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--key-dim", type=int, default=4)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--quick", action="store_true", help="warmup 2, reps 5")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    p.add_argument("--only", choices=["torch", "tensorflow"], help="benchmark one framework only")
    p.add_argument("--no-rss", action="store_true", help="skip the peak-RSS child processes")
    # Internal: run as the peak-RSS child for one framework, print {"peak_rss_mb": ...} and exit.
    p.add_argument("--rss-child", choices=["torch", "tensorflow"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.quick:
        args.warmup, args.reps = 2, 5
    if args.threads < 1 or args.reps < 1 or args.warmup < 0:
        p.error("--threads and --reps must be >= 1, --warmup >= 0")
    return args


def set_thread_env(threads):
    # Must happen before torch / TensorFlow are imported.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        os.environ[var] = str(threads)
    os.environ["TF_NUM_INTEROP_THREADS"] = str(threads)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def import_torch(threads):
    import torch
    import torch._dynamo  # noqa: F401  (must be imported before tensorflow in this environment)

    torch.set_num_threads(threads)
    # torch 2.15 names it set_num_interop_threads; older releases set_interop_threads.
    set_interop = getattr(torch, "set_num_interop_threads", None) or getattr(torch, "set_interop_threads", None)
    if set_interop is not None:
        try:
            set_interop(threads)
        except RuntimeError:
            pass  # already set (only allowed once per process)
    return torch


def import_tensorflow(threads):
    import tensorflow as tf
    import keras

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    try:
        tf.config.set_visible_devices([], "GPU")
    except (RuntimeError, ValueError):
        pass
    return tf, keras


def data(shape):
    import numpy as np

    rng = np.random.default_rng(SEED)
    b, t, f = shape["batch"], shape["seq_len"], shape["features"]
    x = rng.standard_normal((b, t, f), dtype=np.float32)
    y = rng.standard_normal((b, t, f), dtype=np.float32)
    return x, y


# ----------------------------------------------------------------------------------------------------
# torch models
# ----------------------------------------------------------------------------------------------------


def torch_models(torch, shape):
    nn = torch.nn
    F = torch.nn.functional
    feat, heads, kd = shape["features"], shape["heads"], shape["key_dim"]
    width = heads * kd

    class KerasStyle(nn.Module):
        """keras.layers.MultiHeadAttention(heads, kd) self-attention, written in torch."""

        def __init__(self, sdpa):
            super().__init__()
            self.sdpa = sdpa
            self.query = nn.Linear(feat, width)
            self.key = nn.Linear(feat, width)
            self.value = nn.Linear(feat, width)
            self.attention_output = nn.Linear(width, feat)
            self.scale = 1.0 / kd**0.5

        def split(self, u):
            b, t, _ = u.shape
            return u.view(b, t, heads, kd).transpose(1, 2)  # [B,h,T,k]

        def forward(self, x):
            q, k, v = self.split(self.query(x)), self.split(self.key(x)), self.split(self.value(x))
            if self.sdpa:
                o = F.scaled_dot_product_attention(q, k, v)
            else:
                o = torch.softmax(torch.matmul(q, k.transpose(-2, -1)) * self.scale, dim=-1) @ v
            b, _, t, _ = o.shape
            return self.attention_output(o.transpose(1, 2).reshape(b, t, width))

    class Projected(nn.Module):
        """Linear(F, h*k) -> nn.MultiheadAttention(h*k, h, batch_first=True) -> Linear(h*k, F)."""

        def __init__(self):
            super().__init__()
            self.proj = nn.Linear(feat, width)
            self.mha = nn.MultiheadAttention(width, heads, batch_first=True)
            self.final = nn.Linear(width, feat)

        def forward(self, x):
            z = self.proj(x)
            return self.final(self.mha(z, z, z, need_weights=False)[0])

    torch.manual_seed(SEED)
    return {
        "keras_style_sdpa": KerasStyle(sdpa=True),
        "keras_style_manual": KerasStyle(sdpa=False),
        "projected_mha": Projected(),
    }


def torch_steps(torch, model, x, y):
    """(forward, train_step) closures; each returns only after the result is on the host."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.MSELoss()

    def forward():
        model.eval()
        with torch.no_grad():
            out = model(x)
        out.sum().item()  # pull a result to the host (no-op synchronisation on CPU)
        return out

    def train_step():
        model.train()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return forward, train_step


# ----------------------------------------------------------------------------------------------------
# TensorFlow / Keras
# ----------------------------------------------------------------------------------------------------


def keras_steps(tf, keras, shape, x, y, jit_compile):
    keras.utils.set_random_seed(SEED)
    layer = keras.layers.MultiHeadAttention(num_heads=shape["heads"], key_dim=shape["key_dim"])
    xt, yt = tf.constant(x), tf.constant(y)
    layer(xt, xt)  # build
    opt = keras.optimizers.Adam(learning_rate=1e-3)
    opt.build(layer.trainable_variables)

    @tf.function(jit_compile=jit_compile)
    def fwd(inp):
        return layer(inp, inp, training=False)

    @tf.function(jit_compile=jit_compile)
    def step(inp, target):
        with tf.GradientTape() as tape:
            out = layer(inp, inp, training=True)
            loss = tf.reduce_mean(tf.square(out - target))
        grads = tape.gradient(loss, layer.trainable_variables)
        opt.apply_gradients(zip(grads, layer.trainable_variables))
        return loss

    def forward():
        return fwd(xt).numpy()

    def train_step():
        return float(step(xt, yt).numpy())

    params = int(sum(int(tf.size(v)) for v in layer.trainable_variables))
    return forward, train_step, params


# ----------------------------------------------------------------------------------------------------


def time_it(fn, warmup, reps):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return times


def percentile(sorted_values, q):
    """Linear-interpolation percentile (numpy's default) of an already sorted list."""
    if len(sorted_values) == 1:
        return sorted_values[0]
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarise(framework, model, phase, times, batch, params):
    s = sorted(times)
    median = statistics.median(s)
    return {
        "framework": framework,
        "model": model,
        "phase": phase,
        "median_ms": median,
        "p10_ms": percentile(s, 0.10),
        "p90_ms": percentile(s, 0.90),
        "samples_per_s": batch / (median / 1e3),
        "params": params,
    }


def bench_torch(torch, shape, args, results):
    import numpy as np

    x_np, y_np = data(shape)
    x, y = torch.from_numpy(x_np), torch.from_numpy(y_np)
    for name, model in torch_models(torch, shape).items():
        params = sum(p.numel() for p in model.parameters())
        forward, train_step = torch_steps(torch, model, x, y)
        for phase, fn in (("forward", forward), ("train_step", train_step)):
            times = time_it(fn, args.warmup, args.reps)
            results.append(summarise("torch", name, phase, times, shape["batch"], params))
            print_row(results[-1])
        assert np.isfinite(train_step())


def bench_tensorflow(tf, keras, shape, args, results, errors):
    x, y = data(shape)
    for name, jit in (("keras_mha", False), ("keras_mha_xla", True)):
        try:
            forward, train_step, params = keras_steps(tf, keras, shape, x, y, jit)
            forward()  # trace / compile outside the timing (the warm-up would too, even with --warmup 0)
            train_step()
        except Exception as e:  # noqa: BLE001 - XLA may be unavailable; report and go on
            if not jit:
                raise
            errors.append(f"{name}: jit_compile=True failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}")
            print(f"  ({errors[-1]})")
            continue
        for phase, fn in (("forward", forward), ("train_step", train_step)):
            times = time_it(fn, args.warmup, args.reps)
            results.append(summarise("tensorflow", name, phase, times, shape["batch"], params))
            print_row(results[-1])


def print_header():
    print(f"{'framework':<11} {'model':<19} {'phase':<10} {'median ms':>10} {'p10 ms':>9} {'p90 ms':>9} {'samples/s':>11} {'params':>7}")


def print_row(r):
    print(
        f"{r['framework']:<11} {r['model']:<19} {r['phase']:<10} {r['median_ms']:>10.3f} {r['p10_ms']:>9.3f} "
        f"{r['p90_ms']:>9.3f} {r['samples_per_s']:>11.0f} {r['params']:>7}",
        flush=True,
    )


# ----------------------------------------------------------------------------------------------------
# peak RSS
# ----------------------------------------------------------------------------------------------------


def rss_child(framework, shape, threads):
    """Build the framework's model(s), run RSS_TRAIN_STEPS train steps, print own peak RSS (MB)."""
    x, y = data(shape)
    if framework == "torch":
        torch = import_torch(threads)
        models = torch_models(torch, shape)
        _, train_step = torch_steps(torch, models["keras_style_sdpa"], torch.from_numpy(x), torch.from_numpy(y))
    else:
        tf, keras = import_tensorflow(threads)
        _, train_step, _ = keras_steps(tf, keras, shape, x, y, jit_compile=False)
    for _ in range(RSS_TRAIN_STEPS):
        train_step()
    print(json.dumps({"peak_rss_mb": own_peak_rss_mb()}))


def own_peak_rss_mb():
    """Peak RSS of this process image in MB.

    On Linux, VmHWM from /proc/self/status: ru_maxrss would also count the parent's RSS at fork time
    (the kernel carries the pre-exec high-water mark over into the child's ru_maxrss).
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    # Linux reports ru_maxrss in KiB, macOS in bytes.
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss / 1024 / (1024 if sys.platform == "darwin" else 1)


def measure_rss(framework, args, errors):
    cmd = [
        sys.executable, os.path.abspath(__file__), "--rss-child", framework, "--threads", str(args.threads),
        "--batch", str(args.batch), "--seq-len", str(args.seq_len), "--features", str(args.features),
        "--heads", str(args.heads), "--key-dim", str(args.key_dim),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        errors.append(f"peak_rss {framework}: child exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
        return None
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)["peak_rss_mb"]
    errors.append(f"peak_rss {framework}: no result from child")
    return None


# ----------------------------------------------------------------------------------------------------


def installed_version(*dists):
    """Version of an installed distribution without importing it (None when absent)."""
    from importlib import metadata

    for dist in dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return None


def main(argv=None):
    args = parse_args(argv)
    set_thread_env(args.threads)
    shape = {
        "batch": args.batch,
        "seq_len": args.seq_len,
        "features": args.features,
        "heads": args.heads,
        "key_dim": args.key_dim,
    }
    if args.rss_child:
        rss_child(args.rss_child, shape, args.threads)
        return 0
    errors = []
    load_start = list(os.getloadavg())
    if load_start[0] > 0.5:
        print(f"warning: 1-minute load average is {load_start[0]:.2f} before the benchmark; torch's OpenMP "
              "threads slow down by up to 20x when other processes compete for the cores", flush=True)

    frameworks = [args.only] if args.only else ["torch", "tensorflow"]
    # Peak RSS first, while this process is still small (its children start as forks of it).
    peak = {} if args.no_rss else {fw: measure_rss(fw, args, errors) for fw in frameworks}

    # torch is always imported first (importing it after tensorflow aborts with an LLVM error here).
    torch = import_torch(args.threads)
    tf = keras = None
    if "tensorflow" in frameworks:
        tf, keras = import_tensorflow(args.threads)

    print(
        f"python {platform.python_version()}, torch {torch.__version__}"
        + (f", tensorflow {tf.__version__}, keras {keras.__version__}" if tf else "")
        + f"; threads {args.threads}; x [{args.batch},{args.seq_len},{args.features}], heads {args.heads}, "
        f"key_dim {args.key_dim}; warmup {args.warmup}, reps {args.reps}",
        flush=True,
    )
    print_header()
    results = []
    if "torch" in frameworks:
        bench_torch(torch, shape, args, results)
    if "tensorflow" in frameworks:
        bench_tensorflow(tf, keras, shape, args, results, errors)

    if peak:
        print("peak RSS (fresh process, model(s) + %d train steps): %s" % (
            RSS_TRAIN_STEPS, ", ".join(f"{k} {v:.0f} MB" if v is not None else f"{k} n/a" for k, v in peak.items())))
    for e in errors:
        print(f"note: {e}")

    report = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "tensorflow": tf.__version__ if tf else installed_version("tensorflow-cpu", "tensorflow"),
        "keras": keras.__version__ if keras else installed_version("keras"),
        "threads": args.threads,
        "warmup": args.warmup,
        "reps": args.reps,
        "shape": shape,
        "results": results,
        "peak_rss_mb": peak,
        "errors": errors,
        "loadavg_start": load_start,
        "loadavg_end": list(os.getloadavg()),
    }
    if args.json:
        os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
