//! The fused attention kernel as a Burn backend operation, with its own backward pass.
//!
//! A burn 0.22 backend extension: implemented for the CPU backends (flex, ndarray), whose
//! tensors live in host memory, and for `Autodiff<B, C>`, where the backward pass is the
//! kernel's own instead of burn-autodiff's decomposition into a dozen passes over the
//! `[B, h, T, S]` score tensor.

#![allow(deprecated)] // NdArray: deprecated in burn 0.22, still one of this project's backends.

use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, NdArray, TensorMetadata, backend_extension};
use burn::tensor::{Tensor, TensorData};

use super::kernel::{self, Dims};

/// `softmax(scale · q kᵀ) v` as one backend operation.
#[backend_extension(Flex, NdArray, Autodiff)]
pub trait FusedAttentionBackend: Backend {
    /// `query`: `[B, T, h, dk]`, `key`: `[B, S, h, dk]`, `value`: `[B, S, h, dv]` (heads last, the
    /// projections' layout); returns `[B, T, h, dv]`.
    fn fused_attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        scale: f32,
    ) -> FloatTensor<Self>;
}

impl FusedAttentionBackend for Flex {
    fn fused_attention(query: FloatTensor<Self>, key: FloatTensor<Self>, value: FloatTensor<Self>, scale: f32) -> FloatTensor<Self> {
        host_forward::<Self>(query, key, value, scale).1
    }
}

impl FusedAttentionBackend for NdArray {
    fn fused_attention(query: FloatTensor<Self>, key: FloatTensor<Self>, value: FloatTensor<Self>, scale: f32) -> FloatTensor<Self> {
        host_forward::<Self>(query, key, value, scale).1
    }
}

impl<B: Backend, C: CheckpointStrategy> FusedAttentionBackend for Autodiff<B, C> {
    fn fused_attention(query: FloatTensor<Self>, key: FloatTensor<Self>, value: FloatTensor<Self>, scale: f32) -> FloatTensor<Self> {
        let nodes = [query.node(), key.node(), value.node()];
        let (query, key, value) = (query.into_primitive(), key.into_primitive(), value.into_primitive());
        match FusedAttentionBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (saved, output) = host_forward::<B>(query, key, value, scale);
                prep.finish(Arc::new(saved), output)
            }
            OpsKind::UnTracked(prep) => prep.finish(host_forward::<B>(query, key, value, scale).1),
        }
    }
}

/// The backward step: the kernel's gradients for query, key and value.
#[derive(Debug)]
struct FusedAttentionBackward;

/// What the forward pass leaves for the backward pass.
#[derive(Debug)]
struct Saved {
    forward: kernel::Forward,
    key_shape: [usize; 4],
    value_shape: [usize; 4],
    query_shape: [usize; 4],
}

impl<B: Backend> Backward<B, 3> for FusedAttentionBackward {
    type State = Arc<Saved>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let output_grad = grads.consume::<B>(&ops.node); // [B, T, h, dv]
        let (device, dtype) = (output_grad.device(), output_grad.dtype());
        let (output_grad, _) = to_host::<B>(output_grad);
        let saved = &ops.state;
        let kernel::Gradients { query, key, value } = kernel::backward(&saved.forward, &output_grad);
        let [query_node, key_node, value_node] = ops.parents;
        for (node, grad, shape) in [
            (query_node, query, saved.query_shape),
            (key_node, key, saved.key_shape),
            (value_node, value, saved.value_shape),
        ] {
            if let Some(node) = node {
                let grad = TensorData::new(grad, shape).convert_dtype(dtype);
                grads.register::<B>(node.id, B::float_from_data(grad, &device));
            }
        }
    }
}

/// Runs the kernel's forward pass on `B`'s tensors; returns what the backward pass needs and
/// the output `[B, T, h, dv]`.
fn host_forward<B: Backend>(
    query: FloatTensor<B>, // [B, T, h, dk]
    key: FloatTensor<B>,   // [B, S, h, dk]
    value: FloatTensor<B>, // [B, S, h, dv]
    scale: f32,
) -> (Saved, FloatTensor<B>) {
    let (device, dtype) = (query.device(), query.dtype());
    let (query, query_shape) = to_host::<B>(query);
    let (key, key_shape) = to_host::<B>(key);
    let (value, value_shape) = to_host::<B>(value);
    let [batch, query_len, heads, key_dim] = query_shape;
    let [_, source_len, _, value_dim] = value_shape;
    let dims = Dims { batch, heads, query_len, source_len, key_dim, value_dim };
    let forward = kernel::forward(&query, &key, &value, dims, scale);
    // The kernel computes in float32; the output keeps the input's precision.
    let output = TensorData::new(forward.output.clone(), [batch, query_len, heads, value_dim]).convert_dtype(dtype);
    (Saved { forward, key_shape, value_shape, query_shape }, B::float_from_data(output, &device))
}

/// A rank-4 float tensor of a host-memory backend as float32 values (the kernel's precision)
/// and its shape.
fn to_host<B: Backend>(tensor: FloatTensor<B>) -> (Vec<f32>, [usize; 4]) {
    let shape: [usize; 4] = tensor.shape().dims();
    let data = pollster::block_on(B::float_into_data(tensor)).expect("a host-memory tensor can always be read");
    let values = data.convert::<f32>().into_vec::<f32>().expect("converted to float32");
    (values, shape)
}

/// Whether [`fused_attention`] runs on `device` for heads of these widths: the host-memory CPU
/// backends (flex, ndarray), and widths up to the kernel's largest ([`kernel::WIDTHS`]).
pub fn supports(device: &burn::tensor::Device, key_dim: usize, value_dim: usize) -> bool {
    use burn::backend::DispatchDevice;
    let host_memory = matches!(device.clone().without_autodiff().as_dispatch(), DispatchDevice::Flex(_) | DispatchDevice::NdArray(_));
    host_memory && Dims { batch: 1, heads: 1, query_len: 1, source_len: 1, key_dim, value_dim }.width().is_some()
}

/// `softmax(scale · q kᵀ) v` per head through the fused kernel: `[B, T, h, dk]`, `[B, S, h, dk]`,
/// `[B, S, h, dv]` -> `[B, T, h, dv]` (heads last). Differentiable. Only where [`supports`] says.
pub fn fused_attention(query: Tensor<4>, key: Tensor<4>, value: Tensor<4>, scale: f32) -> Tensor<4> {
    let output = <Dispatch as FusedAttentionBackend>::fused_attention(
        query.into_dispatch(),
        key.into_dispatch(),
        value.into_dispatch(),
        scale,
    );
    Tensor::from_dispatch(output) // [B, T, h, dv]
}
