//! The fused attention kernel as a Burn backend operation, with its own backward pass.
//!
//! A burn 0.22 backend extension: implemented for the CPU backends (flex, ndarray), whose
//! tensors live in host memory, and for `Autodiff<B, C>`, where the backward pass is the
//! kernel's own instead of burn-autodiff's decomposition into a dozen passes over the
//! `[B, h, T, S]` score tensor.

#![allow(deprecated)] // NdArray (also in the macro's expansion): deprecated in burn 0.22, still one of this project's backends.

use std::sync::Arc;

use burn::backend::autodiff::checkpoint::base::Checkpointer;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::tensor::FloatTensor;
use burn::backend::{Autodiff, Backend, Dispatch, Flex, NdArray, TensorMetadata, backend_extension};
use burn::tensor::{Bool, Tensor, TensorData};

use super::host::{HostBackend, HostBoolBackend, OutputGrad};
use crate::attention as kernel;
use crate::bias::FloatBias;
use crate::dims::{Dims, FullyMaskedRows, Layout};
use crate::dropout::KeepMask;
use crate::mask::{BoolMask, Marks, Mask};

/// What a fused call attends: the scale of the logits and the mask of allowed pairs.
#[derive(Debug, Clone)]
pub struct FusedCall {
    pub scale: f32,
    /// `true` = query `t` may attend key `s`, `[Bm, Hm, Tm, S]` broadcasting to `[B, h, T, S]`,
    /// compacted ([`BoolMask::read`] compacts as it reads; the call packs it as it is).
    pub allowed: Option<BoolMask>,
    /// Keras' and torch's top-left causal rule, ANDed with `allowed`.
    pub causal: bool,
    /// What a query row with no allowed key gets.
    pub rows: FullyMaskedRows,
    /// Dropout on the probabilities (training), its keep-mask.
    pub dropout: Option<KeepMask>,
    /// A float mask added to the scaled logits (torch's float `attn_mask`, its `-inf` entries
    /// given to `allowed` instead).
    pub bias: Option<FloatBias>,
}

/// `softmax(scale · q kᵀ, mask) v` as one backend operation: the kernel on the backend's
/// host-memory tensors (flex, ndarray); `Autodiff<B, C>` adds the backward step.
#[backend_extension(Flex, NdArray, Autodiff)]
pub trait FusedAttentionBackend: Backend {
    /// `query`: `[B, T, h, dk]`, `key`: `[B, S, h, dk]`, `value`: `[B, S, h, dv]` (heads last, the
    /// projections' layout); returns `[B, T, h, dv]`.
    fn fused_attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        call: FusedCall,
    ) -> FloatTensor<Self>;

    /// Self-attention whose query, key and value are the parts of one packed projection `qkv`,
    /// `[B, T, h·(dk + dk + dv)]` (side by side in each row, torch's `in_proj` order; `dims` says
    /// the sizes, `S = T`), read in place; returns `[B, T, h, dv]`, and the backward pass gives
    /// `qkv` one packed gradient.
    fn fused_self_attention(qkv: FloatTensor<Self>, dims: Dims, call: FusedCall) -> FloatTensor<Self>;
}

/// The operations on a host-memory backend's own tensors, with no backward pass to record.
macro_rules! host_attention_ops {
    ($($backend:ty),*) => {$(
        impl FusedAttentionBackend for $backend {
            fn fused_attention(
                query: FloatTensor<Self>,
                key: FloatTensor<Self>,
                value: FloatTensor<Self>,
                call: FusedCall,
            ) -> FloatTensor<Self> {
                host_forward::<Self>(query, key, value, call).0
            }

            fn fused_self_attention(qkv: FloatTensor<Self>, dims: Dims, call: FusedCall) -> FloatTensor<Self> {
                host_forward_packed::<Self>(qkv, dims, call).0
            }
        }
    )*};
}

host_attention_ops!(Flex, NdArray);

