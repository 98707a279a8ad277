#!/usr/bin/env python3
"""Regenerate the MultiHeadAttention training-trajectory fixtures (``train_*``).

Each case in ``CASES`` trains a model from given weights for N optimizer steps, one new batch per step, with the
REAL library optimizer, and becomes one ``<case>.safetensors`` file (see README.md beside this script):

* ``init.*``, ``data.x``, ``data.y`` (and ``data.attention_mask``): the float32 starting point,
* ``expected.loss`` [N], ``grads0.*``, ``step1.*``, ``final.*``: the library run in **float64** on those numbers
  (cast up exactly), rounded to float32.

The same library also runs in float32 (``config.f32_drift``), which sets the tolerances
``max(10 x drift, 1e-5)``; the key bias, whose exact gradient is 0, gets the Adam step bound instead
(``zero_gradient_weights``). ``config.checks`` replays the documented optimizer formula in numpy float64 on the
library's gradients (``formula_replay``), replays wrong formulas (``variants``) and, for torch, counts which
optimizer kernel ran and tries the foreach/fused kernels in float32.

Usage::

    python generate_train.py                      # every case, into this script's folder
    python generate_train.py --out /tmp/train --only train_keras_seed
"""

# torch, with torch._dynamo (which loads triton's LLVM), must be imported before tensorflow: the other order aborts
# with "LLVM ERROR: inconsistency in registered CommandLine options" as soon as a torch optimizer is constructed.
import torch
import torch._dynamo  # noqa: F401

import argparse
import collections
import contextlib
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import generate as fx  # noqa: E402  (the forward generator: rng, weight draws, Keras/torch helpers, file writing)

keras, tf = fx.keras, fx.tf

TARGET_NOISE_STD = 0.05
MIN_TOLERANCE = 1e-5


# --------------------------------------------------------------------------------------------------------------------
# Case table. One entry per fixture; add a case by adding a line (the file name is the key).
# --------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KerasTrain:
    """keras.layers.MultiHeadAttention(num_heads, key_dim) self-attention on x [B,T,D] -> [B,T,D], keras Adam.

    ``min_padding_length``: also pass a key-padding ``attention_mask`` whose valid length is drawn per (step, batch)
    from [min_padding_length, seq_len]."""
    description: str
    num_heads: int
    key_dim: int
    input_dim: int
    seq_len: int
    steps: int
    learning_rate: float
    batch: int = 4
    beta_1: float = 0.9
    beta_2: float = 0.999
    epsilon: float = 1e-7
    use_causal_mask: bool = False
    min_padding_length: Optional[int] = None


@dataclass(frozen=True)
class TorchTrain:
    """Linear(in_features, embed_dim) -> nn.MultiheadAttention(embed_dim, num_heads, batch_first=True) on proj(x),
    trained with torch.optim.Adam (default betas and eps) or plain torch.optim.SGD."""
    description: str
    optimizer: str  # "adam" | "sgd"
    lr: float
    in_features: int = 4
    embed_dim: int = 24
    num_heads: int = 6
    seq_len: int = 136
    steps: int = 20
    batch: int = 4


CASES = {
    "train_keras_seed": KerasTrain("Seed Keras model: MultiHeadAttention(num_heads=6, key_dim=4) self-attention on x [4,136,4] -> [4,136,4]; MSE to teacher targets; keras Adam(lr=1e-2, beta_1=0.9, beta_2=0.999, epsilon=1e-7); 20 steps, new batch every step", num_heads=6, key_dim=4, input_dim=4, seq_len=136, steps=20, learning_rate=1e-2),
    "train_torch_projected": TorchTrain("Seed PyTorch model: Linear(4,24) -> nn.MultiheadAttention(24, 6, batch_first=True) self-attention on proj(x); x [4,136,4] -> [4,136,24]; MSE; torch Adam(lr=1e-2, betas=(0.9,0.999), eps=1e-8, weight_decay=0); 20 steps", optimizer="adam", lr=1e-2),
    "train_torch_projected_sgd": TorchTrain("Seed PyTorch model (as train_torch_projected) with plain torch.optim.SGD(lr=0.1, momentum=0); 20 steps", optimizer="sgd", lr=0.1),
    "train_keras_masked": KerasTrain("Keras MultiHeadAttention(num_heads=2, key_dim=4) self-attention on x [4,32,8] with use_causal_mask=True AND a key-padding attention_mask (lengths random per step/batch in [8,32]); keras Adam(learning_rate=3e-2, beta_1=0.9, beta_2=0.999, epsilon=1e-7); 10 steps", num_heads=2, key_dim=4, input_dim=8, seq_len=32, steps=10, learning_rate=3e-2, use_causal_mask=True, min_padding_length=8),
    "train_keras_h3_k2_betas": KerasTrain("EXTRA: Keras MHA(3,2) on x [3,17,5]; keras Adam(lr=5e-3, beta_1=0.8, beta_2=0.99, epsilon=1e-5); 7 steps", num_heads=3, key_dim=2, input_dim=5, seq_len=17, steps=7, learning_rate=5e-3, batch=3, beta_1=0.8, beta_2=0.99, epsilon=1e-5),
    "train_keras_masked_h2_k3": KerasTrain("EXTRA: Keras MHA(2,3) on x [4,12,6], causal AND key padding (lengths in [4,12]); keras Adam(lr=2e-2); 6 steps", num_heads=2, key_dim=3, input_dim=6, seq_len=12, steps=6, learning_rate=2e-2, use_causal_mask=True, min_padding_length=4),
    "train_torch_projected_in3_e8": TorchTrain("EXTRA: Linear(3,8) -> MHA(8,2) on x [2,19,3]; torch Adam(lr=3e-3); 6 steps", optimizer="adam", lr=3e-3, in_features=3, embed_dim=8, num_heads=2, seq_len=19, steps=6, batch=2),
    "train_torch_projected_sgd_in5_e12": TorchTrain("EXTRA: Linear(5,12) -> MHA(12,4) on x [3,9,5]; torch SGD(lr=0.05); 5 steps", optimizer="sgd", lr=0.05, in_features=5, embed_dim=12, num_heads=4, seq_len=9, steps=5, batch=3),
}


