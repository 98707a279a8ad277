#!/usr/bin/env python3
"""Regenerate the MultiHeadAttention forward-pass reference fixtures.

Every case in ``CASES`` becomes one ``<case>.safetensors`` file, and ``index.json`` lists every fixture file of the
output folder (see FORMAT.md for the tensor names and the config fields):

* ``keras_*``      keras.layers.MultiHeadAttention (keras 3.15.1, TensorFlow 2.21 backend)
* ``torch_*``      torch.nn.MultiheadAttention(batch_first=True), eval mode (torch 2.15.0)
* ``projected_*``  torch Linear(in, E) -> MultiheadAttention(E, h), self-attention on proj(x)
* ``conversion_*`` weight conversions between the two libraries, checked on both sides

Inputs and weights are drawn in float32 from ``numpy.random.default_rng([SEED, crc32(case)])``. The reference
outputs are the real library run in float64 on those float32 numbers, rounded to float32; the same library run in
float32 is recorded as ``config.f32_library_max_abs_diff``.

Usage::

    python generate.py                      # every case, into this script's folder
    python generate.py --out /tmp/fixtures  # elsewhere
    python generate.py --only keras_causal torch_attn_mask

Without ``--only`` it also writes ``initializers.json`` (statistics of Keras' initializers' draws).
"""

# torch, with torch._dynamo (which loads triton's LLVM), must be imported before tensorflow: the other order aborts
# with "LLVM ERROR: inconsistency in registered CommandLine options" as soon as a torch optimizer is constructed.
import torch
import torch._dynamo  # noqa: F401

import argparse
import hashlib
import json
import os
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

torch.backends.mha.set_fastpath_enabled(False)  # MultiheadAttention always takes its reference Python path

SEED = 20240611
TOLERANCE = 1e-5  # absolute, for every forward output
KERAS_KINDS = ("query", "key", "value", "attention_output")


# --------------------------------------------------------------------------------------------------------------------
# Case table. One entry per fixture; add a case by adding a line (the file name is the key).
# --------------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Keras:
    """keras.layers.MultiHeadAttention on query [B,T,Dq], value [B,S,Dv] and optionally key [B,S,Dk].

    ``self_attention``: value holds the same numbers as query (S = T, Dv = Dq). ``key_input_dim`` None: no key
    tensor (key = value). Masks: ``valid_lengths`` gives a key-padding ``attention_mask`` (s < length[b]);
    ``fully_masked`` gives a random ``attention_mask`` (each pair allowed with probability 0.7) in which the listed
    ``(b, t)`` query rows, or whole batch elements ``(b, None)``, allow no key at all.
    """
    description: str
    num_heads: int
    key_dim: int
    batch: int = 2
    query_len: int = 8
    query_dim: int = 8
    self_attention: bool = False
    source_len: Optional[int] = None
    value_input_dim: Optional[int] = None
    key_input_dim: Optional[int] = None
    value_dim: Optional[int] = None
    output_shape: Optional[int] = None
    use_bias: bool = True
    use_causal_mask: bool = False
    valid_lengths: Optional[tuple] = None
    fully_masked: Optional[tuple] = None
    # The implicit masks, as lengths per batch element: the query tensor's Keras mask [B, T] (as
    # Embedding(mask_zero=True) or Masking attach it), value_mask [B, S] and key_mask [B, S].
    sliding_window: Optional[int] = None
    use_gate: bool = False
    # The constructor's dropout rate; the fixture calls are inference calls (no dropout is drawn), but
    # a layer with dropout > 0 takes Keras' explicit-softmax path, whose fully masked rows are zero.
    dropout: float = 0.0
    query_mask_lengths: Optional[tuple] = None
    value_mask_lengths: Optional[tuple] = None
    key_mask_lengths: Optional[tuple] = None


@dataclass(frozen=True)
class KerasNd:
    """keras.layers.MultiHeadAttention(attention_axes=...) on N-D inputs: query ``query_shape`` [B, ..., Dq],
    value ``source_shape`` [B, ..., Dv] (None: self-attention, value = query).

    ``attention_axes`` as the layer takes it (None: Keras' default, every axis between the batch and the feature
    axis; negative axes count as Keras counts them). ``mask_shape`` gives a random ``attention_mask`` of that shape
    (each entry allowed with probability 0.7, broadcast as Keras broadcasts it), whose first query row allows no
    key; ``query_mask`` / ``value_mask`` attach random implicit masks of the inputs' shapes without the features.
    """
    description: str
    num_heads: int
    key_dim: int
    query_shape: tuple
    attention_axes: Optional[tuple]
    source_shape: Optional[tuple] = None
    value_dim: Optional[int] = None
    use_bias: bool = True
    use_gate: bool = False
    use_causal_mask: bool = False
    sliding_window: Optional[int] = None
    mask_shape: Optional[tuple] = None
    query_mask: bool = False
    value_mask: bool = False


@dataclass(frozen=True)
class Torch:
    """torch.nn.MultiheadAttention(embed_dim, num_heads, bias, kdim, vdim, batch_first=True) in eval mode.

    ``self_attention``: query, key and value hold the same numbers. Masks: ``key_padding_lengths`` gives
    ``key_padding_mask`` (ignore s >= length[b]); ``causal_attn_mask`` gives ``attn_mask`` = s > t;
    ``masked_query_rows`` forbids every key for those query rows in ``attn_mask``.
    """
    description: str
    embed_dim: int = 24
    num_heads: int = 6
    batch: int = 2
    query_len: int = 10
    self_attention: bool = False
    source_len: Optional[int] = None
    kdim: Optional[int] = None
    vdim: Optional[int] = None
    bias: bool = True
    key_padding_lengths: Optional[tuple] = None
    causal_attn_mask: bool = False
    masked_query_rows: tuple = ()
    # torch's is_causal hint (with need_weights=False and no key_padding_mask torch drops attn_mask
    # and SDPA applies its top-left causal rule to the keys after add_bias_kv / add_zero_attn
    # appended theirs; otherwise it uses attn_mask as given).
    is_causal: bool = False
    add_zero_attn: bool = False
    add_bias_kv: bool = False
    # The constructor's dropout rate; the module is in eval mode, where torch applies no dropout.
    dropout: float = 0.0
    # attn_mask as a float [B*h, T, S] added to the logits: N(0, 1) values, -inf where s > t + 2 in
    # every other head (drawn after everything else; combined with causal_attn_mask it is an error).
    float_attn_mask: bool = False


@dataclass(frozen=True)
class Projected:
    """Linear(in_features, embed_dim) -> MultiheadAttention(embed_dim, num_heads): self-attention on proj(x)."""
    description: str
    in_features: int = 4
    embed_dim: int = 24
    num_heads: int = 6
    batch: int = 2
    seq_len: int = 136


@dataclass(frozen=True)
class Conversion:
    """A weight conversion (``direction``) checked by running the source and the converted model.

    keras_to_torch: Keras MHA(h, k) with Dq = Dk = Dv = h*k, query [B,T,D], key/value [B,S,D].
    keras_to_projected: Keras MHA(h, k) self-attention on x [B,T,in] -> Linear(in,h*k)+MHA(h*k,h)+Linear(h*k,in).
    projected_to_keras: Linear(in,h*k)+MHA(h*k,h) on x [B,T,in] -> Keras MHA(h, k, output_shape=h*k).
    """
    description: str
    direction: str
    num_heads: int = 6
    key_dim: int = 4
    in_features: int = 4
    batch: int = 2
    query_len: int = 9
    source_len: Optional[int] = None


