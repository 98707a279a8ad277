//! `keras.layers.Reshape(target_shape)`: the batch axis kept, one entry of the target may be
//! -1. It does not support masking.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::TorchCall;
use crate::value::{Value, resolve_shape};
use model::error::Result;

#[derive(Module, Debug)]
pub struct Reshape {
    #[module(skip)]
    pub target: Vec<i64>,
}

impl KerasLayer for Reshape {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        Ok(Self { target: args.take_ints("target_shape")?.ok_or_else(|| args.error("target_shape is missing"))? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?;
        let shape = x.shape();
        let target = &self.target;
        let Some(per_sample) = resolve_shape(target, shape[1..].iter().product()) else {
            return Err(call.error(format!("cannot reshape {:?} to target_shape {target:?}", &shape[1..])));
        };
        Ok(vec![Value::float(x.tensor.reshape(&[vec![shape[0]], per_sample].concat())?)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let target: String = self.target.iter().map(|d| format!(", {d}")).collect();
        call.assign(&format!("{x}.reshape({x}.shape[0]{target})"), "None");
        Ok("reshape".into())
    }
}
