//! `keras.layers.ReLU(max_value, negative_slope, threshold)`, step by step as Keras'
//! `ReLU.static_call`. It supports masking. torch: `F.relu` or `F.leaky_relu` where that is all
//! it does, else the prelude's `keras_relu`.

use burn::module::Module;
use burn::tensor::{Tensor, activation as act};

use super::{Build, Call, KerasLayer, keep_mask};
use crate::torch::{PyCall, TorchCall, py_float};
use crate::value::{Value, map_rank};
use model::error::Result;

#[derive(Module, Debug)]
pub struct ReLU {
    #[module(skip)]
    pub max_value: Option<f64>,
    pub negative_slope: f64,
    pub threshold: f64,
}

impl KerasLayer for ReLU {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        Ok(Self {
            max_value: args.take_opt_f64("max_value")?,
            negative_slope: args.take_f64("negative_slope", 0.0)?,
            threshold: args.take_f64("threshold", 0.0)?,
        })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let y = map_rank!(x, t => relu(t, self.max_value, self.negative_slope, self.threshold));
        Ok(vec![keep_mask(Value::float(y), call)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        // The prelude's first steps where they are all it does: torch's relu and leaky_relu.
        let y = match (self.max_value, self.negative_slope, self.threshold) {
            (None, 0.0, 0.0) => format!("F.relu({x})"),
            (None, slope, 0.0) => format!("F.leaky_relu({x}, negative_slope={})", py_float(slope)),
            (max_value, slope, threshold) => PyCall::new("keras_relu")
                .arg(x)
                .kw_if(max_value.is_some(), "max_value", py_float(max_value.unwrap_or(0.0)))
                .kw_if(slope != 0.0, "negative_slope", py_float(slope))
                .kw_if(threshold != 0.0, "threshold", py_float(threshold))
                .to_string(),
        };
        call.assign(&y, &call.previous_mask());
        Ok("ReLU".into())
    }
}

/// Keras' `ReLU.static_call`, step by step.
fn relu<const D: usize>(x: Tensor<D>, max_value: Option<f64>, negative_slope: f64, threshold: f64) -> Tensor<D> {
    if negative_slope != 0.0 && max_value.is_none() && threshold == 0.0 {
        return act::leaky_relu(x, negative_slope);
    }
    let negative_part = (negative_slope != 0.0).then(|| act::relu(x.clone().neg().add_scalar(threshold)));
    let mut y = if threshold != 0.0 {
        x.clone().zeros_like().mask_where(x.clone().greater_elem(threshold), x)
    } else {
        act::relu(x)
    };
    if let Some(max) = max_value {
        y = y.clamp(0.0, max);
    }
    if let Some(negative) = negative_part {
        y = y - negative.mul_scalar(negative_slope);
    }
    y
}
