//! PyTorch-style multi-head attention: `torch.nn.MultiheadAttention` (torch 2.x) as a Burn module.
//!
//! For query `[B, T, E]`, key `[B, S, kdim]` and value `[B, S, vdim]` (batch first):
//!
//! ```text
//! Q = query Wq^T + bq,  K = key Wk^T + bk,  V = value Wv^T + bv       (E features, h heads of E/h)
//! P = softmax(sqrt(1 / (E/h)) * Q K^T + masks)                         -> [B, h, T, S]
//! y = concat_h(P V) Wo^T + bo                                          -> [B, T, E]
//! ```
//!
//! Masks use torch's polarity: `key_padding_mask [B, S]` true = ignore that key; a boolean
//! `attn_mask [T, S]` (or `[B*h, T, S]`) true = the pair is NOT allowed; a float `attn_mask` is
//! added to the logits. Returned weights are averaged over heads unless asked per head, and come
//! after dropout, as torch returns them.
//!
//! A query row with no allowed key is NaN in torch's `need_weights=True` path. This module never
//! returns NaN: such a row gets zero attention, so its output is `out_proj.bias`, which is what
//! torch's `need_weights=False` (fused SDPA) path returns.
//!
//! Why not burn-nn's `MultiHeadAttention`: it has no `kdim`/`vdim`, fills masked logits with a
//! finite `-1e4` (not torch's `-inf`, so large logits leak through the mask), applies dropout 0.1
//! by default and returns per-head weights only. The parameter layout here is the same (separate
//! query/key/value/output Linears); torch's packed `in_proj_weight` is split and joined at I/O.

use burn::config::Config;
use burn::module::{Module, Param};
use burn::nn::{Initializer, Linear};
use burn::tensor::{Bool, Device, Tensor};
use kernels::{Dense, Marks, linear_after, linear_forward};

use crate::attention::{
    AttentionCall, AttentionPath, FullyMaskedRows, Operands, PairMask, Probs, merge_heads, probs_dropout, split_heads,
};
use crate::dense::{linear, linear_weights};
use crate::error::{ModelError, Result};
use crate::weights::{HostTensor, WeightMap};

/// The constructor arguments of `torch.nn.MultiheadAttention`.
#[derive(Config, Debug, PartialEq)]
pub struct TorchMhaConfig {
    /// Total width `E` of queries, keys, values and output.
    pub embed_dim: usize,
    /// Number of heads `h`; each has `E / h` features.
    pub num_heads: usize,
    /// Width of the key input; `None` = `embed_dim`.
    pub kdim: Option<usize>,
    /// Width of the value input; `None` = `embed_dim`.
    pub vdim: Option<usize>,
    /// Biases on the input and output projections (all or nothing, as in torch).
    #[config(default = true)]
    pub bias: bool,
    /// Dropout on the attention weights (training only).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Inputs are `[B, L, E]` when true, `[L, B, E]` when false.
    #[config(default = true)]
    pub batch_first: bool,
    /// torch's `add_zero_attn`: a zero key and a zero value are appended after the projections
    /// (every mask gets an allowed column for them), so every query row can attend something.
    #[config(default = false)]
    pub add_zero_attn: bool,
    /// torch's `add_bias_kv`: learned rows `bias_k`, `bias_v` `[1, 1, E]` appended to the
    /// projected keys and values (before `add_zero_attn`'s zeros; masks padded likewise).
    #[config(default = false)]
    pub add_bias_kv: bool,
}

