//! `keras.layers.MaxPooling1D` and `AveragePooling1D(pool_size, strides, padding, data_format)`.
//!
//! A window is `pool_size` steps, `strides` apart. `valid` keeps whole windows; `same` gives
//! `ceil(L / s)` windows over an input padded TensorFlow's way (the smaller half first), and
//! padding never counts: a max ignores it, an average divides by the steps it covered. Neither
//! supports masking. torch: the prelude's `max_pooling1d` and `average_pooling1d`.

use burn::module::Module;

use super::{Build, Call, KerasLayer, same_padding};
use crate::torch::{PyCall, TorchCall, py_str};
use crate::value::{Binary, DynTensor, Value};
use model::error::Result;

#[derive(Module, Debug)]
pub struct Pooling1D {
    /// `MaxPooling1D`; else `AveragePooling1D`.
    pub max: bool,
    pub pool: usize,
    pub stride: usize,
    /// `padding="same"`; else `valid`.
    pub same: bool,
    pub channels_last: bool,
}

impl KerasLayer for Pooling1D {
    fn build(layer: &mut Build) -> Result<Self> {
        let max = layer.class() == "MaxPooling1D";
        let args = &mut layer.args;
        let pool = args.take_usize("pool_size", Some(2))?;
        let stride = args.take_opt_usize("strides")?.unwrap_or(pool);
        let same = args.take_choice("padding", "valid", &["valid", "same"])? == "same";
        Ok(Self { max, pool, stride, same, channels_last: args.take_channels_last()? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        if x.rank() != 3 {
            return Err(call.error(format!("an input of shape {:?}; 1-D pooling takes [B, L, C]", x.shape())));
        }
        let steps_axis = if self.channels_last { 1 } else { 2 };
        let y = window(x, steps_axis, self.max, self.pool, self.stride, self.same).map_err(|e| call.error(e))?;
        Ok(vec![Value::float(y)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let y = PyCall::new(if self.max { "max_pooling1d" } else { "average_pooling1d" })
            .arg(x)
            .kw("pool_size", self.pool)
            .kw("strides", self.stride)
            .kw("padding", py_str(if self.same { "same" } else { "valid" }))
            .kw_if(!self.channels_last, "channels_last", "False")
            .to_string();
        call.assign(&y, "None");
        Ok(format!("{} pooling, TensorFlow's padding", if self.max { "max" } else { "average" }))
    }
}

/// Windows of `pool` steps along `axis`, `stride` apart, reduced by max or mean.
pub fn window(x: DynTensor, axis: usize, max: bool, pool: usize, stride: usize, same: bool) -> Result<DynTensor, String> {
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