# --------------------------------------------------------------------------------------------------------------------
# Documentation recorded in every config
# --------------------------------------------------------------------------------------------------------------------

LOSS_FORMULA = ("mse_mean: loss = mean over all B*T*O elements of (output - y)^2 (keras: ops.mean(ops.square(out - "
                "y)); torch: F.mse_loss(out, y, reduction='mean')). dloss/doutput = 2*(output - y)/(B*T*O). Padded "
                "positions (if any) are NOT excluded from the loss.")
LOSS_TIMING = ("expected.loss[i] is computed with the weights BEFORE update i (i = 0..N-1); the update at step i uses "
               "the gradient of exactly that loss")
TOLERANCE_RULE = (
    "absolute, elementwise: tolerance_X = max(10 x (float32 library run vs float64 reference), 1e-5) for X = loss "
    "(every step), weights (final.*), step1 (step1.*), grads (grads0.*). The entries listed in zero_gradient_weights "
    "(the key bias; its gradient is exactly 0 in exact arithmetic, the float64 reference keeps it at init to ~1e-10, "
    "but a float32 run feeds ~1e-8 rounding noise into Adam, which normalises it into lr-sized random steps) are "
    "EXCLUDED from tolerance_weights/tolerance_step1 and compared with tolerance_zero_gradient_final = steps * lr * "
    "max(1, (1-beta1)/sqrt(1-beta2)) (the Adam step bound) and tolerance_zero_gradient_step1 = lr * max(1, "
    "(1-beta1)/sqrt(1-beta2)); for SGD they use the normal tolerances. They do not influence the loss.")