CASES = {
    # keras.layers.MultiHeadAttention
    "keras_seed_h6_k4_dq4": Keras("Seed snippet: MultiHeadAttention(num_heads=6, key_dim=4) self-attention on [B,136,4]; output [B,136,4] (output projection back to Dq=4)", num_heads=6, key_dim=4, query_len=136, query_dim=4, self_attention=True),
    "keras_causal": Keras("use_causal_mask=True self-attention, T=S=12", num_heads=2, key_dim=4, query_len=12, self_attention=True, use_causal_mask=True),
    "keras_cross_distinct_key": Keras("cross-attention with distinct key tensor: Dq=8, Dk=6, Dv=5, T=7, S=11", num_heads=2, key_dim=4, query_len=7, source_len=11, value_input_dim=5, key_input_dim=6),
    "keras_fully_masked_rows": Keras("EXTRA: random attention_mask with one fully masked query row (b=0,t=2) and a fully masked batch element (b=2); outputs.output (default call) gives uniform attention over ALL keys there, outputs.output_with_scores/attention_scores give zero attention (output = bias)", num_heads=2, key_dim=4, batch=3, query_len=6, source_len=7, value_input_dim=8, fully_masked=((0, 2), (2, None))),
    "keras_hk_ne_dq": Keras("key_dim*num_heads (4*3=12) != query dim (10), self-attention", num_heads=4, key_dim=3, query_len=12, query_dim=10, self_attention=True),
    "keras_no_bias": Keras("use_bias=False (no bias variables at all)", num_heads=3, key_dim=4, query_len=9, query_dim=12, source_len=6, value_input_dim=7, use_bias=False),
    "keras_output_shape_7": Keras("output_shape=7 (attention_output.kernel (h,v,7))", num_heads=2, key_dim=3, query_len=8, query_dim=6, source_len=5, value_input_dim=6, output_shape=7),
    "keras_padding_mask": Keras("attention_mask [B,T,S] built from key padding (valid lengths 10,7,3)", num_heads=2, key_dim=4, batch=3, query_len=10, source_len=10, value_input_dim=8, valid_lengths=(10, 7, 3)),
    "keras_value_dim_ne_key_dim": Keras("value_dim=6 != key_dim=3", num_heads=2, key_dim=3, query_len=8, source_len=9, value_input_dim=5, value_dim=6),
    "keras_cross_v2_o9_nobias_padding": Keras("EXTRA: h=3, k=5, value_dim=2, output_shape=9, use_bias=False, cross-attention Dq=7, Dk=4, Dv=6, T=11, S=13, key padding (13, 5, 1)", num_heads=3, key_dim=5, value_dim=2, output_shape=9, use_bias=False, batch=3, query_len=11, query_dim=7, source_len=13, value_input_dim=6, key_input_dim=4, valid_lengths=(13, 5, 1)),
    "keras_value_mask": Keras("EXTRA: value_mask [B, S] from lengths (10, 6, 2), cross-attention T=7, S=10", num_heads=2, key_dim=4, batch=3, query_len=7, source_len=10, value_input_dim=6, value_mask_lengths=(10, 6, 2)),
    "keras_query_value_key_masks_causal": Keras("EXTRA: the query tensor's Keras mask (lengths 9, 4; masked query rows attend nothing, so the default call makes them uniform), value_mask (9, 7), key_mask (8, 9) with a distinct key, and use_causal_mask, all ANDed", num_heads=3, key_dim=2, value_dim=3, query_len=9, source_len=9, value_input_dim=5, key_input_dim=6, use_causal_mask=True, query_mask_lengths=(9, 4), value_mask_lengths=(9, 7), key_mask_lengths=(8, 9)),
    "keras_query_mask_attention_mask": Keras("EXTRA: the query tensor's Keras mask (lengths 6, 3) ANDed with a random attention_mask, self-attention", num_heads=2, key_dim=3, query_len=6, self_attention=True, query_mask_lengths=(6, 3), fully_masked=()),
    "keras_sliding_window": Keras("EXTRA: sliding_window=3 (|t - s| < 3), self-attention T=10", num_heads=2, key_dim=4, query_len=10, self_attention=True, sliding_window=3),
    "keras_sliding_window_causal_padding": Keras("EXTRA: sliding_window=4 ANDed with use_causal_mask and key padding (11, 6), cross-attention T=8 < S=11", num_heads=3, key_dim=2, query_len=8, source_len=11, value_input_dim=5, use_causal_mask=True, sliding_window=4, valid_lengths=(11, 6)),
    "keras_use_gate": Keras("EXTRA: use_gate=True (sigmoid gate (Dq, h, v) on the query, multiplied into the attention output), value_dim=3, cross-attention", num_heads=2, key_dim=4, value_dim=3, query_len=7, source_len=9, value_input_dim=6, use_gate=True),
    "keras_use_gate_nobias_causal": Keras("EXTRA: use_gate=True without biases, use_causal_mask and key padding (8, 3), self-attention", num_heads=3, key_dim=2, query_len=8, self_attention=True, use_bias=False, use_gate=True, use_causal_mask=True, valid_lengths=(8, 3)),
    "keras_causal_t5_s9_padding": Keras("EXTRA: use_causal_mask with T=5 < S=9 (top-left aligned) ANDed with key padding (9, 4)", num_heads=2, key_dim=3, query_len=5, source_len=9, value_input_dim=8, use_causal_mask=True, valid_lengths=(9, 4)),
    "keras_dropout_inference_fully_masked": Keras("EXTRA: dropout=0.3 in an inference call: nothing is dropped, but the layer takes Keras' explicit-softmax path, so the fully masked query row (0, 1) and batch element 1 get zero attention in the default call too (outputs.output = outputs.output_with_scores)", num_heads=2, key_dim=3, batch=2, query_len=5, source_len=6, value_input_dim=4, dropout=0.3, fully_masked=((0, 1), (1, None))),
    # keras.layers.MultiHeadAttention(attention_axes=...) on inputs of rank 4 and 5
    "keras_nd_axes_1_2": KerasNd("EXTRA: attention_axes=(1, 2) on [B, 3, 4, 6] self-attention: one softmax over the 12 positions of both axes", num_heads=2, key_dim=3, query_shape=(2, 3, 4, 6), attention_axes=(1, 2)),
    "keras_nd_default_axes_cross_mask": KerasNd("EXTRA: attention_axes=None on rank-4 inputs (Keras' default: axes 1 and 2), cross-attention [2, 3, 2, 5] -> [2, 2, 3, 4], value_dim=3, attention_mask [B, T1, T2, S1, S2] with a fully masked query row", num_heads=3, key_dim=2, value_dim=3, query_shape=(2, 3, 2, 5), source_shape=(2, 2, 3, 4), attention_axes=None, mask_shape=(2, 3, 2, 2, 3)),
    "keras_nd_axis_2_batch_axis_1": KerasNd("EXTRA: attention_axes=(2,) on [B, 3, 5, 4]: axis 1 is a batch axis; cross-attention to S=7 along axis 2; attention_mask [B, 5, 7] broadcast over axis 1 and the heads; use_gate", num_heads=2, key_dim=4, query_shape=(2, 3, 5, 4), source_shape=(2, 3, 7, 6), attention_axes=(2,), use_gate=True, mask_shape=(2, 5, 7)),
    "keras_nd_negative_axis_causal": KerasNd("EXTRA: attention_axes=(-3,) on [B, 6, 3, 4] (= axis 1, counted as Keras counts it) with use_causal_mask (Keras' causal mask is [1, T, S] over axis 1) and sliding_window=3", num_heads=2, key_dim=2, query_shape=(2, 6, 3, 4), attention_axes=(-3,), use_causal_mask=True, sliding_window=3),
    "keras_nd_axis_2_implicit_masks": KerasNd("EXTRA: attention_axes=(2,) on [B, 3, 6, 5] self-attention with the query tensor's Keras mask and value_mask of shape [B, 3, 6] (Keras expands them to [B, 3, 6, 1] and [B, 3, 1, 6])", num_heads=2, key_dim=3, query_shape=(2, 3, 6, 5), attention_axes=(2,), query_mask=True, value_mask=True),
    "keras_nd_rank5_axes_1_3_nobias": KerasNd("EXTRA: rank-5 input [B, 3, 2, 4, 5], attention_axes=(1, 3) (not adjacent: axis 2 is a batch axis between them), no biases, attention_mask [B, 3, 4, 3, 4] broadcast over axis 2 and the heads", num_heads=2, key_dim=2, query_shape=(2, 3, 2, 4, 5), attention_axes=(1, 3), use_bias=False, mask_shape=(2, 3, 4, 3, 4)),
    "keras_causal_fully_masked": Keras("EXTRA: causal mask ANDed with a random mask that leaves query row (1, 3) and batch element 2 with no key", num_heads=4, key_dim=2, batch=3, query_len=6, source_len=6, value_input_dim=8, use_causal_mask=True, fully_masked=((1, 3), (2, None))),
    # torch.nn.MultiheadAttention
    "torch_plain_e24_h6": Torch("nn.MultiheadAttention(24, 6, batch_first=True) self-attention (query, key, value identical)", self_attention=True),
    "torch_is_causal_hint": Torch("EXTRA: is_causal=True with an attn_mask that is NOT causal (rows 1 and 3 masked): need_weights=True uses the mask as given (outputs.output), need_weights=False replaces it by the causal mask (outputs.output_need_weights_false), as torch does; cross-attention T=6 < S=9", embed_dim=8, num_heads=2, query_len=6, source_len=9, masked_query_rows=(1, 3), is_causal=True),
    "torch_is_causal_hint_padding": Torch("EXTRA: is_causal=True with a causal attn_mask and a key_padding_mask (9, 4): torch ignores the hint and uses both masks", embed_dim=8, num_heads=4, query_len=9, self_attention=True, causal_attn_mask=True, key_padding_lengths=(9, 4), is_causal=True),
    "torch_is_causal_hint_bias_kv_t9_s5": Torch("EXTRA: is_causal=True with add_bias_kv, a causal attn_mask and T=9 > S=5: need_weights=True uses the mask as given with an allowed column for bias_k (outputs.output); need_weights=False hands SDPA is_causal=True on the S+1 keys, top-left (row t sees key s iff s <= t), so bias_k is seen from row 5 on (outputs.output_need_weights_false)", embed_dim=8, num_heads=2, query_len=9, source_len=5, causal_attn_mask=True, is_causal=True, add_bias_kv=True),
    "torch_is_causal_hint_bias_kv_t4_s7": Torch("EXTRA: is_causal=True with add_bias_kv and T=4 < S=7: with need_weights=False SDPA's top-left causal rule over the S+1 keys hides bias_k from every row; need_weights=True uses the causal attn_mask padded with an allowed column", embed_dim=8, num_heads=2, query_len=4, source_len=7, causal_attn_mask=True, is_causal=True, add_bias_kv=True),
    "torch_is_causal_hint_zero_attn_t8_s3": Torch("EXTRA: is_causal=True with add_zero_attn and T=8 > S=3 (kdim=5, vdim=6): with need_weights=False the zero key is seen from row 3 on (SDPA's top-left causal rule over S+1 keys); need_weights=True pads the causal attn_mask with an allowed column", embed_dim=8, num_heads=2, query_len=8, source_len=3, kdim=5, vdim=6, causal_attn_mask=True, is_causal=True, add_zero_attn=True),
    "torch_is_causal_hint_bias_kv_zero_attn_t6": Torch("EXTRA: is_causal=True with add_bias_kv and add_zero_attn, self-attention T=S=6: with need_weights=False SDPA's causal rule over the S+2 keys hides both appended keys from every row; need_weights=True pads the causal attn_mask with two allowed columns", embed_dim=6, num_heads=3, query_len=6, self_attention=True, causal_attn_mask=True, is_causal=True, add_bias_kv=True, add_zero_attn=True),
    "torch_is_causal_hint_zero_attn_padding": Torch("EXTRA: is_causal=True with add_zero_attn, a causal attn_mask and a key_padding_mask (4, 2), T=7 > S=4: torch ignores the hint and pads both masks with an allowed column, with need_weights=False too", embed_dim=8, num_heads=2, query_len=7, source_len=4, causal_attn_mask=True, key_padding_lengths=(4, 2), is_causal=True, add_zero_attn=True),
    "torch_add_zero_attn": Torch("EXTRA: add_zero_attn=True (a zero key and value appended after the projections; the weights have S+1 columns), key padding (7, 3) and a fully masked query row (2), cross-attention with kdim=5, vdim=6", embed_dim=8, num_heads=2, query_len=5, source_len=7, kdim=5, vdim=6, key_padding_lengths=(7, 3), masked_query_rows=(2,), add_zero_attn=True),
    "torch_add_bias_kv": Torch("EXTRA: add_bias_kv=True (learned rows bias_k, bias_v appended to the projected keys and values), a causal attn_mask and key padding (10, 4), self-attention", embed_dim=8, num_heads=2, self_attention=True, causal_attn_mask=True, key_padding_lengths=(10, 4), add_bias_kv=True),
    "torch_add_bias_kv_zero_attn": Torch("EXTRA: add_bias_kv and add_zero_attn together (the bias row first, then the zero row), cross-attention kdim=5, vdim=3, no bias in the projections", embed_dim=6, num_heads=3, query_len=4, source_len=6, kdim=5, vdim=3, bias=False, add_bias_kv=True, add_zero_attn=True),
    "torch_dropout_eval": Torch("EXTRA: dropout=0.4 in eval mode: torch applies no dropout (to the weights or the output); key padding (8, 5), cross-attention", embed_dim=8, num_heads=2, query_len=6, source_len=8, key_padding_lengths=(8, 5), dropout=0.4),
    "torch_float_attn_mask_3d": Torch("EXTRA: a float attn_mask [B*h, T, S] added to the logits (N(0, 1) values, -inf where s > t + 2 in every other head) with key padding (9, 5); cross-attention T=7 < S=9", embed_dim=8, num_heads=2, query_len=7, source_len=9, key_padding_lengths=(9, 5), float_attn_mask=True),
    "torch_attn_mask": Torch("self-attention with 2D bool attn_mask [T,S] (causal: True above diagonal)", self_attention=True, causal_attn_mask=True),
    "torch_kdim_vdim": Torch("kdim=10, vdim=7 (separate q/k/v_proj_weight), T=6, S=8", query_len=6, source_len=8, kdim=10, vdim=7),
    "torch_key_padding_mask": Torch("cross-attention (distinct q/k/v, T=9, S=12) with key_padding_mask (valid lengths 12, 8)", query_len=9, source_len=12, key_padding_lengths=(12, 8)),
    "torch_fully_masked_rows": Torch("EXTRA: cross-attention (T=6, S=7) whose key_padding_mask ignores every key of batch element b=2 (valid lengths 7, 5, 0) and whose attn_mask forbids every key for query row t=2; with need_weights=True those output rows and attention-weight rows are NaN, outputs.output_need_weights_false (need_weights=False) gives out_proj.bias there", batch=3, query_len=6, source_len=7, key_padding_lengths=(7, 5, 0), masked_query_rows=(2,)),
    "torch_nobias_kdim_vdim_masks": Torch("EXTRA: embed_dim=12, 3 heads, bias=False, kdim=5, vdim=9, key padding (7, 3) and a causal bool attn_mask", embed_dim=12, num_heads=3, bias=False, kdim=5, vdim=9, query_len=7, source_len=7, key_padding_lengths=(7, 3), causal_attn_mask=True),
    "torch_e8_h4_fully_masked": Torch("EXTRA: embed_dim=8, 4 heads, key padding (6, 0, 2) and query rows 1 and 4 forbidden every key", embed_dim=8, num_heads=4, batch=3, query_len=5, source_len=6, key_padding_lengths=(6, 0, 2), masked_query_rows=(1, 4)),
    # Linear -> MultiheadAttention
    "projected_seed": Projected("Seed PyTorch architecture: Linear(4,24) then nn.MultiheadAttention(24, 6, batch_first=True) self-attention on proj(x); x [2,136,4] -> [2,136,24]"),
    "projected_in6_e16_h4": Projected("EXTRA: Linear(6,16) then nn.MultiheadAttention(16, 4); x [3,20,6]", in_features=6, embed_dim=16, num_heads=4, seq_len=20, batch=3),
    # weight conversions
    "conversion_keras_to_torch": Conversion("EXTRA: Keras MHA(h=6,k=4) Dq=24,Dk=24,Dv=24 -> torch in_proj_weight etc. (pure reshape/transpose)", "keras_to_torch", query_len=5, source_len=7),
    "conversion_keras_to_projected": Conversion("EXTRA: Keras MHA(6,4) on Dq=4 -> Linear(4,24)+MHA(24,6)+final Linear(24,4)", "keras_to_projected"),
    "conversion_projected_to_keras": Conversion("EXTRA: Linear(4,24)+MHA(24,6) -> Keras MHA(6,4,output_shape=24)", "projected_to_keras"),
    "conversion_keras_to_torch_h2_k5": Conversion("EXTRA: Keras MHA(2,5) with D=10 -> torch (pure reshape/transpose)", "keras_to_torch", num_heads=2, key_dim=5, query_len=4, source_len=6),
    "conversion_keras_to_projected_h3_k2_in5": Conversion("EXTRA: Keras MHA(3,2) on Dq=5 -> Linear(5,6)+MHA(6,3)+Linear(6,5)", "keras_to_projected", num_heads=3, key_dim=2, in_features=5),
    "conversion_projected_to_keras_h4_k3_in7": Conversion("EXTRA: Linear(7,12)+MHA(12,4) -> Keras MHA(4,3,output_shape=12)", "projected_to_keras", num_heads=4, key_dim=3, in_features=7),
}


