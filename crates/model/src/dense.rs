//! Dense layers built from explicit weights, and Keras' Glorot-uniform initialiser.

use burn::module::Param;
use burn::nn::{Initializer, Linear};
use burn::tensor::{Device, Tensor};

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

/// A `[rows, cols]` Linear initialised as Keras initialises the `EinsumDense` whose kernel has
/// `kernel_shape` (its row-major flattening): Glorot-uniform kernel, zero bias.
///
/// Keras computes the fans over the kernel's own axes (`receptive = prod(shape[:-2])`,
/// `fan_in = shape[-2] * receptive`, `fan_out = shape[-1] * receptive`), which is not the fans of
/// the flattened matrix: for a query kernel `(D, h, k)` the limit is `sqrt(6 / (D * (h + k)))`.
pub fn keras_glorot_linear(kernel_shape: &[usize], rows: usize, cols: usize, use_bias: bool, device: &Device) -> Linear {
    debug_assert_eq!(kernel_shape.iter().product::<usize>(), rows * cols);
    let (fan_in, fan_out) = keras_fans(kernel_shape);
    let limit = (6.0 / (fan_in + fan_out) as f64).sqrt();
    let weight = Initializer::Uniform { min: -limit, max: limit }.init([rows, cols], device);
    let bias = use_bias.then(|| Initializer::Zeros.init([cols], device));
    Linear { weight, bias }
}

/// Keras' `compute_fans`.
pub fn keras_fans(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [n] => (*n, *n),
        [i, o] => (*i, *o),
        [lead @ .., i, o] => {
            let receptive: usize = lead.iter().product();
            (i * receptive, o * receptive)
        }
    }
}