KERAS_MODEL_TEXT = {
    "class": "keras.layers.MultiHeadAttention",
    "attention_scale": "1/sqrt(key_dim), rounded to float32 by the TF backend even in the float64 run (tf.cast of a "
                       "python float)",
    "call": "out = layer(query=x, value=x, attention_mask=data.attention_mask[i] as bool (if present), "
            "use_causal_mask=use_causal_mask, training=True)  (key defaults to value)",
    "forward": "Q = x.query.kernel + query.bias [B,T,h,k]; K, V likewise; logits[b,n,t,s] = (Q[b,t,n,:].K[b,s,n,:]) "
               "* scale; masked (mask AND causal s<=t) logits -> large negative; P = softmax over s; C = P.V; out = "
               "sum_{n,v} C[b,t,n,v] attention_output.kernel[n,v,o] + attention_output.bias  (keras default call -> "
               "ops.dot_product_attention path)",
}
KERAS_ADAM_TEXT = {
    "name": "keras.optimizers.Adam",
    "driver": "custom loop: tf.GradientTape over the forward + loss, grads = tape.gradient(loss, "
              "layer.trainable_variables), optimizer.apply_gradients(zip(grads, vars)), eager",
    "formula": "keras.optimizers.Adam (keras/src/optimizers/adam.py, amsgrad=False, no weight_decay/clipnorm/clipvalue/"
               "EMA/loss_scale/grad accumulation). Per weight w: m_0 = v_0 = 0. At optimizer step t = 1,2,...,N (t = "
               "optimizer.iterations + 1) with gradient g_t: m_t = m_{t-1} + (g_t - m_{t-1}) * (1 - beta_1); v_t = "
               "v_{t-1} + (g_t*g_t - v_{t-1}) * (1 - beta_2); alpha_t = learning_rate * sqrt(1 - beta_2^t) / (1 - "
               "beta_1^t); w_t = w_{t-1} - alpha_t * m_t / (sqrt(v_t) + epsilon). epsilon is added to the sqrt of "
               "the UN-corrected v_t ('epsilon hat' of Kingma & Ba); equivalently w_t = w_{t-1} - lr/(1-beta_1^t) * "
               "m_t / (sqrt(v_t/(1-beta_2^t)) + epsilon/sqrt(1-beta_2^t)), i.e. in torch terms an effective eps of "
               "epsilon/sqrt(1-beta_2^t) (= 31.6*epsilon at t=1 for beta_2=0.999). TF-backend numerics: "
               "beta_1/beta_2 inside the powers go through tf.cast(python float) and are therefore float32-rounded "
               "even for float64 variables (0.9 -> 0.8999999761581421, 0.999 -> 0.9990000128746033); (1 - beta_1), "
               "(1 - beta_2) are computed in python double and then cast to the variable dtype; epsilon is a python "
               "double cast to the variable dtype; learning_rate is a Variable of dtype keras.config.floatx() at "
               "optimizer creation (float32-rounded in the float32 run, e.g. 0.01 -> 0.009999999776482582; exact "
               "double in the float64 run, where floatx was set to float64).",
}
TORCH_MODEL_TEXT = {
    "class": "Linear(in_features, embed_dim) -> torch.nn.MultiheadAttention",
    "call": "z = proj(x); out = mha(z, z, z)[0]  (default need_weights=True -> explicit softmax(q*sqrt(1/head_dim) @ "
            "k^T) path, not SDPA; no fast path in training)",
    "forward": "z = x @ proj.weight^T + proj.bias; [q|k|v] = z @ in_proj_weight^T + in_proj_bias (rows 0:E, E:2E, "
               "2E:3E); per head: P = softmax(q_h k_h^T / sqrt(head_dim)); out = concat_h(P v_h) @ out_proj.weight^T "
               "+ out_proj.bias",
}
TORCH_DRIVER = "opt.zero_grad(set_to_none=True); loss = F.mse_loss(model(x), y); loss.backward(); opt.step()"
TORCH_OPTIMIZERS = {
    "adam": {
        "class": torch.optim.Adam, "name": "torch.optim.Adam",
        "hyperparameters": {"betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0.0, "amsgrad": False,
                            "maximize": False, "foreach": None, "capturable": False, "differentiable": False,
                            "fused": None, "decoupled_weight_decay": False},
        "formula": "torch.optim.Adam (torch/optim/adam.py _single_tensor_adam: on CPU foreach=None resolves to False "
                   "and fused defaults to None, so the single-tensor for-loop ran; amsgrad=False, maximize=False, "
                   "weight_decay=0, capturable=False, differentiable=False). Per weight w: m_0 = v_0 = 0, step "
                   "counter t incremented BEFORE the update (t = 1,2,...,N): m_t = lerp(m_{t-1}, g_t, 1 - beta1) = "
                   "m_{t-1} + (1 - beta1) * (g_t - m_{t-1}); v_t = beta2 * v_{t-1} + (1 - beta2) * g_t*g_t; "
                   "bias_correction1 = 1 - beta1^t; bias_correction2 = 1 - beta2^t (python double scalars); "
                   "step_size = lr / bias_correction1; denom = sqrt(v_t) / sqrt(bias_correction2) + eps; w_t = "
                   "w_{t-1} - step_size * m_t / denom. eps is added AFTER bias-correcting v (Algorithm 1 of Kingma & "
                   "Ba), unlike Keras.",
    },
    "sgd": {
        "class": torch.optim.SGD, "name": "torch.optim.SGD",
        "hyperparameters": {"momentum": 0.0, "dampening": 0.0, "weight_decay": 0.0, "nesterov": False,
                            "maximize": False, "foreach": None, "fused": None},
        "formula": "torch.optim.SGD (torch/optim/sgd.py _single_tensor_sgd, momentum=0, dampening=0, weight_decay=0, "
                   "nesterov=False, maximize=False): w_t = w_{t-1} - lr * g_t  (param.add_(grad, alpha=-lr)). No "
                   "optimizer state.",
    },
}


# --------------------------------------------------------------------------------------------------------------------
# Models: the library's forward, MSE loss and gradients, in one dtype
# --------------------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def keras_floatx(dtype):
    """Set keras floatx for the block: the optimizer's learning-rate Variable takes that dtype."""
    previous = keras.config.floatx()
    keras.config.set_floatx(dtype)
    try:
        yield
    finally:
        keras.config.set_floatx(previous)