# --------------------------------------------------------------------------------------------------------------------
# Random numbers, weights and files (shared with train/generate_train.py)
# --------------------------------------------------------------------------------------------------------------------

def case_rng(case):
    """The case's generator: ``default_rng([SEED, crc32(case)])``."""
    return np.random.default_rng([SEED, zlib.crc32(case.encode())])


def seed_of(case):
    """The seed as recorded in the config."""
    return [SEED, zlib.crc32(case.encode())]


def normal(rng, shape, std=1.0):
    """float32 draw from N(0, std^2)."""
    return (rng.standard_normal(shape) * std).astype(np.float32)


def kernel(rng, shape, fan_in):
    """A kernel: normal with std 1.5*sqrt(2/(fan_in+fan_out)), fan_out = size/fan_in (Glorot, scaled up by 1.5)."""
    fan_out = int(np.prod(shape)) // fan_in
    return normal(rng, shape, 1.5 * np.sqrt(2.0 / (fan_in + fan_out)))


def bias(rng, shape):
    """A bias: N(0, 0.5^2)."""
    return normal(rng, shape, 0.5)


def draw_keras_weights(rng, dq, dk, dv, num_heads, key_dim, value_dim, output_dim, use_bias=True):
    """Keras MHA weights: the four kernels (query, key, value, attention_output), then the four biases."""
    h = num_heads
    w = {
        "query.kernel": kernel(rng, (dq, h, key_dim), dq),
        "key.kernel": kernel(rng, (dk, h, key_dim), dk),
        "value.kernel": kernel(rng, (dv, h, value_dim), dv),
        "attention_output.kernel": kernel(rng, (h, value_dim, output_dim), h * value_dim),
    }
    if use_bias:
        w["query.bias"] = bias(rng, (h, key_dim))
        w["key.bias"] = bias(rng, (h, key_dim))
        w["value.bias"] = bias(rng, (h, value_dim))
        w["attention_output.bias"] = bias(rng, (output_dim,))
    return w


