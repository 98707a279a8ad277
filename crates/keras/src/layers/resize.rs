//! Image resizing as TensorFlow's `tf.image.resize` computes it (what Keras' `ops.image.resize`
//! runs on its TensorFlow backend): one axis at a time, as a product with an interpolation
//! matrix, so that any backend runs it and autodiff sees it.

use model::weights::HostTensor;

use crate::value::DynTensor;
use model::error::Result;

/// `x` resized along `axis` to `out` entries by TensorFlow's bilinear rule with half-pixel
/// centres: output `i` reads input position `(i + 0.5) in / out - 0.5`, between its floor
/// (clamped at 0) and its ceiling (clamped at the last entry), weighted by the fraction.
pub fn bilinear_axis(x: DynTensor, axis: usize, out: usize) -> Result<DynTensor> {
    let input = x.shape()[axis];
    // TensorFlow computes the scale and the positions in float32.
    let scale = input as f32 / out as f32;
    let mut weights = vec![0.0f32; input * out]; // [in, out]: y = x M
    for i in 0..out {
        let position = (i as f32 + 0.5) * scale - 0.5;
        let floor = position.floor();
        let lerp = position - floor;
        let lower = (floor.max(0.0) as usize).min(input - 1);
        let upper = (position.ceil().max(0.0) as usize).min(input - 1);
        weights[lower * out + i] += 1.0 - lerp;
        weights[upper * out + i] += lerp;
    }
    let matrix = DynTensor::from_host(&HostTensor::new(vec![input, out], weights), &x.device())?;
    along(x, axis, |last| DynTensor::matmul(last, matrix))
}

/// `f` applied with `axis` moved last, then moved back.
fn along(x: DynTensor, axis: usize, f: impl FnOnce(DynTensor) -> Result<DynTensor>) -> Result<DynTensor> {
    let rank = x.rank();
    if axis + 1 == rank {
        return f(x);
    }
    let mut order: Vec<usize> = (0..rank).filter(|&a| a != axis).collect();
    order.push(axis);
    let moved = f(x.permute(&order)?)?;
    let mut inverse = vec![0; rank];
    for (position, &a) in order.iter().enumerate() {
        inverse[a] = position;
    }
    moved.permute(&inverse)
}