class KerasStudent:
    """A Keras MHA of a ``KerasTrain`` case in one dtype, with the real keras Adam."""

    def __init__(self, c, weights, data, dtype):
        self.c = c
        with keras_floatx(dtype):
            self.layer = fx.make_keras_mha(weights, dtype, c.num_heads, c.key_dim)
            self.optimizer = keras.optimizers.Adam(**keras_adam_hyperparameters(c))
        self.variables = list(self.layer.trainable_variables)
        by_id = {id(v): name for name, v in fx.keras_variables(self.layer).items()}
        self.names = [by_id[id(v)] for v in self.variables]
        self.x = tf.constant(data["data.x"], dtype)
        self.y = tf.constant(data["data.y"], dtype)
        mask = data.get("data.attention_mask")
        self.mask = None if mask is None else tf.constant(mask.astype(bool))

    def loss_and_grads(self, i):
        """Loss of step i and d loss / d w at the current weights (numpy, in the model dtype)."""
        with tf.GradientTape() as tape:
            out = self.layer(query=self.x[i], value=self.x[i],
                             attention_mask=None if self.mask is None else self.mask[i],
                             use_causal_mask=self.c.use_causal_mask, training=True)
            loss = keras.ops.mean(keras.ops.square(out - self.y[i]))
        grads = tape.gradient(loss, self.variables)
        return float(loss), {n: g.numpy() for n, g in zip(self.names, grads)}

    def optimizer_step(self, grads):
        self.optimizer.apply_gradients([(tf.constant(grads[n]), v) for n, v in zip(self.names, self.variables)])

    def weights(self):
        return {n: np.array(v.numpy()) for n, v in zip(self.names, self.variables)}

    def set_weights(self, weights):
        for n, v in zip(self.names, self.variables):
            v.assign(weights[n])


class ProjectedModel(torch.nn.Module):
    """z = proj(x); out = mha(z, z, z)[0]."""

    def __init__(self, in_features, embed_dim, num_heads, dtype):
        super().__init__()
        self.proj = torch.nn.Linear(in_features, embed_dim, dtype=dtype)
        self.mha = torch.nn.MultiheadAttention(embed_dim, num_heads, batch_first=True, dtype=dtype)

    def forward(self, x):
        z = self.proj(x)
        return self.mha(z, z, z)[0]


def projected_model(c, weights, dtype):
    """A training-mode ``ProjectedModel`` holding ``weights`` (fixture names: the state_dict without ``mha.``)."""
    model = ProjectedModel(c.in_features, c.embed_dim, c.num_heads, dtype)
    state = {(k if k.startswith("proj.") else "mha." + k): v for k, v in fx.to_torch(weights, dtype).items()}
    model.load_state_dict(state, strict=True)
    return model.train()


class TorchStudent:
    """The projected model of a ``TorchTrain`` case in one dtype, with the real torch optimizer."""

    def __init__(self, c, weights, data, dtype, **optimizer_overrides):
        self.model = projected_model(c, weights, dtype)
        self.params = {n.removeprefix("mha."): p for n, p in self.model.named_parameters()}
        self.names = list(self.params)
        spec = TORCH_OPTIMIZERS[c.optimizer]
        self.optimizer = spec["class"](self.model.parameters(), lr=c.lr,
                                       **{**spec["hyperparameters"], **optimizer_overrides})
        self.x = torch.from_numpy(data["data.x"]).to(dtype)
        self.y = torch.from_numpy(data["data.y"]).to(dtype)

    def loss_and_grads(self, i):
        """Loss of step i and d loss / d w at the current weights (numpy, in the model dtype)."""
        self.optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(self.model(self.x[i]), self.y[i], reduction="mean")
        loss.backward()
        return loss.item(), {n: p.grad.detach().numpy().copy() for n, p in self.params.items()}

    def optimizer_step(self, grads):
        self.optimizer.step()  # the gradients are in .grad

    def weights(self):
        return {n: p.detach().numpy().copy() for n, p in self.params.items()}

    def set_weights(self, weights):
        with torch.no_grad():
            for n, p in self.params.items():
                p.copy_(torch.from_numpy(weights[n]))


# --------------------------------------------------------------------------------------------------------------------
# Trajectories
# --------------------------------------------------------------------------------------------------------------------

@dataclass
class Trajectory:
    """What a training run records, in float64: loss per step, first gradients, weights after step 1, final."""
    losses: np.ndarray
    grads0: dict
    step1: dict
    final: dict


def as_f64(d):
    return {k: np.asarray(v, np.float64) for k, v in d.items()}


def run_trajectory(student, steps, update):
    """``steps`` steps of: loss and grads of step i, then ``update(grads, t)`` (t = i + 1)."""
    losses = []
    for i in range(steps):
        loss, grads = student.loss_and_grads(i)
        losses.append(loss)
        if i == 0:
            grads0 = as_f64(grads)
        update(grads, i + 1)
        if i == 0:
            step1 = as_f64(student.weights())
    return Trajectory(np.asarray(losses), grads0, step1, as_f64(student.weights()))


def library_run(student, steps):
    """Train with the library optimizer."""
    return run_trajectory(student, steps, lambda grads, t: student.optimizer_step(grads))


def formula_run(student, steps, formula):
    """The library's float64 forward and gradients, but the update ``formula(w, g, state, t)`` in numpy float64."""
    state = {}

    def update(grads, t):
        student.set_weights(formula(as_f64(student.weights()), as_f64(grads), state, t))

    return run_trajectory(student, steps, update)


