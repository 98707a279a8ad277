//! Scaled dot-product attention over heads, shared by the Keras-exact and the torch-style modules.
//!
//! The two libraries agree on everything here except what a query row with no allowed key gets,
//! which is a parameter ([`FullyMaskedRows`]).

use burn::tensor::activation::softmax;
use burn::tensor::module::attention;
use burn::tensor::ops::AttentionModuleOptions;
use burn::tensor::{Bool, Device, Distribution, Tensor, TensorData};

use crate::fused;
use crate::rng::Rng;

/// The logit given to a blocked (query, key) pair.
///
/// This is Keras' `dot_product_attention` value, `-0.7 * float32::MAX`: finite, so a row whose
/// keys are all blocked gets equal logits and a uniform softmax instead of NaN, and far enough
/// below any real logit that `exp` of it underflows to exactly 0 in every other row.
pub const BLOCKED_LOGIT: f32 = -0.7 * f32::MAX;

/// What a query row with no allowed key attends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FullyMaskedRows {
    /// Uniform attention over all keys, blocked ones included: Keras 3's default call
    /// (`ops.dot_product_attention`).
    Uniform,
    /// No attention at all (probabilities 0, so the row's output is the output bias): Keras 3's
    /// `return_attention_scores=True` / dropout path, and torch's `need_weights=False` path.
    Zero,
}

/// Which implementation computes a call's `softmax(q kᵀ) v`. All three compute the same function;
/// the exact one is the reference the others are tested against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionPath {
    /// Explicit logits, masked softmax, two products ([`attend`]): every call can take it.
    Exact,
    /// burn's fused `attention` op ([`burn_fused_attention`]): inference only (it decomposes under
    /// autodiff), boolean masks with zeroed fully masked rows, no probabilities, no dropout.
    BurnFused,
    /// This crate's fused kernel with its own backward pass ([`fused::fused_attention`]): the CPU
    /// backends, inference and training, boolean and causal masks, no dropout. A training call
    /// that returns the probabilities takes it too: the context comes from the kernel, the
    /// probabilities from a masked softmax beside it, so the backward pass of the product with
    /// the values (and of the probabilities, when the loss does not read them) is the kernel's.
    Kernel,
}

/// What decides a call's [`AttentionPath`].
#[derive(Debug, Clone, Copy)]
pub struct CallTraits {
    /// The call records gradients.
    pub autodiff: bool,
    /// Dropout on the probabilities is active (training with a rate above 0).
    pub dropout: bool,
    /// The call returns the probabilities.
    pub probs: bool,
    /// Every mask of the call is boolean (the kernel's kind); false for torch's float masks.
    pub kernel_masks: bool,
    /// burn's fused op gives the call's masks their meaning.
    pub burn_masks_match: bool,
}

impl AttentionPath {
    /// The fastest path that computes a call on `device`.
    pub fn fastest(device: &Device, call: CallTraits) -> Self {
        match () {
            _ if call.dropout => Self::Exact,
            // In inference the decomposition computes the probabilities and the context in one
            // pass; the kernel would compute the context a second time.
            _ if call.probs && !call.autodiff => Self::Exact,
            _ if call.kernel_masks && fused::supports(device) => Self::Kernel,
            _ if !call.probs && !call.autodiff && call.burn_masks_match => Self::BurnFused,
            _ => Self::Exact,
        }
    }
}

/// Softmax over the last axis (keys) with blocked pairs removed.
///
/// `logits`: `[B, h, T, S]`; `blocked`: `[B, h, T, S]`, true = the query may NOT attend that key.
pub fn masked_softmax(logits: Tensor<4>, blocked: Option<Tensor<4, Bool>>, rows: FullyMaskedRows) -> Tensor<4> {
    let Some(blocked) = blocked else {
        return softmax(logits, 3); // [B, h, T, S]
    };
    let logits = logits.mask_fill(blocked.clone(), BLOCKED_LOGIT); // [B, h, T, S]
    let probs = softmax(logits, 3); // [B, h, T, S]
    match rows {
        FullyMaskedRows::Uniform => probs,
        // Outside fully masked rows the blocked probabilities are already exactly 0.
        FullyMaskedRows::Zero => probs.mask_fill(blocked, 0.0), // [B, h, T, S]
    }
}

