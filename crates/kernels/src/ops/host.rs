//! The CPU backends' float tensors as float32 slices in host memory, for the kernel and the GEMM,
//! and their boolean tensors (masks) as `bool`s.
//!
//! burn's `into_data` copies a tensor that is shared (a layer's weight, an input that is also
//! returned, a projection read by three others) twice: once out of the shared buffer, once more
//! to realign it. At the projected model's 8,512,256,8x32 row those copies and their page faults
//! were an eighth of the forward pass. On flex a contiguous float32 tensor is read in place: the
//! slice borrows the tensor's reference-counted buffer, which the backward pass may keep too.

#![allow(deprecated)] // NdArray: deprecated in burn 0.22, still one of this project's backends.

use std::ops::Deref;

use burn::backend::autodiff::NodeId;
use burn::backend::autodiff::checkpoint::strategy::CheckpointStrategy;
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::Ops;
use burn::backend::flex::FlexTensor;
use burn::backend::tensor::{BoolTensor, FloatTensor};
use burn::backend::{Autodiff, Backend, Flex, NdArray, TensorMetadata, backend_extension};
use burn::tensor::{BoolStore, DType, TensorData};

/// A float tensor's values as float32, row-major, and its shape.
#[derive(Debug, Clone)]
pub struct HostValues {
    values: Values,
    pub shape: Vec<usize>,
}

#[derive(Debug, Clone)]
enum Values {
    Owned(Vec<f32>),
    /// A contiguous float32 flex tensor, read in place.
    Flex(FlexTensor),
}

impl Deref for HostValues {
    type Target = [f32];

    fn deref(&self) -> &[f32] {
        match &self.values {
            Values::Owned(values) => values,
            Values::Flex(tensor) => tensor.as_slice::<f32>().expect("checked contiguous float32 when built"),
        }
    }
}

impl HostValues {
    /// A copy through `TensorData`, converted to float32.
    fn from_data(data: TensorData) -> Self {
        let shape = data.shape().to_vec();
        let values = data.convert::<f32>().try_into_vec::<f32>().expect("converted to float32");
        Self { values: Values::Owned(values), shape }
    }
}

/// A backend whose tensors live in host memory: its float tensors read as float32 slices and
/// float32 values made into its tensors, each without a copy where the backend allows.
pub trait HostBackend: Backend {
    /// `tensor`'s values as float32 (a copy unless the backend can lend its buffer).
    fn host_values(tensor: FloatTensor<Self>) -> HostValues {
        HostValues::from_data(
            pollster::block_on(Self::float_into_data(tensor)).expect("a host-memory tensor can always be read"),
        )
    }

    /// A tensor of `values` (row-major `shape`) in `dtype` on `device`; float32 moves the buffer.
    fn from_host(values: Vec<f32>, shape: &[usize], dtype: DType, device: &Self::Device) -> FloatTensor<Self> {
        Self::float_from_data(TensorData::new(values, shape.to_vec()).convert_dtype(dtype), device)
    }
}

impl HostBackend for Flex {
    fn host_values(tensor: FloatTensor<Self>) -> HostValues {
        match tensor.dtype() == DType::F32 && tensor.as_slice::<f32>().is_some() {
            true => HostValues { shape: tensor.shape().to_vec(), values: Values::Flex(tensor) },
            false => HostValues::from_data(tensor.into_data()),
        }
    }
}

impl HostBackend for NdArray {}

/// A backward step's output gradient on the host, with the device and dtype that the gradients it
/// yields for the step's inputs take.
pub(crate) struct OutputGrad<B: Backend> {
    pub values: HostValues,
    device: B::Device,
    dtype: DType,
}

impl<B: HostBackend> OutputGrad<B> {
    /// The output gradient of `ops`, consumed from `grads` (read in place where `B` allows).
    pub(crate) fn consume<S, const N: usize>(grads: &mut Gradients, ops: &Ops<S, N>) -> Self {
        let grad = grads.consume::<B>(&ops.node);
        let (device, dtype) = (grad.device(), grad.dtype());
        Self { values: B::host_values(grad), device, dtype }
    }