impl<B: HostBackend, C: CheckpointStrategy> FusedAttentionBackend for Autodiff<B, C> {
    fn fused_attention(
        query: FloatTensor<Self>,
        key: FloatTensor<Self>,
        value: FloatTensor<Self>,
        call: FusedCall,
    ) -> FloatTensor<Self> {
        let nodes = [query.node(), key.node(), value.node()];
        let (query, key, value) = (query.into_primitive(), key.into_primitive(), value.into_primitive());
        match FusedAttentionBackward.prepare::<C>(nodes).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (output, saved) = host_forward::<B>(query, key, value, call);
                prep.finish(Arc::new(saved), output)
            }
            OpsKind::UnTracked(prep) => prep.finish(host_forward::<B>(query, key, value, call).0),
        }
    }

    fn fused_self_attention(qkv: FloatTensor<Self>, dims: Dims, call: FusedCall) -> FloatTensor<Self> {
        let (qkv, node) = qkv.into_parts();
        match PackedAttentionBackward.prepare::<C>([node]).compute_bound().stateful() {
            OpsKind::Tracked(prep) => {
                let (output, saved) = host_forward_packed::<B>(qkv, dims, call);
                prep.finish(Arc::new(saved), output)
            }
            OpsKind::UnTracked(prep) => prep.finish(host_forward_packed::<B>(qkv, dims, call).0),
        }
    }
}

/// The backward step: the kernel's gradients for query, key and value.
#[derive(Debug)]
struct FusedAttentionBackward;

impl<B: HostBackend> Backward<B, 3> for FusedAttentionBackward {
    type State = Arc<kernel::Forward>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let output_grad = OutputGrad::<B>::consume(grads, &ops); // [B, T, h, dv]
        let kernel::Gradients { query, key, value } = kernel::backward(&ops.state, &output_grad.values);
        for ((node, grad), shape) in ops.parents.into_iter().zip([query, key, value]).zip(ops.state.dims.shapes()) {
            if let Some(node) = node {
                output_grad.register(grads, node.id, grad, &shape);
            }
        }
    }
}

/// The backward step of the packed call: one gradient, packed as `qkv` is.
#[derive(Debug)]
struct PackedAttentionBackward;

impl<B: HostBackend> Backward<B, 1> for PackedAttentionBackward {
    type State = Arc<kernel::Forward>;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let output_grad = OutputGrad::<B>::consume(grads, &ops); // [B, T, h, dv]
        if let [Some(node)] = &ops.parents {
            let dims = ops.state.dims;
            let grad = kernel::backward_packed(&ops.state, &output_grad.values); // [B, T, h·(dk + dk + dv)]
            let shape = [dims.batch, dims.query_len, Layout::packed_width(&dims)];
            output_grad.register(grads, node.id, grad, &shape);
        }
    }
}

/// Runs the kernel's forward pass on `B`'s tensors; returns the output `[B, T, h, dv]` and what
/// the backward pass needs.
fn host_forward<B: HostBackend>(
    query: FloatTensor<B>, // [B, T, h, dk]
    key: FloatTensor<B>,   // [B, S, h, dk]
    value: FloatTensor<B>, // [B, S, h, dv]
    call: FusedCall,
) -> (FloatTensor<B>, kernel::Forward) {
    let (device, dtype) = (query.device(), query.dtype());
    let [query, key, value] = [query, key, value].map(B::host_values);
    let dims = Dims::of(rank4(&query.shape), rank4(&value.shape));
    let (scale, mask) = call.rule(dims);
    let (output, saved) = kernel::forward(&query, &key, &value, dims, scale, mask);
    // The kernel computes in float32; the output keeps the input's precision.
    (B::from_host(output, &dims.output_shape(), dtype, &device), saved)
}

/// [`host_forward`] of a packed projection `[B, T, h·(dk + dk + dv)]`.
fn host_forward_packed<B: HostBackend>(
    qkv: FloatTensor<B>,
    dims: Dims,
    call: FusedCall,
) -> (FloatTensor<B>, kernel::Forward) {
    let (device, dtype) = (qkv.device(), qkv.dtype());
    let qkv = B::host_values(qkv);
    let (scale, mask) = call.rule(dims);
    let (output, saved) = kernel::forward_packed(&qkv, dims, scale, mask);
    (B::from_host(output, &dims.output_shape(), dtype, &device), saved)
}

fn rank4(shape: &[usize]) -> [usize; 4] {
    shape.try_into().expect("a rank-4 tensor")
}

impl FusedCall {
    /// The scale and the kernel's masking rule of this call at `dims`.
    fn rule(self, dims: Dims) -> (f32, Mask) {
        let mask = Mask::with_compacted(self.causal, self.rows, self.allowed, dims)
            .with_dropout(self.dropout)
            .with_bias(self.bias, dims);
        (self.scale, mask)
    }
}

