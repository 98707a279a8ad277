//! Keras-exact multi-head attention: `keras.layers.MultiHeadAttention` (Keras 3.15) as a Burn module.
//!
//! For query `x_q [B, T, Dq]`, value `x_v [B, S, Dv]` and key `x_k [B, S, Dk]` (default: the value):
//!
//! ```text
//! Q = x_q Wq + bq      Wq: (Dq, h, k)   -> Q [B, T, h, k]
//! K = x_k Wk + bk      Wk: (Dk, h, k)   -> K [B, S, h, k]
//! V = x_v Wv + bv      Wv: (Dv, h, v)   -> V [B, S, h, v]
//! P = softmax(scale * Q K^T, mask)      -> P [B, h, T, S],  scale = float32(1 / sqrt(k))
//! y = concat_h(P V) Wo + bo             Wo: (h, v, O)   -> y [B, T, O]
//! ```
//!
//! With `use_gate`, `G = sigmoid(x_q Wg + bg)` (`Wg: (Dq, h, v)`, `G [B, T, h, v]`) multiplies
//! `P V` before the output projection.
//!
//! `O` is `output_shape`, by default the query width `Dq`: the layer maps `[B, 136, 4]` back to
//! `[B, 136, 4]` whatever `h * k` is, which is what torch's `nn.MultiheadAttention` cannot express.
//!
//! Masks use Keras' polarity: `true` = the query may attend the key. `use_causal_mask` allows
//! key `s` for query `t` iff `s <= t` (top-left aligned) and is ANDed with `attention_mask`.
//! The implicit masks (`Embedding(mask_zero=True)`, `Masking`) are ANDed in as Keras'
//! `_compute_attention_mask` does: the query's `[B, T]` as `[B, T, 1]`, `value_mask` and
//! `key_mask` `[B, S]` as `[B, 1, S]`; a masked query row then has no allowed key.
//!
//! A query row with no allowed key follows Keras exactly, and Keras has two behaviours:
//! the default call attends uniformly to all keys ([`FullyMaskedRows::Uniform`]); a call that
//! returns the scores, or any call of a layer with `dropout > 0`, goes through Keras' explicit
//! softmax whose masked probabilities are zeroed, so the row's output is `attention_output.bias`
//! ([`FullyMaskedRows::Zero`]). Neither produces NaN.
//!
//! burn-nn's `MultiHeadAttention` cannot serve here: its head size is `d_model / n_heads` (0 for
//! the seed's 4 features and 6 heads), its output width is `d_model`, and query, key and value
//! must share one width; Keras sizes heads (`key_dim`, `value_dim`) and output (`output_shape`)
//! independently of the inputs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use burn::config::Config;
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::activation::sigmoid;
use burn::tensor::{Bool, Device, Tensor, TensorData};
use kernels::{Dense, Marks, linear_forward};

use crate::attention::{
    AttentionCall, AttentionPath, FullyMaskedRows, Operands, PairMask, Probs, fresh_seed, merge_heads, probs_dropout,
    split_heads,
};
use crate::dense::{linear, linear_weights};
use crate::error::{ModelError, Result};
use crate::initializer::{KerasInitializer, keras_fans};
use crate::weights::WeightMap;

/// The attention axes of an input of rank `rank`, resolved as Keras resolves them: `None` =
/// every axis between the batch and the features; a negative axis counts from the projected
/// tensor's end (`axis + rank`). Each must be a position axis (not the batch, feature or heads
/// axis), named once.
pub fn resolve_attention_axes(axes: Option<&[i64]>, rank: usize) -> Result<Vec<usize>> {
    let Some(axes) = axes else { return Ok((1..rank - 1).collect()) };
    let mut resolved = Vec::with_capacity(axes.len());
    for &axis in axes {
        let at = if axis < 0 { axis + rank as i64 } else { axis };
        if !(1..rank as i64 - 1).contains(&at) {
            return Err(ModelError::config(
                "attention_axes",
                format!("{axes:?}"),
                format!(
                    "axis {axis} of a rank-{rank} input is not a position axis (1..={}, or -{}..=-2)",
                    rank - 2,
                    rank - 1
                ),
            ));
        }
        if resolved.contains(&(at as usize)) {
            return Err(ModelError::config("attention_axes", format!("{axes:?}"), format!("axis {at} is named twice")));
        }
        resolved.push(at as usize);
    }
    if resolved.is_empty() {
        return Err(ModelError::config("attention_axes", "[]", "must name at least one axis (None = Keras' default)"));
    }
    Ok(resolved)
}

