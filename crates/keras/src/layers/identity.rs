//! `keras.layers.Identity`: its input, mask included.

use burn::module::Module;

use super::{Build, Call, KerasLayer, keep_mask};
use crate::torch::TorchCall;
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct Identity;

impl KerasLayer for Identity {
    fn build(_layer: &mut Build) -> Result<Self> {
        Ok(Self)
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        Ok(vec![keep_mask(Value::float(x), call)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&x, &call.previous_mask());
        Ok("identity".into())
    }
}
