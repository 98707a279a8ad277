//! `keras.layers.GaussianDropout(rate)`: multiplies by `N(1, sqrt(rate / (1 - rate)))` noise in
//! training; the identity otherwise. It supports masking. torch: the prelude's
//! `gaussian_dropout`.

use burn::module::Module;
use burn::tensor::Distribution;

use super::{Build, Call, KerasLayer, keep_mask, random};
use crate::torch::{TorchCall, py_float};
use crate::value::{Binary, DynTensor, Value};
use model::error::Result;

#[derive(Module, Debug)]
pub struct GaussianDropout {
    pub rate: f64,
}

impl KerasLayer for GaussianDropout {
    fn build(layer: &mut Build) -> Result<Self> {
        Ok(Self { rate: layer.args.take_f64("rate", 0.0)? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let rate = self.rate;
        let y = if call.training() && rate > 0.0 && rate < 1.0 {
            let stddev = (rate / (1.0 - rate)).sqrt();
            let noise = random(&x.shape(), Distribution::Normal(1.0, stddev), &x.device())?;
            DynTensor::binary(Binary::Multiply, x, noise)?
        } else {
            x
        };
        Ok(vec![keep_mask(Value::float(y), call)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("gaussian_dropout({x}, rate={}, training=self.training)", py_float(self.rate)), &call.previous_mask());
        Ok("Gaussian dropout (identity in eval)".into())
    }
}