def draw_torch_mha_weights(rng, embed_dim, kdim=None, vdim=None, bias_=True):
    """MultiheadAttention state_dict. in_proj_weight is drawn as three stacked (E,E) blocks (fan of one block)."""
    e = embed_dim
    kdim, vdim = kdim or e, vdim or e
    w = {}
    if kdim == e and vdim == e:
        w["in_proj_weight"] = normal(rng, (3 * e, e), 1.5 * np.sqrt(2.0 / (2 * e)))
    else:
        w["q_proj_weight"] = kernel(rng, (e, e), e)
        w["k_proj_weight"] = kernel(rng, (e, kdim), kdim)
        w["v_proj_weight"] = kernel(rng, (e, vdim), vdim)
    if bias_:
        w["in_proj_bias"] = bias(rng, (3 * e,))
    w["out_proj.weight"] = kernel(rng, (e, e), e)
    if bias_:
        w["out_proj.bias"] = bias(rng, (e,))
    return w


def draw_projected_weights(rng, in_features, embed_dim):
    """Linear(in, E) then MultiheadAttention(E, h) weights, state_dict names with the ``mha.`` prefix dropped."""
    w = {"proj.weight": kernel(rng, (embed_dim, in_features), in_features), "proj.bias": bias(rng, (embed_dim,))}
    w.update(draw_torch_mha_weights(rng, embed_dim))
    return w