/// Whether [`fused_attention`] runs on `device`: the host-memory CPU backends (flex, ndarray).
pub fn supports(device: &burn::tensor::Device) -> bool {
    use burn::backend::DispatchDevice;
    matches!(device.clone().without_autodiff().as_dispatch(), DispatchDevice::Flex(_) | DispatchDevice::NdArray(_))
}

/// `softmax(scale · q kᵀ, mask) v` per head through the fused kernel: `[B, T, h, dk]`,
/// `[B, S, h, dk]`, `[B, S, h, dv]` -> `[B, T, h, dv]` (heads last). Differentiable. Only where
/// [`supports`] says.
pub fn fused_attention(query: Tensor<4>, key: Tensor<4>, value: Tensor<4>, call: FusedCall) -> Tensor<4> {
    let output = <Dispatch as FusedAttentionBackend>::fused_attention(
        query.into_dispatch(),
        key.into_dispatch(),
        value.into_dispatch(),
        call,
    );
    Tensor::from_dispatch(output) // [B, T, h, dv]
}

/// Self-attention through the fused kernel from one packed projection `qkv: [B, T, h·(dk + dk +
/// dv)]`: the query, key and value side by side in each row (torch's `in_proj` order), read in
/// place, so that one product makes all three and their gradients come back as one. Returns
/// `[B, T, h, dv]` (heads last). Differentiable. Only where [`supports`] says.
///
/// # Panics
/// If `qkv`'s last axis is not `h·(2 key_dim + value_dim)`.
pub fn fused_self_attention(
    qkv: Tensor<3>,
    heads: usize,
    key_dim: usize,
    value_dim: usize,
    call: FusedCall,
) -> Tensor<4> {
    let [batch, len, width] = qkv.dims();
    let dims = Dims { batch, heads, query_len: len, source_len: len, key_dim, value_dim };
    assert_eq!(
        width,
        Layout::packed_width(&dims),
        "a packed projection of {heads} heads of {key_dim}, {key_dim} and {value_dim}"
    );
    let output = <Dispatch as FusedAttentionBackend>::fused_self_attention(qkv.into_dispatch(), dims, call);
    Tensor::from_dispatch(output) // [B, T, h, dv]
}

/// Inference only (no gradients flow through it): `softmax(scale · q kᵀ, mask) v` as
/// [`fused_attention`] computes it, and the probabilities `[B, h, T, S]` (before dropout), both
/// from one kernel call. Only where [`supports`] says.
pub fn fused_attention_with_probs(
    query: Tensor<4>,
    key: Tensor<4>,
    value: Tensor<4>,
    call: FusedCall,
) -> (Tensor<4>, Tensor<4>) {
    let (device, dtype) = (query.device(), query.dtype());
    let dims = Dims::of(query.dims(), value.dims());
    let host = |x: Tensor<4>| x.into_data().convert::<f32>().try_into_vec::<f32>().expect("converted to float32");
    let (scale, mask) = call.rule(dims);
    let (output, probs) = kernel::forward_with_probs(&host(query), &host(key), &host(value), dims, scale, mask);
    let tensor = |values: Vec<f32>, shape: [usize; 4]| {
        Tensor::<4>::from_data(TensorData::new(values, shape).convert_dtype(dtype), &device)
    };
    let Dims { batch, heads, query_len, source_len, .. } = dims;
    (tensor(output, dims.output_shape()), tensor(probs, [batch, heads, query_len, source_len])) // [B, T, h, dv], [B, h, T, S]
}

impl BoolMask {
    /// A mask tensor `[Bm, Hm, Tm, S]` whose `true` entries mark `marks`, read to the host in place
    /// where the backend allows ([`HostBoolBackend`]) and compacted ([`BoolMask::compact_bytes`]):
    /// whether it is the causal rule, and what is left of it.
    pub fn read(mask: Tensor<4, Bool>, marks: Marks) -> (bool, Option<Self>) {
        let dims = mask.dims();
        let bytes = <Dispatch as HostBoolBackend>::host_bytes(mask.into_dispatch());
        Self::compact_bytes(dims, &bytes, marks)
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Bool, Device, Tensor, TensorData};

    use crate::mask::{BoolMask, Marks};