impl TorchMhaConfig {
    fn validate(&self) -> Result<(usize, usize)> {
        if self.embed_dim == 0 {
            return Err(ModelError::config("embed_dim", 0, "must be at least 1"));
        }
        if self.num_heads == 0 || !self.embed_dim.is_multiple_of(self.num_heads) {
            return Err(ModelError::config(
                "num_heads",
                self.num_heads,
                format!("must divide embed_dim = {} (torch requires it)", self.embed_dim),
            ));
        }
        for (field, value) in [("kdim", self.kdim), ("vdim", self.vdim)] {
            if value == Some(0) {
                return Err(ModelError::config(field, 0, "must be at least 1"));
            }
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ModelError::config("dropout", self.dropout, "must be in [0, 1)"));
        }
        Ok((self.kdim.unwrap_or(self.embed_dim), self.vdim.unwrap_or(self.embed_dim)))
    }

    /// A module with torch's default initialisation: Xavier-uniform input projections (over the
    /// packed `(3E, E)` matrix when kdim = vdim = E), `out_proj` weight U(+-1/sqrt(E)), zero biases.
    pub fn init(&self, device: &Device) -> Result<TorchMha> {
        let (kdim, vdim) = self.validate()?;
        let e = self.embed_dim;
        let packed = kdim == e && vdim == e;
        let xavier = |d_in: usize, fan_out: usize| {
            let limit = (6.0 / (d_in + fan_out) as f64).sqrt();
            Initializer::Uniform { min: -limit, max: limit }.init::<2, _>([d_in, e], device).val()
        };
        let zeros = || self.bias.then(|| Tensor::<1>::zeros([e], device));
        let in_fan_out = if packed { 3 * e } else { e };
        let out_limit = 1.0 / (e as f64).sqrt();
        let out_weight = Initializer::Uniform { min: -out_limit, max: out_limit }.init::<2, _>([e, e], device).val();
        // torch: xavier_normal_ on [1, 1, E] (fan_in = fan_out = E).
        let bias_row = || {
            self.add_bias_kv.then(|| {
                Initializer::Normal { mean: 0.0, std: (1.0 / e as f64).sqrt() }.init::<3, _>([1, 1, e], device)
            })
        };
        Ok(TorchMha {
            query: linear(xavier(e, in_fan_out), zeros()),
            key: linear(xavier(kdim, in_fan_out), zeros()),
            value: linear(xavier(vdim, in_fan_out), zeros()),
            output: linear(out_weight, zeros()),
            bias_k: bias_row(),
            bias_v: bias_row(),
            num_heads: self.num_heads,
            dropout: self.dropout,
            batch_first: self.batch_first,
            add_zero_attn: self.add_zero_attn,
        })
    }

    /// A module holding the weights of a torch state_dict (names without the module's prefix):
    /// `in_proj_weight (3E, E)` when kdim = vdim = E, otherwise `q_proj_weight (E, E)`,
    /// `k_proj_weight (E, kdim)`, `v_proj_weight (E, vdim)`; `in_proj_bias (3E)`,
    /// `out_proj.weight (E, E)`, `out_proj.bias (E)`.
    pub fn init_with_state_dict(&self, weights: &WeightMap, device: &Device) -> Result<TorchMha> {
        let (kdim, vdim) = self.validate()?;
        let e = self.embed_dim;
        let mut known = vec!["out_proj.weight"];
        // torch weights are [out, in]; Burn's Linear holds [in, out].
        let (wq, wk, wv) = if kdim == e && vdim == e {
            known.push("in_proj_weight");
            let packed = weights.expect("in_proj_weight", &[3 * e, e])?;
            let block = |i: usize| HostTensor::new(vec![e, e], packed.data[i * e * e..(i + 1) * e * e].to_vec());
            (block(0), block(1), block(2))
        } else {
            known.extend(["q_proj_weight", "k_proj_weight", "v_proj_weight"]);
            (
                weights.expect("q_proj_weight", &[e, e])?.clone(),
                weights.expect("k_proj_weight", &[e, kdim])?.clone(),
                weights.expect("v_proj_weight", &[e, vdim])?.clone(),
            )
        };
        let (bq, bk, bv, bo) = if self.bias {
            known.extend(["in_proj_bias", "out_proj.bias"]);
            let packed = weights.expect("in_proj_bias", &[3 * e])?;
            let block = |i: usize| Some(HostTensor::new(vec![e], packed.data[i * e..(i + 1) * e].to_vec()));
            (block(0), block(1), block(2), Some(weights.expect("out_proj.bias", &[e])?.clone()))
        } else {
            (None, None, None, None)
        };
        let wo = weights.expect("out_proj.weight", &[e, e])?;
        let (bias_k, bias_v) = match self.add_bias_kv {
            true => {
                known.extend(["bias_k", "bias_v"]);
                let row = |name: &str| -> Result<Param<Tensor<3>>> {
                    Ok(Param::from_tensor(weights.expect(name, &[1, 1, e])?.to_tensor(name, device)?))
                };
                (Some(row("bias_k")?), Some(row("bias_v")?))
            }
            false => (None, None),
        };
        weights.reject_unknown(&known)?;
        let to_linear = |name: &str, w: &HostTensor, b: Option<HostTensor>| -> Result<Linear> {
            let bias = b.map(|b| b.to_tensor(name, device)).transpose()?;
            Ok(linear(w.transposed().to_tensor(name, device)?, bias))
        };
        Ok(TorchMha {
            query: to_linear("q_proj_weight", &wq, bq)?,
            key: to_linear("k_proj_weight", &wk, bk)?,
            value: to_linear("v_proj_weight", &wv, bv)?,
            output: to_linear("out_proj.weight", wo, bo)?,
            bias_k,
            bias_v,
            num_heads: self.num_heads,
            dropout: self.dropout,
            batch_first: self.batch_first,
            add_zero_attn: self.add_zero_attn,
        })
    }
}