/// The smallest input rank that `attention_axes` fit: 3 (`[B, T, D]`) for the default.
pub fn smallest_input_rank(axes: Option<&[i64]>) -> usize {
    axes.unwrap_or_default().iter().map(|&a| if a < 0 { 1 - a } else { a + 2 }).max().unwrap_or(3).max(3) as usize
}

/// The constructor arguments of `keras.layers.MultiHeadAttention`, plus the input widths that
/// Keras infers at build time.
#[derive(Config, Debug, PartialEq)]
pub struct KerasMhaConfig {
    /// Number of attention heads `h`.
    pub num_heads: usize,
    /// Size of each query and key head `k`.
    pub key_dim: usize,
    /// Width of the query input `Dq`.
    pub query_dim: usize,
    /// Size of each value head `v`; `None` = `key_dim`.
    pub value_dim: Option<usize>,
    /// Width of the value input `Dv`; `None` = `query_dim`.
    pub value_input_dim: Option<usize>,
    /// Width of the key input `Dk`; `None` = the value width.
    pub key_input_dim: Option<usize>,
    /// Width of the output `O`; `None` = `query_dim`.
    pub output_shape: Option<usize>,
    /// Dropout rate on the attention probabilities (training only).
    #[config(default = 0.0)]
    pub dropout: f64,
    /// Whether the four dense layers have biases.
    #[config(default = true)]
    pub use_bias: bool,
    /// Keras' `attention_axes`: the axes of the inputs attention runs over, jointly (negative
    /// axes count as Keras counts them). `None` = every axis between the batch and the features:
    /// the sequence axis of `[B, T, D]` inputs ([`KerasMha::forward`]); inputs of other ranks go
    /// through [`KerasMha::forward_nd`].
    pub attention_axes: Option<Vec<i64>>,
    /// Keras' `use_gate`: the attention output is multiplied by `sigmoid(x_q Wg + bg)`
    /// (`Wg: (Dq, h, v)`) before the output projection.
    #[config(default = false)]
    pub use_gate: bool,
    /// Keras' `sliding_window`: query `t` may attend key `s` only if `|t - s| < window` (a
    /// symmetric band, ANDed with every other mask).
    pub sliding_window: Option<usize>,
    /// Keras' `kernel_initializer` for the dense layers' kernels.
    #[config(default = "KerasInitializer::glorot_uniform()")]
    pub kernel_initializer: KerasInitializer,
    /// Keras' `bias_initializer`.
    #[config(default = "KerasInitializer::zeros()")]
    pub bias_initializer: KerasInitializer,
    /// Keras' `seed`, which seeds the dropout layer: the keep-masks of successive training calls
    /// are drawn from `(seed, call index)`, the same on every backend. `None`: the backend's
    /// generator.
    pub seed: Option<u64>,
    /// Keras' `flash_attention`: a request for the backend's flash kernel, which computes the
    /// same function. As in Keras it cannot be combined with dropout or returned scores.
    #[config(default = false)]
    pub flash_attention: bool,
}

/// The sizes of a validated [`KerasMhaConfig`], every default resolved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KerasMhaDims {
    pub num_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub query_dim: usize,
    pub key_input_dim: usize,
    pub value_input_dim: usize,
    pub output_dim: usize,
}

impl KerasMhaConfig {
    /// Checks every field and resolves the defaults.
    pub fn dims(&self) -> Result<KerasMhaDims> {
        for (field, value) in [("num_heads", self.num_heads), ("key_dim", self.key_dim), ("query_dim", self.query_dim)]
        {
            if value == 0 {
                return Err(ModelError::config(field, value, "must be at least 1"));
            }
        }
        for (field, value) in [
            ("value_dim", self.value_dim),
            ("value_input_dim", self.value_input_dim),
            ("key_input_dim", self.key_input_dim),
            ("output_shape", self.output_shape),
        ] {
            if value == Some(0) {
                return Err(ModelError::config(field, 0, "must be at least 1"));
            }
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(ModelError::config("dropout", self.dropout, "must be in [0, 1)"));
        }
        if self.attention_axes.as_ref().is_some_and(Vec::is_empty) {
            return Err(ModelError::config(
                "attention_axes",
                "[]",
                "must name at least one axis (None = Keras' default)",
            ));
        }
        if self.flash_attention && self.dropout > 0.0 {
            return Err(ModelError::config(
                "flash_attention",
                true,
                format!(
                    "cannot be combined with dropout = {} (Keras' rule: its flash kernel has no dropout)",
                    self.dropout
                ),
            ));
        }
        if self.sliding_window == Some(0) {
            return Err(ModelError::config("sliding_window", 0, "must be a positive integer (Keras' rule)"));
        }
        let value_input_dim = self.value_input_dim.unwrap_or(self.query_dim);
        Ok(KerasMhaDims {
            num_heads: self.num_heads,
            key_dim: self.key_dim,
            value_dim: self.value_dim.unwrap_or(self.key_dim),
            query_dim: self.query_dim,
            key_input_dim: self.key_input_dim.unwrap_or(value_input_dim),
            value_input_dim,
            output_dim: self.output_shape.unwrap_or(self.query_dim),
        })
    }

