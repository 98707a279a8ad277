//! Merge layers: `Add`, `Subtract`, `Multiply`, `Average`, `Maximum`, `Minimum`, `Concatenate`.
//!
//! Their operands come as one list. Masks (Keras' `Merge.compute_mask`): the OR of the inputs'
//! masks when every input has one, else none; `Concatenate` joins the masks along its axis
//! (all-true for an unmasked input) and keeps a step if any of its joined entries is kept.

use super::Call;
use model::error::Result;
use crate::config::LayerArgs;
use crate::value::{Binary, DynTensor, Reduce, Value};

#[derive(Debug, Clone)]
pub enum Merge {
    Elementwise(Binary),
    Average,
    Concatenate { axis: i64 },
}

impl Merge {
    pub fn build(class: &str, args: &mut LayerArgs) -> Result<Option<Self>> {
        Ok(Some(match class {
            "Add" => Self::Elementwise(Binary::Add),
            "Subtract" => Self::Elementwise(Binary::Subtract),
            "Multiply" => Self::Elementwise(Binary::Multiply),
            "Maximum" => Self::Elementwise(Binary::Maximum),
            "Minimum" => Self::Elementwise(Binary::Minimum),
            "Average" => Self::Average,
            "Concatenate" => {
                Self::Concatenate { axis: args.take_ints("axis")?.and_then(|a| a.first().copied()).unwrap_or(-1) }
            }
            _ => return Ok(None),
        }))
    }

    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let inputs = call.tensor_list()?;
        if inputs.len() < 2 && !matches!(self, Self::Concatenate { .. }) {
            return Err(call.error(format!("{} inputs; a merge layer takes at least 2", inputs.len())));
        }
        if matches!(self, Self::Elementwise(Binary::Subtract)) && inputs.len() != 2 {
            return Err(call.error(format!("{} inputs; Subtract takes exactly 2", inputs.len())));
        }
        let masks: Vec<Option<DynTensor>> = inputs.iter().map(|v| v.mask.clone()).collect();
        match self {
            Self::Elementwise(_) | Self::Average => {
                let op = match self {
                    Self::Elementwise(op) => *op,
                    _ => Binary::Add,
                };
                let mut tensors = inputs.into_iter().map(|v| v.tensor);
                let first = tensors.next().expect("two inputs or more");
                let count = 1 + tensors.len();
                let mut y = tensors.try_fold(first, |acc, t| DynTensor::binary(op, acc, t))?;
                if matches!(self, Self::Average) {
                    y = y.map(crate::value::Unary::Scale(1.0 / count as f32));
                }
                let mask = if masks.iter().all(Option::is_some) {
                    let mut masks = masks.into_iter().flatten();
                    let first = masks.next().expect("inputs");
                    Some(masks.try_fold(first, |acc, m| DynTensor::binary(Binary::LogicalOr, acc, m))?)
                } else {
                    None
                };
                Ok(vec![Value::float(y).with_mask(mask)])
            }
            Self::Concatenate { axis: a } => {
                let rank = inputs[0].shape().len();
                let resolved = call.axis(*a, rank)?;
                let mask = if masks.iter().any(Option::is_some) {
                    let full: Vec<DynTensor> = inputs
                        .iter()
                        .map(|v| match &v.mask {
                            None => Ok(DynTensor::full(&v.shape(), 1.0, &v.tensor.device())),
                            Some(m) if m.rank() < rank => m.clone().expand_dims(m.rank())?.broadcast_to(&v.shape()),
                            Some(m) => Ok(m.clone()),
                        })
                        .collect::<Result<_>>()?;
                    Some(DynTensor::concat(full, resolved)?.reduce(Reduce::Any, &[rank - 1], false)?)
                } else {
                    None
                };
                let y = DynTensor::concat(inputs.into_iter().map(|v| v.tensor).collect(), resolved)?;
                Ok(vec![Value::float(y).with_mask(mask)])
            }
        }
    }
}
