#!/usr/bin/env python3
"""Reference side of `cargo xtask bench`: PyTorch and TensorFlow/Keras on the same rows.

    python3 xtask/python/bench_reference.py --cases CASES.json [--threads 2] [--quick] [--json OUT]
                                            [--only torch|tensorflow] [--no-rss]
    python3 xtask/python/bench_reference.py --serve [--threads 2] [--quick]

CASES.json is a list of rows written by `cargo xtask bench`, each
`{"shape": {"batch", "seq_len", "features", "heads", "key_dim"}, "mask": "none|causal|padding",
"model": "keras|projected", "call": "plain|scores|dropout"}`. Without --cases the seed's row
(32,136,4,6x4) is measured with every mask and both models, plain calls.

Calls: `plain` is the layer's default call; `scores` returns the attention probabilities too
(Keras `return_attention_scores=True`; torch `need_weights=True`, and since SDPA cannot return
them, the Keras-style torch model writes the softmax out: `keras_style_explicit`); `dropout`
builds every layer with dropout 0.1 on the probabilities (SDPA `dropout_p` in training).

Every row is x [B, T, D] -> [B, T, D], MSE against fixed random targets, Adam lr 1e-3; masks are
the same as ours in each library's own form (padding lengths `T - T*(i+1)//(4B)`, at least 1):

* keras rows
  * torch `keras_style_sdpa`: the Keras MultiHeadAttention function written in torch (q/k/v
    Linear(D -> h*k), split heads, `F.scaled_dot_product_attention`, output Linear(h*k -> D));
    causal: `is_causal=True`; padding: a boolean `attn_mask [B, 1, 1, S]`.
  * tensorflow `keras_mha`: the real `keras.layers.MultiHeadAttention(h, k)`, forward and train
    step each in `tf.function`; causal: `use_causal_mask=True`; padding: `attention_mask [B, T, S]`.
* projected rows
  * torch `projected_mha`: Linear(D, h*k) -> nn.MultiheadAttention(h*k, h, batch_first=True)
    (need_weights=False) -> Linear(h*k, D); causal: boolean `attn_mask [T, S]` with `is_causal=True`;
    padding: `key_padding_mask [B, S]`.
  * torch `projected_sdpa`: the same function with `F.scaled_dot_product_attention`.

Phases: `forward` (inference: torch eval + no_grad, Keras training=False) and `train_step`
(forward, backward, optimizer step). Each is timed with time.perf_counter after warm-up, the
result pulled to the host inside the timed region; the number of repetitions is capped by a time
budget per row (as on our side), so large rows do not take minutes. Peak memory: for each row,
a fresh child process (importing torch only) builds the row's torch model, takes 3 training steps
and reports its own VmHWM.

`cargo xtask bench` runs this script with --serve and measures each row in rounds, alternating
ours and these on the same cores (see `serve`): this machine's speed drifts by up to 2x over
minutes, and a reference measured minutes away from ours would carry that drift into the ratio.

Timings are only meaningful on otherwise idle cores: with 2 threads on 2 busy cores torch's
OpenMP threads were measured up to 20x slower. The load averages are stored in the JSON.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

SEED = 20240611
RSS_TRAIN_STEPS = 3


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", metavar="FILE", help="the rows to measure (JSON list, written by cargo xtask bench)")
    p.add_argument("--threads", type=int, default=2, help="CPU threads for torch and TensorFlow (default 2)")
    p.add_argument("--quick", action="store_true", help="few repetitions: checks that the script works")
    p.add_argument("--json", metavar="OUT", help="write the results as JSON to OUT")
    p.add_argument("--only", choices=["torch", "tensorflow"], help="benchmark one framework only")
    p.add_argument("--no-rss", action="store_true", help="skip the peak-memory child processes")
    p.add_argument("--isa", choices=sorted(ISA_ENV), help="restrict torch, MKL and oneDNN to this instruction set")
    p.add_argument("--serve", action="store_true",
                   help="answer measurement requests, one JSON line each, on stdin/stdout (cargo xtask bench)")
    # Internal: run as the peak-memory child for one row, print {"peak_rss_mb": ...} and exit.
    p.add_argument("--rss-child", metavar="CASE_JSON", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.threads < 1:
        p.error("--threads must be >= 1")
    return args


def repetitions(quick):
    """(warm-up calls, timed calls, seconds of timed calls): the same policy as `Reps` in Rust."""
    return (1, 3, 0.2) if quick else (10, 50, 3.0)


# The variables that restrict each library to an instruction set (torch's own kernels, MKL, oneDNN
# in torch and TensorFlow), by the names `cargo xtask bench --isa` takes.
ISA_ENV = {
    "avx512": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "portable": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
}


def set_isa_env(isa):
    # Must happen before torch / TensorFlow are imported; the peak-memory children inherit it.
    os.environ.update(ISA_ENV[isa] if isa else {})


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


def padding_lengths(shape):
    b, t = shape["batch"], shape["seq_len"]
    return [max(1, t - t * (i + 1) // (4 * b)) for i in range(b)]


def data(shape):
    import numpy as np

    rng = np.random.default_rng(SEED)
    b, t, f = shape["batch"], shape["seq_len"], shape["features"]
    return rng.standard_normal((b, t, f), dtype=np.float32), rng.standard_normal((b, t, f), dtype=np.float32)


def case_name(case):
    s = case["shape"]
    return f"{s['batch']},{s['seq_len']},{s['features']},{s['heads']}x{s['key_dim']} {case['mask']} {case['model']} {call_of(case)}"


def call_of(case):
    return case.get("call", "plain")


DROPOUT = 0.1


# ----------------------------------------------------------------------------------------------------
# torch
# ----------------------------------------------------------------------------------------------------


def torch_models(torch, case):
    """The torch models of a row, by name, each a module taking x [B, T, D]."""
    nn, F = torch.nn, torch.nn.functional
    s, mask = case["shape"], case["mask"]
    feat, heads, kd = s["features"], s["heads"], s["key_dim"]
    b, t = s["batch"], s["seq_len"]
    width = heads * kd
    keep = None  # [B, 1, 1, S], True = may attend (SDPA's boolean convention)
    ignore = None  # [B, S], True = ignore (nn.MultiheadAttention's convention)
    if mask == "padding":
        positions = torch.arange(t)
        ignore = torch.stack([positions >= n for n in padding_lengths(s)])
        keep = (~ignore)[:, None, None, :]
    causal = mask == "causal"
    blocked_future = torch.triu(torch.ones(t, t, dtype=torch.bool), diagonal=1) if causal else None
    call = call_of(case)
    dropout = DROPOUT if call == "dropout" else 0.0

    def sdpa(q, k, v, training):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=causal, dropout_p=dropout if training else 0.0)

    def explicit(q, k, v):
        """Attention with its probabilities [B, h, T, S] written out (what returning them costs)."""
        logits = q @ k.transpose(-1, -2) / kd**0.5
        if causal:
            logits = logits.masked_fill(blocked_future, float("-inf"))
        if keep is not None:
            logits = logits.masked_fill(~keep, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        return probs @ v, probs

    class KerasStyle(nn.Module):
        """keras.layers.MultiHeadAttention(heads, kd) self-attention, written in torch."""

        def __init__(self):
            super().__init__()
            self.query, self.key, self.value = nn.Linear(feat, width), nn.Linear(feat, width), nn.Linear(feat, width)
            self.attention_output = nn.Linear(width, feat)

        def forward(self, x):
            split = lambda u: u.view(b, t, heads, kd).transpose(1, 2)  # noqa: E731  [B, h, T, k]
            q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
            o = explicit(q, k, v)[0] if call == "scores" else sdpa(q, k, v, self.training)
            return self.attention_output(o.transpose(1, 2).reshape(b, t, width))

    class Projected(nn.Module):
        """Linear(D, h*k) -> nn.MultiheadAttention(h*k, h, batch_first=True) -> Linear(h*k, D)."""

        def __init__(self, use_sdpa):
            super().__init__()
            self.use_sdpa = use_sdpa
            self.proj = nn.Linear(feat, width)
            self.mha = nn.MultiheadAttention(width, heads, dropout=dropout, batch_first=True)
            self.final = nn.Linear(width, feat)

        def forward(self, x):
            z = self.proj(x)
            if self.use_sdpa:
                q, k, v = F.linear(z, self.mha.in_proj_weight, self.mha.in_proj_bias).chunk(3, dim=-1)
                split = lambda u: u.view(b, t, heads, kd).transpose(1, 2)  # noqa: E731
                o = sdpa(split(q), split(k), split(v), self.training).transpose(1, 2).reshape(b, t, width)
                return self.final(self.mha.out_proj(o))
            need_weights = call == "scores"
            out = self.mha(z, z, z, need_weights=need_weights, key_padding_mask=ignore, attn_mask=blocked_future, is_causal=causal)[0]
            return self.final(out)

    torch.manual_seed(SEED)
    if case["model"] == "keras":
        return {"keras_style_explicit" if call == "scores" else "keras_style_sdpa": KerasStyle()}
    if call == "scores":
        return {"projected_mha": Projected(use_sdpa=False)}
    return {"projected_mha": Projected(use_sdpa=False), "projected_sdpa": Projected(use_sdpa=True)}


def torch_steps(torch, model, x, y):
    """(forward, train_step) closures; each returns only after the result is on the host."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = torch.nn.MSELoss()

    def forward():
        model.eval()
        with torch.no_grad():
            out = model(x)
        out.sum().item()

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


