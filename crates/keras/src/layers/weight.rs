//! `keras2torch.weight.Weight`: a weight that a custom layer's `call` read, as the flattener
//! writes it (`python/keras2torch/weight.py`): its `value`, whatever its input (which only ties
//! the node to the graph). A learned position embedding or a class token stays a trainable
//! weight this way. torch: an `nn.Parameter` of the module.

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::{Build, Call, KerasLayer, Variable, flat_tensor};
use crate::torch::{TorchCall, TorchModule};
use crate::value::{DynTensor, MAX_RANK, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct Weight {
    /// The value, flat; `shape` is the saved one.
    pub value: Param<Tensor<1>>,
    #[module(skip)]
    pub shape: Vec<usize>,
}

impl KerasLayer for Weight {
    fn build(layer: &mut Build) -> Result<Self> {
        layer.args.take("shape"); // the saved value's
        let mut vars = layer.vars()?;
        let value = vars.next_any("value")?;
        vars.finish()?;
        if value.shape.is_empty() || value.shape.len() > MAX_RANK {
            return Err(layer
                .args
                .error(format!("a weight of shape {:?}: ranks 1 to {MAX_RANK} are supported", value.shape)));
        }
        Ok(Self { shape: value.shape.clone(), value: Param::from_tensor(flat_tensor(&value, layer.device)?) })
    }

    fn call(&self, _call: &Call) -> Result<Vec<Value>> {
        Ok(vec![Value::float(DynTensor::from(self.value.val()).reshape(&self.shape)?)])
    }

    fn variables(&self) -> Vec<Variable> {
        vec![Variable::new("value", self.host())]
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        module.parameter(self.host());
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        call.assign(&format!("self.{}", call.attr), "None");
        Ok("nn.Parameter".into())
    }
}

impl Weight {
    fn host(&self) -> HostTensor {
        HostTensor::from_tensor(self.value.val()).reshaped(self.shape.clone())
    }
}
