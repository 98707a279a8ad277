//! The dense layers' `x W + b` as a Burn backend operation with its own backward pass, on
//! [`crate::gemm`]: the `gemm` crate called directly, with the bias as the product's starting
//! value. flex's own matmul wraps the same crate at nearly the same rate (201 against 208 GFLOP/s
//! at 1024³ on a 2-thread Zen 4, `docs/benchmarks.md`); this op adds the bias as the product's
//! starting value instead of in a second pass, and runs on ndarray too.
//!
//! Two dense layers in a row, `y = (x P + p) W + b` with nothing between them (the projected
//! model's projection before the attention's query, key and value, and its output layer before
//! the final head), have a cheaper backward pass than two separate layers when the rows `M`
//! outnumber the widths: every product over the `M` rows starts from `G = xᵀ dy`,
//!
//! ```text
//! dW = Pᵀ G + p ⊗ Σ_rows dy      dP = G Wᵀ      dp = (Σ_rows dy) Wᵀ      dx = dy (P W)ᵀ
//! ```
//!
//! instead of `dW = zᵀ dy`, `dz = dy Wᵀ`, `dP = xᵀ dz`, `dx = dz Pᵀ`: the order of the products
//! in a chain, chosen at run time from the four widths ([`LinearPair::reassociates`]).

#![allow(deprecated)] // NdArray (also in the macro's expansion): deprecated in burn 0.22, still one of this project's backends.

use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, NdArray, TensorMetadata, backend_extension};
use burn::nn::Linear;
use burn::tensor::Tensor;

use super::attention::supports;
use super::host::{HostBackend, HostValues, OutputGrad};
use crate::gemm::{View, matmul, matmul_bias};

/// `x W` and `x W + b` for `x: [M, K]`, `W: [K, N]` and `b: [N]`: the GEMM on the backend's
/// host-memory tensors (flex, ndarray), the bias added as the products are stored;
/// `Autodiff<B, C>` adds the backward step. (Two operations: burn 0.22's extension macro does
/// not route an optional tensor.)
#[backend_extension(Flex, NdArray, Autodiff)]
pub trait FusedLinearBackend: Backend {
    fn fused_matmul(x: FloatTensor<Self>, weight: FloatTensor<Self>) -> FloatTensor<Self>;
    fn fused_linear(x: FloatTensor<Self>, weight: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self>;
    /// `z W + b` for `z = x P + p`, differentiated through `x`, `P`, `p`, `W` and `b` by the
    /// reassociated products (`z`'s own graph is not a parent).
    fn fused_linear_after(
        x: FloatTensor<Self>,
        z: FloatTensor<Self>,
        first_weight: FloatTensor<Self>,
        first_bias: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self>;
}

/// The operations on a host-memory backend's own tensors, with no backward pass to record.
macro_rules! host_linear_ops {
    ($($backend:ty),*) => {$(
        impl FusedLinearBackend for $backend {
            fn fused_matmul(x: FloatTensor<Self>, weight: FloatTensor<Self>) -> FloatTensor<Self> {
                host_linear::<Self>(x, weight, None).0
            }

            fn fused_linear(
                x: FloatTensor<Self>,
                weight: FloatTensor<Self>,
                bias: FloatTensor<Self>,
            ) -> FloatTensor<Self> {
                host_linear::<Self>(x, weight, Some(bias)).0
            }

            fn fused_linear_after(
                _x: FloatTensor<Self>,
                z: FloatTensor<Self>,
                _first_weight: FloatTensor<Self>,
                _first_bias: FloatTensor<Self>,
                weight: FloatTensor<Self>,
                bias: FloatTensor<Self>,
            ) -> FloatTensor<Self> {
                host_linear::<Self>(z, weight, Some(bias)).0
            }
        }
    )*};
}

host_linear_ops!(Flex, NdArray);

impl<B: HostBackend, C: CheckpointStrategy> FusedLinearBackend for Autodiff<B, C> {
    fn fused_matmul(x: FloatTensor<Self>, weight: FloatTensor<Self>) -> FloatTensor<Self> {
        let ((x, x_node), (weight, weight_node)) = (x.into_parts(), weight.into_parts());
        record::<B, C, 2>([x_node, weight_node], x, weight, None)
    }

    fn fused_linear(x: FloatTensor<Self>, weight: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        let ((x, x_node), (weight, weight_node), (bias, bias_node)) =
            (x.into_parts(), weight.into_parts(), bias.into_parts());
        record::<B, C, 3>([x_node, weight_node, bias_node], x, weight, Some(bias))
    }

    fn fused_linear_after(
        x: FloatTensor<Self>,
        z: FloatTensor<Self>,
        first_weight: FloatTensor<Self>,
        first_bias: FloatTensor<Self>,
        weight: FloatTensor<Self>,
        bias: FloatTensor<Self>,
    ) -> FloatTensor<Self> {
        let (z, _) = z.into_parts(); // z's gradient is never formed: the pair's backward skips it
        let ((x, x_node), (first_weight, first_weight_node), (first_bias, first_bias_node)) =
            (x.into_parts(), first_weight.into_parts(), first_bias.into_parts());
        let ((weight, weight_node), (bias, bias_node)) = (weight.into_parts(), bias.into_parts());
        let nodes = [x_node, first_weight_node, first_bias_node, weight_node, bias_node];
        match PairBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (output, second) = host_linear::<B>(z, weight, Some(bias));
                let x = B::host_values(x);
                let (first_weight, first_bias) = (B::host_values(first_weight), B::host_values(first_bias));
                let [m, d] = [x.shape[0], x.shape[1]];
                let pair = LinearPair { m, d, e: second.k, n: second.n };
                prep.finish(Arc::new(PairSaved { x, first_weight, first_bias, weight: second.weight, pair }), output)
            }
            OpsKind::UnTracked(prep) => prep.finish(host_linear::<B>(z, weight, Some(bias)).0),
        }
    }
}