def keras_steps(tf, keras, case, x, y):
    s, mask = case["shape"], case["mask"]
    keras.utils.set_random_seed(SEED)
    call = call_of(case)
    layer = keras.layers.MultiHeadAttention(num_heads=s["heads"], key_dim=s["key_dim"], dropout=DROPOUT if call == "dropout" else 0.0)
    scores = call == "scores"

    def apply(inp, training):
        out = layer(inp, inp, attention_mask=attention_mask, use_causal_mask=causal, training=training, return_attention_scores=scores)
        return out[0] if scores else out

    xt, yt = tf.constant(x), tf.constant(y)
    causal = mask == "causal"
    attention_mask = None
    if mask == "padding":
        import numpy as np

        t = s["seq_len"]
        keys = np.arange(t)[None, None, :] < np.array(padding_lengths(s))[:, None, None]
        attention_mask = tf.constant(np.broadcast_to(keys, (s["batch"], t, t)))
    layer(xt, xt, attention_mask=attention_mask, use_causal_mask=causal)  # build
    opt = keras.optimizers.Adam(learning_rate=1e-3)
    opt.build(layer.trainable_variables)

    @tf.function
    def fwd(inp):
        return apply(inp, training=False)

    @tf.function
    def step(inp, target):
        with tf.GradientTape() as tape:
            out = apply(inp, training=True)
            loss = tf.reduce_mean(tf.square(out - target))
        grads = tape.gradient(loss, layer.trainable_variables)
        opt.apply_gradients(zip(grads, layer.trainable_variables))
        return loss

    def forward():
        return fwd(xt).numpy()

    def train_step():
        return float(step(xt, yt).numpy())

    return forward, train_step