/// PyTorch-style multi-head attention. Build it with [`TorchMhaConfig::init`] or
/// [`TorchMhaConfig::init_with_state_dict`].
#[derive(Module, Debug)]
pub struct TorchMha {
    /// Query projection, weight `[E, E]` (torch's `q_proj_weight` transposed).
    pub query: Linear,
    /// Key projection, weight `[kdim, E]`.
    pub key: Linear,
    /// Value projection, weight `[vdim, E]`.
    pub value: Linear,
    /// Output projection `out_proj`, weight `[E, E]` (transposed).
    pub output: Linear,
    /// `add_bias_kv`'s learned key and value rows, `[1, 1, E]` each.
    pub bias_k: Option<Param<Tensor<3>>>,
    pub bias_v: Option<Param<Tensor<3>>>,
    pub num_heads: usize,
    pub dropout: f64,
    pub batch_first: bool,
    /// See [`TorchMhaConfig::add_zero_attn`].
    pub add_zero_attn: bool,
}

/// An `attn_mask`, as torch takes it.
#[derive(Debug, Clone)]
pub enum AttnMask {
    /// `[1 | B*h, T, S]`, true = the pair is NOT allowed. A 2-D `[T, S]` mask is `[1, T, S]`.
    Bool(Tensor<3, Bool>),
    /// `[1 | B*h, T, S]`, added to the logits (`-inf` entries block the pair).
    Additive(Tensor<3>),
}

impl AttnMask {
    /// A `[T, S]` boolean mask shared by every batch element and head.
    pub fn bool_2d(mask: Tensor<2, Bool>) -> Self {
        Self::Bool(mask.unsqueeze())
    }
}