def keras_adam_formula(c, exact_double_betas=False, bias_correction=True, torch_eps=False):
    """keras Adam (keras/src/optimizers/adam.py, TF numerics) in numpy float64, or a wrong variant of it."""
    b1, b2, eps, lr = c.beta_1, c.beta_2, c.epsilon, c.learning_rate
    pb1, pb2 = (b1, b2) if exact_double_betas else (float(np.float32(b1)), float(np.float32(b2)))

    def update(w, g, state, t):
        new = {}
        for n in w:
            m, v = state.get(n, (np.zeros_like(w[n]), np.zeros_like(w[n])))
            m = m + (g[n] - m) * (1 - b1)
            v = v + (np.square(g[n]) - v) * (1 - b2)
            state[n] = (m, v)
            b1p, b2p = np.power(pb1, float(t)), np.power(pb2, float(t))
            if torch_eps:
                new[n] = w[n] - lr / (1 - b1p) * (m / (np.sqrt(v) / np.sqrt(1 - b2p) + eps))
            else:
                alpha = lr * np.sqrt(1 - b2p) / (1 - b1p) if bias_correction else lr
                new[n] = w[n] - (m * alpha) / (np.sqrt(v) + eps)
        return new

    return update


def torch_adam_formula(c, keras_eps=False, bias_correction=True):
    """torch ``_single_tensor_adam`` in numpy float64, or a wrong variant of it."""
    b1, b2 = TORCH_OPTIMIZERS["adam"]["hyperparameters"]["betas"]
    eps, lr = TORCH_OPTIMIZERS["adam"]["hyperparameters"]["eps"], c.lr

    def update(w, g, state, t):
        new = {}
        for n in w:
            m, v = state.get(n, (np.zeros_like(w[n]), np.zeros_like(w[n])))
            m = m + (1 - b1) * (g[n] - m)
            v = v * b2 + (1 - b2) * g[n] * g[n]
            state[n] = (m, v)
            bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
            if keras_eps:
                new[n] = w[n] - lr * math.sqrt(bc2) / bc1 * (m / (np.sqrt(v) + eps))
            elif not bias_correction:
                new[n] = w[n] - lr * (m / (np.sqrt(v) + eps))
            else:
                new[n] = w[n] - (lr / bc1) * (m / (np.sqrt(v) / math.sqrt(bc2) + eps))
        return new

    return update


def sgd_formula(lr):
    """torch SGD without momentum: w -= lr * g."""
    return lambda w, g, state, t: {n: w[n] - lr * g[n] for n in w}


@contextlib.contextmanager
def count_torch_optimizer_kernels():
    """Count calls of torch's per-implementation optimizer functions (``_single_tensor_adam``, ``_fused_sgd``...)."""
    counts = collections.Counter()
    patched = []
    for module in (sys.modules[torch.optim.Adam.__module__], sys.modules[torch.optim.SGD.__module__]):
        for name in dir(module):
            if name.startswith(("_single_tensor_", "_multi_tensor_", "_fused_")) and callable(getattr(module, name)):
                original = getattr(module, name)

                def counted(*args, _original=original, _name=name, **kwargs):
                    counts[_name] += 1
                    return _original(*args, **kwargs)

                setattr(module, name, counted)
                patched.append((module, name, original))
    try:
        yield counts
    finally:
        for module, name, original in patched:
            setattr(module, name, original)


# --------------------------------------------------------------------------------------------------------------------
# Differences, drift and tolerances
# --------------------------------------------------------------------------------------------------------------------

def zero_gradient_masks(zero_gradient_weights, shapes):
    """{weight name: bool array}, True on the entries whose exact gradient is 0."""
    masks = {n: np.zeros(s, bool) for n, s in shapes.items()}
    for entry in zero_gradient_weights:
        rows = entry["rows"]
        masks[entry["name"]][slice(None) if rows is None else slice(*rows)] = True
    return masks


def weight_diffs(a, b, zero):
    """(max over regular entries, per-tensor max over regular entries, max over zero-gradient entries) of |a - b|."""
    per_tensor = {n: fx.max_abs_diff(a[n][~zero[n]], b[n][~zero[n]]) for n in a}
    zero_only = max(fx.max_abs_diff(a[n][zero[n]], b[n][zero[n]]) for n in a)
    return max(per_tensor.values()), per_tensor, zero_only


def compare(run, ref, zero):
    """How far trajectory ``run`` lands from the reference ``ref``."""
    final, per_tensor, final_zero = weight_diffs(run.final, ref.final, zero)
    step1, _, step1_zero = weight_diffs(run.step1, ref.step1, zero)
    loss = np.abs(run.losses - ref.losses)
    return {
        "loss_abs_diff_per_step": loss.tolist(), "loss_max_abs_diff": float(loss.max()),
        "grads0_max_abs_diff": max(fx.max_abs_diff(run.grads0[n], ref.grads0[n]) for n in ref.grads0),
        "step1_max_abs_diff": step1, "step1_zero_gradient_entries_max_abs_diff": step1_zero,
        "final_weights_max_abs_diff": final, "final_weights_max_abs_diff_per_tensor": per_tensor,
        "final_zero_gradient_entries_max_abs_diff": final_zero,
    }


