//! `keras.layers.UnitNormalization(axis)`: `x * min(rsqrt(sum(x^2, axis)), 1e12)` (Keras'
//! `ops.normalize` with order 2 and epsilon 1e-12). It supports masking. torch: the same.

use burn::module::Module;

use super::{Build, Call, KerasLayer, keep_mask};
use crate::torch::TorchCall;
use crate::value::{Binary, DynTensor, Reduce, Unary, Value};
use model::error::Result;

#[derive(Module, Debug)]
pub struct UnitNormalization {
    #[module(skip)]
    pub axes: Vec<i64>,
}

impl KerasLayer for UnitNormalization {
    fn build(layer: &mut Build) -> Result<Self> {
        Ok(Self { axes: layer.args.take_ints("axis")?.unwrap_or(vec![-1]) })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let axes = call.axes(&self.axes, x.rank())?;
        let square_sum = x.clone().map(Unary::Square).reduce(Reduce::Sum, &axes, true)?;
        let inverse = square_sum.map(Unary::Sqrt).map(Unary::PowScalar(-1.0)).map(Unary::Clip(0.0, 1e12));
        Ok(vec![keep_mask(Value::float(DynTensor::binary(Binary::Multiply, x, inverse)?), call)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let inverse = format!("torch.clamp(torch.rsqrt(torch.sum(torch.square({x}), dim={:?}, keepdim=True)), max=1e12)", self.axes);
        call.assign(&format!("{x} * {inverse}"), &call.previous_mask());
        Ok("x * rsqrt(sum(x^2))".into())
    }
}
