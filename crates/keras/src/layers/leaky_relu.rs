//! `keras.layers.LeakyReLU(negative_slope)`. It supports masking. torch: `F.leaky_relu`.

use burn::module::Module;
use burn::tensor::activation as act;

use super::{Build, Call, KerasLayer, keep_mask};
use crate::torch::{TorchCall, py_float};
use crate::value::{Value, map_rank};
use model::error::Result;

#[derive(Module, Debug)]
pub struct LeakyReLU {
    pub negative_slope: f64,
}

impl KerasLayer for LeakyReLU {
    fn build(layer: &mut Build) -> Result<Self> {
        Ok(Self { negative_slope: layer.args.take_f64("negative_slope", 0.3)? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let y = map_rank!(x, t => act::leaky_relu(t, self.negative_slope));
        Ok(vec![keep_mask(Value::float(y), call)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("F.leaky_relu({x}, negative_slope={})", py_float(self.negative_slope)), &call.previous_mask());
        Ok("F.leaky_relu".into())
    }
}