def tolerances(drift, steps, lr, adam_betas):
    """tolerance_X = max(10 x drift, 1e-5); the zero-gradient entries get the Adam step bound (SGD: normal rule)."""
    tol = {
        "tolerance_loss": max(10 * drift["loss_max_abs_diff"], MIN_TOLERANCE),
        "tolerance_weights": max(10 * drift["final_weights_max_abs_diff"], MIN_TOLERANCE),
        "tolerance_step1": max(10 * drift["step1_max_abs_diff"], MIN_TOLERANCE),
        "tolerance_grads": max(10 * drift["grads0_max_abs_diff"], MIN_TOLERANCE),
        "tolerance_rule": TOLERANCE_RULE,
    }
    if adam_betas is None:
        tol["tolerance_zero_gradient_final"] = max(10 * drift["final_zero_gradient_entries_max_abs_diff"],
                                                   MIN_TOLERANCE)
        tol["tolerance_zero_gradient_step1"] = max(10 * drift["step1_zero_gradient_entries_max_abs_diff"],
                                                   MIN_TOLERANCE)
    else:
        b1, b2 = adam_betas
        step_bound = lr * max(1.0, (1 - b1) / math.sqrt(1 - b2))
        tol["tolerance_zero_gradient_final"] = steps * step_bound
        tol["tolerance_zero_gradient_step1"] = step_bound
    return tol


def formula_replay_report(run, ref, zero):
    """checks.formula_replay: documented formula on the library's gradients vs the library optimizer."""
    d = compare(run, ref, zero)
    keys = ("loss_max_abs_diff", "grads0_max_abs_diff", "step1_max_abs_diff",
            "step1_zero_gradient_entries_max_abs_diff", "final_weights_max_abs_diff",
            "final_zero_gradient_entries_max_abs_diff")
    return {k: d[k] for k in keys}


def variant_report(run, ref, zero, tol):
    """checks.variants: a wrong formula must fail the tolerances."""
    d = compare(run, ref, zero)
    return {"loss_max_abs_diff": d["loss_max_abs_diff"], "step1_max_abs_diff": d["step1_max_abs_diff"],
            "final_weights_max_abs_diff": d["final_weights_max_abs_diff"],
            "passes_loss_tolerance": d["loss_max_abs_diff"] <= tol["tolerance_loss"],
            "passes_weight_tolerance": d["final_weights_max_abs_diff"] <= tol["tolerance_weights"]}


def common_config(case, c, ref, weight_names, ref_zero_moved):
    """Config fields shared by every train case."""
    return {
        "case": case, "description": c.description, "seed": fx.seed_of(case), "steps": c.steps, "batch": c.batch,
        "seq_len": c.seq_len, "target_noise_std": TARGET_NOISE_STD, "loss": "mse_mean", "loss_formula": LOSS_FORMULA,
        "loss_timing": LOSS_TIMING, "reference_dtype": "float64", "stored_dtype": "float32",
        "expected_loss_float64": ref.losses.tolist(),
        "loss_decrease": {"first": float(ref.losses[0]), "last": float(ref.losses[-1]),
                          "min": float(ref.losses.min())},
        "weight_names": weight_names, "reference_zero_gradient_entries_moved": ref_zero_moved,
    }


def trajectory_tensors(init, data, ref):
    """The stored tensors: init.*, data.*, expected.loss, grads0.*, step1.*, final.*."""
    tensors = {f"init.{n}": v for n, v in init.items()}
    tensors.update(data)
    tensors["expected.loss"] = ref.losses
    for prefix, weights in (("grads0", ref.grads0), ("step1", ref.step1), ("final", ref.final)):
        tensors.update({f"{prefix}.{n}": v for n, v in weights.items()})
    return tensors


def zero_moved(ref, init, zero):
    """How far the float64 reference moved the zero-gradient entries from init."""
    return weight_diffs(ref.final, as_f64(init), zero)[2]


# --------------------------------------------------------------------------------------------------------------------
# One function per fixture kind: (case name, case spec) -> (tensors, config)
# --------------------------------------------------------------------------------------------------------------------

def keras_adam_hyperparameters(c):
    """Every keras.optimizers.Adam constructor argument that changes the update."""
    return {"learning_rate": c.learning_rate, "beta_1": c.beta_1, "beta_2": c.beta_2, "epsilon": c.epsilon,
            "amsgrad": False, "weight_decay": None, "clipnorm": None, "clipvalue": None, "global_clipnorm": None,
            "use_ema": False, "loss_scale_factor": None, "gradient_accumulation_steps": None}


def learning_rate_variable(student):
    """[dtype, value] of the keras optimizer's learning-rate Variable."""
    lr = student.optimizer.learning_rate
    return [lr.dtype, float(lr.numpy())]