/// The masks of an `add_bias_kv` or `add_zero_attn` call: an allowed column for the appended key,
/// as torch pads them (`key_padding_mask [B, S+1]`, `attn_mask [*, T, S+1]`).
fn zero_attn_columns(
    key_padding_mask: Option<Tensor<2, Bool>>,
    attn_mask: Option<AttnMask>,
) -> (Option<Tensor<2, Bool>>, Option<AttnMask>) {
    let key_padding_mask = key_padding_mask.map(|mask| {
        let [batch, _] = mask.dims();
        let column = Tensor::<2>::zeros([batch, 1], &mask.device()).greater_elem(0.0); // [B, 1], false
        Tensor::cat(vec![mask, column], 1) // [B, S+1]
    });
    let attn_mask = attn_mask.map(|mask| match mask {
        AttnMask::Bool(mask) => {
            let [n, t, _] = mask.dims();
            let column = Tensor::<3>::zeros([n, t, 1], &mask.device()).greater_elem(0.0); // [n, T, 1], false
            AttnMask::Bool(Tensor::cat(vec![mask, column], 2)) // [n, T, S+1]
        }
        AttnMask::Additive(mask) => {
            let [n, t, _] = mask.dims();
            let column = Tensor::<3>::zeros([n, t, 1], &mask.device()); // [n, T, 1]
            AttnMask::Additive(Tensor::cat(vec![mask, column], 2)) // [n, T, S+1]
        }
    });
    (key_padding_mask, attn_mask)
}

/// SDPA's `is_causal` rule as a `[1, T, S]` mask, true = blocked: top-left aligned, so query
/// row `t` sees key column `s` iff `s <= t`, whatever `T` and `S` are.
fn causal_mask(query_len: usize, source_len: usize, device: &Device) -> AttnMask {
    let blocked: Vec<bool> = (0..query_len).flat_map(|t| (0..source_len).map(move |s| s > t)).collect();
    let mask = Tensor::<2, Bool>::from_data(burn::tensor::TensorData::new(blocked, [query_len, source_len]), device); // [T, S]
    AttnMask::bool_2d(mask) // [1, T, S]
}

/// The arguments of one call, named as torch names them.
#[derive(Debug, Clone)]
pub struct TorchMhaInput {
    /// `[B, T, E]` (`[T, B, E]` when not batch first)
    pub query: Tensor<3>,
    /// `[B, S, kdim]`
    pub key: Tensor<3>,
    /// `[B, S, vdim]`
    pub value: Tensor<3>,
    /// `[B, S]`, true = ignore that key.
    pub key_padding_mask: Option<Tensor<2, Bool>>,
    pub attn_mask: Option<AttnMask>,
    /// Return the attention weights (torch's default: true).
    pub need_weights: bool,
    /// Average the returned weights over heads (torch's default: true).
    pub average_attn_weights: bool,
    /// Applies dropout to the attention weights.
    pub training: bool,
    /// torch's `is_causal` hint that `attn_mask` is the causal mask. As torch applies it: it needs
    /// an `attn_mask`; without a `key_padding_mask` and with `need_weights=False` the mask is
    /// replaced by SDPA's causal rule (top-left, `s > t` blocked) over the keys as SDPA gets them,
    /// after `add_bias_kv` and `add_zero_attn` appended theirs; otherwise the mask is used as given.
    pub is_causal: bool,
    /// Query, key and value are one tensor ([`TorchMhaInput::self_attention`]): on the fused
    /// kernel one product then makes all three projections ([`Operands::Packed`]).
    pub self_attention: bool,
}

impl TorchMhaInput {
    pub fn new(query: Tensor<3>, key: Tensor<3>, value: Tensor<3>) -> Self {
        Self {
            query,
            key,
            value,
            key_padding_mask: None,
            attn_mask: None,
            need_weights: true,
            average_attn_weights: true,
            training: false,
            is_causal: false,
            self_attention: false,
        }
    }

    pub fn is_causal(mut self, is_causal: bool) -> Self {
        self.is_causal = is_causal;
        self
    }

