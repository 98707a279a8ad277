//! `keras.layers.Softmax(axis)` with the mask Keras passes it: masked positions get -1e9 first,
//! and 0 after (a fully masked row attends to nothing).
//! Over several axes: `exp(x - logsumexp(x, axes))`. It supports masking. torch: `F.softmax` over
//! one axis without a mask, else the prelude's `keras_softmax`.

use burn::module::Module;

use super::{Build, Call, KerasLayer, keep_mask};
use crate::torch::{PyCall, TorchCall};
use crate::value::{Binary, DynTensor, Reduce, Unary, Value};
use model::error::Result;

#[derive(Module, Debug)]
pub struct Softmax {
    #[module(skip)]
    pub axes: Vec<i64>,
}

impl KerasLayer for Softmax {
    fn build(layer: &mut Build) -> Result<Self> {
        Ok(Self { axes: layer.args.take_ints("axis")?.unwrap_or(vec![-1]) })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let mut x = call.tensor(0, "inputs")?.tensor;
        let rank = x.rank();
        let device = x.device();
        let mask = match &call.previous_mask {
            Some(mask) if mask.rank() > rank => {
                return Err(call.error(format!(
                    "a mask of shape {:?} for inputs of shape {:?}",
                    mask.shape(),
                    x.shape()
                )));
            }
            // Keras keeps the positions where the mask is True or above 0.5.
            Some(mask) => Some(DynTensor::binary(Binary::Greater, mask.clone(), DynTensor::scalar(0.5, &device))?),
            None => None,
        };
        if let Some(mask) = &mask {
            x = DynTensor::select(mask.clone(), x, DynTensor::scalar(-1e9, &device))?;
        }
        let resolved: Vec<usize> = call.axes(&self.axes, rank)?;
        let y = match resolved.as_slice() {
            [one] => x.softmax(*one),
            many => {
                // exp(x - logsumexp(x, axes)), the maximum taken out first for range
                let max = x.clone().reduce(Reduce::Max, many, true)?;
                let shifted = DynTensor::binary(Binary::Subtract, x, max)?;
                let log_sum = shifted.clone().map(Unary::Exp).reduce(Reduce::Sum, many, true)?.map(Unary::Log);
                DynTensor::binary(Binary::Subtract, shifted, log_sum)?.map(Unary::Exp)
            }
        };
        // Keras 3.15 zeroes the masked positions after it, so a fully masked row gets none.
        let y = match mask {
            Some(mask) => DynTensor::select(mask, y, DynTensor::scalar(0.0, &device))?,
            None => y,
        };
        Ok(vec![keep_mask(Value::float(y), call)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let (x, mask) = (call.input()?, call.previous_mask());
        let y = match self.axes.as_slice() {
            // What the prelude's keras_softmax computes for one axis without a mask.
            [axis] if mask == "None" => format!("F.softmax({x}, dim={axis})"),
            axes => PyCall::new("keras_softmax").arg(x).kw("axis", format!("{axes:?}")).kw_if(mask != "None", "mask", &mask).to_string(),
        };
        call.assign(&y, &mask);
        Ok("softmax with the mask".into())
    }
}
