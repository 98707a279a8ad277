//! `keras.layers.PReLU`: `relu(x) - alpha relu(-x)`, `alpha` shared over `shared_axes`. PReLU
//! supports masking. torch: the prelude's `PReLU` (torch's own shares alpha over channels only).

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::{Build, Call, KerasLayer, Variable, flat_tensor, keep_mask};
use crate::torch::{PyCall, TorchCall, TorchModule};
use crate::value::{Binary, DynTensor, Unary, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct PReLU {
    pub alpha: Param<Tensor<1>>,
    /// The saved `alpha`'s shape: the input's without the batch axis, 1 on shared axes.
    #[module(skip)]
    pub alpha_shape: Vec<usize>,
}

impl KerasLayer for PReLU {
    fn build(layer: &mut Build) -> Result<Self> {
        layer.args.take("shared_axes"); // visible in the saved alpha's shape
        let mut vars = layer.vars()?;
        let alpha = vars.next_any("alpha")?;
        vars.finish()?;
        Ok(Self { alpha_shape: alpha.shape.clone(), alpha: Param::from_tensor(flat_tensor(&alpha, layer.device)?) })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let alpha = DynTensor::from(self.alpha.val()).reshape(&self.alpha_shape)?;
        let positive = x.clone().map(Unary::Relu);
        let negative = x.map(Unary::Negative).map(Unary::Relu);
        let y = DynTensor::binary(Binary::Subtract, positive, DynTensor::binary(Binary::Multiply, alpha, negative)?)?;
        Ok(vec![keep_mask(Value::float(y), call)])
    }

    fn variables(&self) -> Vec<Variable> {
        vec![Variable::new("alpha", self.alpha_host())]
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        module.construct(PyCall::new("PReLU").kw("alpha_shape", format!("{:?}", self.alpha_shape)));
        module.tensor("alpha", self.alpha_host());
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("self.{}({x})", call.attr), &call.previous_mask());
        Ok("PReLU".into())
    }
}

impl PReLU {
    fn alpha_host(&self) -> HostTensor {
        HostTensor::from_tensor(self.alpha.val()).reshaped(self.alpha_shape.clone())
    }
}