    /// Applies the `is_causal` hint as torch's `multi_head_attention_forward` does. Where torch
    /// hands the hint to SDPA (no `key_padding_mask`, `need_weights=False`) it drops `attn_mask`
    /// and keeps `is_causal` set: the causal rule is built in the forward pass over the keys as
    /// they are after `add_bias_kv` / `add_zero_attn` ([`causal_mask`]), as SDPA sees them.
    /// Elsewhere the hint is cleared and `attn_mask` is used (and padded) as given.
    fn with_causal_hint(mut self) -> Result<Self> {
        if !self.is_causal {
            return Ok(self);
        }
        if self.attn_mask.is_none() {
            return Err(ModelError::config(
                "is_causal",
                true,
                "needs attn_mask (torch: \"Need attn_mask if specifying the is_causal hint\")",
            ));
        }
        match self.key_padding_mask.is_none() && !self.need_weights {
            true => self.attn_mask = None,
            false => self.is_causal = false,
        }
        Ok(self)
    }

    /// Self-attention: query, key and value are `x`.
    pub fn self_attention(x: Tensor<3>) -> Self {
        Self { self_attention: true, ..Self::new(x.clone(), x.clone(), x) }
    }

    pub fn key_padding_mask(mut self, mask: Tensor<2, Bool>) -> Self {
        self.key_padding_mask = Some(mask);
        self
    }

    pub fn attn_mask(mut self, mask: AttnMask) -> Self {
        self.attn_mask = Some(mask);
        self
    }

    pub fn need_weights(mut self, need: bool) -> Self {
        self.need_weights = need;
        self
    }

    pub fn average_attn_weights(mut self, average: bool) -> Self {
        self.average_attn_weights = average;
        self
    }

    pub fn training(mut self, training: bool) -> Self {
        self.training = training;
        self
    }
}

/// Attention weights as torch returns them.
#[derive(Debug, Clone)]
pub enum AttnWeights {
    /// `[B, T, S]`, the mean over heads.
    Averaged(Tensor<3>),
    /// `[B, h, T, S]`
    PerHead(Tensor<4>),
}

impl AttnWeights {
    /// The weights a call returns from its probabilities `[B, h, T, S]`: their mean over heads
    /// when `average` (torch's `average_attn_weights`), else all of them.
    fn of(probs: Tensor<4>, average: bool) -> Self {
        match average {
            true => AttnWeights::Averaged(probs.mean_dim(1).squeeze_dim(1)), // [B, T, S]
            false => AttnWeights::PerHead(probs),
        }
    }
}

/// The result of a call.
#[derive(Debug, Clone)]
pub struct TorchMhaOutput {
    /// `[B, T, E]` (`[T, B, E]` when not batch first)
    pub output: Tensor<3>,
    pub attn_weights: Option<AttnWeights>,
}

/// Dense layers of the caller's on either side of the attention. `before` made the query, key
/// and value: all three are `before`'s output for its input (self-attention after a
/// projection). `after` reads the attention's output. Each such pair of layers runs as one
/// ([`kernels::linear_after`]), whose backward pass takes the cheaper order of products.
#[derive(Default)]
pub(crate) struct Neighbours<'a> {
    /// The layer and its input `[B, T, in]` (in the attention's batch order).
    pub before: Option<(&'a Linear, Tensor<3>)>,
    pub after: Option<&'a Linear>,
}

impl TorchMha {
    /// The call `mha(query, key, value, key_padding_mask, need_weights, attn_mask,
    /// average_attn_weights)`.
    ///
    /// Takes the fastest [`AttentionPath`] that computes the call: on the CPU backends the fused
    /// kernel (boolean and float masks, training and dropout included; the weights written by the
    /// kernel in inference, and from a softmax beside it in training or with active dropout,
    /// after dropout with the kernel's own keep-mask, as torch returns them);
    /// elsewhere inference without weights runs burn's fused op (which, like torch,
    /// gives fully blocked rows zero attention); everything else the decomposed path of
    /// [`TorchMha::forward_exact`].
    pub fn forward(&self, input: TorchMhaInput) -> Result<TorchMhaOutput> {
        self.forward_path(input.with_causal_hint()?, None, Neighbours::default()).map(|(output, _)| output)
    }

