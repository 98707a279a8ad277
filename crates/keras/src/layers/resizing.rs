//! `keras.layers.Resizing(height, width, interpolation, crop_to_aspect_ratio, data_format)`:
//! images resized as TensorFlow's `tf.image.resize` does ([`super::resize`]: bilinear or nearest,
//! half-pixel centres, no antialiasing), after a centred crop to the target's aspect ratio when
//! asked. `pad_to_aspect_ratio` and the other interpolations are refused by name. It does not
//! support masking. torch: the prelude's `resize` (TensorFlow's arithmetic).

use burn::module::Module;

use super::resize::{aspect_crop, bilinear_axis, nearest_axis};
use super::{Build, Call, KerasLayer};
use crate::torch::{PyCall, TorchCall, py_str};
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct Resizing {
    pub height: usize,
    pub width: usize,
    /// `interpolation="bilinear"`; else `nearest`.
    pub bilinear: bool,
    pub crop_to_aspect_ratio: bool,
    pub channels_last: bool,
}

impl KerasLayer for Resizing {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        let height = args.take_usize("height", None)?;
        let width = args.take_usize("width", None)?;
        let bilinear = args.take_choice("interpolation", "bilinear", &["bilinear", "nearest"])? == "bilinear";
        let crop_to_aspect_ratio = args.take_bool("crop_to_aspect_ratio", false)?;
        for refused in ["pad_to_aspect_ratio", "antialias"] {
            if args.take_bool(refused, false)? {
                return Err(args.error(format!("{refused} = true is not supported")));
            }
        }
        args.take("fill_mode"); // used by pad_to_aspect_ratio only
        args.take("fill_value");
        Ok(Self { height, width, bilinear, crop_to_aspect_ratio, channels_last: args.take_channels_last()? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let mut x = call.tensor(0, "inputs")?.tensor;
        let shape = x.shape();
        if shape.len() != 4 {
            return Err(call.error(format!("an input of shape {shape:?}; Resizing takes a batch of images")));
        }
        let first = if self.channels_last { 1 } else { 2 };
        if self.crop_to_aspect_ratio {
            let boxes = aspect_crop(shape[first], shape[first + 1], self.height, self.width);
            for (axis, (start, size)) in boxes.into_iter().enumerate() {
                x = x.slice_axis(first + axis, start, start + size, 1);
            }
        }
        // The width first, as TensorFlow interpolates.
        for (axis, size) in [self.height, self.width].into_iter().enumerate().rev() {
            x = if self.bilinear { bilinear_axis(x, first + axis, size)? } else { nearest_axis(x, first + axis, size)? };
        }
        Ok(vec![Value::float(x)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let y = PyCall::new("resize")
            .arg(format!("{x}.float()"))
            .kw("height", self.height)
            .kw("width", self.width)
            .kw("interpolation", py_str(if self.bilinear { "bilinear" } else { "nearest" }))
            .kw_if(self.crop_to_aspect_ratio, "crop_to_aspect_ratio", "True")
            .kw_if(!self.channels_last, "channels_last", "False")
            .to_string();
        call.assign(&y, "None");
        Ok(format!("resize to ({}, {})", self.height, self.width))
    }
}
