//! `keras.layers.MaxPooling2D` and `AveragePooling2D(pool_size, strides, padding, data_format)`:
//! the 1-D window of [`super::pooling1d`] along the height, then the width (a maximum over a
//! rectangle is the maximum of the column maxima; an average that excludes padding is the
//! average of averages, the counts being a product). Neither supports masking. torch: the
//! prelude's `max_pooling2d` and `average_pooling2d`.

use burn::module::Module;

use super::convolution::two_sizes;
use super::pooling1d::window;
use super::{Build, Call, KerasLayer};
use crate::torch::{PyCall, TorchCall, py_str, tuple};
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct Pooling2D {
    /// `MaxPooling2D`; else `AveragePooling2D`.
    pub max: bool,
    pub pool: [usize; 2],
    pub stride: [usize; 2],
    /// `padding="same"`; else `valid`.
    pub same: bool,
    pub channels_last: bool,
}

impl KerasLayer for Pooling2D {
    fn build(layer: &mut Build) -> Result<Self> {
        let max = layer.class() == "MaxPooling2D";
        let args = &mut layer.args;
        let pool =
            two_sizes(args.take_ints("pool_size")?, Some([2, 2])).ok_or_else(|| args.error("pool_size: not one or two sizes"))?;
        let stride =
            two_sizes(args.take_ints("strides")?, Some(pool)).ok_or_else(|| args.error("strides: not one or two sizes"))?;
        let same = args.take_choice("padding", "valid", &["valid", "same"])? == "same";
        Ok(Self { max, pool, stride, same, channels_last: args.take_channels_last()? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        if x.rank() != 4 {
            return Err(call.error(format!("an input of shape {:?}; 2-D pooling takes [B, H, W, C]", x.shape())));
        }
        let first = if self.channels_last { 1 } else { 2 };
        let rows = window(x, first, self.max, self.pool[0], self.stride[0], self.same).map_err(|e| call.error(e))?;
        let y = window(rows, first + 1, self.max, self.pool[1], self.stride[1], self.same).map_err(|e| call.error(e))?;
        Ok(vec![Value::float(y)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let y = PyCall::new(if self.max { "max_pooling2d" } else { "average_pooling2d" })
            .arg(x)
            .kw("pool_size", tuple(&self.pool))
            .kw("strides", tuple(&self.stride))
            .kw("padding", py_str(if self.same { "same" } else { "valid" }))
            .kw_if(!self.channels_last, "channels_last", "False")
            .to_string();
        call.assign(&y, "None");
        Ok(format!("{} pooling, TensorFlow's padding", if self.max { "max" } else { "average" }))
    }
}