    /// The decomposed reference path, for any call.
    pub fn forward_exact(&self, input: TorchMhaInput) -> Result<TorchMhaOutput> {
        self.forward_path(input.with_causal_hint()?, Some(AttentionPath::Exact), Neighbours::default())
            .map(|(output, _)| output)
    }

    /// The call with the caller's dense layers on either side (see [`Neighbours`]): the output,
    /// and `after`'s output when there is an `after`.
    pub(crate) fn forward_between(
        &self,
        input: TorchMhaInput,
        neighbours: Neighbours,
    ) -> Result<(TorchMhaOutput, Option<Tensor<3>>)> {
        self.forward_path(input.with_causal_hint()?, None, neighbours)
    }

    /// The call on `path` (`None`: the fastest for it).
    fn forward_path(
        &self,
        input: TorchMhaInput,
        path: Option<AttentionPath>,
        neighbours: Neighbours,
    ) -> Result<(TorchMhaOutput, Option<Tensor<3>>)> {
        let time_first = |x: Tensor<3>| if self.batch_first { x } else { x.swap_dims(0, 1) };
        let (query, key, value) = (time_first(input.query), time_first(input.key), time_first(input.value)); // [B, L, *]
        let (batch, query_len, source_len) = self.check_shapes(&query, &key, &value)?;
        let h = self.num_heads;
        let e = self.embed_dim();

        let device = query.device();
        let before = neighbours.before.map(|(layer, x)| (layer, time_first(x))); // x [B, T, in]
        let project = |layer: Dense, input: Tensor<3>| match &before {
            Some((before, x)) => linear_after(*before, layer, x.clone(), input),
            None => linear_forward(layer, input),
        };
        let (mut key_padding_mask, mut attn_mask) = (input.key_padding_mask, input.attn_mask);
        // Self-attention on the fused kernel: the query, key and value from one product, read by
        // the kernel where it left them (no key or value rows appended).
        let packed =
            input.self_attention && self.bias_k.is_none() && !self.add_zero_attn && Operands::packs(path, &device);
        let (operands, source_len) = if packed {
            let qkv = project(Dense::joined(&[&self.query, &self.key, &self.value]), query); // [B, T, 3E]
            (Operands::Packed { qkv, heads: h, key_dim: e / h, value_dim: e / h }, source_len)
        } else {
            let q = split_heads(project((&self.query).into(), query), h); // [B, T, h, E/h]
            let (k, v) = (project((&self.key).into(), key), project((&self.value).into(), value)); // [B, S, E]
            let (k, v, source_len) = match (&self.bias_k, &self.bias_v) {
                (Some(bias_k), Some(bias_v)) => {
                    let row = |bias: &Param<Tensor<3>>| bias.val().expand([batch, 1, e]); // [B, 1, E]
                    (key_padding_mask, attn_mask) = zero_attn_columns(key_padding_mask, attn_mask);
                    (Tensor::cat(vec![k, row(bias_k)], 1), Tensor::cat(vec![v, row(bias_v)], 1), source_len + 1) // [B, S+1, E]
                }
                _ => (k, v, source_len),
            };
            let (k, v) = (split_heads(k, h), split_heads(v, h)); // [B, S, h, E/h]
            let (k, v, source_len) = match self.add_zero_attn {
                true => {
                    let zero = || Tensor::<4>::zeros([batch, 1, h, e / h], &device); // [B, 1, h, E/h]
                    (key_padding_mask, attn_mask) = zero_attn_columns(key_padding_mask, attn_mask);
                    (Tensor::cat(vec![k, zero()], 1), Tensor::cat(vec![v, zero()], 1), source_len + 1) // [B, S+1, h, E/h]
                }
                false => (k, v, source_len),
            };
            (Operands::Apart { q, k, v }, source_len)
        };
        if input.is_causal {
            // The hint replaced attn_mask: SDPA's rule over all S' keys, appended ones included.
            attn_mask = Some(causal_mask(query_len, source_len, &device));
        }
        let (mask, bias) = fold_masks(key_padding_mask, attn_mask, [batch, h, query_len, source_len])?;
        // torch draws its masks from its global generator; this one from the device's.
        let dropout = probs_dropout(if input.training { self.dropout } else { 0.0 }, None, &device);
        let call = AttentionCall {
            operands,
            // torch scales q by sqrt(1 / head_dim) before the product.
            scale: (1.0 / (e / h) as f64).sqrt() as f32,
            mask,
            causal: false, // an is_causal hint is a mask above, as torch builds it
            bias,
            rows: FullyMaskedRows::Zero,
            dropout,
            probs: if input.need_weights { Probs::AfterDropout } else { Probs::None },
        };
        let (context, probs) = call.run(path); // [B, T, h, E/h], [B, h, T, S]
        let attn_weights = probs.map(|probs| AttnWeights::of(probs, input.average_attn_weights));
        let context = merge_heads(context); // [B, T, E]
        let output = linear_forward(&self.output, context.clone()); // [B, T, E]
        let after =
            neighbours.after.map(|after| time_first(linear_after(&self.output, after, context, output.clone()))); // [B, T, out]
        Ok((TorchMhaOutput { output: time_first(output), attn_weights }, after))
    }