    /// The config of the layer that holds `weights` (Keras names and shapes): every size is read
    /// off the kernels, `use_bias` off the presence of `query.bias`.
    pub fn from_weights(weights: &WeightMap) -> Result<Self> {
        let kernel = |name: &str| -> Result<[usize; 3]> {
            let shape = &weights.get(name)?.shape;
            <[usize; 3]>::try_from(shape.as_slice()).map_err(|_| ModelError::TensorRank {
                name: name.to_string(),
                expected: 3,
                found: shape.clone(),
            })
        };
        let [dq, h, k] = kernel("query.kernel")?;
        let [dk, _, _] = kernel("key.kernel")?;
        let [dv, _, v] = kernel("value.kernel")?;
        let [_, _, o] = kernel("attention_output.kernel")?;
        Ok(Self::new(h, k, dq)
            .with_value_dim(Some(v))
            .with_key_input_dim(Some(dk))
            .with_value_input_dim(Some(dv))
            .with_output_shape(Some(o))
            .with_use_bias(weights.contains("query.bias"))
            .with_use_gate(weights.contains(KERAS_GATE.kernel)))
    }

    /// A layer initialised by `kernel_initializer` and `bias_initializer` (Keras' defaults:
    /// Glorot-uniform kernels, zero biases), drawn on the host (see [`crate::initializer`]). An
    /// initializer without a seed takes its seeds from `device`'s generator, so seeding the
    /// device makes the weights reproducible.
    pub fn init(&self, device: &Device) -> Result<KerasMha> {
        let d = self.dims()?;
        let dense_layer = |dense: &KerasDense, kernel_shape: [usize; 3]| {
            // Keras 3.15 gives an EinsumDense kernel the fans of its input and output axes.
            let (rows, cols) = dense.matrix_shape(kernel_shape);
            let kernel = self.kernel_initializer.sample(&kernel_shape, (rows, cols), fresh_seed(device));
            let bias = self.use_bias.then(|| {
                let shape = dense.bias_shape(kernel_shape);
                Tensor::from_data(
                    TensorData::new(
                        self.bias_initializer.sample(&shape, keras_fans(&shape), fresh_seed(device)),
                        [cols],
                    ),
                    device,
                )
            });
            linear(Tensor::from_data(TensorData::new(kernel, [rows, cols]), device), bias)
        };
        let layers =
            KERAS_DENSE.iter().zip(d.kernel_shapes()).map(|(dense, kernel_shape)| dense_layer(dense, kernel_shape));
        let gate = self.use_gate.then(|| dense_layer(&KERAS_GATE, d.gate_shape()));
        Ok(KerasMha::from_layers(layers.collect(), gate, d, self))
    }

    /// A layer holding the given weights, in Keras' names and shapes (see [`KerasMha::keras_weights`]).
    /// Missing, misshapen or unknown tensors are errors naming the tensor.
    pub fn init_with_weights(&self, weights: &WeightMap, device: &Device) -> Result<KerasMha> {
        let d = self.dims()?;
        let dense_layer = |dense: &KerasDense, kernel_shape: [usize; 3]| -> Result<Linear> {
            let (rows, cols) = dense.matrix_shape(kernel_shape);
            let kernel = weights.expect(dense.kernel, &kernel_shape)?.reshaped(vec![rows, cols]);
            let bias = match self.use_bias {
                true => {
                    let bias = weights.expect(dense.bias, &dense.bias_shape(kernel_shape))?;
                    Some(bias.reshaped(vec![cols]).to_tensor(dense.bias, device)?)
                }
                false => None,
            };
            Ok(linear(kernel.to_tensor(dense.kernel, device)?, bias))
        };
        let layers = KERAS_DENSE
            .iter()
            .zip(d.kernel_shapes())
            .map(|(dense, shape)| dense_layer(dense, shape))
            .collect::<Result<Vec<_>>>()?;
        let gate = self.use_gate.then(|| dense_layer(&KERAS_GATE, d.gate_shape())).transpose()?;
        let gate_names = [KERAS_GATE.kernel, KERAS_GATE.bias];
        let known: Vec<&str> = KERAS_DENSE
            .iter()
            .flat_map(|d| [d.kernel, d.bias])
            .chain(gate_names.into_iter().filter(|_| self.use_gate))
            .collect();
        weights.reject_unknown(&known)?;
        Ok(KerasMha::from_layers(layers, gate, d, self))
    }
}

