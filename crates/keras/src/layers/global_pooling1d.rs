//! `keras.layers.GlobalAveragePooling1D` and `GlobalMaxPooling1D(data_format, keepdims)` over
//! the steps axis. The average is over the unmasked steps only (it consumes the mask); neither
//! hands a mask on. torch: `torch.amax`, `torch.mean` or, with a mask, the prelude's
//! `global_average_pooling1d`.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::{PyCall, TorchCall, py_bool};
use crate::value::{Binary, DynTensor, Reduce, Value};
use model::error::Result;

#[derive(Module, Debug)]
pub struct GlobalPooling1D {
    /// `GlobalMaxPooling1D`; else `GlobalAveragePooling1D`.
    pub max: bool,
    pub channels_last: bool,
    pub keepdims: bool,
}

impl KerasLayer for GlobalPooling1D {
    fn build(layer: &mut Build) -> Result<Self> {
        let max = layer.class() == "GlobalMaxPooling1D";
        let args = &mut layer.args;
        Ok(Self { max, channels_last: args.take_channels_last()?, keepdims: args.take_bool("keepdims", false)? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        if x.rank() != 3 {
            return Err(call.error(format!("an input of shape {:?}; 1-D pooling takes [B, L, C]", x.shape())));
        }
        let (channels_last, keepdims) = (self.channels_last, self.keepdims);
        let steps_axis = if channels_last { 1 } else { 2 };
        let y = match (&call.previous_mask, self.max) {
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

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let keepdims = py_bool(self.keepdims);
        let dim = if self.channels_last { 1 } else { 2 };
        let mask = call.previous_mask();
        if self.max || mask == "None" {
            // The prelude's global_average_pooling1d without a mask is this mean.
            let function = if self.max { "torch.amax" } else { "torch.mean" };
            call.assign(&format!("{function}({x}, dim={dim}, keepdim={keepdims})"), "None");
            Ok(format!("{function} over the steps"))
        } else {
            let y = PyCall::new("global_average_pooling1d")
                .arg(x)
                .kw("mask", mask)
                .kw_if(self.keepdims, "keepdims", "True")
                .kw_if(!self.channels_last, "channels_last", "False");
            call.assign(&y.to_string(), "None");
            Ok("masked mean over the steps".into())
        }
    }
}
