//! `keras.layers.Masking(mask_value)`: a step whose features all equal `mask_value` is masked
//! and zeroed (`keep = any(x != mask_value, axis=-1); outputs = x * keep`); the mask is `keep`.
//! torch: the prelude's `masking`.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::{TorchCall, py_float};
use crate::value::{Binary, DynTensor, Reduce, Value};
use model::error::Result;

#[derive(Module, Debug)]
pub struct Masking {
    pub mask_value: f64,
}

impl KerasLayer for Masking {
    fn build(layer: &mut Build) -> Result<Self> {
        Ok(Self { mask_value: layer.args.take_f64("mask_value", 0.0)? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let last = x.rank() - 1;
        let differs =
            DynTensor::binary(Binary::NotEqual, x.clone(), DynTensor::scalar(self.mask_value as f32, &x.device()))?;
        let keep = differs.reduce(Reduce::Any, &[last], true)?;
        let y = DynTensor::binary(Binary::Multiply, x, keep.clone())?;
        let mask = keep.reduce(Reduce::Max, &[last], false)?;
        Ok(vec![Value::float(y).with_mask(Some(mask))])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let i = call.index;
        call.line(format!("x{i}, m{i} = masking({x}, mask_value={})", py_float(self.mask_value)));
        Ok("masking".into())
    }
}
