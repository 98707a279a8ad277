//! `keras.layers.UpSampling2D(size, data_format, interpolation)`: `nearest` repeats every row and
//! column (`ops.repeat`); `bilinear` resizes to `size` times the height and width as TensorFlow's
//! `tf.image.resize` does ([`super::resize`]). It does not support masking. torch:
//! `repeat_interleave`, or the prelude's `resize` (TensorFlow's arithmetic).

use burn::module::Module;

use super::convolution::two_sizes;
use super::resize::bilinear_axis;
use super::{Build, Call, KerasLayer};
use crate::torch::{PyCall, TorchCall};
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct UpSampling2D {
    pub size: [usize; 2],
    pub channels_last: bool,
    /// `interpolation="bilinear"`; else `nearest`.
    pub bilinear: bool,
}

impl KerasLayer for UpSampling2D {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        let size = two_sizes(args.take_ints("size")?, Some([2, 2])).ok_or_else(|| args.error("size: not one or two sizes"))?;
        let bilinear = args.take_choice("interpolation", "nearest", &["nearest", "bilinear"])? == "bilinear";
        Ok(Self { size, channels_last: args.take_channels_last()?, bilinear })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let mut x = call.tensor(0, "inputs")?.tensor;
        let shape = x.shape();
        if shape.len() != 4 {
            return Err(call.error(format!("an input of shape {shape:?}; UpSampling2D takes rank 4")));
        }
        let first = if self.channels_last { 1 } else { 2 };
        // The width first, as TensorFlow interpolates.
        for (axis, &factor) in self.size.iter().enumerate().rev() {
            let axis = first + axis;
            x = if self.bilinear { bilinear_axis(x, axis, shape[axis] * factor)? } else { x.repeat_axis(axis, factor)? };
        }
        Ok(vec![Value::float(x)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let [h, w] = self.size;
        let first = if self.channels_last { 1 } else { 2 };
        let y = if self.bilinear {
            let (rows, columns) = if self.channels_last { (1, 2) } else { (2, 3) };
            PyCall::new("resize")
                .arg(&x)
                .kw("height", format!("{x}.shape[{rows}] * {h}"))
                .kw("width", format!("{x}.shape[{columns}] * {w}"))
                .kw("interpolation", "\"bilinear\"")
                .kw_if(!self.channels_last, "channels_last", "False")
                .to_string()
        } else {
            format!("torch.repeat_interleave(torch.repeat_interleave({x}, {h}, dim={first}), {w}, dim={})", first + 1)
        };
        call.assign(&y, "None");
        Ok(if self.bilinear { "resize, TensorFlow's bilinear" } else { "repeat_interleave" }.into())
    }
}
