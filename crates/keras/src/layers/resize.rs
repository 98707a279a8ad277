//! Image resizing as TensorFlow's `tf.image.resize` computes it (what Keras' `ops.image.resize`
//! runs on its TensorFlow backend): one axis at a time, the width first, with gathers and
//! elementwise arithmetic that any backend runs and autodiff sees.

use model::weights::HostTensor;

use crate::value::{Binary, DynTensor};
use model::error::Result;

/// `x` resized along `axis` to `out` entries by TensorFlow's bilinear rule with half-pixel
/// centres: output `i` reads input position `(i + 0.5) in / out - 0.5`, between its floor
/// (clamped at 0) and its ceiling (clamped at the last entry), as `a + (b - a) * fraction`
/// (TensorFlow's own arithmetic, so that large pixel values round as they do there).
pub fn bilinear_axis(x: DynTensor, axis: usize, out: usize) -> Result<DynTensor> {
    let input = x.shape()[axis];
    // TensorFlow computes the scale and the positions in float32.
    let scale = input as f32 / out as f32;
    let (mut lower, mut upper, mut fraction) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..out {
        let position = (i as f32 + 0.5) * scale - 0.5;
        let floor = position.floor();
        lower.push((floor.max(0.0) as usize).min(input - 1));
        upper.push((position.ceil().max(0.0) as usize).min(input - 1));
        fraction.push(position - floor);
    }
    let mut shape = vec![1; x.rank()];
    shape[axis] = out;
    let fraction = DynTensor::from_host(&HostTensor::new(shape, fraction), &x.device())?;
    let (a, b) = (x.clone().take_axis(axis, &lower)?, x.take_axis(axis, &upper)?);
    let step = DynTensor::binary(Binary::Multiply, DynTensor::binary(Binary::Subtract, b, a.clone())?, fraction)?;
    DynTensor::binary(Binary::Add, a, step)
}

/// `x` resized along `axis` to `out` entries by TensorFlow's nearest-neighbour rule with
/// half-pixel centres: output `i` reads input `min(floor((i + 0.5) in / out), in - 1)`.
pub fn nearest_axis(x: DynTensor, axis: usize, out: usize) -> Result<DynTensor> {
    let input = x.shape()[axis];
    let scale = input as f32 / out as f32;
    let sources: Vec<usize> = (0..out).map(|i| (((i as f32 + 0.5) * scale).floor() as usize).min(input - 1)).collect();
    x.take_axis(axis, &sources)
}

/// The centred window of `(height, width)`'s aspect ratio in an image of `(rows, columns)`, as
/// Keras' `crop_to_aspect_ratio` computes it (float32 divisions truncated to integers): its start
/// and size along each axis.
pub fn aspect_crop(rows: usize, columns: usize, height: usize, width: usize) -> [(usize, usize); 2] {
    let crop_rows = ((columns * height) as f32 / width as f32) as usize;
    let crop_columns = ((rows * width) as f32 / height as f32) as usize;
    let crop_rows = crop_rows.min(rows).max(1);
    let crop_columns = crop_columns.min(columns).max(1);
    [
        (((rows - crop_rows) as f32 / 2.0) as usize, crop_rows),
        (((columns - crop_columns) as f32 / 2.0) as usize, crop_columns),
    ]
}
