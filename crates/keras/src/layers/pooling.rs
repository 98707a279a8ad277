//! Pooling over the steps axis: `MaxPooling1D`, `AveragePooling1D`, and their global forms.
//!
//! A window is `pool_size` steps, `strides` apart. `valid` keeps whole windows; `same` gives
//! `ceil(L / s)` windows over an input padded TensorFlow's way (the smaller half first), and
//! padding never counts: a max ignores it, an average divides by the steps it covered.
//! `GlobalAveragePooling1D` averages over the unmasked steps only.

use super::{Call, same_padding};
use model::error::Result;
use crate::config::LayerArgs;
use crate::value::{Binary, DynTensor, Reduce, Value};

#[derive(Debug, Clone)]
pub enum Pooling {
    Window { max: bool, pool: usize, stride: usize, same: bool, channels_last: bool },
    Global { max: bool, channels_last: bool, keepdims: bool },
}

impl Pooling {
    pub fn build(class: &str, args: &mut LayerArgs) -> Result<Option<Self>> {
        Ok(Some(match class {
            "MaxPooling1D" | "AveragePooling1D" => {
                let pool = args.take_usize("pool_size", Some(2))?;
                let stride = args.take_opt_usize("strides")?.unwrap_or(pool);
                let same = args.take_choice("padding", "valid", &["valid", "same"])? == "same";
                Self::Window {
                    max: class == "MaxPooling1D",
                    pool,
                    stride,
                    same,
                    channels_last: args.take_channels_last()?,
                }
            }
            "GlobalAveragePooling1D" | "GlobalMaxPooling1D" => Self::Global {
                max: class == "GlobalMaxPooling1D",
                channels_last: args.take_channels_last()?,
                keepdims: args.take_bool("keepdims", false)?,
            },
            _ => return Ok(None),
        }))
    }

    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        if x.rank() != 3 {
            return Err(call.error(format!("an input of shape {:?}; 1-D pooling takes [B, L, C]", x.shape())));
        }
        // Neither kind hands a mask on (GlobalAveragePooling1D consumes it).
        match *self {
            Self::Window { max, pool, stride, same, channels_last } => {
                let steps_axis = if channels_last { 1 } else { 2 };
                Ok(vec![Value::float(window(x, steps_axis, max, pool, stride, same).map_err(|e| call.error(e))?)])
            }
            Self::Global { max, channels_last, keepdims } => {
                let steps_axis = if channels_last { 1 } else { 2 };
                let y = match (&call.previous_mask, max) {
                    (Some(mask), false) => {
                        // sum(where(mask, x, 0)) / sum(mask) over the steps
                        let mask = mask.clone().expand_dims(if channels_last { 2 } else { 1 })?;
                        let kept = DynTensor::binary(Binary::Multiply, x, mask.clone())?;
                        let total = kept.reduce(Reduce::Sum, &[steps_axis], keepdims)?;
                        let count = mask.reduce(Reduce::Sum, &[steps_axis], keepdims)?;
                        DynTensor::binary(Binary::Divide, total, count)?
                    }
                    (_, false) => x.reduce(Reduce::Mean, &[steps_axis], keepdims)?,
                    (_, true) => x.reduce(Reduce::Max, &[steps_axis], keepdims)?,
                };
                Ok(vec![Value::float(y)])
            }
        }
    }
}

/// Windows of `pool` steps along `axis`, `stride` apart, reduced by max or mean.
fn window(x: DynTensor, axis: usize, max: bool, pool: usize, stride: usize, same: bool) -> Result<DynTensor, String> {
    let length = x.shape()[axis];
    let (out, left, right) = if same {
        same_padding(length, pool, stride)
    } else {
        if length < pool {
            return Err(format!("{length} steps, fewer than pool_size {pool}"));
        }
        ((length - pool) / stride + 1, 0, 0)
    };
    let device = x.device();
    // Padding never wins a max and never counts in a mean.
    let fill = if max { f32::MIN } else { 0.0 };
    let padded = x.pad_axis(axis, left, right, fill).map_err(|e| e.to_string())?;
    let counts = {
        let mut shape = vec![1; padded.rank()];
        shape[axis] = length;
        DynTensor::full(&shape, 1.0, &device).pad_axis(axis, left, right, 0.0).map_err(|e| e.to_string())?
    };
    let span = (out - 1) * stride + 1;
    let mut acc: Option<(DynTensor, DynTensor)> = None;
    for offset in 0..pool {
        let part = padded.clone().slice_axis(axis, offset, offset + span, stride);
        let count = counts.clone().slice_axis(axis, offset, offset + span, stride);
        acc = Some(match acc {
            None => (part, count),
            Some((a, c)) => {
                let op = if max { Binary::Maximum } else { Binary::Add };
                (
                    DynTensor::binary(op, a, part).map_err(|e| e.to_string())?,
                    DynTensor::binary(Binary::Add, c, count).map_err(|e| e.to_string())?,
                )
            }
        });
    }
    let (reduced, count) = acc.ok_or("pool_size 0")?;
    if max { Ok(reduced) } else { DynTensor::binary(Binary::Divide, reduced, count).map_err(|e| e.to_string()) }
}