    fn check_shapes(&self, query: &Tensor<3>, key: &Tensor<3>, value: &Tensor<3>) -> Result<(usize, usize, usize)> {
        let [batch, query_len, _] = query.dims();
        let [_, source_len, _] = key.dims();
        check_dims("query", &query.dims(), &[batch, query_len, self.embed_dim()])?;
        check_dims("key", &key.dims(), &[batch, source_len, self.key.weight.dims()[0]])?;
        check_dims("value", &value.dims(), &[batch, source_len, self.value.weight.dims()[0]])?;
        Ok((batch, query_len, source_len))
    }

    /// Total width `E`.
    pub fn embed_dim(&self) -> usize {
        self.query.weight.dims()[1]
    }

    /// The config that rebuilds this module's shape.
    pub fn config(&self) -> TorchMhaConfig {
        TorchMhaConfig::new(self.embed_dim(), self.num_heads)
            .with_kdim(Some(self.key.weight.dims()[0]))
            .with_vdim(Some(self.value.weight.dims()[0]))
            .with_bias(self.query.bias.is_some())
            .with_dropout(self.dropout)
            .with_batch_first(self.batch_first)
            .with_add_zero_attn(self.add_zero_attn)
            .with_add_bias_kv(self.bias_k.is_some())
    }

    /// The weights under torch's state_dict names (see [`TorchMhaConfig::init_with_state_dict`]).
    pub fn state_dict(&self) -> WeightMap {
        let e = self.embed_dim();
        let [(wq, bq), (wk, bk), (wv, bv), (wo, bo)] = [&self.query, &self.key, &self.value, &self.output].map(|l| {
            let (w, b) = linear_weights(l);
            (w.transposed(), b) // torch's [out, in]
        });
        let mut map = WeightMap::new();
        if wk.shape == [e, e] && wv.shape == [e, e] {
            let packed = [wq.data, wk.data, wv.data].concat();
            map.insert("in_proj_weight", HostTensor::new(vec![3 * e, e], packed));
        } else {
            map.insert("q_proj_weight", wq);
            map.insert("k_proj_weight", wk);
            map.insert("v_proj_weight", wv);
        }
        if let (Some(bq), Some(bk), Some(bv)) = (bq, bk, bv) {
            map.insert("in_proj_bias", HostTensor::new(vec![3 * e], [bq.data, bk.data, bv.data].concat()));
        }
        map.insert("out_proj.weight", wo);
        if let Some(bo) = bo {
            map.insert("out_proj.bias", bo);
        }
        for (name, row) in [("bias_k", &self.bias_k), ("bias_v", &self.bias_v)] {
            if let Some(row) = row {
                map.insert(name, HostTensor::from_tensor(row.val()));
            }
        }
        map
    }
}