def max_abs_diff(a, b):
    """max |a - b| as a python float; NaNs must sit at the same places in both and are skipped."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    nan = np.isnan(a)
    if not np.array_equal(nan, np.isnan(b)):
        raise AssertionError("NaN patterns differ")
    return float(np.max(np.abs(a[~nan] - b[~nan]), initial=0.0))


def save_fixture(path, tensors, config):
    """Write one safetensors file: float tensors as float32, masks as uint8, config as JSON in the metadata."""
    out = {}
    for name, value in tensors.items():
        value = np.asarray(value)
        out[name] = np.ascontiguousarray(value if value.dtype == np.uint8 else value.astype(np.float32))
    save_file(out, str(path), metadata={"config": json.dumps(config, sort_keys=True)})


def write_index(folder, prefixes, with_sha256=False):
    """Rebuild ``folder/index.json`` from every ``<prefix>*.safetensors`` file present there."""
    entries = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        if not path.name.startswith(prefixes):
            continue
        with safe_open(str(path), "np") as f:
            entry = {
                "config": json.loads(f.metadata()["config"]),
                "file": path.name,
                "tensors": {k: [list(f.get_slice(k).get_shape()), str(f.get_tensor(k).dtype)] for k in f.keys()},
            }
        if with_sha256:
            entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        entries.append(entry)
    with open(Path(folder) / "index.json", "w") as f:
        json.dump(entries, f, indent=1, sort_keys=True)
        f.write("\n")


# --------------------------------------------------------------------------------------------------------------------
# The libraries
# --------------------------------------------------------------------------------------------------------------------

def keras_sublayers(layer):
    """The EinsumDense sublayers of a Keras MHA, by fixture name prefix (and `gate` with use_gate)."""
    subs = dict(zip(KERAS_KINDS, (layer.query_dense, layer.key_dense, layer.value_dense, layer.output_dense)))
    if getattr(layer, "_use_gate", False):
        subs["gate"] = layer._gate_dense
    return subs


def keras_variables(layer):
    """{fixture name: keras Variable} of a built Keras MHA."""
    out = {}
    for kind, sub in keras_sublayers(layer).items():
        out[f"{kind}.kernel"] = sub.kernel
        if sub.bias is not None:
            out[f"{kind}.bias"] = sub.bias
    return out


def make_keras_mha(weights, dtype, num_heads, key_dim, value_dim=None, output_shape=None, use_bias=True,
                   sliding_window=None, use_gate=False, dropout=0.0):
    """A built Keras MHA in ``dtype`` holding ``weights`` (float32 arrays, cast up exactly)."""
    layer = keras.layers.MultiHeadAttention(num_heads=num_heads, key_dim=key_dim, value_dim=value_dim,
                                            output_shape=output_shape, use_bias=use_bias, dtype=dtype,
                                            sliding_window=sliding_window, use_gate=use_gate, dropout=dropout)
    dq, dk, dv = (weights[f"{k}.kernel"].shape[0] for k in ("query", "key", "value"))
    layer.build((None, None, dq), (None, None, dv), (None, None, dk))
    variables = keras_variables(layer)
    if set(variables) != set(weights):
        raise ValueError(f"weight names {sorted(weights)} != layer variables {sorted(variables)}")
    for name, var in variables.items():
        var.assign(weights[name].astype(dtype))
    return layer


def run_keras(weights, inputs, dtype, use_causal_mask=False, **layer_args):
    """Keras MHA forward: the default call and the ``return_attention_scores=True`` call, as float64 numpy."""
    layer = make_keras_mha(weights, dtype, **layer_args)
    masks = ("inputs.attention_mask", "inputs.query_mask", "inputs.value_mask", "inputs.key_mask")
    t = {k: tf.constant(v, dtype=dtype) for k, v in inputs.items() if k not in masks}
    kwargs = {"use_causal_mask": use_causal_mask}
    if "inputs.key" in t:
        kwargs["key"] = t["inputs.key"]
    for name in ("attention_mask", "value_mask", "key_mask"):
        if f"inputs.{name}" in inputs:
            kwargs[name] = tf.constant(inputs[f"inputs.{name}"].astype(bool))

    def query():
        # Keras 3.15 reads the query's mask off the tensor (an explicit `query_mask=` argument is
        # ignored): attach it as Embedding(mask_zero=True) or Masking would.
        q = tf.identity(t["inputs.query"])
        if "inputs.query_mask" in inputs:
            keras.src.backend.set_keras_mask(q, tf.constant(inputs["inputs.query_mask"].astype(bool)))
        return q

    out = layer(query(), t["inputs.value"], **kwargs)
    out_s, scores = layer(query(), t["inputs.value"], return_attention_scores=True, **kwargs)
    return {"outputs.output": np.asarray(out, np.float64),
            "outputs.attention_scores": np.asarray(scores, np.float64),
            "outputs.output_with_scores": np.asarray(out_s, np.float64)}


def to_torch(weights, dtype):
    """float32 numpy arrays -> torch tensors of ``dtype``."""
    return {k: torch.from_numpy(np.asarray(v)).to(dtype) for k, v in weights.items()}


def make_torch_mha(weights, dtype, embed_dim, num_heads, kdim=None, vdim=None, bias_=True, add_zero_attn=False,
                   add_bias_kv=False, dropout=0.0):
    """An eval-mode MultiheadAttention(batch_first=True) in ``dtype`` holding ``weights``."""
    mha = torch.nn.MultiheadAttention(embed_dim, num_heads, bias=bias_, kdim=kdim, vdim=vdim, batch_first=True,
                                      dtype=dtype, add_zero_attn=add_zero_attn, add_bias_kv=add_bias_kv, dropout=dropout)
    mha.load_state_dict(to_torch(weights, dtype), strict=True)
    return mha.eval()


def make_projected(weights, dtype, in_features, embed_dim, num_heads):
    """(Linear(in, E), eval-mode MultiheadAttention(E, h)) holding ``weights``."""
    proj = torch.nn.Linear(in_features, embed_dim, dtype=dtype)
    proj.load_state_dict(to_torch({"weight": weights["proj.weight"], "bias": weights["proj.bias"]}, dtype))
    mha = make_torch_mha({k: v for k, v in weights.items() if not k.startswith("proj.")}, dtype, embed_dim, num_heads)
    return proj.eval(), mha


def run_torch_mha(mha, query, key, value, dtype, need_weights=True, is_causal=False, **masks):
    """MultiheadAttention forward (reference Python path: the fast path is disabled at import) as float64 numpy."""
    # Float masks are added to the logits in the run's dtype; the others are boolean.
    masks = {k: torch.from_numpy(v).to(dtype) if v.dtype == np.float32 else torch.from_numpy(v.astype(bool)) for k, v in masks.items()}
    with torch.no_grad():
        out, weights = mha(*(torch.from_numpy(a).to(dtype) for a in (query, key, value)), need_weights=need_weights,
                           average_attn_weights=True, is_causal=is_causal, **masks)
    return out.double().numpy(), (None if weights is None else weights.double().numpy())


def run_projected(weights, x, dtype, in_features, embed_dim, num_heads):
    """proj(x) and mha(z, z, z) of the projected model, as float64 numpy."""
    proj, mha = make_projected(weights, dtype, in_features, embed_dim, num_heads)
    with torch.no_grad():
        z = proj(torch.from_numpy(x).to(dtype)).double().numpy()
    out, attn = run_torch_mha(mha, z, z, z, dtype)
    return {"intermediates.proj_output": z, "outputs.output": out, "outputs.attention_weights": attn}


def reference_and_drift(run):
    """Run ``run(dtype)`` in float64 (the reference) and in float32; return the reference and, per output, the
    max abs difference of the float32 run from it."""
    ref = run("float64")
    f32 = run("float32")
    return ref, {k: max_abs_diff(f32[k], ref[k]) for k in ref}


# --------------------------------------------------------------------------------------------------------------------
# One function per fixture kind: (case name, case spec) -> (tensors, config)
# --------------------------------------------------------------------------------------------------------------------

def keras_case(case, c):
    """keras_*: draws inputs (query, value, key), kernels, biases, then the random mask; runs Keras in f64 and f32."""
    rng = case_rng(case)
    t = c.query_len if c.self_attention else c.source_len
    dv = c.query_dim if c.self_attention else c.value_input_dim
    dk = c.key_input_dim or dv
    value_dim = c.value_dim or c.key_dim
    output_dim = c.output_shape or c.query_dim

    inputs = {"inputs.query": normal(rng, (c.batch, c.query_len, c.query_dim))}
    inputs["inputs.value"] = inputs["inputs.query"].copy() if c.self_attention else normal(rng, (c.batch, t, dv))
    if c.key_input_dim is not None:
        inputs["inputs.key"] = normal(rng, (c.batch, t, dk))
    weights = draw_keras_weights(rng, c.query_dim, dk, dv, c.num_heads, c.key_dim, value_dim, output_dim, c.use_bias)
    if c.use_gate:  # drawn after the others, so the other cases' draws do not move
        weights["gate.kernel"] = kernel(rng, (c.query_dim, c.num_heads, value_dim), c.query_dim)
        if c.use_bias:
            weights["gate.bias"] = bias(rng, (c.num_heads, value_dim))
    if c.valid_lengths is not None:
        keep = np.arange(t)[None, None, :] < np.asarray(c.valid_lengths)[:, None, None]
        inputs["inputs.attention_mask"] = np.broadcast_to(keep, (c.batch, c.query_len, t)).astype(np.uint8)
    if c.fully_masked is not None:
        keep = rng.random((c.batch, c.query_len, t)) > 0.3
        for b, row in c.fully_masked:
            keep[b, slice(None) if row is None else row, :] = False
        inputs["inputs.attention_mask"] = keep.astype(np.uint8)

    lengths_mask = lambda lengths, n: (np.arange(n)[None, :] < np.asarray(lengths)[:, None]).astype(np.uint8)
    if c.query_mask_lengths is not None:
        inputs["inputs.query_mask"] = lengths_mask(c.query_mask_lengths, c.query_len)
    if c.value_mask_lengths is not None:
        inputs["inputs.value_mask"] = lengths_mask(c.value_mask_lengths, t)
    if c.key_mask_lengths is not None:
        inputs["inputs.key_mask"] = lengths_mask(c.key_mask_lengths, t)

    allowed = np.ones((c.batch, c.query_len, t), bool)
    if "inputs.attention_mask" in inputs:
        allowed &= inputs["inputs.attention_mask"].astype(bool)
    if "inputs.query_mask" in inputs:
        allowed &= inputs["inputs.query_mask"].astype(bool)[:, :, None]
    for name in ("inputs.value_mask", "inputs.key_mask"):
        if name in inputs:
            allowed &= inputs[name].astype(bool)[:, None, :]
    if c.use_causal_mask:
        allowed &= np.tril(np.ones((c.query_len, t), bool))
    if c.sliding_window is not None:
        allowed &= np.abs(np.arange(c.query_len)[:, None] - np.arange(t)[None, :]) < c.sliding_window

    layer_args = dict(num_heads=c.num_heads, key_dim=c.key_dim, value_dim=c.value_dim, output_shape=c.output_shape,
                      use_bias=c.use_bias, use_causal_mask=c.use_causal_mask, sliding_window=c.sliding_window,
                      use_gate=c.use_gate, dropout=c.dropout)
    ref, drift = reference_and_drift(lambda dtype: run_keras(weights, inputs, dtype, **layer_args))
    config = {
        "framework": "keras", "framework_version": keras.__version__, "backend": "tensorflow",
        "backend_version": tf.__version__, "case": case, "description": c.description, "seed": seed_of(case),
        "num_heads": c.num_heads, "key_dim": c.key_dim, "value_dim": value_dim, "value_dim_arg": c.value_dim,
        "use_bias": c.use_bias, "output_shape": c.output_shape, "use_causal_mask": c.use_causal_mask,
        "attention_axes": None, "dropout": c.dropout, "self_attention": c.self_attention,
        "has_key": "inputs.key" in inputs, "has_attention_mask": "inputs.attention_mask" in inputs,
        "sliding_window": c.sliding_window, "use_gate": c.use_gate,
        "has_query_mask": "inputs.query_mask" in inputs, "has_value_mask": "inputs.value_mask" in inputs,
        "has_key_mask": "inputs.key_mask" in inputs,
        "fully_masked_rows": bool((~allowed.any(-1)).any()),
        "batch": c.batch, "query_len": c.query_len, "source_len": t, "query_dim": c.query_dim,
        "key_input_dim": dk, "value_input_dim": dv, "output_dim": output_dim,
        "reference_dtype": "float64", "tolerance": TOLERANCE, "f32_library_max_abs_diff": drift,
    }
    return {**inputs, **weights, **ref}, config


def keras_nd_case(case, c):
    """keras_nd_*: draws query (value), kernels, biases, gate, then the masks; runs Keras in f64 and f32."""
    rng = case_rng(case)
    dq = c.query_shape[-1]
    dv = dq if c.source_shape is None else c.source_shape[-1]
    value_dim = c.value_dim or c.key_dim
    inputs = {"inputs.query": normal(rng, c.query_shape)}
    inputs["inputs.value"] = inputs["inputs.query"].copy() if c.source_shape is None else normal(rng, c.source_shape)
    weights = draw_keras_weights(rng, dq, dv, dv, c.num_heads, c.key_dim, value_dim, dq, c.use_bias)
    if c.use_gate:
        weights["gate.kernel"] = kernel(rng, (dq, c.num_heads, value_dim), dq)
        if c.use_bias:
            weights["gate.bias"] = bias(rng, (c.num_heads, value_dim))
    if c.mask_shape is not None:
        keep = rng.random(c.mask_shape) > 0.3
        n = len(c.attention_axes or range(1, len(c.query_shape) - 1))
        keep[(0,) * (len(c.mask_shape) - n)] = False  # the first query row allows no key
        inputs["inputs.attention_mask"] = keep.astype(np.uint8)
    if c.query_mask:
        inputs["inputs.query_mask"] = (rng.random(c.query_shape[:-1]) > 0.25).astype(np.uint8)
    if c.value_mask:
        inputs["inputs.value_mask"] = (rng.random(inputs["inputs.value"].shape[:-1]) > 0.25).astype(np.uint8)

    def run(dtype):
        layer = keras.layers.MultiHeadAttention(num_heads=c.num_heads, key_dim=c.key_dim, value_dim=c.value_dim,
                                                use_bias=c.use_bias, use_gate=c.use_gate, dtype=dtype,
                                                attention_axes=c.attention_axes, sliding_window=c.sliding_window)
        shape = lambda a: (None,) * (a.ndim - 1) + (a.shape[-1],)
        layer.build(shape(inputs["inputs.query"]), shape(inputs["inputs.value"]))
        variables = keras_variables(layer)
        if set(variables) != set(weights):
            raise ValueError(f"weight names {sorted(weights)} != layer variables {sorted(variables)}")
        for name, var in variables.items():
            var.assign(weights[name].astype(dtype))
        kwargs = {"use_causal_mask": c.use_causal_mask}
        for name in ("attention_mask", "value_mask"):
            if f"inputs.{name}" in inputs:
                kwargs[name] = tf.constant(inputs[f"inputs.{name}"].astype(bool))

        def query():
            q = tf.constant(inputs["inputs.query"], dtype=dtype)
            if "inputs.query_mask" in inputs:
                keras.src.backend.set_keras_mask(q, tf.constant(inputs["inputs.query_mask"].astype(bool)))
            return q

        value = tf.constant(inputs["inputs.value"], dtype=dtype)
        out = layer(query(), value, **kwargs)
        out_s, scores = layer(query(), value, return_attention_scores=True, **kwargs)
        return {"outputs.output": np.asarray(out, np.float64),
                "outputs.attention_scores": np.asarray(scores, np.float64),
                "outputs.output_with_scores": np.asarray(out_s, np.float64)}

    ref, drift = reference_and_drift(run)
    config = {
        "framework": "keras", "framework_version": keras.__version__, "backend": "tensorflow",
        "backend_version": tf.__version__, "case": case, "description": c.description, "seed": seed_of(case),
        "num_heads": c.num_heads, "key_dim": c.key_dim, "value_dim": value_dim, "value_dim_arg": c.value_dim,
        "use_bias": c.use_bias, "output_shape": None, "use_causal_mask": c.use_causal_mask,
        "attention_axes": None if c.attention_axes is None else list(c.attention_axes), "dropout": 0.0,
        "self_attention": c.source_shape is None, "has_key": False,
        "has_attention_mask": "inputs.attention_mask" in inputs, "sliding_window": c.sliding_window,
        "use_gate": c.use_gate, "has_query_mask": "inputs.query_mask" in inputs,
        "has_value_mask": "inputs.value_mask" in inputs, "has_key_mask": False,
        "query_shape": list(c.query_shape), "value_shape": list(inputs["inputs.value"].shape),
        "attention_scores_shape": list(ref["outputs.attention_scores"].shape),
        "reference_dtype": "float64", "tolerance": TOLERANCE, "f32_library_max_abs_diff": drift,
    }
    return {**inputs, **weights, **ref}, config


def torch_config(case, description, batch, query_len, source_len, embed_dim, num_heads, kdim, vdim, bias_,
                 self_attention, masks, fully_masked_rows, drift):
    """Config fields shared by torch_* and projected_*."""
    return {
        "framework": "torch", "framework_version": torch.__version__, "case": case, "description": description,
        "seed": seed_of(case), "embed_dim": embed_dim, "num_heads": num_heads, "head_dim": embed_dim // num_heads,
        "kdim": kdim, "vdim": vdim, "bias": bias_, "batch_first": True, "dropout": 0.0, "add_bias_kv": False,
        "add_zero_attn": False, "need_weights": True, "average_attn_weights": True,
        "self_attention": self_attention, "has_key_padding_mask": "inputs.key_padding_mask" in masks,
        "has_attn_mask": "inputs.attn_mask" in masks, "fully_masked_rows": fully_masked_rows,
        "batch": batch, "query_len": query_len, "source_len": source_len,
        "reference_dtype": "float64", "tolerance": TOLERANCE, "f32_library_max_abs_diff": drift,
    }


def torch_case(case, c):
    """torch_*: draws inputs (query, key, value), then the state_dict; runs MultiheadAttention in f64 and f32."""
    rng = case_rng(case)
    e = c.embed_dim
    s = c.query_len if c.self_attention else c.source_len
    kdim, vdim = c.kdim or e, c.vdim or e
    if c.self_attention:
        x = normal(rng, (c.batch, c.query_len, e))
        inputs = {"inputs.query": x, "inputs.key": x.copy(), "inputs.value": x.copy()}
    else:
        inputs = {"inputs.query": normal(rng, (c.batch, c.query_len, e)),
                  "inputs.key": normal(rng, (c.batch, s, kdim)), "inputs.value": normal(rng, (c.batch, s, vdim))}
    weights = draw_torch_mha_weights(rng, e, c.kdim, c.vdim, c.bias)
    if c.add_bias_kv:  # drawn after the others, so the other cases' draws do not move
        weights["bias_k"] = normal(rng, (1, 1, e)).astype(np.float32) * 0.5
        weights["bias_v"] = normal(rng, (1, 1, e)).astype(np.float32) * 0.5

    masks = {}
    if c.key_padding_lengths is not None:
        masks["inputs.key_padding_mask"] = (np.arange(s)[None, :] >= np.asarray(c.key_padding_lengths)[:, None])
    if c.causal_attn_mask or c.masked_query_rows:
        attn = np.triu(np.ones((c.query_len, s), bool), 1) if c.causal_attn_mask else np.zeros((c.query_len, s), bool)
        attn[list(c.masked_query_rows), :] = True
        masks["inputs.attn_mask"] = attn
    masks = {k: v.astype(np.uint8) for k, v in masks.items()}
    forbidden = np.zeros((c.batch, c.num_heads, c.query_len, s), bool)
    if "inputs.key_padding_mask" in masks:
        forbidden |= masks["inputs.key_padding_mask"].astype(bool)[:, None, None, :]
    if "inputs.attn_mask" in masks:
        forbidden |= masks["inputs.attn_mask"].astype(bool)[None, None]
    if c.float_attn_mask:
        assert not (c.causal_attn_mask or c.masked_query_rows), "one attn_mask per case"
        additive = normal(rng, (c.batch * c.num_heads, c.query_len, s)).astype(np.float32)
        band = np.arange(s)[None, :] > np.arange(c.query_len)[:, None] + 2  # [T, S]
        additive[1::2][:, band] = -np.inf
        masks["inputs.attn_mask"] = additive
        forbidden |= np.isneginf(additive).reshape(c.batch, c.num_heads, c.query_len, s)
    fully_masked_rows = bool(forbidden.all(-1).any())

    def run(dtype):
        dtype = getattr(torch, dtype)
        mha = make_torch_mha(weights, dtype, e, c.num_heads, c.kdim, c.vdim, c.bias, c.add_zero_attn, c.add_bias_kv,
                             c.dropout)
        kw = {name.split(".", 1)[1]: m for name, m in masks.items()}
        args = (inputs["inputs.query"], inputs["inputs.key"], inputs["inputs.value"], dtype)
        out, attn = run_torch_mha(mha, *args, is_causal=c.is_causal, **kw)
        res = {"outputs.output": out, "outputs.attention_weights": attn}
        if c.is_causal:
            res["outputs.output_need_weights_false"] = run_torch_mha(mha, *args, need_weights=False, is_causal=True, **kw)[0]
        elif fully_masked_rows:
            res["outputs.output_need_weights_false"] = run_torch_mha(mha, *args, need_weights=False, **kw)[0]
        return res

    ref, drift = reference_and_drift(run)
    config = torch_config(case, c.description, c.batch, c.query_len, s, e, c.num_heads, kdim, vdim, c.bias,
                          c.self_attention, masks, fully_masked_rows, drift)
    config["is_causal"] = c.is_causal
    config["add_zero_attn"] = c.add_zero_attn
    config["add_bias_kv"] = c.add_bias_kv
    config["dropout"] = c.dropout
    return {**inputs, **masks, **weights, **ref}, config


def projected_case(case, c):
    """projected_*: draws x, then proj and MHA weights; runs Linear -> MultiheadAttention in f64 and f32."""
    rng = case_rng(case)
    x = normal(rng, (c.batch, c.seq_len, c.in_features))
    weights = draw_projected_weights(rng, c.in_features, c.embed_dim)
    ref, drift = reference_and_drift(lambda dtype: run_projected(weights, x, getattr(torch, dtype), c.in_features,
                                                                 c.embed_dim, c.num_heads))
    config = torch_config(case, c.description, c.batch, c.seq_len, c.seq_len, c.embed_dim, c.num_heads, c.embed_dim,
                          c.embed_dim, True, True, {}, False, drift)
    config.update(kind="projected", in_features=c.in_features)
    return {"inputs.x": x, **weights, **ref}, config


def keras_to_torch_weights(w, num_heads, key_dim):
    """Keras MHA weights -> MultiheadAttention state_dict (pure reshape/transpose, exact)."""
    e = num_heads * key_dim
    flat = {k: w[f"{k}.kernel"].reshape(-1, e).T for k in ("query", "key", "value")}
    return {
        "in_proj_weight": np.concatenate([flat["query"], flat["key"], flat["value"]]),
        "in_proj_bias": np.concatenate([w[f"{k}.bias"].ravel() for k in ("query", "key", "value")]),
        "out_proj.weight": w["attention_output.kernel"].reshape(e, -1).T.copy(),
        "out_proj.bias": w["attention_output.bias"].copy(),
    }


def keras_to_projected_weights(w, num_heads, key_dim, in_features):
    """Keras MHA(h, k) on D = in_features -> Linear(D, E) + MHA(E, h) + final Linear(E, D), E = h*k (exact)."""
    e = num_heads * key_dim
    mha = keras_to_torch_weights(w, num_heads, key_dim)  # in_proj blocks are (E, D): pad with zero columns
    pad = np.zeros((3 * e, e - in_features), np.float32)
    return {
        "proj.weight": np.eye(e, in_features, dtype=np.float32), "proj.bias": np.zeros(e, np.float32),
        "in_proj_weight": np.concatenate([mha["in_proj_weight"], pad], axis=1), "in_proj_bias": mha["in_proj_bias"],
        "out_proj.weight": np.eye(e, dtype=np.float32), "out_proj.bias": np.zeros(e, np.float32),
        "final.weight": mha["out_proj.weight"], "final.bias": mha["out_proj.bias"],
    }


def projected_to_keras_weights(w, num_heads):
    """Linear(D, E) + MHA(E, h) -> Keras MHA(h, E/h, output_shape=E) on D: kernel^T = W'P, bias = W'p + b'.

    Computed in float64, rounded to float32."""
    e, d = w["proj.weight"].shape
    p, pb = w["proj.weight"].astype(np.float64), w["proj.bias"].astype(np.float64)
    wi, bi = w["in_proj_weight"].astype(np.float64), w["in_proj_bias"].astype(np.float64)
    out = {}
    for i, kind in enumerate(("query", "key", "value")):
        blk, b = wi[i * e:(i + 1) * e], bi[i * e:(i + 1) * e]
        out[f"{kind}.kernel"] = (blk @ p).T.reshape(d, num_heads, e // num_heads)
        out[f"{kind}.bias"] = (blk @ pb + b).reshape(num_heads, e // num_heads)
    out["attention_output.kernel"] = w["out_proj.weight"].astype(np.float64).T.reshape(num_heads, e // num_heads, e)
    out["attention_output.bias"] = w["out_proj.bias"].astype(np.float64)
    return {k: v.astype(np.float32) for k, v in out.items()}


def run_keras_to_projected_model(dst, x, in_features, embed_dim, num_heads):
    """float64 output of Linear -> MHA -> final Linear holding ``dst``."""
    mha_w = {k: v for k, v in dst.items() if not k.startswith("final.")}
    z = run_projected(mha_w, x, torch.float64, in_features, embed_dim, num_heads)["outputs.output"]
    return z @ dst["final.weight"].astype(np.float64).T + dst["final.bias"].astype(np.float64)


def conversion_case(case, c):
    """conversion_*: draws the source weights, then the inputs; converts; runs source (reference) and destination."""
    rng = case_rng(case)
    h, k, e = c.num_heads, c.key_dim, c.num_heads * c.key_dim
    config = {"framework": "conversion", "direction": c.direction, "case": case, "description": c.description,
              "seed": seed_of(case), "num_heads": h, "key_dim": k, "embed_dim": e,
              "keras_version": keras.__version__, "torch_version": torch.__version__, "tolerance": TOLERANCE}
    if c.direction == "keras_to_torch":
        src = draw_keras_weights(rng, e, e, e, h, k, k, e)
        inputs = {"inputs.query": normal(rng, (c.batch, c.query_len, e)),
                  "inputs.key": normal(rng, (c.batch, c.source_len, e)),
                  "inputs.value": normal(rng, (c.batch, c.source_len, e))}
        dst = keras_to_torch_weights(src, h, k)
        out = run_keras(src, inputs, "float64", num_heads=h, key_dim=k)["outputs.output"]
        other, _ = run_torch_mha(make_torch_mha(dst, torch.float64, e, h), inputs["inputs.query"],
                                 inputs["inputs.key"], inputs["inputs.value"], torch.float64)
        config.update(kdim=e, vdim=e)
    elif c.direction == "keras_to_projected":
        d = c.in_features
        src = draw_keras_weights(rng, d, d, d, h, k, k, d)
        inputs = {"inputs.x": normal(rng, (c.batch, c.query_len, d))}
        dst = keras_to_projected_weights(src, h, k, d)
        x = inputs["inputs.x"]
        out = run_keras(src, {"inputs.query": x, "inputs.value": x}, "float64", num_heads=h, key_dim=k)[
            "outputs.output"]
        other = run_keras_to_projected_model(dst, x, d, e, h)
        config.update(in_features=d, mapping="proj.weight=[I;0], proj.bias=0, in_proj rows = keras kernels "
                      "flattened^T padded with zero columns, out_proj=I (bias 0), final.weight=Wo^T, final.bias=bo")
    elif c.direction == "projected_to_keras":
        d = c.in_features
        src = draw_projected_weights(rng, d, e)
        inputs = {"inputs.x": normal(rng, (c.batch, c.query_len, d))}
        dst = projected_to_keras_weights(src, h)
        x = inputs["inputs.x"]
        out = run_projected(src, x, torch.float64, d, e, h)["outputs.output"]
        other = run_keras(dst, {"inputs.query": x, "inputs.value": x}, "float64", num_heads=h, key_dim=k,
                          output_shape=e)["outputs.output"]
        config.update(in_features=d, keras_output_shape=e, mapping="kernel^T = W' @ P (reshaped (Din,h,E/h)), "
                      "bias = W' @ p + b'; attention_output.kernel = out_proj.weight^T reshaped (h,E/h,E); computed "
                      "in float64 then rounded to float32")
    else:
        raise ValueError(f"unknown conversion direction {c.direction!r}")
    config["cross_library_max_abs_diff_float64"] = {"output": max_abs_diff(out, other)}
    tensors = {**inputs, **{f"src.{n}": v for n, v in src.items()}, **{f"dst.{n}": v for n, v in dst.items()},
               "outputs.output": out}
    return tensors, config


KINDS = {Keras: keras_case, KerasNd: keras_nd_case, Torch: torch_case, Projected: projected_case, Conversion: conversion_case}
PREFIXES = ("keras_", "torch_", "projected_", "conversion_")


# Keras' initializers, as MultiHeadAttention applies them: statistics of the real draws
INITIALIZERS = ["glorot_uniform", "glorot_normal", "he_uniform", "he_normal", "lecun_uniform", "lecun_normal", "zeros",
                "ones", "random_normal", "random_uniform", "truncated_normal",
                {"class_name": "VarianceScaling", "config": {"scale": 0.5, "mode": "fan_out", "distribution": "untruncated_normal"}},
                {"class_name": "RandomUniform", "config": {"minval": -0.2, "maxval": 0.3}},
                {"class_name": "GlorotUniform", "config": {"seed": 7}}]


def initializer_stats(out):
    """``initializers.json``: for each initializer (as kernel_initializer and bias_initializer of
    MultiHeadAttention(num_heads=8, key_dim=32) on Dq=64, Dv=48, so the fans of every kernel differ), every
    variable's shape and the mean, std, min and max of Keras' draw, and whether the query and key kernels came out
    identical (Keras' rule for a seeded initializer when their shapes agree)."""
    entries = []
    for initializer in INITIALIZERS:
        layer = keras.layers.MultiHeadAttention(num_heads=8, key_dim=32, kernel_initializer=initializer,
                                                bias_initializer=initializer)
        layer.build((None, None, 64), (None, None, 48), (None, None, 64))
        variables = {name: np.asarray(var, np.float64) for name, var in keras_variables(layer).items()}
        entries.append({
            "initializer": initializer,
            "equal_query_key_kernels": bool(np.array_equal(variables["query.kernel"], variables["key.kernel"])),
            "variables": {name: {"shape": list(v.shape), "mean": float(v.mean()), "std": float(v.std()),
                                 "min": float(v.min()), "max": float(v.max())} for name, v in variables.items()},
        })
    with open(out / "initializers.json", "w") as f:
        json.dump({"keras": keras.__version__, "layer": "MultiHeadAttention(num_heads=8, key_dim=32), query [B, T, 64], "
                   "value [B, S, 48], key [B, S, 64]", "entries": entries}, f, indent=1)
        f.write("\n")


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
        save_fixture(args.out / f"{case}.safetensors", tensors, config)
        print(f"{case}: {len(tensors)} tensors, {time.time() - start:.1f}s", flush=True)
    write_index(args.out, PREFIXES)
    if not args.only:
        initializer_stats(args.out)
        print("initializers.json: statistics of Keras' initializers", flush=True)


if __name__ == "__main__":
    main()
