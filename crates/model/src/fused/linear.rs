//! The dense layers' product `x W` as a Burn backend operation with its own backward pass, on
//! this crate's GEMM ([`gemm`]): on the CPU backends it runs about twice as fast as the backends'
//! own matrix product (see `docs/benchmarks.md`).

#![allow(deprecated)] // NdArray (also in the macro's expansion): deprecated in burn 0.22, still one of this project's backends.

use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, NdArray, TensorMetadata, backend_extension};
use burn::nn::Linear;
use burn::tensor::{Tensor, TensorData};

use super::gemm::{View, matmul};
use super::op::{host_values, supports};

/// `x W` for `x: [M, K]` and `W: [K, N]`; the default body runs the GEMM on the backend's
/// host-memory tensors (flex, ndarray); `Autodiff<B, C>` adds the backward step.
#[backend_extension(Flex, NdArray, Autodiff)]
pub trait FusedLinearBackend: Backend {
    fn fused_matmul(x: FloatTensor<Self>, weight: FloatTensor<Self>) -> FloatTensor<Self> {
        host_matmul::<Self>(x, weight).0
    }
}

impl FusedLinearBackend for Flex {}

impl FusedLinearBackend for NdArray {}

impl<B: Backend, C: CheckpointStrategy> FusedLinearBackend for Autodiff<B, C> {
    fn fused_matmul(x: FloatTensor<Self>, weight: FloatTensor<Self>) -> FloatTensor<Self> {
        let nodes = [x.node(), weight.node()];
        let (x, weight) = (x.into_primitive(), weight.into_primitive());
        match LinearBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (output, saved) = host_matmul::<B>(x, weight);
                prep.finish(Arc::new(saved), output)
            }
            OpsKind::UnTracked(prep) => prep.finish(host_matmul::<B>(x, weight).0),
        }
    }
}

/// What the backward pass needs: both operands on the host.
#[derive(Debug)]
struct Saved {
    /// `[M, K]`
    x: Vec<f32>,
    /// `[K, N]`
    weight: Vec<f32>,
    m: usize,
    k: usize,
    n: usize,
}

/// `dx = dy Wᵀ`, `dW = xᵀ dy`.
#[derive(Debug)]
struct LinearBackward;

impl<B: Backend> Backward<B, 2> for LinearBackward {
    type State = Arc<Saved>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let output_grad = grads.consume::<B>(&ops.node); // [M, N]
        let (device, dtype) = (output_grad.device(), output_grad.dtype());
        let (dy, _) = host_values::<B>(output_grad);
        let Saved { x, weight, m, k, n } = &*ops.state;
        let [x_node, weight_node] = ops.parents;
        let register = |grads: &mut Gradients, id, values: Vec<f32>, shape: [usize; 2]| {
            let grad = TensorData::new(values, shape).convert_dtype(dtype);
            grads.register::<B>(id, B::float_from_data(grad, &device));
        };
        if let Some(node) = x_node {
            let dx = matmul(View::new(&dy, *m, *n), View::new(weight, *k, *n).t()); // [M, K]
            register(grads, node.id, dx, [*m, *k]);
        }
        if let Some(node) = weight_node {
            let dw = matmul(View::new(x, *m, *k).t(), View::new(&dy, *m, *n)); // [K, N]
            register(grads, node.id, dw, [*k, *n]);
        }
    }
}

/// The product on `B`'s host tensors: the output `[M, N]` and what the backward pass needs.
fn host_matmul<B: Backend>(x: FloatTensor<B>, weight: FloatTensor<B>) -> (FloatTensor<B>, Saved) {
    let (device, dtype) = (x.device(), x.dtype());
    let (x, x_shape) = host_values::<B>(x);
    let (weight, w_shape) = host_values::<B>(weight);
    let (m, k, n) = (x_shape[0], x_shape[1], w_shape[1]);
    let y = matmul(View::new(&x, m, k), View::new(&weight, k, n));
    let y = TensorData::new(y, [m, n]).convert_dtype(dtype);
    (B::float_from_data(y, &device), Saved { x, weight, m, k, n })
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
    let y = <Dispatch as FusedLinearBackend>::fused_matmul(x.reshape([batch * len, d_in]).into_dispatch(), weight.into_dispatch());
    let y = Tensor::<2>::from_dispatch(y).reshape([batch, len, d_out]); // [B, L, d_out]
    match &layer.bias {
        Some(bias) => y + bias.val().unsqueeze::<3>(), // [B, L, d_out]
        None => y,
    }
}
