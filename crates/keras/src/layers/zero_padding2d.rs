//! `keras.layers.ZeroPadding2D(padding, data_format)`: zeros around the height and width,
//! `((top, bottom), (left, right))`. It does not support masking. torch: `F.pad`.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::TorchCall;
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct ZeroPadding2D {
    /// `(before, after)` for the height, then the width.
    #[module(skip)]
    pub padding: Vec<(usize, usize)>,
    pub channels_last: bool,
}

impl KerasLayer for ZeroPadding2D {
    fn build(layer: &mut Build) -> Result<Self> {
        let padding = layer.args.take_pairs("padding", 2, 1)?;
        Ok(Self { padding, channels_last: layer.args.take_channels_last()? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let mut x = call.tensor(0, "inputs")?.tensor;
        if x.rank() != 4 {
            return Err(call.error(format!("an input of shape {:?}; ZeroPadding2D takes rank 4", x.shape())));
        }
        let first = if self.channels_last { 1 } else { 2 };
        for (axis, &(before, after)) in self.padding.iter().enumerate() {
            x = x.pad_axis(first + axis, before, after, 0.0)?;
        }
        Ok(vec![Value::float(x)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let [(top, bottom), (left, right)] = [self.padding[0], self.padding[1]];
        // F.pad lists the last axis first.
        let pad = if self.channels_last {
            format!("(0, 0, {left}, {right}, {top}, {bottom})")
        } else {
            format!("({left}, {right}, {top}, {bottom})")
        };
        call.assign(&format!("F.pad({x}, {pad})"), "None");
        Ok("F.pad".into())
    }
}