def keras_train_case(case, c):
    """train_keras_*: draws student weights, teacher weights, x [N,B,T,D], padding lengths (masked cases), noise;
    trains keras MHA with keras Adam in float64 (reference) and float32 (drift)."""
    rng = fx.case_rng(case)
    d, h, k, n, b, t = c.input_dim, c.num_heads, c.key_dim, c.steps, c.batch, c.seq_len
    init = fx.draw_keras_weights(rng, d, d, d, h, k, k, d)
    teacher = fx.draw_keras_weights(rng, d, d, d, h, k, k, d)
    data = {"data.x": fx.normal(rng, (n, b, t, d))}
    mask_config = None
    if c.min_padding_length is not None:
        lengths = rng.integers(c.min_padding_length, t + 1, (n, b))
        keep = np.arange(t)[None, None, None, :] < lengths[:, :, None, None]
        data["data.attention_mask"] = np.broadcast_to(keep, (n, b, t, t)).astype(np.uint8)
        mask_config = {
            "construction": "key padding: keep[i,b,:,s] = s < padding_lengths[i][b]; no fully masked rows (every "
                            "row keeps key 0)",
            "format": "data.attention_mask[i] [B,T,T] uint8, 1 = query t may attend key s; the causal mask "
                      "tril(ones(T,T)) (s <= t) is ANDed with it inside Keras",
            "padding_lengths": lengths.tolist()}
    noise = rng.standard_normal((n, b, t, d))
    layer = fx.make_keras_mha(teacher, "float64", h, k)
    y = [layer(query=data["data.x"][i].astype(np.float64), value=data["data.x"][i].astype(np.float64),
               attention_mask=None if mask_config is None else data["data.attention_mask"][i].astype(bool),
               use_causal_mask=c.use_causal_mask) for i in range(n)]
    data["data.y"] = (np.stack([np.asarray(o) for o in y]) + TARGET_NOISE_STD * noise).astype(np.float32)

    def student(dtype):
        return KerasStudent(c, init, data, dtype)

    ref_student, f32_student = student("float64"), student("float32")
    ref, f32 = library_run(ref_student, n), library_run(f32_student, n)
    zero_gradient_weights = [{"name": "key.bias", "rows": None}]
    zero = zero_gradient_masks(zero_gradient_weights, {name: w.shape for name, w in init.items()})
    drift = compare(f32, ref, zero)
    tol = tolerances(drift, n, c.learning_rate, (c.beta_1, c.beta_2))
    variants = {"exact_double_betas_in_powers": keras_adam_formula(c, exact_double_betas=True),
                "no_bias_correction": keras_adam_formula(c, bias_correction=False),
                "torch_eps_placement": keras_adam_formula(c, torch_eps=True)}
    checks = {
        "f32_lr_variable": learning_rate_variable(f32_student), "f64_lr_variable": learning_rate_variable(ref_student),
        "formula_replay": formula_replay_report(formula_run(student("float64"), n, keras_adam_formula(c)), ref, zero),
        "variants": {name: variant_report(formula_run(student("float64"), n, f), ref, zero, tol)
                     for name, f in variants.items()},
    }
    model = {"kind": "keras_mha", **KERAS_MODEL_TEXT, "num_heads": h, "key_dim": k, "value_dim": None,
             "value_dim_resolved": k, "dropout": 0.0, "use_bias": True, "output_shape": None, "attention_axes": None,
             "flash_attention": None, "use_causal_mask": c.use_causal_mask,
             "has_attention_mask": mask_config is not None, "self_attention": True, "input_dim": d, "output_dim": d,
             "attention_scale_value": float(np.float32(1.0 / math.sqrt(k)))}
    config = {
        **common_config(case, c, ref, ref_student.names, zero_moved(ref, init, zero)),
        "framework": "keras", "framework_version": keras.__version__, "backend": "tensorflow",
        "backend_version": tf.__version__, "input_dim": d, "output_dim": d,
        "targets": "y = teacher(x) + noise*N(0,1), teacher = same Keras MHA config with other random weights (same "
                   "masks), computed in float64 and rounded to float32",
        "model": model, "optimizer": {**KERAS_ADAM_TEXT, "hyperparameters": keras_adam_hyperparameters(c)},
        "zero_gradient_weights": zero_gradient_weights, "f32_drift": drift, "checks": checks, **tol,
    }
    if mask_config is not None:
        config["mask"] = mask_config
    return trajectory_tensors(init, data, ref), config