impl KerasMhaDims {
    /// The kernel shape of the gate (`use_gate`): `(Dq, h, v)`.
    pub fn gate_shape(&self) -> [usize; 3] {
        [self.query_dim, self.num_heads, self.value_dim]
    }

    /// The Keras kernel shapes of `query`, `key`, `value` and `attention_output`.
    pub fn kernel_shapes(&self) -> [[usize; 3]; 4] {
        let (h, k, v) = (self.num_heads, self.key_dim, self.value_dim);
        [[self.query_dim, h, k], [self.key_input_dim, h, k], [self.value_input_dim, h, v], [h, v, self.output_dim]]
    }
}

/// One of Keras' four `EinsumDense` sublayers and how its 3-D kernel maps onto a Linear.
struct KerasDense {
    kernel: &'static str,
    bias: &'static str,
    /// How many leading kernel axes are input axes: 1 for `(D, h, k)`, 2 for `(h, v, O)`.
    input_axes: usize,
}

impl KerasDense {
    /// The `[d_in, d_out]` matrix a kernel flattens to (row-major, so no data moves).
    fn matrix_shape(&self, kernel: [usize; 3]) -> (usize, usize) {
        let rows = kernel[..self.input_axes].iter().product();
        (rows, kernel.iter().product::<usize>() / rows)
    }

    /// Keras' bias shape: the kernel's output axes.
    fn bias_shape(&self, kernel: [usize; 3]) -> Vec<usize> {
        kernel[self.input_axes..].to_vec()
    }
}

/// The gate of `use_gate`, an `EinsumDense` of the query like `query`, with `v` per head.
const KERAS_GATE: KerasDense = KerasDense { kernel: "gate.kernel", bias: "gate.bias", input_axes: 1 };

const KERAS_DENSE: [KerasDense; 4] = [
    KerasDense { kernel: "query.kernel", bias: "query.bias", input_axes: 1 },
    KerasDense { kernel: "key.kernel", bias: "key.bias", input_axes: 1 },
    KerasDense { kernel: "value.kernel", bias: "value.bias", input_axes: 1 },
    KerasDense { kernel: "attention_output.kernel", bias: "attention_output.bias", input_axes: 2 },
];

/// Keras-exact multi-head attention. Build it with [`KerasMhaConfig::init`] or
/// [`KerasMhaConfig::init_with_weights`].
#[derive(Module, Debug)]
pub struct KerasMha {
    /// Query projection, weight `[Dq, h*k]` (Keras' `(Dq, h, k)` kernel, row-major).
    pub query: Linear,
    /// Key projection, weight `[Dk, h*k]`.
    pub key: Linear,
    /// Value projection, weight `[Dv, h*v]`.
    pub value: Linear,
    /// Output projection, weight `[h*v, O]` (Keras' `(h, v, O)` kernel, row-major).
    pub output: Linear,
    /// `use_gate`'s gate, weight `[Dq, h*v]`: the attention output is multiplied by
    /// `sigmoid(x_q Wg + bg)` before `output`.
    pub gate: Option<Linear>,
    pub num_heads: usize,
    pub key_dim: usize,
    pub value_dim: usize,
    pub dropout: f64,
    /// Keras' `sliding_window` (see [`KerasMhaConfig::sliding_window`]).
    pub sliding_window: Option<usize>,
    /// Keras' `attention_axes` (see [`KerasMhaConfig::attention_axes`]).
    #[module(skip)]
    pub attention_axes: Option<Vec<i64>>,
    /// Keras' `seed` for the dropout layer (see [`KerasMhaConfig::seed`]).
    pub seed: Option<u64>,
    /// Training calls with dropout so far: the index of the next keep-mask of a seeded layer.
    #[module(skip)]
    pub dropout_calls: Arc<AtomicU64>,
    /// Keras' `flash_attention` (see [`KerasMhaConfig::flash_attention`]).
    pub flash_attention: bool,
}