/// The product on `B`'s tensors, tracked for the backward pass when a parent (`[x, W]` or
/// `[x, W, b]`) requires gradients.
fn record<B: HostBackend, C: CheckpointStrategy, const N: usize>(
    nodes: [NodeGuard; N],
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> FloatTensor<Autodiff<B, C>>
where
    LinearBackward: Backward<B, N, State = Arc<Saved>>,
{
    match LinearBackward.prepare::<C>(nodes).compute_bound().stateful() {
        OpsKind::Tracked(prep) => {
            let (output, saved) = host_linear::<B>(x, weight, bias);
            prep.finish(Arc::new(saved), output)
        }
        OpsKind::UnTracked(prep) => prep.finish(host_linear::<B>(x, weight, bias).0),
    }
}

/// What the backward pass needs: both operands on the host (flex's read in place, not copied).
#[derive(Debug)]
struct Saved {
    /// `[M, K]`
    x: HostValues,
    /// `[K, N]`
    weight: HostValues,
    m: usize,
    k: usize,
    n: usize,
}

/// `dx = dy Wᵀ`, `dW = xᵀ dy`, `db = Σ_rows dy`; `N` = 2 parents (`x`, `W`) or 3 (and `b`).
#[derive(Debug)]
struct LinearBackward;

impl<B: HostBackend, const N: usize> Backward<B, N> for LinearBackward {
    type State = Arc<Saved>;

    fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let output_grad = OutputGrad::<B>::consume(grads, &ops);
        let dy = &output_grad.values; // [M, N]
        let Saved { x, weight, m, k, n } = &*ops.state;
        let mut parents = ops.parents.into_iter();
        if let Some(node) = parents.next().flatten() {
            let dx = matmul(View::new(dy, *m, *n), View::new(weight, *k, *n).t()); // [M, K]
            output_grad.register(grads, node.id, dx, &[*m, *k]);
        }
        if let Some(node) = parents.next().flatten() {
            let dw = matmul(View::new(x, *m, *k).t(), View::new(dy, *m, *n)); // [K, N]
            output_grad.register(grads, node.id, dw, &[*k, *n]);
        }
        if let Some(node) = parents.next().flatten() {
            let db = column_sums(dy, *n); // [N]
            output_grad.register(grads, node.id, db, &[*n]);
        }
    }
}