/// torch's masks folded into the shared call's form, in torch's polarity: the blocked pairs
/// (true = may not attend), `[B|1, h|1, T|1, S]`, `key_padding_mask` `[B, 1, 1, S]` OR
/// `attn_mask` `[1|B, 1|h, T, S]` (for a float mask: its `-inf` entries), `None` without masks;
/// and a float mask's finite entries as the bias on the logits `[1|B, 1|h, T, S]` (its `-inf`
/// entries 0). A `-inf` entry is thus a blocked pair, so that a fully blocked row gets zero
/// attention instead of NaN.
fn fold_masks(
    key_padding_mask: Option<Tensor<2, Bool>>, // [B, S], true = ignore
    attn_mask: Option<AttnMask>,
    shape: [usize; 4],
) -> Result<(Option<PairMask>, Option<Tensor<4>>)> {
    let [batch, heads, query_len, source_len] = shape;
    let from_padding = match key_padding_mask {
        Some(padding) => {
            check_dims("key_padding_mask", &padding.dims(), &[batch, source_len])?;
            Some(padding.reshape([batch, 1, 1, source_len])) // [B, 1, 1, S]
        }
        None => None,
    };
    // [1 | B*h, T, S] -> [1|B, 1|h, T, S]
    let per_slice =
        |n: usize| if n == 1 { [1, 1, query_len, source_len] } else { [batch, heads, query_len, source_len] };
    let (from_attn, bias) = match attn_mask {
        Some(AttnMask::Bool(mask)) => {
            check_attn_mask(&mask.dims(), shape)?;
            let [n, _, _] = mask.dims();
            (Some(mask.reshape(per_slice(n))), None) // [1|B, 1|h, T, S]
        }
        Some(AttnMask::Additive(mask)) => {
            check_attn_mask(&mask.dims(), shape)?;
            let [n, _, _] = mask.dims();
            let infinite = mask.clone().equal_elem(f32::NEG_INFINITY); // [1 | B*h, T, S]
            let bias = mask.mask_fill(infinite.clone(), 0.0).reshape(per_slice(n)); // [1|B, 1|h, T, S]
            (Some(infinite.reshape(per_slice(n))), Some(bias)) // [1|B, 1|h, T, S]
        }
        None => (None, None),
    };
    let blocked = match (from_padding, from_attn) {
        (Some(padding), Some(attn)) => {
            let [_, mask_heads, _, _] = attn.dims();
            let both = [batch, mask_heads, query_len, source_len];
            Some(padding.expand(both).bool_or(attn.expand(both))) // [B, h|1, T, S]
        }
        (padding, attn) => padding.or(attn),
    };
    Ok((blocked.map(|pairs| PairMask { pairs, marks: Marks::Blocked }), bias))
}

/// Checks a `[1 | B*h, T, S]` mask's shape.
fn check_attn_mask(found: &[usize], [batch, heads, query_len, source_len]: [usize; 4]) -> Result<()> {
    match *found {
        [n, t, s] if (t, s) == (query_len, source_len) && (n == 1 || n == batch * heads) => Ok(()),
        _ => Err(ModelError::InputShape {
            input: "attn_mask",
            expected: format!(
                "[{query_len}, {source_len}], [1, {query_len}, {source_len}] or [{}, {query_len}, {source_len}]",
                batch * heads
            ),
            found: found.to_vec(),
        }),
    }
}

fn check_dims(input: &'static str, found: &[usize], expected: &[usize]) -> Result<()> {
    if found == expected {
        Ok(())
    } else {
        Err(ModelError::InputShape { input, expected: format!("{expected:?}"), found: found.to_vec() })
    }
}