/// The arguments of one call, named as Keras names them.
#[derive(Debug, Clone)]
pub struct KerasMhaInput {
    /// `[B, T, Dq]`
    pub query: Tensor<3>,
    /// `[B, S, Dv]`
    pub value: Tensor<3>,
    /// `[B, S, Dk]`; `None` = `value`.
    pub key: Option<Tensor<3>>,
    /// `[B, T, S]`, true = query `t` may attend key `s`.
    pub attention_mask: Option<Tensor<3, Bool>>,
    /// `[B, T]`: the Keras mask the query tensor carries (`Embedding(mask_zero=True)`,
    /// `Masking`). Keras 3.15 reads it off the tensor and ignores an explicit `query_mask=`.
    pub query_mask: Option<Tensor<2, Bool>>,
    /// `[B, S]`: Keras' `value_mask`.
    pub value_mask: Option<Tensor<2, Bool>>,
    /// `[B, S]`: Keras' `key_mask` (applied even when the key is the value, as Keras does).
    pub key_mask: Option<Tensor<2, Bool>>,
    pub use_causal_mask: bool,
    /// Applies dropout to the attention probabilities.
    pub training: bool,
    /// Also return the per-head probabilities (Keras' `return_attention_scores=True`).
    pub return_attention_scores: bool,
    /// Query, value and key are one tensor ([`KerasMhaInput::self_attention`]): on the fused
    /// kernel one product then makes all three projections ([`Operands::Packed`]).
    pub self_attention: bool,
}

impl KerasMhaInput {
    /// `layer(query, value)`: self-attention when `value` is `query`.
    pub fn new(query: Tensor<3>, value: Tensor<3>) -> Self {
        Self {
            query,
            value,
            key: None,
            attention_mask: None,
            query_mask: None,
            value_mask: None,
            key_mask: None,
            use_causal_mask: false,
            training: false,
            return_attention_scores: false,
            self_attention: false,
        }
    }

    /// `layer(x, x)`: self-attention, known to be so (see [`KerasMhaInput::self_attention`]'s
    /// field).
    pub fn self_attention(x: Tensor<3>) -> Self {
        Self { self_attention: true, ..Self::new(x.clone(), x) }
    }

    pub fn key(mut self, key: Tensor<3>) -> Self {
        self.key = Some(key);
        self
    }

    pub fn attention_mask(mut self, mask: Tensor<3, Bool>) -> Self {
        self.attention_mask = Some(mask);
        self
    }

    pub fn query_mask(mut self, mask: Tensor<2, Bool>) -> Self {
        self.query_mask = Some(mask);
        self
    }

    pub fn value_mask(mut self, mask: Tensor<2, Bool>) -> Self {
        self.value_mask = Some(mask);
        self
    }

    pub fn key_mask(mut self, mask: Tensor<2, Bool>) -> Self {
        self.key_mask = Some(mask);
        self
    }

    /// The implicit masks folded into `attention_mask [B, T, S]`, as Keras'
    /// `_compute_attention_mask` combines them (a logical AND of every mask given).
    fn with_implicit_masks(mut self) -> Result<Self> {
        let [batch, query_len, _] = self.query.dims();
        let source_len = self.value.dims()[1];
        let shape = [batch, query_len, source_len];
        // Checked here, before any mask is combined with it.
        if let Some(mask) = &self.attention_mask
            && mask.dims() != shape
        {
            return Err(ModelError::InputShape {
                input: "attention_mask",
                expected: format!("{shape:?}"),
                found: mask.dims().to_vec(),
            });
        }
        if self.query_mask.is_none() && self.value_mask.is_none() && self.key_mask.is_none() {
            return Ok(self);
        }
        let check = |name: &'static str, mask: &Tensor<2, Bool>, expected: [usize; 2]| {
            if mask.dims() == expected {
                Ok(())
            } else {
                Err(ModelError::InputShape {
                    input: name,
                    expected: format!("{expected:?}"),
                    found: mask.dims().to_vec(),
                })
            }
        };
        let mut parts = Vec::new();
        if let Some(mask) = self.query_mask.take() {
            check("query_mask", &mask, [batch, query_len])?;
            parts.push(mask.unsqueeze_dim::<3>(2).expand(shape)); // [B, T, S]
        }
        for (name, mask) in [("value_mask", self.value_mask.take()), ("key_mask", self.key_mask.take())] {
            if let Some(mask) = mask {
                check(name, &mask, [batch, source_len])?;
                parts.push(mask.unsqueeze_dim::<3>(1).expand(shape)); // [B, T, S]
            }
        }
        parts.extend(self.attention_mask.take());
        self.attention_mask = parts.into_iter().reduce(|a, b| a.bool_and(b));
        Ok(self)
    }

    pub fn use_causal_mask(mut self, causal: bool) -> Self {
        self.use_causal_mask = causal;
        self
    }

    pub fn training(mut self, training: bool) -> Self {
        self.training = training;
        self
    }

    pub fn return_attention_scores(mut self, scores: bool) -> Self {
        self.return_attention_scores = scores;
        self
    }
}

