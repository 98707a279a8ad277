//! `keras.layers.Dropout(rate)` and `SpatialDropout1D(rate)` (whole channels): in training,
//! zero each value (or channel) with probability `rate` and scale the rest by `1 / (1 - rate)`;
//! the identity otherwise. Both support masking. torch: the prelude's `dropout` (its
//! `keras_dropout` in training) and `spatial_dropout1d`.

use burn::module::Module;
use burn::tensor::Distribution;

use super::{Build, Call, KerasLayer, keep_mask, random};
use crate::torch::{TorchCall, py_float};
use crate::value::{Binary, DynTensor, Unary, Value};
use model::error::Result;

#[derive(Module, Debug)]
pub struct Dropout {
    pub rate: f64,
    /// `SpatialDropout1D`: one draw per sequence and channel.
    pub spatial: bool,
}

impl KerasLayer for Dropout {
    fn build(layer: &mut Build) -> Result<Self> {
        let spatial = layer.class() == "SpatialDropout1D";
        let args = &mut layer.args;
        if !args.take("noise_shape").is_null() {
            return Err(args.error("noise_shape: only the default (None) is supported"));
        }
        Ok(Self { rate: args.take_f64("rate", 0.0)?, spatial })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let rate = self.rate;
        let y = if call.training() && rate > 0.0 {
            let shape = x.shape();
            let noise_shape = if self.spatial { vec![shape[0], 1, shape[shape.len() - 1]] } else { shape.clone() };
            let keep = random(&noise_shape, Distribution::Bernoulli(1.0 - rate), &x.device())?;
            DynTensor::binary(Binary::Multiply, x, keep.map(Unary::Scale((1.0 / (1.0 - rate)) as f32)))?
        } else {
            x
        };
        Ok(vec![keep_mask(Value::float(y), call)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let function = if self.spatial { "spatial_dropout1d" } else { "dropout" };
        let y = format!("{function}({x}, rate={}, training=self.training)", py_float(self.rate));
        call.assign(&y, &call.previous_mask());
        Ok("dropout (identity in eval)".into())
    }
}