/// Dropout on the attention probabilities of one call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbsDropout {
    /// The rate; 0 = no dropout.
    pub rate: f64,
    /// A seeded layer's `(seed, call index)`: the keep-mask is drawn on the host from it, so the
    /// same seed gives the same masks on every backend. `None`: the backend's generator.
    pub seed: Option<[u64; 2]>,
}

impl ProbsDropout {
    pub const NONE: Self = Self { rate: 0.0, seed: None };

    pub fn active(&self) -> bool {
        self.rate > 0.0
    }
}

/// Inverted dropout on attention probabilities: keeps each entry with probability `1 - rate` and
/// scales the kept ones by `1 / (1 - rate)`, as Keras' and torch's `Dropout` do.
pub fn dropout_probs(probs: Tensor<4>, dropout: ProbsDropout) -> Tensor<4> {
    if !dropout.active() {
        return probs;
    }
    let keep = match dropout.seed {
        None => Tensor::<4>::random(probs.shape(), Distribution::Bernoulli(1.0 - dropout.rate), &probs.device()), // [B, h, T, S]
        Some(seed) => {
            let mut rng = Rng::from_parts(&seed);
            let dims = probs.dims();
            let keep: Vec<f32> = (0..dims.iter().product::<usize>()).map(|_| f32::from(rng.uniform() >= dropout.rate)).collect();
            Tensor::from_data(TensorData::new(keep, dims), &probs.device()) // [B, h, T, S]
        }
    };
    probs * keep.div_scalar(1.0 - dropout.rate) // [B, h, T, S]
}

/// Splits the feature axis into heads: `[B, L, h * d] -> [B, L, h, d]` (no data moves).
pub fn split_heads(x: Tensor<3>, num_heads: usize) -> Tensor<4> {
    let [batch, len, width] = x.dims();
    x.reshape([batch, len, num_heads, width / num_heads]) // [B, L, h, d]
}

/// Concatenates the heads back: `[B, L, h, d] -> [B, L, h * d]` (head-major, Keras' and torch's flat order).
pub fn merge_heads(x: Tensor<4>) -> Tensor<3> {
    let [batch, len, heads, dim] = x.dims();
    x.reshape([batch, len, heads * dim]) // [B, L, h * d]
}

/// `[B, L, h, d] <-> [B, h, L, d]`: heads-last (the projections' layout) to head-major (one
/// matrix per head, what batched matrix products need) and back.
pub fn transpose_heads(x: Tensor<4>) -> Tensor<4> {
    x.swap_dims(1, 2)
}

/// `softmax(q k^T / sqrt(d)) v` through burn's fused attention op (one kernel on flex, flash
/// attention on wgpu where autotune picks it), for inference: it has no dropout, returns no probabilities, and gives a
/// fully blocked row zero attention ([`FullyMaskedRows::Zero`]). `q` is NOT pre-scaled; the op's
/// default scale `1/sqrt(d)` equals Keras' float32-rounded one to within one ulp.
///
/// The decomposed path ([`attend`]) stays the reference: tests check
/// that both agree within the fixtures' 1e-5 (they differ by float32 reduction order, ~2e-6).
pub fn burn_fused_attention(
    q: Tensor<4>,                      // [B, T, h, d]
    k: Tensor<4>,                      // [B, S, h, d]
    v: Tensor<4>,                      // [B, S, h, dv]
    blocked: Option<Tensor<4, Bool>>, // [B, h, T, S], true = may NOT attend
) -> Tensor<4> {
    let options = AttentionModuleOptions { scale: None, softcap: None, is_causal: false };
    let (q, k, v) = (transpose_heads(q), transpose_heads(k), transpose_heads(v)); // [B, h, L, *]
    transpose_heads(attention(q, k, v, blocked, None, options)) // [B, T, h, dv]
}

