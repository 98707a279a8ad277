//! The elementwise merge layers: `Add`, `Subtract` (two inputs), `Multiply`, `Average`,
//! `Maximum`, `Minimum`. Their operands come as one list. Mask (Keras' `Merge.compute_mask`):
//! the OR of the inputs' masks when every input has one, else none. torch: the operators, and
//! the prelude's `merge_masks`.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::graph::Arg;
use crate::torch::{TorchCall, fold, var};
use crate::value::{Binary, DynTensor, Unary, Value};
use model::error::Result;

#[derive(Module, Debug)]
pub struct Merge {
    /// How two operands combine (`Average` adds, then divides).
    #[module(skip)]
    pub op: Binary,
    pub average: bool,
}

impl KerasLayer for Merge {
    fn build(layer: &mut Build) -> Result<Self> {
        let (op, average) = match layer.class() {
            "Subtract" => (Binary::Subtract, false),
            "Multiply" => (Binary::Multiply, false),
            "Maximum" => (Binary::Maximum, false),
            "Minimum" => (Binary::Minimum, false),
            "Average" => (Binary::Add, true),
            _ => (Binary::Add, false),
        };
        Ok(Self { op, average })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let inputs = call.tensor_list()?;
        if inputs.len() < 2 {
            return Err(call.error(format!("{} inputs; a merge layer takes at least 2", inputs.len())));
        }
        if self.op == Binary::Subtract && inputs.len() != 2 {
            return Err(call.error(format!("{} inputs; Subtract takes exactly 2", inputs.len())));
        }
        let masks: Vec<Option<DynTensor>> = inputs.iter().map(|v| v.mask.clone()).collect();
        let count = inputs.len();
        let mut tensors = inputs.into_iter().map(|v| v.tensor);
        let first = tensors.next().expect("two inputs or more");
        let mut y = tensors.try_fold(first, |acc, t| DynTensor::binary(self.op, acc, t))?;
        if self.average {
            y = y.map(Unary::Scale(1.0 / count as f32));
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

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let ports = call.node.args.first().map(Arg::ports).unwrap_or_default();
        let xs: Vec<String> = ports.iter().map(|p| var(*p)).collect();
        let ms: Vec<String> = ports.iter().map(|p| call.mask_of(*p)).collect();
        if xs.is_empty() {
            return Err(call.refuse("no inputs"));
        }
        let y = match self.op {
            _ if self.average => format!("({}) / {}", xs.join(" + "), xs.len()),
            Binary::Add => xs.join(" + "),
            Binary::Subtract => xs.join(" - "),
            Binary::Multiply => xs.join(" * "),
            Binary::Maximum => fold("torch.maximum", &xs),
            Binary::Minimum => fold("torch.minimum", &xs),
            other => return Err(call.refuse(format!("merge {other:?}"))),
        };
        call.assign(&y, &format!("merge_masks([{}])", ms.join(", ")));
        Ok("elementwise merge".into())
    }
}
