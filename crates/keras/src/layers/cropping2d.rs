//! `keras.layers.Cropping2D(cropping, data_format)`: rows and columns removed from the edges,
//! `((top, bottom), (left, right))`. It does not support masking. torch: slicing.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::TorchCall;
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct Cropping2D {
    /// `(start, end)` for the height, then the width.
    #[module(skip)]
    pub cropping: Vec<(usize, usize)>,
    pub channels_last: bool,
}

impl KerasLayer for Cropping2D {
    fn build(layer: &mut Build) -> Result<Self> {
        let cropping = layer.args.take_pairs("cropping", 2, 0)?;
        Ok(Self { cropping, channels_last: layer.args.take_channels_last()? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let mut x = call.tensor(0, "inputs")?.tensor;
        let shape = x.shape();
        let first = if self.channels_last { 1 } else { 2 };
        if shape.len() != 4 || self.cropping.iter().enumerate().any(|(a, &(s, e))| s + e >= shape[first + a]) {
            return Err(call.error(format!(
                "cropping {:?} of an input of shape {shape:?}: Keras needs rank 4 and fewer rows and columns cropped than there are",
                self.cropping
            )));
        }
        for (axis, &(start, end)) in self.cropping.iter().enumerate() {
            let length = shape[first + axis];
            x = x.slice_axis(first + axis, start, length - end, 1);
        }
        Ok(vec![Value::float(x)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let range = |(start, end): (usize, usize)| if end == 0 { format!("{start}:") } else { format!("{start}:-{end}") };
        let (rows, columns) = (range(self.cropping[0]), range(self.cropping[1]));
        let y = if self.channels_last { format!("{x}[:, {rows}, {columns}, :]") } else { format!("{x}[:, :, {rows}, {columns}]") };
        call.assign(&y, "None");
        Ok("slicing".into())
    }
}