def torch_train_case(case, c):
    """train_torch_*: draws student weights, teacher weights, x [N,B,T,in], noise; trains Linear -> MHA with the
    torch optimizer in float64 (reference) and float32 (drift), and with the foreach/fused kernels in float32."""
    rng = fx.case_rng(case)
    e, n, b, t = c.embed_dim, c.steps, c.batch, c.seq_len
    init = fx.draw_projected_weights(rng, c.in_features, e)
    teacher = fx.draw_projected_weights(rng, c.in_features, e)
    data = {"data.x": fx.normal(rng, (n, b, t, c.in_features))}
    noise = rng.standard_normal((n, b, t, e))
    teacher_model = projected_model(c, teacher, torch.float64)
    with torch.no_grad():
        y = np.stack([teacher_model(torch.from_numpy(data["data.x"][i]).double()).numpy() for i in range(n)])
    data["data.y"] = (y + TARGET_NOISE_STD * noise).astype(np.float32)

    def student(dtype, **overrides):
        return TorchStudent(c, init, data, dtype, **overrides)

    kernel_calls, runs = {}, {}
    for name, dtype in (("float64", torch.float64), ("float32", torch.float32)):
        with count_torch_optimizer_kernels() as counts:
            trained = student(dtype)
            runs[name] = library_run(trained, n)
        kernel_calls[name] = dict(counts)
    ref, f32 = runs["float64"], runs["float32"]
    zero_gradient_weights = [{"name": "in_proj_bias", "rows": [e, 2 * e]}]
    zero = zero_gradient_masks(zero_gradient_weights, {name: w.shape for name, w in init.items()})
    drift = compare(f32, ref, zero)
    spec = TORCH_OPTIMIZERS[c.optimizer]
    adam = c.optimizer == "adam"
    tol = tolerances(drift, n, c.lr, spec["hyperparameters"]["betas"] if adam else None)

    if adam:
        formula = torch_adam_formula(c)
        variants = {"keras_eps_placement": torch_adam_formula(c, keras_eps=True),
                    "no_bias_correction": torch_adam_formula(c, bias_correction=False)}
    else:
        formula = sgd_formula(c.lr)
        variants = {"lr_times_1.01": sgd_formula(c.lr * 1.01)}
    alternatives = {}
    for impl in ("foreach", "fused"):
        alt = library_run(student(torch.float32, **{impl: True}), n)
        vs_default, vs_ref = compare(alt, f32, zero), compare(alt, ref, zero)
        alternatives[impl] = {
            "bitwise_equal_to_default_f32": bool(np.array_equal(alt.losses, f32.losses) and all(
                np.array_equal(alt.final[w], f32.final[w]) for w in alt.final)),
            "vs_default_f32_loss_max_abs_diff": vs_default["loss_max_abs_diff"],
            "vs_default_f32_final_weights_max_abs_diff": vs_default["final_weights_max_abs_diff"],
            "vs_reference_loss_max_abs_diff": vs_ref["loss_max_abs_diff"],
            "vs_reference_final_weights_max_abs_diff": vs_ref["final_weights_max_abs_diff"],
            "vs_reference_zero_gradient_entries_max_abs_diff": vs_ref["final_zero_gradient_entries_max_abs_diff"],
        }
    checks = {
        "torch_optimizer_kernel_calls": kernel_calls,
        "formula_replay": formula_replay_report(formula_run(student(torch.float64), n, formula), ref, zero),
        "variants": {name: variant_report(formula_run(student(torch.float64), n, f), ref, zero, tol)
                     for name, f in variants.items()},
        "f32_alternative_torch_impls": alternatives,
    }
    (implementation_ran,) = kernel_calls["float64"]
    hyperparameters = {"lr": c.lr, **spec["hyperparameters"]}
    if adam:
        hyperparameters["betas"] = list(hyperparameters["betas"])
    model = {"kind": "projected", **TORCH_MODEL_TEXT, "in_features": c.in_features, "embed_dim": e,
             "num_heads": c.num_heads, "head_dim": e // c.num_heads, "bias": True, "batch_first": True,
             "dropout": 0.0, "add_bias_kv": False, "add_zero_attn": False, "kdim": e, "vdim": e,
             "need_weights": True, "average_attn_weights": True, "output_dim": e, "training_mode": True}
    config = {
        **common_config(case, c, ref, trained.names, zero_moved(ref, init, zero)),
        "framework": "torch", "framework_version": torch.__version__, "device": "cpu",
        "input_dim": c.in_features, "output_dim": e,
        "targets": "y = teacher(x) + noise*N(0,1), teacher = same projected model with other random weights, "
                   "computed in float64 and rounded to float32",
        "model": model,
        "optimizer": {"name": spec["name"], "hyperparameters": hyperparameters, "formula": spec["formula"],
                      "driver": TORCH_DRIVER, "implementation_ran": implementation_ran},
        "zero_gradient_weights": zero_gradient_weights, "f32_drift": drift, "checks": checks, **tol,
    }
    return trajectory_tensors(init, data, ref), config


KINDS = {KerasTrain: keras_train_case, TorchTrain: torch_train_case}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent, help="output folder")
    parser.add_argument("--only", nargs="+", metavar="CASE", choices=sorted(CASES), help="only these cases")
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    for case in args.only or CASES:
        spec = CASES[case]
        start = time.time()
        tensors, config = KINDS[type(spec)](case, spec)
        fx.save_fixture(args.out / f"{case}.safetensors", tensors, config)
        print(f"{case}: {len(tensors)} tensors, {time.time() - start:.1f}s", flush=True)
    fx.write_index(args.out, ("train_",), with_sha256=True)


if __name__ == "__main__":
    main()
