//! `keras.layers.Dense`: `activation(x W + b)` over the last axis of an input of any rank.
//! torch: `nn.Linear` (its weight is the kernel transposed). Dense supports masking: the
//! input's mask goes on.

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::{Build, Call, KerasLayer, Variable, keep_mask};
use crate::activation::Activation;
use crate::torch::{PyCall, TorchCall, TorchModule, activate};
use crate::value::{DynTensor, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct Dense {
    /// `[in, units]`, Keras' kernel as saved.
    pub kernel: Param<Tensor<2>>,
    pub bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    pub activation: Activation,
}

impl KerasLayer for Dense {
    fn build(layer: &mut Build) -> Result<Self> {
        let units = layer.args.take_usize("units", None)?;
        let use_bias = layer.args.take_bool("use_bias", true)?;
        let activation = layer.activation()?;
        let mut vars = layer.vars()?;
        let kernel = vars.next("kernel", &[None, Some(units)])?.to_tensor("kernel", layer.device)?;
        let bias = if use_bias {
            Some(Param::from_tensor(vars.next("bias", &[Some(units)])?.to_tensor("bias", layer.device)?))
        } else {
            None
        };
        vars.finish()?;
        Ok(Self { kernel: Param::from_tensor(kernel), bias, activation })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?;
        let y = dense(x.tensor, self.kernel.val(), self.bias.as_ref().map(|b| b.val()))?;
        Ok(vec![keep_mask(Value::float(self.activation.apply(y)), call)])
    }

    fn variables(&self) -> Vec<Variable> {
        Variable::kernels_and_bias(vec![("kernel", HostTensor::from_tensor(self.kernel.val()))], &self.bias)
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let [input, units] = self.kernel.dims();
        module.construct(PyCall::new("torch.nn.Linear").arg(input).arg(units).kw_if(self.bias.is_none(), "bias", "False"));
        if self.activation != Activation::Linear {
            module.untraced(); // the activation follows the module: its output is not the layer's
        }
        module.tensor("weight", HostTensor::from_tensor(self.kernel.val()).transposed());
        if let Some(b) = &self.bias {
            module.tensor("bias", HostTensor::from_tensor(b.val()));
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let y = activate(self.activation, &format!("self.{}({x})", call.attr));
        call.assign(&y, &call.previous_mask());
        let [input, units] = self.kernel.dims();
        Ok(format!("nn.Linear({input}, {units})"))
    }
}

/// `x W + b` over the last axis of `x` (any rank), `W: [in, out]`.
pub fn dense(x: DynTensor, kernel: Tensor<2>, bias: Option<Tensor<1>>) -> Result<DynTensor> {
    let shape = x.shape();
    let [input, output] = kernel.dims();
    let rows = shape[..shape.len() - 1].iter().product::<usize>();
    if shape[shape.len() - 1] != input {
        return Err(model::ModelError::InputShape {
            input: "dense",
            expected: format!("a last axis of {input}"),
            found: shape,
        });
    }
    let flat = x.reshape(&[rows, input])?.rank_n::<2>("dense")?; // [N, in]
    let mut y = flat.matmul(kernel); // [N, out]
    if let Some(bias) = bias {
        y = y + bias.unsqueeze_dim(0);
    }
    DynTensor::from(y).reshape(&[&shape[..shape.len() - 1], &[output]].concat())
}
