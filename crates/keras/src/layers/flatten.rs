//! `keras.layers.Flatten(data_format)`: every axis but the batch's as one; channels-first
//! inputs are moved to channels-last first. It does not support masking.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::TorchCall;
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct Flatten {
    pub channels_last: bool,
}

impl KerasLayer for Flatten {
    fn build(layer: &mut Build) -> Result<Self> {
        Ok(Self { channels_last: layer.args.take_channels_last()? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?;
        let shape = x.shape();
        let mut t = x.tensor;
        if !self.channels_last && shape.len() > 2 {
            let order: Vec<usize> = std::iter::once(0).chain(2..shape.len()).chain(std::iter::once(1)).collect();
            t = t.permute(&order)?;
        }
        Ok(vec![Value::float(t.reshape(&[shape[0], shape[1..].iter().product()])?)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let y = if self.channels_last {
            format!("torch.flatten({x}, 1)")
        } else {
            format!(
                "torch.flatten({x}.permute(0, *range(2, {x}.dim()), 1), 1) if {x}.dim() > 2 else torch.flatten({x}, 1)"
            )
        };
        call.assign(&y, "None");
        Ok("torch.flatten".into())
    }
}
