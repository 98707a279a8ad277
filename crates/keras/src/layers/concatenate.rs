//! `keras.layers.Concatenate(axis)`: its operands (one list) joined along `axis`. Mask (Keras'
//! `Concatenate.compute_mask`): the masks joined along the axis (all-true for an unmasked
//! input), a step kept if any of its joined entries is. torch: `torch.cat`, and the prelude's
//! `concatenate_masks`.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::graph::Arg;
use crate::torch::{TorchCall, var};
use crate::value::{DynTensor, Reduce, Value};
use model::error::Result;

#[derive(Module, Debug)]
pub struct Concatenate {
    pub axis: i64,
}

impl KerasLayer for Concatenate {
    fn build(layer: &mut Build) -> Result<Self> {
        Ok(Self { axis: layer.args.take_ints("axis")?.and_then(|a| a.first().copied()).unwrap_or(-1) })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let inputs = call.tensor_list()?;
        let Some(first) = inputs.first() else { return Err(call.error("no inputs")) };
        let rank = first.shape().len();
        let axis = call.axis(self.axis, rank)?;
        let mask = if inputs.iter().any(|v| v.mask.is_some()) {
            let full: Vec<DynTensor> = inputs
                .iter()
                .map(|v| match &v.mask {
                    None => Ok(DynTensor::full(&v.shape(), 1.0, &v.tensor.device())),
                    Some(m) if m.rank() < rank => m.clone().expand_dims(m.rank())?.broadcast_to(&v.shape()),
                    Some(m) => Ok(m.clone()),
                })
                .collect::<Result<_>>()?;
            Some(DynTensor::concat(full, axis)?.reduce(Reduce::Any, &[rank - 1], false)?)
        } else {
            None
        };
        let y = DynTensor::concat(inputs.into_iter().map(|v| v.tensor).collect(), axis)?;
        Ok(vec![Value::float(y).with_mask(mask)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let ports = call.node.args.first().map(Arg::ports).unwrap_or_default();
        let xs = ports.iter().map(|p| var(*p)).collect::<Vec<_>>().join(", ");
        let ms = ports.iter().map(|p| call.mask_of(*p)).collect::<Vec<_>>().join(", ");
        let axis = self.axis;
        call.assign(&format!("torch.cat([{xs}], dim={axis})"), &format!("concatenate_masks([{xs}], [{ms}], axis={axis})"));
        Ok("torch.cat".into())
    }
}
