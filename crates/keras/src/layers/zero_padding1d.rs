//! `keras.layers.ZeroPadding1D(padding, data_format)`: zeros added before and after the steps
//! axis. It does not support masking. torch: `F.pad`.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::TorchCall;
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct ZeroPadding1D {
    pub before: usize,
    pub after: usize,
    pub channels_last: bool,
}

impl KerasLayer for ZeroPadding1D {
    fn build(layer: &mut Build) -> Result<Self> {
        let (before, after) = layer.args.take_pairs("padding", 1, 1)?[0];
        Ok(Self { before, after, channels_last: layer.args.take_channels_last()? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        if x.rank() != 3 {
            return Err(call.error(format!("an input of shape {:?}; ZeroPadding1D takes rank 3", x.shape())));
        }
        let steps = if self.channels_last { 1 } else { 2 };
        Ok(vec![Value::float(x.pad_axis(steps, self.before, self.after, 0.0)?)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let (before, after) = (self.before, self.after);
        // F.pad lists the last axis first.
        let pad = if self.channels_last { format!("(0, 0, {before}, {after})") } else { format!("({before}, {after})") };
        call.assign(&format!("F.pad({x}, {pad})"), "None");
        Ok("F.pad".into())
    }
}