    /// Registers `values` (row-major `shape`) as node `id`'s gradient.
    pub(crate) fn register(&self, grads: &mut Gradients, id: NodeId, values: Vec<f32>, shape: &[usize]) {
        grads.register::<B>(id, B::from_host(values, shape, self.dtype, &self.device));
    }
}

/// A boolean tensor's entries on the host, row-major, one byte each (0 = false): flex's contiguous
/// buffer read in place, any other through `into_data`, which first copies a shared tensor out of
/// its buffer (a mask reused across calls, as Keras users pass one, is shared: 0.29 ms of copying
/// for the seed's padding mask, `[32, 1, 136, 136]`). Bytes, not `bool`s: at `[4096, 4096]`
/// turning them into a `Vec<bool>` took 1.1 ms a call, and most masks compact to a rule or a
/// row per slice without it ([`crate::BoolMask::read`]).
#[backend_extension(Flex, NdArray, Autodiff)]
pub trait HostBoolBackend: Backend {
    fn host_bytes(tensor: BoolTensor<Self>) -> HostBytes;
}

/// [`HostBoolBackend::host_bytes`]' answer: the entries in place, or a copy.
pub enum HostBytes {
    /// A contiguous flex tensor of one-byte booleans and the range of its bytes that holds it.
    Flex(FlexTensor, std::ops::Range<usize>),
    Owned(Vec<u8>),
}

impl Deref for HostBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match self {
            HostBytes::Flex(tensor, range) => &tensor.bytes()[range.clone()],
            HostBytes::Owned(bytes) => bytes,
        }
    }
}

/// Whether booleans of `dtype` are stored one byte each (0 or 1).
fn one_byte(dtype: DType) -> bool {
    matches!(dtype, DType::Bool(BoolStore::Native | BoolStore::U8))
}

fn bytes_of(data: TensorData) -> HostBytes {
    HostBytes::Owned(match one_byte(data.dtype()) {
        true => data.into_bytes().to_vec(),
        false => data.iter::<bool>().map(u8::from).collect(),
    })
}

impl HostBoolBackend for Flex {
    fn host_bytes(tensor: FlexTensor) -> HostBytes {
        match tensor.layout().contiguous_offsets() {
            Some((start, end)) if one_byte(tensor.dtype()) => HostBytes::Flex(tensor, start..end),
            _ => bytes_of(tensor.into_data()),
        }
    }
}

impl HostBoolBackend for NdArray {
    fn host_bytes(tensor: BoolTensor<Self>) -> HostBytes {
        use burn::backend::ops::BoolTensorOps;
        bytes_of(pollster::block_on(Self::bool_into_data(tensor)).expect("a host-memory tensor can always be read"))
    }
}

impl<B: HostBoolBackend, C: CheckpointStrategy> HostBoolBackend for Autodiff<B, C> {
    fn host_bytes(tensor: BoolTensor<Self>) -> HostBytes {
        B::host_bytes(tensor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::flex::FlexDevice;

    #[test]
    fn flex_tensors_read_in_place_when_contiguous_and_copied_otherwise() {
        let values: Vec<f32> = (0..24).map(|i| i as f32).collect();
        let tensor = Flex::from_host(values.clone(), &[2, 3, 4], DType::F32, &FlexDevice);
        let shared = Flex::host_values(tensor.clone());
        assert!(matches!(shared.values, Values::Flex(_)));
        assert_eq!((&shared[..], shared.shape.as_slice()), (values.as_slice(), [2, 3, 4].as_slice()));

        // A transposed view is not contiguous: its values come out copied, in the view's order.
        let transposed = Flex::host_values(tensor.transpose(0, 2)); // [4, 3, 2]
        assert!(matches!(transposed.values, Values::Owned(_)));
        assert_eq!(transposed.shape, [4, 3, 2]);
        assert_eq!(transposed[1], values[12]);
        assert_eq!(transposed[2], values[4]);
    }
}