/// The widths of `y = (x P + p) W + b`: `x [M, D]`, `P [D, E]`, `W [E, N]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearPair {
    pub m: usize,
    pub d: usize,
    pub e: usize,
    pub n: usize,
}

impl LinearPair {
    /// Whether the pair's backward pass costs fewer multiply-adds from `G = xᵀ dy` than as two
    /// layers (`x_grad`: whether `x` needs its gradient too). Two layers: `zᵀ dy` and `dy Wᵀ`
    /// (`M·E·N` each), `xᵀ dz` (`M·D·E`) and, for `x`, `dz Pᵀ` (`M·E·D`). The pair: `G`
    /// (`M·D·N`), `Pᵀ G` and `G Wᵀ` (`D·E·N` each) and, for `x`, `P W` and `dy (P W)ᵀ`
    /// (`D·E·N + M·N·D`). The two-layer count charges this pair the whole of `dz`'s products,
    /// which several layers reading one `z` share; with three (the query, key and value) the
    /// choice can be one way where the other saves up to a third of `xᵀ dz`.
    pub fn reassociates(self, x_grad: bool) -> bool {
        let LinearPair { m, d, e, n } = self;
        let x_pass = usize::from(x_grad);
        let pair = m * d * n + 2 * d * e * n + x_pass * (d * e * n + m * n * d);
        let layers = 2 * m * e * n + m * d * e + x_pass * m * e * d;
        pair < layers
    }
}

/// What the pair's backward pass needs: `x`, both weights and the first bias on the host.
#[derive(Debug)]
struct PairSaved {
    /// `[M, D]`
    x: HostValues,
    /// `P [D, E]`
    first_weight: HostValues,
    /// `p [E]`
    first_bias: HostValues,
    /// `W [E, N]`
    weight: HostValues,
    pair: LinearPair,
}

/// The gradients of `y = (x P + p) W + b` for its parents `[x, P, p, W, b]`, from `G = xᵀ dy`.
#[derive(Debug)]
struct PairBackward;

impl<B: HostBackend> Backward<B, 5> for PairBackward {
    type State = Arc<PairSaved>;

    fn backward(self, ops: Ops<Self::State, 5>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let output_grad = OutputGrad::<B>::consume(grads, &ops);
        let dy = &output_grad.values; // [M, N]
        let PairSaved { x, first_weight, first_bias, weight, pair } = &*ops.state;
        let LinearPair { m, d, e, n } = *pair;
        let [x_node, first_weight_node, first_bias_node, weight_node, bias_node] = ops.parents;
        let (dy_rows, w) = (View::new(dy, m, n), View::new(weight, e, n));
        let sums = column_sums(dy, n); // Σ_rows dy [N]
        let g = match first_weight_node.is_some() || weight_node.is_some() {
            true => matmul(View::new(x, m, d).t(), dy_rows), // G = xᵀ dy [D, N]
            false => Vec::new(),
        };
        if let Some(node) = x_node {
            let chained = matmul(View::new(first_weight, d, e), w); // P W [D, N]
            let dx = matmul(dy_rows, View::new(&chained, d, n).t()); // [M, D]
            output_grad.register(grads, node.id, dx, &[m, d]);
        }
        if let Some(node) = first_weight_node {
            let dp = matmul(View::new(&g, d, n), w.t()); // G Wᵀ [D, E]
            output_grad.register(grads, node.id, dp, &[d, e]);
        }
        if let Some(node) = first_bias_node {
            let dp = matmul(View::new(&sums, 1, n), w.t()); // [1, E]
            output_grad.register(grads, node.id, dp, &[e]);
        }
        if let Some(node) = weight_node {
            let mut dw = matmul(View::new(first_weight, d, e).t(), View::new(&g, d, n)); // Pᵀ G [E, N]
            for (row, &p) in dw.chunks_exact_mut(n).zip(first_bias.iter()) {
                row.iter_mut().zip(&sums).for_each(|(dw, s)| *dw += p * s); // + p ⊗ Σ_rows dy
            }
            output_grad.register(grads, node.id, dw, &[e, n]);
        }
        if let Some(node) = bias_node {
            output_grad.register(grads, node.id, sums, &[n]);
        }
    }
}