/// The result of a call.
#[derive(Debug, Clone)]
pub struct KerasMhaOutput {
    /// `[B, T, O]`
    pub output: Tensor<3>,
    /// `[B, h, T, S]` attention probabilities before dropout, when requested.
    pub attention_scores: Option<Tensor<4>>,
}

impl KerasMha {
    /// Assembles the layer from its query, key, value and output Linears, in that order.
    fn from_layers(layers: Vec<Linear>, gate: Option<Linear>, dims: KerasMhaDims, config: &KerasMhaConfig) -> Self {
        let [query, key, value, output] = <[Linear; 4]>::try_from(layers).expect("exactly four dense layers");
        Self {
            query,
            key,
            value,
            output,
            gate,
            num_heads: dims.num_heads,
            key_dim: dims.key_dim,
            value_dim: dims.value_dim,
            dropout: config.dropout,
            sliding_window: config.sliding_window,
            attention_axes: config.attention_axes.clone(),
            seed: config.seed,
            dropout_calls: Arc::default(),
            flash_attention: config.flash_attention,
        }
    }

    /// The call's masks folded into one `attention_mask [B, T, S]`: the implicit masks and the
    /// sliding window, ANDed as Keras' `_compute_attention_mask` does (the causal rule stays a
    /// flag: every path computes it without a tensor).
    fn fold_masks(&self, input: KerasMhaInput) -> Result<KerasMhaInput> {
        let mut input = input.with_implicit_masks()?;
        if let Some(window) = self.sliding_window {
            let [batch, query_len, _] = input.query.dims();
            let source_len = input.value.dims()[1];
            let band: Vec<bool> =
                (0..query_len).flat_map(|t| (0..source_len).map(move |s| t.abs_diff(s) < window)).collect();
            let band = Tensor::<2, Bool>::from_data(
                burn::tensor::TensorData::new(band, [query_len, source_len]),
                &input.query.device(),
            );
            let band = band.unsqueeze_dim::<3>(0).expand([batch, query_len, source_len]); // [B, T, S]
            input.attention_mask = Some(match input.attention_mask.take() {
                Some(mask) => mask.bool_and(band),
                None => band,
            });
        }
        Ok(input)
    }

    /// The call `layer(query, value, key, attention_mask, use_causal_mask, training,
    /// return_attention_scores)`.
    ///
    /// Takes the fastest [`AttentionPath`] that computes the call ([`AttentionCall::fastest_path`]):
    /// on the CPU backends every call runs the fused kernel, masks, dropout and returned scores
    /// included (the scores written by the kernel in inference, from a softmax beside it in
    /// training); elsewhere inference without an attention mask, scores or dropout runs burn's
    /// fused op (with no attention mask no row is fully masked, so its zeroed rows never show);
    /// everything else the decomposed path of [`KerasMha::forward_exact`].
    pub fn forward(&self, input: KerasMhaInput) -> Result<KerasMhaOutput> {
        self.check_sequence_axis()?;
        self.check_flash(input.return_attention_scores)?;
        let rows = self.fully_masked_rows(input.return_attention_scores);
        self.forward_folded(self.fold_masks(input)?, rows, None)
    }

    /// The decomposed reference path (explicit logits, masked softmax, two products), for any call.
    pub fn forward_exact(&self, input: KerasMhaInput) -> Result<KerasMhaOutput> {
        self.check_sequence_axis()?;
        let rows = self.fully_masked_rows(input.return_attention_scores);
        self.forward_folded(self.fold_masks(input)?, rows, Some(AttentionPath::Exact))
    }

    /// Keras refuses to return scores from a layer built with `flash_attention`.
    pub(crate) fn check_flash(&self, return_attention_scores: bool) -> Result<()> {
        match self.flash_attention && return_attention_scores {
            true => Err(ModelError::config(
                "flash_attention",
                true,
                "returning attention scores is not supported with flash attention (Keras' rule); build the layer without it",
            )),
            false => Ok(()),
        }
    }

    /// [`KerasMha::forward`] takes `[B, T, D]` inputs, so the layer must attend over axis 1.
    fn check_sequence_axis(&self) -> Result<()> {
        match resolve_attention_axes(self.attention_axes.as_deref(), 3) {
            Ok(axes) if axes == [1] => Ok(()),
            _ => Err(ModelError::config(
                "attention_axes",
                format!("{:?}", self.attention_axes.as_deref().unwrap_or_default()),
                "forward takes [B, T, D] inputs and attends over axis 1; call forward_nd with inputs of the layer's rank",
            )),
        }
    }