/// The scaled logits `(scale · q) kᵀ` per head, for the decomposed path: `q` `[B, T, h, d]` and
/// `k` `[B, S, h, d]` (heads last) -> `[B, h, T, S]`. Keras and torch both scale the query before
/// the product, so the rounding matches theirs.
pub fn scaled_logits(q: Tensor<4>, k: Tensor<4>, scale: f32) -> Tensor<4> {
    let q = transpose_heads(q).mul_scalar(scale); // [B, h, T, d]
    q.matmul(transpose_heads(k).swap_dims(2, 3)) // [B, h, T, S]
}

/// `P v` with `P = masked softmax(logits)`, for the decomposed (training) path.
///
/// When the probabilities themselves are not needed (no dropout, no returned scores) the
/// normalisation is deferred: `context = (E v) / rowsum(E)` with `E = exp(logits - max)`, which
/// divides the `[B, h, T, dv]` context instead of the `[B, h, T, S]` probabilities and so saves
/// one pass over the score tensor in the forward pass and one in the backward pass. The row
/// maximum is a constant for autodiff (the softmax does not depend on it).
///
/// Returns the context `[B, h, T, dv]` and, when `keep_probs`, the probabilities before dropout.
pub fn attend(
    logits: Tensor<4>,                 // [B, h, T, S], scaled
    v: Tensor<4>,                      // [B, h, S, dv]
    blocked: Option<Tensor<4, Bool>>, // [B, h, T, S]
    rows: FullyMaskedRows,
    dropout: ProbsDropout,
    keep_probs: bool,
) -> (Tensor<4>, Option<Tensor<4>>) {
    if keep_probs || dropout.active() {
        let probs = masked_softmax(logits, blocked, rows); // [B, h, T, S]
        let context = dropout_probs(probs.clone(), dropout).matmul(v); // [B, h, T, dv]
        return (context, keep_probs.then_some(probs));
    }
    let logits = match &blocked {
        Some(blocked) => logits.mask_fill(blocked.clone(), BLOCKED_LOGIT), // [B, h, T, S]
        None => logits,
    };
    let max = logits.clone().detach().max_dim(3); // [B, h, T, 1]
    let weights = (logits - max).exp(); // [B, h, T, S]
    let weights = match (rows, blocked) {
        // A fully blocked row has all weights 0 and a zero context; clamp its sum away from 0/0.
        (FullyMaskedRows::Zero, Some(blocked)) => weights.mask_fill(blocked, 0.0),
        _ => weights,
    };
    let total = weights.clone().sum_dim(3).clamp_min(f32::MIN_POSITIVE); // [B, h, T, 1]
    (weights.matmul(v) / total, None) // [B, h, T, dv]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_without_dropout_trains_on_the_kernel_on_the_cpu_backends() {
        let flex = Device::flex().autodiff();
        let call = |autodiff, dropout, probs, kernel_masks| CallTraits { autodiff, dropout, probs, kernel_masks, burn_masks_match: true };
        assert_eq!(AttentionPath::fastest(&flex, call(true, false, false, true)), AttentionPath::Kernel);
        assert_eq!(AttentionPath::fastest(&flex, call(true, false, true, true)), AttentionPath::Kernel, "scores in training");
        assert_eq!(AttentionPath::fastest(&flex, call(false, false, true, true)), AttentionPath::Exact, "scores in inference: one pass");
        assert_eq!(AttentionPath::fastest(&flex, call(true, true, false, true)), AttentionPath::Exact, "dropout");
        assert_eq!(AttentionPath::fastest(&flex, call(true, false, false, false)), AttentionPath::Exact, "float masks");
    }
}