/// `Σ_i rows[i, j]` of a row-major `[M, N]` matrix.
fn column_sums(rows: &[f32], n: usize) -> Vec<f32> {
    let mut sums = vec![0.0; n];
    for row in rows.chunks_exact(n) {
        sums.iter_mut().zip(row).for_each(|(sum, x)| *sum += x);
    }
    sums
}

/// The product on `B`'s host tensors: the output `[M, N]` and what the backward pass needs.
fn host_linear<B: HostBackend>(
    x: FloatTensor<B>,
    weight: FloatTensor<B>,
    bias: Option<FloatTensor<B>>,
) -> (FloatTensor<B>, Saved) {
    let (device, dtype) = (x.device(), x.dtype());
    let (x, weight) = (B::host_values(x), B::host_values(weight));
    let (m, k, n) = (x.shape[0], x.shape[1], weight.shape[1]);
    let (a, b) = (View::new(&x, m, k), View::new(&weight, k, n));
    let y = match bias.map(B::host_values) {
        Some(bias) => matmul_bias(a, b, &bias),
        None => matmul(a, b),
    }; // [M, N]
    (B::from_host(y, &[m, n], dtype, &device), Saved { x, weight, m, k, n })
}

/// A dense layer's weights as tensors, `W [d_in, d_out]` and `b [d_out]`: a burn `Linear`'s, or
/// those of layers that read one input joined into one ([`Dense::joined`]).
#[derive(Debug, Clone)]
pub struct Dense {
    pub weight: Tensor<2>,
    pub bias: Option<Tensor<1>>,
}

impl From<&Linear> for Dense {
    fn from(layer: &Linear) -> Self {
        Self { weight: layer.weight.val(), bias: layer.bias.as_ref().map(|bias| bias.val()) }
    }
}

impl Dense {
    /// Layers of one input as one layer whose outputs are theirs side by side, `[W_1 | W_2 | ..]`
    /// (self-attention's query, key and value projections: one product instead of three). A
    /// layer without a bias among layers with one adds zeros. Differentiable: each layer's
    /// weights get their part of the joined gradient.
    pub fn joined(layers: &[&Linear]) -> Self {
        let layers: Vec<Dense> = layers.iter().map(|&layer| layer.into()).collect();
        let weight = Tensor::cat(layers.iter().map(|layer| layer.weight.clone()).collect(), 1); // [d_in, Σ d_out]
        let bias = layers.iter().any(|layer| layer.bias.is_some()).then(|| {
            Tensor::cat(layers.iter().map(Dense::bias_or_zeros).collect(), 0) // [Σ d_out]
        });
        Self { weight, bias }
    }

    /// The bias `[d_out]`, zeros (untracked) for a layer without: for the fused ops, which take
    /// one, and for layers joined with others that have one.
    fn bias_or_zeros(&self) -> Tensor<1> {
        match &self.bias {
            Some(bias) => bias.clone(),
            None => Tensor::zeros([self.weight.dims()[1]], &self.weight.device()),
        }
    }
}

