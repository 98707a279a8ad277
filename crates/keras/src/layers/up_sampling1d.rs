//! `keras.layers.UpSampling1D(size)`: every step repeated `size` times (`ops.repeat` on axis 1),
//! `[B, L, C]` to `[B, size L, C]`. It does not support masking. torch: `repeat_interleave`.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::TorchCall;
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct UpSampling1D {
    pub size: usize,
}

impl KerasLayer for UpSampling1D {
    fn build(layer: &mut Build) -> Result<Self> {
        Ok(Self { size: layer.args.take_usize("size", Some(2))? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        if x.rank() != 3 {
            return Err(call.error(format!("an input of shape {:?}; UpSampling1D takes [B, L, C]", x.shape())));
        }
        Ok(vec![Value::float(x.repeat_axis(1, self.size)?)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("torch.repeat_interleave({x}, {}, dim=1)", self.size), "None");
        Ok("torch.repeat_interleave".into())
    }
}
