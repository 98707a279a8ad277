//! `keras.layers.Permute(dims)`: 1-based, the batch axis stays first. It does not support
//! masking.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::TorchCall;
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct Permute {
    #[module(skip)]
    pub dims: Vec<usize>,
}

impl KerasLayer for Permute {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        let dims = args.take_ints("dims")?.ok_or_else(|| args.error("dims is missing"))?;
        let n = dims.len() as i64;
        let mut seen = vec![false; dims.len()];
        if dims.iter().any(|&d| d < 1 || d > n || std::mem::replace(&mut seen[d as usize - 1], true)) {
            return Err(args.error(format!("dims = {dims:?} is not a permutation of 1..={n}")));
        }
        Ok(Self { dims: dims.into_iter().map(|d| d as usize).collect() })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?;
        let shape = x.shape();
        if self.dims.len() + 1 != shape.len() {
            return Err(call.error(format!("dims {:?} for an input of shape {shape:?}", self.dims)));
        }
        let order: Vec<usize> = std::iter::once(0).chain(self.dims.iter().copied()).collect();
        Ok(vec![Value::float(x.tensor.permute(&order)?)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let dims: Vec<String> = self.dims.iter().map(|d| d.to_string()).collect();
        call.assign(&format!("{x}.permute(0, {})", dims.join(", ")), "None");
        Ok("permute".into())
    }
}
