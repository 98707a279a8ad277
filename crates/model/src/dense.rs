//! Dense layers built from explicit weights.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::Tensor;

use crate::weights::HostTensor;

/// `y = x W + b` with `W: [d_in, d_out]` (a Keras `Dense` kernel; torch's weight transposed).
pub fn linear(weight: Tensor<2>, bias: Option<Tensor<1>>) -> Linear {
    Linear { weight: Param::from_tensor(weight), bias: bias.map(Param::from_tensor) }
}

/// Reads a Linear's weight `[d_in, d_out]` and bias `[d_out]` back to the host.
pub fn linear_weights(layer: &Linear) -> (HostTensor, Option<HostTensor>) {
    let weight = HostTensor::from_tensor(layer.weight.val());
    let bias = layer.bias.as_ref().map(|b| HostTensor::from_tensor(b.val()));
    (weight, bias)
}
