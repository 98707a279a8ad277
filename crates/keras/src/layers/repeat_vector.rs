//! `keras.layers.RepeatVector(n)`: `[B, D]` to `[B, n, D]`. It does not support masking.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::TorchCall;
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct RepeatVector {
    pub n: usize,
}

impl KerasLayer for RepeatVector {
    fn build(layer: &mut Build) -> Result<Self> {
        Ok(Self { n: layer.args.take_usize("n", None)? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?;
        let shape = x.shape();
        if shape.len() != 2 {
            return Err(call.error(format!("an input of shape {shape:?}; RepeatVector takes [B, D]")));
        }
        Ok(vec![Value::float(x.tensor.expand_dims(1)?.broadcast_to(&[shape[0], self.n, shape[1]])?)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("{x}.unsqueeze(1).expand(-1, {}, -1)", self.n), "None");
        Ok("repeat".into())
    }
}