# ----------------------------------------------------------------------------------------------------


def time_into(fn, times, warmup, reps, minimum, budget):
    """Times `fn` as `Reps::time_into` does in Rust, appending each timed call's milliseconds."""
    start = time.perf_counter()
    for _ in range(warmup):
        fn()
        if time.perf_counter() - start > budget / 2:
            break
    first = len(times)
    start = time.perf_counter()
    while len(times) - first < reps and (len(times) - first < minimum or time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)


def summarise(case, framework, model, phase, times):
    s = sorted(times)
    return {
        "case": case,
        "framework": framework,
        "model": model,
        "phase": phase,
        "median_ms": statistics.median(s),
        "p10_ms": s[int(round((len(s) - 1) * 0.1))],
        "p90_ms": s[int(round((len(s) - 1) * 0.9))],
        "reps": len(s),
    }


def describe(error):
    """An exception in one line: its type and the first line of its message."""
    first = (str(error).splitlines() or [""])[0]
    return f"{type(error).__name__}: {first[:300]}"


class Reference:
    """The reference models of the row being measured, and every sample taken so far.

    A row may be measured in several rounds (`measure` called again with the same row and phase):
    `cargo xtask bench` alternates rounds of ours and of these, so that a change in the machine's
    speed during the run reaches both sides of a ratio alike, and comes back to the row in later
    passes, after the other rows (its models are then built again). The samples of all rounds of
    all passes, kept by row, make one result.
    """

    def __init__(self, torch, tf, keras, threads):
        self.torch, self.tf, self.keras, self.threads = torch, tf, keras, threads
        self.row_key, self.calls = None, {}  # the row whose models are built: name -> (framework, model, {phase: fn})
        self.samples = {}  # (row key, framework, model, phase) -> [ms]
        self.cases = {}  # row key -> case
        self.peak, self.errors = [], []

    def _build(self, case):
        key = json.dumps(case, sort_keys=True)
        if key == self.row_key:
            return key
        self.row_key, self.calls = None, {}  # drop the last row's models before building these
        self.cases[key] = case
        if self.torch is not None:
            x_np, y_np = data(case["shape"])
            x, y = self.torch.from_numpy(x_np), self.torch.from_numpy(y_np)
            for name, model in torch_models(self.torch, case).items():
                forward, train_step = torch_steps(self.torch, model, x, y)
                self.calls[name] = ("torch", name, {"forward": forward, "train_step": train_step})
        if self.tf is not None and case["model"] == "keras":
            try:
                x, y = data(case["shape"])
                forward, train_step = keras_steps(self.tf, self.keras, case, x, y)
                forward()  # trace outside the timing
                train_step()
                self.calls["keras_mha"] = ("tensorflow", "keras_mha", {"forward": forward, "train_step": train_step})
            except Exception as e:  # noqa: BLE001 - report and go on with the other rows
                self.errors.append(f"tensorflow {case_name(case)}: {describe(e)}")
        self.row_key = key
        return key

    def measure(self, case, phase, warmup, reps, minimum, budget):
        """One round of `phase` of every reference model of `case`; returns this round's times by name."""
        key = self._build(case)
        rounds = {}
        for name, (framework, model, fns) in list(self.calls.items()):
            times = self.samples.setdefault((key, framework, model, phase), [])
            first = len(times)
            try:
                time_into(fns[phase], times, warmup, reps, minimum, budget)
            except Exception as e:  # noqa: BLE001 - report, drop the model, go on with the others
                self.errors.append(f"{framework} {case_name(case)} {phase}: {describe(e)}")
                del self.calls[name]
                continue
            rounds[f"{framework}/{model}"] = times[first:]
        return rounds

    def memory(self, case):
        measured = measure_rss(case, self.threads, self.errors) or {}
        self.peak.append({"case": case, "framework": "torch", "peak_rss_mb": measured.get("peak_rss_mb"),
                          "step_mb": measured.get("step_mb")})

    def matmul_gflops(self, n, reps):
        """torch's float32 `matmul` rate on `[n, n] x [n, n]` (GFLOP/s, the median of `reps`): the best
        matrix-product library on the machine that the reference process holds (MKL on x86)."""
        torch = self.torch
        a, b = torch.randn(n, n), torch.randn(n, n)
        for _ in range(3):
            torch.matmul(a, b)
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            torch.matmul(a, b)
            times.append(time.perf_counter() - start)
        times.sort()
        return 2 * n ** 3 / times[len(times) // 2] / 1e9

    def results(self):
        return [summarise(self.cases[key], framework, model, phase, times)
                for (key, framework, model, phase), times in self.samples.items() if times]

    def report(self, quick, load_start):
        tf, keras = self.tf, self.keras
        return {
            "python": platform.python_version(),
            "torch": self.torch.__version__ if self.torch else None,
            "tensorflow": tf.__version__ if tf else None,
            "keras": keras.__version__ if keras else None,
            "threads": self.threads,
            "isa_env": {k: os.environ[k] for k in sorted({k for env in ISA_ENV.values() for k in env}) if k in os.environ},
            "quick": quick,
            "results": self.results(),
            "peak_rss_mb": self.peak,
            "errors": self.errors,
            "loadavg_start": load_start,
            "loadavg_end": list(os.getloadavg()),
        }


def print_row(r):
    print(f"  {case_name(r['case']):<34} {r['framework']:<10} {r['model']:<17} {r['phase']:<10} "
          f"{r['median_ms']:>10.2f} ms ({r['reps']} reps)", flush=True)


def write_json(path, report):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(report, f, indent=2)
        f.write("\n")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------
# peak memory
# ----------------------------------------------------------------------------------------------------


def rss_child(case, threads):
    """Build the row's first torch model, take RSS_TRAIN_STEPS train steps, print own peak RSS and
    what the steps added to the idle process (MB): the peak over the resident memory once the
    model and data are built, the peak reset there (Linux clear_refs), as `cargo xtask bench`
    measures its own side."""
    torch = import_torch(threads)
    x, y = data(case["shape"])
    model = next(iter(torch_models(torch, case).values()))
    _, train_step = torch_steps(torch, model, torch.from_numpy(x), torch.from_numpy(y))
    idle = own_rss_mb("VmRSS:")
    reset = reset_peak_rss()
    for _ in range(RSS_TRAIN_STEPS):
        train_step()
    peak = own_rss_mb("VmHWM:")
    step = peak - idle if reset and peak is not None and idle is not None else None
    print(json.dumps({"peak_rss_mb": peak, "step_mb": step}))


def own_rss_mb(field):
    """A memory line of this process's status in MB: VmRSS now, VmHWM at its peak (ru_maxrss
    would count the parent's RSS at fork time)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) / 1024
    return None


def reset_peak_rss():
    """Set VmHWM to the current VmRSS (Linux clear_refs 5); False where that is not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def measure_rss(case, threads, errors):
    cmd = [sys.executable, os.path.abspath(__file__), "--rss-child", json.dumps(case), "--threads", str(threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        errors.append(f"peak memory of {case_name(case)}: child exited {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}")
        return None
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    errors.append(f"peak memory of {case_name(case)}: no result from the child")
    return None


# ----------------------------------------------------------------------------------------------------


def default_cases():
    shape = {"batch": 32, "seq_len": 136, "features": 4, "heads": 6, "key_dim": 4}
    return [{"shape": shape, "mask": m, "model": model} for model in ("keras", "projected") for m in ("none", "causal", "padding")]


def serve(reference, quick, load_start):
    """Answers one JSON request per line of standard input with one JSON line on standard output:

    * `{"op": "memory", "case": CASE}` -> `{"ok": true}`: the row's torch peak memory, in a child;
    * `{"op": "matmul", "n": N, "reps": R}` -> `{"ok": true, "gflops": G}`: torch's matmul rate;
    * `{"op": "measure", "case": CASE, "phase": "forward"|"train_step", "warmup": N, "reps": N,
      "minimum": N, "budget_s": S}` -> `{"ok": true, "times": {"torch/NAME": [ms, ...], ...}}`:
      one round of every reference model of the row;
    * `{"op": "report"}` -> the report `--json` writes, every round of a row and phase in one
      result; then the process exits.

    Anything else the libraries print goes to standard error, so that standard output holds
    only the answers.
    """
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr

    def answer(value):
        answers.write(json.dumps(value) + "\n")
        answers.flush()

    answer({"ok": True, "ready": True})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            op = request.get("op")
            if op == "memory":
                reference.memory(request["case"])
                answer({"ok": True})
            elif op == "matmul":
                answer({"ok": True, "gflops": reference.matmul_gflops(request["n"], request["reps"])})
            elif op == "measure":
                times = reference.measure(request["case"], request["phase"], request["warmup"], request["reps"],
                                          request["minimum"], request["budget_s"])
                answer({"ok": True, "times": times})
            elif op == "report":
                answer(reference.report(quick, load_start))
                return 0
            else:
                answer({"ok": False, "error": f"unknown op {op!r}"})
        except Exception as e:  # noqa: BLE001 - the caller reports it
            answer({"ok": False, "error": f"{type(e).__name__}: {e}"})
    return 0


def main(argv=None):
    args = parse_args(argv)
    set_thread_env(args.threads)
    set_isa_env(args.isa)
    if args.rss_child:
        rss_child(json.loads(args.rss_child), args.threads)
        return 0
    load_start = list(os.getloadavg())
    if load_start[0] > 0.5:
        print(f"warning: 1-minute load average is {load_start[0]:.2f} before the benchmark; torch's OpenMP "
              "threads slow down by up to 20x when other processes compete for the cores", file=sys.stderr, flush=True)
    frameworks = [args.only] if args.only else ["torch", "tensorflow"]
    # torch is always imported first (importing it after tensorflow aborts with an LLVM error here).
    torch = import_torch(args.threads)
    tf = keras = None
    if "tensorflow" in frameworks:
        tf, keras = import_tensorflow(args.threads)
    print(f"python {platform.python_version()}, torch {torch.__version__}"
          + (f", tensorflow {tf.__version__}, keras {keras.__version__}" if tf else "")
          + f"; {args.threads} threads", file=sys.stderr, flush=True)
    reference = Reference(torch if "torch" in frameworks else None, tf, keras, args.threads)
    if args.serve:
        return serve(reference, args.quick, load_start)

    cases = default_cases()
    if args.cases:
        with open(args.cases) as f:
            cases = json.load(f)
    warmup, reps, budget = repetitions(args.quick)
    for case in cases:
        if not args.no_rss and reference.torch is not None:
            reference.memory(case)
        for phase in ("forward", "train_step"):
            for name, times in reference.measure(case, phase, warmup, reps, 3, budget).items():
                print_row(summarise(case, *name.split("/"), phase, times))
    for e in reference.errors:
        print(f"note: {e}")
    if args.json:
        write_json(args.json, reference.report(args.quick, load_start))
    return 0


if __name__ == "__main__":
    sys.exit(main())