    /// The call on `path` (`None`: the fastest for it); `input`'s masks must be folded
    /// ([`KerasMha::fold_masks`]); `rows` is what a query row with no allowed key attends to.
    pub(crate) fn forward_folded(
        &self,
        input: KerasMhaInput,
        rows: FullyMaskedRows,
        path: Option<AttentionPath>,
    ) -> Result<KerasMhaOutput> {
        self.check_shapes(&input)?;
        let (h, k) = (self.num_heads, self.key_dim);
        let one_input = input.self_attention && input.key.is_none();
        let key_input = input.key.unwrap_or_else(|| input.value.clone());
        let gate = self.gate.as_ref().map(|gate| sigmoid(split_heads(linear_forward(gate, input.query.clone()), h))); // [B, T, h, v]

        let device = input.query.device();
        // Self-attention on the fused kernel: the query, key and value from one product, read by
        // the kernel where it left them, where each of the three would be a product too small
        // for the GEMM to split over threads: one call then saves two calls' fixed costs (the
        // seed's forward pass 0.89-0.91 ms against 1.01-1.03 on a Zen 4). Above that the one
        // product gains nothing and the three weights are joined anew every call, 3-7 MB at the
        // wide shapes (8,512,256,8x32's training step 70.0-73.3 ms apart, 74.0-76.3 packed).
        let [batch, query_len, query_dim] = input.query.dims();
        let widest_part = h * k.max(self.value_dim);
        let packed = one_input
            && Operands::packs(path, &device)
            && kernels::gemm::runs_alone(batch * query_len, query_dim, widest_part);
        let operands = if packed {
            let joined = Dense::joined(&[&self.query, &self.key, &self.value]);
            let qkv = linear_forward(joined, input.query); // [B, T, h·(2k + v)]
            Operands::Packed { qkv, heads: h, key_dim: k, value_dim: self.value_dim }
        } else {
            let q = split_heads(linear_forward(&self.query, input.query), h); // [B, T, h, k]
            let kk = split_heads(linear_forward(&self.key, key_input), h); // [B, S, h, k]
            let v = split_heads(linear_forward(&self.value, input.value), h); // [B, S, h, v]
            Operands::Apart { q, k: kk, v }
        };
        // Keras rounds 1/sqrt(key_dim) to float32 before using it (0.5 for k = 4).
        let scale = (1.0 / (k as f64).sqrt()) as f32;
        // A seeded layer counts its dropout calls only, as Keras' seed generator advances only
        // when dropout draws.
        let rate = if input.training { self.dropout } else { 0.0 };
        let seed =
            self.seed.filter(|_| rate > 0.0).map(|seed| [seed, self.dropout_calls.fetch_add(1, Ordering::Relaxed)]);
        let dropout = probs_dropout(rate, seed, &device);
        let call = AttentionCall {
            operands,
            scale,
            mask: input.attention_mask.map(|mask| PairMask { pairs: mask.unsqueeze_dim(1), marks: Marks::Allowed }), // [B, 1, T, S]
            causal: input.use_causal_mask,
            bias: None,
            rows,
            dropout,
            probs: if input.return_attention_scores { Probs::BeforeDropout } else { Probs::None },
        };
        let (context, attention_scores) = call.run(path); // [B, T, h, v], [B, h, T, S]
        let context = match gate {
            Some(gate) => context * gate, // [B, T, h, v]
            None => context,
        };
        let output = linear_forward(&self.output, merge_heads(context)); // [B, T, O]
        Ok(KerasMhaOutput { output, attention_scores })
    }

    /// What a query row with no allowed key attends to: Keras' explicit-softmax path (zeroed rows)
    /// runs when the scores are returned or the layer has dropout, its fused path (uniform rows)
    /// otherwise.
    pub(crate) fn fully_masked_rows(&self, return_attention_scores: bool) -> FullyMaskedRows {
        if return_attention_scores || self.dropout > 0.0 { FullyMaskedRows::Zero } else { FullyMaskedRows::Uniform }
    }

