//! `keras.layers.Cropping1D(cropping)`: steps removed from the start and the end of axis 1. It
//! does not support masking. torch: slicing.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::TorchCall;
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct Cropping1D {
    pub start: usize,
    pub end: usize,
}

impl KerasLayer for Cropping1D {
    fn build(layer: &mut Build) -> Result<Self> {
        let (start, end) = layer.args.take_pairs("cropping", 1, 1)?[0];
        Ok(Self { start, end })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let shape = x.shape();
        if shape.len() != 3 || self.start + self.end >= shape[1] {
            return Err(call.error(format!(
                "cropping ({}, {}) of an input of shape {shape:?}: Keras needs rank 3 and fewer steps cropped than there are",
                self.start, self.end
            )));
        }
        Ok(vec![Value::float(x.slice_axis(1, self.start, shape[1] - self.end, 1))])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let end = if self.end == 0 { String::new() } else { format!("-{}", self.end) };
        call.assign(&format!("{x}[:, {}:{end}, :]", self.start), "None");
        Ok("slicing".into())
    }
}
