//! `keras.layers.Dropout(rate, noise_shape)` and `SpatialDropout1D(rate)` (whole channels): in
//! training, zero each value (or each entry of `noise_shape`, broadcast over the axes where it
//! has 1, as EfficientNet's blocks drop whole samples) with probability `rate` and scale the rest
//! by `1 / (1 - rate)`; the identity otherwise. Both support masking. torch: the prelude's
//! `dropout` (its `keras_dropout` in training) and `spatial_dropout1d`.

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
    /// Keras' `noise_shape`: the shape of the draw, `None` where it is the input's size.
    pub noise_shape: Option<Vec<Option<usize>>>,
}

impl KerasLayer for Dropout {
    fn build(layer: &mut Build) -> Result<Self> {
        let spatial = layer.class() == "SpatialDropout1D";
        let args = &mut layer.args;
        let noise_shape = match args.take("noise_shape") {
            serde_json::Value::Null => None,
            serde_json::Value::Array(sizes) => Some(
                sizes
                    .iter()
                    .map(|d| match d {
                        serde_json::Value::Null => Ok(None),
                        d => d.as_u64().map(|d| Some(d as usize)).ok_or(()),
                    })
                    .collect::<std::result::Result<Vec<_>, ()>>()
                    .map_err(|()| args.error(format!("noise_shape = {sizes:?}: sizes or None")))?,
            ),
            other => return Err(args.error(format!("noise_shape = {other}: a list of sizes or None"))),
        };
        Ok(Self { rate: args.take_f64("rate", 0.0)?, spatial, noise_shape })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let rate = self.rate;
        let y = if call.training() && rate > 0.0 {
            let shape = x.shape();
            let noise_shape = match &self.noise_shape {
                _ if self.spatial => vec![shape[0], 1, shape[shape.len() - 1]],
                Some(sizes) if sizes.len() == shape.len() => {
                    sizes.iter().zip(&shape).map(|(d, &size)| d.unwrap_or(size)).collect()
                }
                Some(sizes) => {
                    return Err(call.error(format!("noise_shape {sizes:?} for an input of shape {shape:?}")));
                }
                None => shape.clone(),
            };
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
        let noise_shape = match &self.noise_shape {
            Some(sizes) if !self.spatial => {
                let sizes: Vec<String> = sizes.iter().map(|d| d.map_or("None".into(), |d| d.to_string())).collect();
                format!(", noise_shape=({},)", sizes.join(", "))
            }
            _ => String::new(),
        };
        let y = format!("{function}({x}, rate={}, training=self.training{noise_shape})", py_float(self.rate));
        call.assign(&y, &call.previous_mask());
        Ok("dropout (identity in eval)".into())
    }
}
