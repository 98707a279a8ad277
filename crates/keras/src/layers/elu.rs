//! `keras.layers.ELU(alpha)`. It supports masking. torch: the prelude's `keras_elu`.

use burn::module::Module;

use super::{Build, Call, KerasLayer, keep_mask};
use crate::activation::elu;
use crate::torch::{TorchCall, py_float};
use crate::value::{Value, map_rank};
use model::error::Result;

#[derive(Module, Debug)]
pub struct ELU {
    pub alpha: f64,
}

impl KerasLayer for ELU {
    fn build(layer: &mut Build) -> Result<Self> {
        Ok(Self { alpha: layer.args.take_f64("alpha", 1.0)? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let y = map_rank!(x, t => elu(t, self.alpha));
        Ok(vec![keep_mask(Value::float(y), call)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("keras_elu({x}, alpha={})", py_float(self.alpha)), &call.previous_mask());
        Ok("ELU".into())
    }
}