/// `x W + b` of a dense layer on `[B, L, d_in]`: through this crate's GEMM where [`supports`]
/// says, burn's own product elsewhere. Differentiable.
pub fn linear_forward(layer: impl Into<Dense>, x: Tensor<3>) -> Tensor<3> {
    let Dense { weight, bias } = layer.into(); // [d_in, d_out], [d_out]
    if !supports(&x.device()) {
        return burn::tensor::module::linear(x, weight, bias);
    }
    let [batch, len, d_in] = x.dims();
    let d_out = weight.dims()[1];
    let (x, weight) = (x.reshape([batch * len, d_in]).into_dispatch(), weight.into_dispatch()); // [B·L, d_in]
    let y = match bias {
        Some(bias) => <Dispatch as FusedLinearBackend>::fused_linear(x, weight, bias.into_dispatch()),
        None => <Dispatch as FusedLinearBackend>::fused_matmul(x, weight),
    };
    Tensor::<2>::from_dispatch(y).reshape([batch, len, d_out]) // [B, L, d_out]
}

/// `second(z)` for `z = first(x)`, `x [B, L, d_in]` (`z` as the caller computed it, which must
/// be `first`'s output for `x`): the output is `second`'s, and where [`LinearPair::reassociates`]
/// says, the backward pass runs through `x`, `first` and `second` at once and `z`'s gradient is
/// never formed. Differentiable.
pub fn linear_after(first: impl Into<Dense>, second: impl Into<Dense>, x: Tensor<3>, z: Tensor<3>) -> Tensor<3> {
    let (first, second) = (first.into(), second.into());
    let [batch, len, d_in] = x.dims();
    let [d_mid, d_out] = second.weight.dims();
    let pair = LinearPair { m: batch * len, d: d_in, e: d_mid, n: d_out };
    if !supports(&x.device()) || !z.is_tracked() || !pair.reassociates(x.is_tracked()) {
        return linear_forward(second, z);
    }
    let (first_bias, bias) = (first.bias_or_zeros(), second.bias_or_zeros());
    let y = <Dispatch as FusedLinearBackend>::fused_linear_after(
        x.reshape([batch * len, d_in]).into_dispatch(),  // [B·L, d_in]
        z.reshape([batch * len, d_mid]).into_dispatch(), // [B·L, d_mid]
        first.weight.into_dispatch(),                    // [d_in, d_mid]
        first_bias.into_dispatch(),                      // [d_mid]
        second.weight.into_dispatch(),                   // [d_mid, d_out]
        bias.into_dispatch(),                            // [d_out]
    );
    Tensor::<2>::from_dispatch(y).reshape([batch, len, d_out]) // [B, L, d_out]
}

#[cfg(test)]
mod tests {
    use burn::nn::LinearConfig;
    use burn::tensor::{Device, Distribution};

    use super::*;

    /// The GEMM's `x W + b` and its gradients for `x`, `W` and `b` against burn's own Linear, with
    /// and without a bias, an input read twice (shared, so read in place on flex) and a transposed
    /// one (not contiguous, so copied), on both CPU backends.
    #[test]
    fn the_fused_linear_matches_burns_linear_with_gradients() {
        for device in [Device::flex(), Device::ndarray()] {
            let device = device.autodiff();
            for bias in [true, false] {
                let layer = LinearConfig::new(37, 21).with_bias(bias).init(&device);
                let x_data = Tensor::<3>::random([3, 37, 5], Distribution::Normal(0.0, 1.0), &device).into_data();
                let probe = Tensor::<3>::random([3, 5, 21], Distribution::Normal(0.0, 1.0), &device);
                let run = |forward: &dyn Fn(Tensor<3>) -> Tensor<3>| {
                    let x = Tensor::<3>::from_data(x_data.clone(), &device).require_grad();
                    let input = x.clone().swap_dims(1, 2); // [3, 5, 37], not contiguous
                    let y = forward(input.clone()) + forward(input) * 0.5; // [3, 5, 21]
                    let grads = (y.clone() * probe.clone()).sum().backward();
                    let mut found = vec![
                        y.into_data(),
                        x.grad(&grads).unwrap().into_data(),
                        layer.weight.val().grad(&grads).unwrap().into_data(),
                    ];
                    found.extend(layer.bias.as_ref().map(|b| b.val().grad(&grads).unwrap().into_data()));
                    found
                };
                let ours = run(&|x| linear_forward(&layer, x));
                let burns = run(&|x| layer.forward(x));
                for (name, (ours, burns)) in ["output", "dx", "dW", "db"].iter().zip(ours.iter().zip(&burns)) {
                    ours.assert_approx_eq::<f32>(burns, burn::tensor::Tolerance::absolute(1e-4));
                    assert_eq!(ours.shape(), burns.shape(), "{name}");
                }
            }
        }
    }

