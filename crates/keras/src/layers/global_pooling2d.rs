//! `keras.layers.GlobalAveragePooling2D` and `GlobalMaxPooling2D(data_format, keepdims)`: the mean
//! or the maximum over height and width. Neither supports masking. torch: `mean` / `amax`.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::{TorchCall, py_bool};
use crate::value::{Reduce, Value};
use model::error::Result;

#[derive(Module, Debug)]
pub struct GlobalPooling2D {
    /// `GlobalMaxPooling2D`; else `GlobalAveragePooling2D`.
    pub max: bool,
    pub channels_last: bool,
    pub keepdims: bool,
}

impl GlobalPooling2D {
    fn axes(&self) -> [usize; 2] {
        if self.channels_last { [1, 2] } else { [2, 3] }
    }
}

impl KerasLayer for GlobalPooling2D {
    fn build(layer: &mut Build) -> Result<Self> {
        let max = layer.class() == "GlobalMaxPooling2D";
        let args = &mut layer.args;
        Ok(Self { max, channels_last: args.take_channels_last()?, keepdims: args.take_bool("keepdims", false)? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        if x.rank() != 4 {
            return Err(call.error(format!("an input of shape {:?}; 2-D pooling takes [B, H, W, C]", x.shape())));
        }
        let kind = if self.max { Reduce::Max } else { Reduce::Mean };
        Ok(vec![Value::float(x.reduce(kind, &self.axes(), self.keepdims)?)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let function = if self.max { "torch.amax" } else { "torch.mean" };
        let axes = self.axes();
        call.assign(&format!("{function}({x}, dim=({}, {}), keepdim={})", axes[0], axes[1], py_bool(self.keepdims)), "None");
        Ok(function.into())
    }
}
