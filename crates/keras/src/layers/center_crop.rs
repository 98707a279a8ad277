//! `keras.layers.CenterCrop(height, width, data_format)`: the centred `height x width` window
//! (start `(in - size) // 2`); an image smaller than that on either axis is instead cropped to
//! the target's aspect ratio and resized bilinearly (Keras' `smart_resize`). It does not
//! support masking. torch: the prelude's `center_crop` (slicing, or its `resize`).

use burn::module::Module;

use super::resize::{aspect_crop, bilinear_axis};
use super::{Build, Call, KerasLayer};
use crate::torch::{PyCall, TorchCall};
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct CenterCrop {
    pub height: usize,
    pub width: usize,
    pub channels_last: bool,
}

impl KerasLayer for CenterCrop {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        let height = args.take_usize("height", None)?;
        let width = args.take_usize("width", None)?;
        Ok(Self { height, width, channels_last: args.take_channels_last()? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let mut x = call.tensor(0, "inputs")?.tensor;
        let shape = x.shape();
        if shape.len() != 4 {
            return Err(call.error(format!("an input of shape {shape:?}; CenterCrop takes a batch of images")));
        }
        let first = if self.channels_last { 1 } else { 2 };
        let (rows, columns) = (shape[first], shape[first + 1]);
        if rows >= self.height && columns >= self.width {
            for (axis, (length, size)) in [(rows, self.height), (columns, self.width)].into_iter().enumerate() {
                let start = (length - size) / 2;
                x = x.slice_axis(first + axis, start, start + size, 1);
            }
        } else {
            for (axis, (start, size)) in aspect_crop(rows, columns, self.height, self.width).into_iter().enumerate() {
                x = x.slice_axis(first + axis, start, start + size, 1);
            }
            x = bilinear_axis(x, first + 1, self.width)?; // the width first, as TensorFlow
            x = bilinear_axis(x, first, self.height)?;
        }
        Ok(vec![Value::float(x)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let y = PyCall::new("center_crop")
            .arg(format!("{x}.float()"))
            .kw("height", self.height)
            .kw("width", self.width)
            .kw_if(!self.channels_last, "channels_last", "False")
            .to_string();
        call.assign(&y, "None");
        Ok(format!("centre crop to ({}, {})", self.height, self.width))
    }
}