    /// Two layers in a row through [`linear_after`] against the same two layers one after the
    /// other: the output and the gradients of `x`, both weights and both biases, with and
    /// without biases and with `x` tracked or not, on both CPU backends.
    #[test]
    fn a_pair_of_layers_matches_the_layers_one_after_the_other() {
        let pair = LinearPair { m: 3 * 41, d: 6, e: 9, n: 7 };
        assert!(pair.reassociates(true) && pair.reassociates(false), "the test's widths take the pair's path");
        for device in [Device::flex(), Device::ndarray()] {
            let device = device.autodiff();
            for (bias, x_grad) in [(true, true), (false, true), (true, false)] {
                let first = LinearConfig::new(pair.d, pair.e).with_bias(bias).init(&device);
                let second = LinearConfig::new(pair.e, pair.n).with_bias(bias).init(&device);
                let x_data = Tensor::<3>::random([3, 41, pair.d], Distribution::Normal(0.0, 1.0), &device).into_data();
                let probe = Tensor::<3>::random([3, 41, pair.n], Distribution::Normal(0.0, 1.0), &device);
                let run = |forward: &dyn Fn(Tensor<3>) -> Tensor<3>| {
                    let x = Tensor::<3>::from_data(x_data.clone(), &device);
                    let x = if x_grad { x.require_grad() } else { x };
                    let y = forward(x.clone()); // [3, 41, n]
                    let grads = (y.clone() * probe.clone()).sum().backward();
                    let mut found = vec![y.into_data()];
                    found.extend(x_grad.then(|| x.grad(&grads).unwrap().into_data()));
                    for layer in [&first, &second] {
                        found.push(layer.weight.val().grad(&grads).unwrap().into_data());
                        found.extend(layer.bias.as_ref().map(|b| b.val().grad(&grads).unwrap().into_data()));
                    }
                    found
                };
                let paired = run(&|x| linear_after(&first, &second, x.clone(), linear_forward(&first, x)));
                let layers = run(&|x| linear_forward(&second, linear_forward(&first, x)));
                assert_eq!(paired.len(), layers.len());
                for (paired, layers) in paired.iter().zip(&layers) {
                    assert_eq!(paired.shape(), layers.shape());
                    paired.assert_approx_eq::<f32>(layers, burn::tensor::Tolerance::absolute(1e-4));
                }
            }
        }
    }

    /// The pair's order where it saves products, the layers' where it does not.
    #[test]
    fn the_pair_reassociates_when_the_rows_outnumber_the_widths() {
        let seed = LinearPair { m: 32 * 136, d: 4, e: 24, n: 24 };
        assert!(seed.reassociates(false) && seed.reassociates(true));
        let wide = LinearPair { m: 8 * 256, d: 512, e: 512, n: 512 };
        assert!(wide.reassociates(false) && wide.reassociates(true));
        let few_rows = LinearPair { m: 64, d: 512, e: 512, n: 512 };
        assert!(!few_rows.reassociates(false) && !few_rows.reassociates(true));
        let wide_input = LinearPair { m: 1024, d: 4096, e: 64, n: 64 };
        assert!(!wide_input.reassociates(false));
    }
}