    /// Checks every input against the layer's widths and each other.
    fn check_shapes(&self, input: &KerasMhaInput) -> Result<()> {
        let [batch, query_len, query_dim] = input.query.dims();
        let [_, source_len, _] = input.value.dims();
        let expect = |name: &'static str, found: [usize; 3], expected: [usize; 3]| {
            if found == expected {
                Ok(())
            } else {
                Err(ModelError::InputShape { input: name, expected: format!("{expected:?}"), found: found.to_vec() })
            }
        };
        expect("query", [batch, query_len, query_dim], [batch, query_len, self.query.weight.dims()[0]])?;
        expect("value", input.value.dims(), [batch, source_len, self.value.weight.dims()[0]])?;
        if let Some(key) = &input.key {
            expect("key", key.dims(), [batch, source_len, self.key.weight.dims()[0]])?;
        } else if self.key.weight.dims()[0] != self.value.weight.dims()[0] {
            return Err(ModelError::InputShape {
                input: "key",
                expected: format!(
                    "a key tensor of width {} (it differs from the value width)",
                    self.key.weight.dims()[0]
                ),
                found: vec![],
            });
        }
        if let Some(mask) = &input.attention_mask {
            expect("attention_mask", mask.dims(), [batch, query_len, source_len])?;
        }
        Ok(())
    }

    /// The weights in Keras' names and shapes: `query.kernel (Dq, h, k)`, `query.bias (h, k)`, ...,
    /// `attention_output.kernel (h, v, O)`, `attention_output.bias (O)`.
    pub fn keras_weights(&self) -> WeightMap {
        let shapes = self.dims().kernel_shapes();
        let mut map = WeightMap::new();
        for ((dense, layer), kernel_shape) in KERAS_DENSE.iter().zip(self.layers()).zip(shapes) {
            let (weight, bias) = linear_weights(layer);
            map.insert(dense.kernel, weight.reshaped(kernel_shape.to_vec()));
            if let Some(bias) = bias {
                map.insert(dense.bias, bias.reshaped(dense.bias_shape(kernel_shape)));
            }
        }
        if let Some(gate) = &self.gate {
            let (weight, bias) = linear_weights(gate);
            let shape = self.dims().gate_shape();
            map.insert(KERAS_GATE.kernel, weight.reshaped(shape.to_vec()));
            if let Some(bias) = bias {
                map.insert(KERAS_GATE.bias, bias.reshaped(KERAS_GATE.bias_shape(shape)));
            }
        }
        map
    }

    fn layers(&self) -> [&Linear; 4] {
        [&self.query, &self.key, &self.value, &self.output]
    }

    /// The resolved sizes of this layer.
    pub fn dims(&self) -> KerasMhaDims {
        KerasMhaDims {
            num_heads: self.num_heads,
            key_dim: self.key_dim,
            value_dim: self.value_dim,
            query_dim: self.query.weight.dims()[0],
            key_input_dim: self.key.weight.dims()[0],
            value_input_dim: self.value.weight.dims()[0],
            output_dim: self.output.weight.dims()[1],
        }
    }

    /// The config that rebuilds this layer's shape.
    pub fn config(&self) -> KerasMhaConfig {
        let d = self.dims();
        KerasMhaConfig::new(d.num_heads, d.key_dim, d.query_dim)
            .with_value_dim(Some(d.value_dim))
            .with_value_input_dim(Some(d.value_input_dim))
            .with_key_input_dim(Some(d.key_input_dim))
            .with_output_shape(Some(d.output_dim))
            .with_dropout(self.dropout)
            .with_use_bias(self.query.bias.is_some())
            .with_sliding_window(self.sliding_window)
            .with_use_gate(self.gate.is_some())
            .with_attention_axes(self.attention_axes.clone())
            .with_seed(self.seed)
            .with_flash_attention(self.flash_attention)
    }

    /// Number of trainable scalars (Keras' `count_params()`).
    pub fn num_params(&self) -> usize {
        Module::num_params(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn axes_resolve_as_keras_resolves_them() {
        assert_eq!(resolve_attention_axes(None, 3).unwrap(), [1]);
        assert_eq!(resolve_attention_axes(None, 5).unwrap(), [1, 2, 3]);
        assert_eq!(resolve_attention_axes(Some(&[-2]), 3).unwrap(), [1]);
        // Keras counts a negative axis from the projected tensor's end: -3 of a rank-4 input is 1.
        assert_eq!(resolve_attention_axes(Some(&[-3]), 4).unwrap(), [1]);
        assert_eq!(resolve_attention_axes(Some(&[3, 1]), 5).unwrap(), [3, 1]);
        for (axes, rank) in
            [(None, 3), (Some(&[1][..]), 3), (Some(&[-2]), 3), (Some(&[1, 2]), 4), (Some(&[-3]), 4), (Some(&[3, 1]), 5)]
        {
            assert_eq!(smallest_input_rank(axes), rank, "{axes:?}");
            assert!(resolve_attention_axes(axes, rank).is_ok(), "{axes:?} fit rank {rank}");
        }
        for bad in [&[0][..], &[2], &[-1], &[1, 1], &[]] {
            assert!(resolve_attention_axes(Some(bad), 3).is_err(), "{bad:?} on rank 3");
        }
    }
}
