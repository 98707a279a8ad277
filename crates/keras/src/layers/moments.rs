//! Moments and normalisation in the order of operations Keras' TensorFlow backend uses
//! (`inv = rsqrt(var + eps) * gamma; y = x * inv + (beta - mean * inv)`), shared by the
//! normalisation layers.

use crate::value::{Binary, DynTensor, Reduce, Unary};
use model::error::Result;

/// `1 / sqrt(variance + epsilon)`.
pub fn inverse_deviation(variance: DynTensor, epsilon: f64) -> DynTensor {
    variance.map(Unary::Shift(epsilon as f32)).map(Unary::Sqrt).map(Unary::PowScalar(-1.0))
}

/// Keras' order of operations (TensorFlow's `batch_normalization`):
/// `inv = rsqrt(var + eps) * gamma; y = x * inv + (beta - mean * inv)`.
pub fn normalize(
    x: DynTensor,
    mean: DynTensor,
    variance: DynTensor,
    epsilon: f64,
    gamma: Option<DynTensor>,
    beta: Option<DynTensor>,
) -> Result<DynTensor> {
    let mut inv = inverse_deviation(variance, epsilon);
    if let Some(g) = gamma {
        inv = DynTensor::binary(Binary::Multiply, inv, g)?;
    }
    let mut offset = DynTensor::binary(Binary::Multiply, mean.map(Unary::Negative), inv.clone())?;
    if let Some(b) = beta {
        offset = DynTensor::binary(Binary::Add, offset, b)?;
    }
    DynTensor::binary(Binary::Add, DynTensor::binary(Binary::Multiply, x, inv)?, offset)
}

/// Mean and (biased) variance over `axes`, kept as size 1; with `weights`, weighted by them.
pub fn moments(x: &DynTensor, axes: &[usize], weights: Option<&DynTensor>) -> Result<(DynTensor, DynTensor)> {
    match weights {
        None => {
            let mean = x.clone().reduce(Reduce::Mean, axes, true)?;
            let centred = DynTensor::binary(Binary::Subtract, x.clone(), mean.clone())?;
            let variance = centred.map(Unary::Square).reduce(Reduce::Mean, axes, true)?;
            Ok((mean, variance))
        }
        Some(w) => {
            let w = w.clone().broadcast_to(&x.shape())?;
            let total = w.clone().reduce(Reduce::Sum, axes, true)?;
            let mean = DynTensor::binary(
                Binary::Divide,
                DynTensor::binary(Binary::Multiply, x.clone(), w.clone())?.reduce(Reduce::Sum, axes, true)?,
                total.clone(),
            )?;
            let centred = DynTensor::binary(Binary::Subtract, x.clone(), mean.clone())?;
            let weighted = DynTensor::binary(Binary::Multiply, centred.map(Unary::Square), w)?;
            let variance = DynTensor::binary(Binary::Divide, weighted.reduce(Reduce::Sum, axes, true)?, total)?;
            Ok((mean, variance))
        }
    }
}
