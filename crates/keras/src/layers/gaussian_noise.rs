//! `keras.layers.GaussianNoise(stddev)`: adds `N(0, stddev)` noise in training; the identity
//! otherwise. It supports masking. torch: the prelude's `gaussian_noise`.

use burn::module::Module;
use burn::tensor::Distribution;

use super::{Build, Call, KerasLayer, keep_mask, random};
use crate::torch::{TorchCall, py_float};
use crate::value::{Binary, DynTensor, Value};
use model::error::Result;

#[derive(Module, Debug)]
pub struct GaussianNoise {
    pub stddev: f64,
}

impl KerasLayer for GaussianNoise {
    fn build(layer: &mut Build) -> Result<Self> {
        Ok(Self { stddev: layer.args.take_f64("stddev", 0.0)? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let y = if call.training() && self.stddev > 0.0 {
            let noise = random(&x.shape(), Distribution::Normal(0.0, self.stddev), &x.device())?;
            DynTensor::binary(Binary::Add, x, noise)?
        } else {
            x
        };
        Ok(vec![keep_mask(Value::float(y), call)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("gaussian_noise({x}, stddev={}, training=self.training)", py_float(self.stddev)), &call.previous_mask());
        Ok("Gaussian noise (identity in eval)".into())
    }
}
