//! The dense layers' `x W + b` as a Burn backend operation with its own backward pass, on
//! [`crate::gemm`]: the `gemm` crate called directly, with the bias as the product's starting
//! value. flex's own matmul wraps the same crate at nearly the same rate (201 against 208 GFLOP/s
//! at 1024³ on a 2-thread Zen 4, `docs/benchmarks.md`); this op adds the bias as the product's
//! starting value instead of in a second pass, and runs on ndarray too.

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
use super::host::{HostBackend, HostValues};
use crate::gemm::{View, matmul, matmul_bias};

/// `x W` and `x W + b` for `x: [M, K]`, `W: [K, N]` and `b: [N]`: the GEMM on the backend's
/// host-memory tensors (flex, ndarray), the bias added as the products are stored;
/// `Autodiff<B, C>` adds the backward step. (Two operations: burn 0.22's extension macro does
/// not route an optional tensor.)
#[backend_extension(Flex, NdArray, Autodiff)]
pub trait FusedLinearBackend: Backend {
    fn fused_matmul(x: FloatTensor<Self>, weight: FloatTensor<Self>) -> FloatTensor<Self>;
    fn fused_linear(x: FloatTensor<Self>, weight: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self>;
}

impl FusedLinearBackend for Flex {
    fn fused_matmul(x: FloatTensor<Self>, weight: FloatTensor<Self>) -> FloatTensor<Self> {
        host_linear::<Self>(x, weight, None).0
    }

    fn fused_linear(x: FloatTensor<Self>, weight: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        host_linear::<Self>(x, weight, Some(bias)).0
    }
}

impl FusedLinearBackend for NdArray {
    fn fused_matmul(x: FloatTensor<Self>, weight: FloatTensor<Self>) -> FloatTensor<Self> {
        host_linear::<Self>(x, weight, None).0
    }

    fn fused_linear(x: FloatTensor<Self>, weight: FloatTensor<Self>, bias: FloatTensor<Self>) -> FloatTensor<Self> {
        host_linear::<Self>(x, weight, Some(bias)).0
    }
}

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
        let output_grad = grads.consume::<B>(&ops.node); // [M, N]
        let (device, dtype) = (output_grad.device(), output_grad.dtype());
        let dy = B::host_values(output_grad);
        let Saved { x, weight, m, k, n } = &*ops.state;
        let register = |grads: &mut Gradients, id, values: Vec<f32>, shape: &[usize]| {
            grads.register::<B>(id, B::from_host(values, shape, dtype, &device));
        };
        let mut parents = ops.parents.into_iter();
        if let Some(node) = parents.next().flatten() {
            let dx = matmul(View::new(&dy, *m, *n), View::new(weight, *k, *n).t()); // [M, K]
            register(grads, node.id, dx, &[*m, *k]);
        }
        if let Some(node) = parents.next().flatten() {
            let dw = matmul(View::new(x, *m, *k).t(), View::new(&dy, *m, *n)); // [K, N]
            register(grads, node.id, dw, &[*k, *n]);
        }
        if let Some(node) = parents.next().flatten() {
            let db = column_sums(&dy, *n); // [N]
            register(grads, node.id, db, &[*n]);
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

/// `x W + b` of a Linear on `[B, L, d_in]`: through this crate's GEMM where [`supports`] says,
/// burn's own product elsewhere. Differentiable.
pub fn linear_forward(layer: &Linear, x: Tensor<3>) -> Tensor<3> {
    if !supports(&x.device()) {
        return layer.forward(x);
    }
    let [batch, len, d_in] = x.dims();
    let weight = layer.weight.val(); // [d_in, d_out]
    let d_out = weight.dims()[1];
    let (x, weight) = (x.reshape([batch * len, d_in]).into_dispatch(), weight.into_dispatch()); // [B·L, d_in]
    let y = match &layer.bias {
        Some(bias) => <Dispatch as FusedLinearBackend>::fused_linear(x, weight, bias.val().into_dispatch()),
        None => <Dispatch as FusedLinearBackend>::fused_matmul(x, weight),
    };
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
}