    /// The same mask read from flex in place (with and without autodiff), from a view that is not
    /// contiguous (copied in the view's order) and from ndarray, in both polarities.
    #[test]
    fn a_mask_reads_the_same_from_every_backend_and_layout() {
        let values: Vec<bool> = (0..2 * 3 * 5).map(|i| (i * 7) % 3 != 0).collect();
        let negated = |values: &[bool]| values.iter().map(|&v| !v).collect::<Vec<_>>();
        #[allow(deprecated)]
        let devices = [Device::flex(), Device::flex().autodiff(), Device::ndarray()];
        for device in devices {
            let mask = Tensor::<3, Bool>::from_data(TensorData::new(values.clone(), [2, 3, 5]), &device);
            let read = |mask: Tensor<3, Bool>, marks| match BoolMask::read(mask.unsqueeze_dim(1), marks) {
                (false, Some(mask)) => mask,
                other => panic!("{device:?}: no rule in this mask, read as {other:?}"),
            };
            let allowed = read(mask.clone(), Marks::Allowed); // [2, 1, 3, 5]
            assert_eq!((allowed.dims, &allowed.allowed), ([2, 1, 3, 5], &values), "{device:?}");
            assert_eq!(read(mask.clone(), Marks::Blocked).allowed, negated(&values), "{device:?}");
            let transposed = read(mask.swap_dims(1, 2), Marks::Allowed); // [2, 1, 5, 3]
            let expected: Vec<bool> =
                (0..2 * 5 * 3).map(|i| values[(i / 15) * 15 + (i % 3) * 5 + (i / 3) % 5]).collect();
            assert_eq!(transposed.allowed, expected, "{device:?}");
        }
    }

    /// Self-attention from one packed projection against the same call on its three parts
    /// (slices, copied to the kernel): the output, and with autodiff the packed tensor's gradient,
    /// on both CPU backends.
    #[test]
    fn a_packed_projection_attends_as_its_three_parts() {
        use crate::dims::FullyMaskedRows;
        use crate::ops::attention::{FusedCall, fused_attention, fused_self_attention};
        use burn::tensor::{Distribution, Tolerance};

        let (batch, len, heads, key_dim, value_dim) = (2, 19, 3, 5, 2);
        let (keys, width) = (heads * key_dim, heads * (2 * key_dim + value_dim));
        let call = FusedCall {
            scale: 0.4,
            allowed: None,
            causal: true,
            rows: FullyMaskedRows::Zero,
            dropout: None,
            bias: None,
        };
        #[allow(deprecated)]
        let devices = [Device::flex(), Device::flex().autodiff(), Device::ndarray().autodiff()];
        for device in devices {
            let tracked = device.is_autodiff();
            let data = Tensor::<3>::random([batch, len, width], Distribution::Normal(0.0, 1.0), &device).into_data();
            let probe = Tensor::<4>::random([batch, len, heads, value_dim], Distribution::Normal(0.0, 1.0), &device);
            let run = |packed: bool| {
                let qkv = Tensor::<3>::from_data(data.clone(), &device); // [B, T, h·(2dk + dv)]
                let qkv = if tracked { qkv.require_grad() } else { qkv };
                let output = match packed {
                    true => fused_self_attention(qkv.clone(), heads, key_dim, value_dim, call.clone()),
                    false => {
                        let part = |from: usize, to: usize, d: usize| {
                            qkv.clone().slice([0..batch, 0..len, from..to]).reshape([batch, len, heads, d])
                        };
                        let (q, k, v) =
                            (part(0, keys, key_dim), part(keys, 2 * keys, key_dim), part(2 * keys, width, value_dim));
                        fused_attention(q, k, v, call.clone())
                    }
                }; // [B, T, h, dv]
                let grad = tracked.then(|| {
                    let grads = (output.clone() * probe.clone()).sum().backward();
                    qkv.grad(&grads).expect("qkv is tracked").into_data()
                });
                (output.into_data(), grad)
            };
            let ((packed, packed_grad), (parts, parts_grad)) = (run(true), run(false));
            packed.assert_approx_eq::<f32>(&parts, Tolerance::absolute(1e-6));
            assert_eq!(packed_grad.is_some(), tracked, "{device:?}");
            if let (Some(packed), Some(parts)) = (packed_grad, parts_grad) {
                assert_eq!(packed.shape(), parts.shape(), "{device:?}");
                packed.assert_approx_eq::<f32>(&parts, Tolerance::absolute(1e-6));
            }
        }
    }
}
