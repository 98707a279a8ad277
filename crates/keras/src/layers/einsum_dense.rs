//! `keras.layers.EinsumDense`: `activation(einsum(equation, x, kernel) + bias)`. EinsumDense does
//! not support masking: the mask stops here. torch: the prelude's `EinsumDense` (`torch.einsum`).

use burn::module::{Module, Param};
use burn::tensor::{EinsumOperand, Tensor};

use super::{Build, Call, KerasLayer, Variable, flat_tensor};
use crate::activation::Activation;
use crate::torch::{PyCall, TorchCall, TorchModule, activation_name, py_str};
use crate::value::{Binary, DynTensor, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct EinsumDense {
    #[module(skip)]
    pub equation: String,
    pub kernel: Param<Tensor<1>>,
    #[module(skip)]
    pub kernel_shape: Vec<usize>,
    pub bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    pub bias_shape: Vec<usize>,
    #[module(skip)]
    pub output_rank: usize,
    #[module(skip)]
    pub activation: Activation,
}

impl KerasLayer for EinsumDense {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        let equation = args.take_str("equation", "")?.replace(' ', "");
        let Some((inputs, output)) = equation.split_once("->") else {
            return Err(args.error(format!("equation {equation:?} has no `->`")));
        };
        let Some((_, kernel_spec)) = inputs.split_once(',') else {
            return Err(args.error(format!("equation {equation:?} does not name two operands")));
        };
        if equation.contains("...") {
            return Err(args.error(format!("equation {equation:?}: ellipses are not supported")));
        }
        args.take("output_shape"); // follows from the saved kernel and the input
        let bias_axes = args.take("bias_axes");
        let activation = layer.activation()?;
        let mut vars = layer.vars()?;
        let kernel = vars.next("kernel", &vec![None; kernel_spec.len()])?;
        let bias = match bias_axes.as_str() {
            Some(axes) if !axes.is_empty() => {
                let first = axes.chars().filter_map(|c| output.find(c)).min().unwrap_or(output.len());
                Some(vars.next("bias", &vec![None; output.len() - first])?)
            }
            _ => None,
        };
        vars.finish()?;
        let device = layer.device;
        Ok(Self {
            output_rank: output.len(),
            kernel_shape: kernel.shape.clone(),
            kernel: Param::from_tensor(flat_tensor(&kernel, device)?),
            bias_shape: bias.as_ref().map(|b| b.shape.clone()).unwrap_or_default(),
            bias: bias.map(|b| flat_tensor(&b, device)).transpose()?.map(Param::from_tensor),
            equation,
            activation,
        })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let kernel = DynTensor::from(self.kernel.val()).reshape(&self.kernel_shape)?;
        let operands = |x: DynTensor, k: DynTensor| -> Vec<EinsumOperand> {
            vec![crate::value::with_rank!(x, t => t.into()), crate::value::with_rank!(k, t => t.into())]
        };
        let ops = operands(x, kernel);
        let eq = self.equation.as_str();
        let mut y = match self.output_rank {
            1 => DynTensor::from(Tensor::<1>::einsum(eq, ops)),
            2 => DynTensor::from(Tensor::<2>::einsum(eq, ops)),
            3 => DynTensor::from(Tensor::<3>::einsum(eq, ops)),
            4 => DynTensor::from(Tensor::<4>::einsum(eq, ops)),
            5 => DynTensor::from(Tensor::<5>::einsum(eq, ops)),
            6 => DynTensor::from(Tensor::<6>::einsum(eq, ops)),
            rank => return Err(call.error(format!("an einsum output of rank {rank}"))),
        };
        if let Some(bias) = &self.bias {
            y = DynTensor::binary(Binary::Add, y, DynTensor::from(bias.val()).reshape(&self.bias_shape)?)?;
        }
        Ok(vec![Value::float(self.activation.apply(y))])
    }

    fn variables(&self) -> Vec<Variable> {
        let host = |t| HostTensor::from_tensor::<1>(t);
        let mut vars = vec![Variable::new("kernel", host(self.kernel.val()).reshaped(self.kernel_shape.clone()))];
        if let Some(b) = &self.bias {
            vars.push(Variable::new("bias", host(b.val()).reshaped(self.bias_shape.clone())));
        }
        vars
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        module.construct(
            PyCall::new("EinsumDense")
                .kw("equation", py_str(&self.equation))
                .kw("kernel_shape", format!("{:?}", self.kernel_shape))
                .kw_if(self.bias.is_some(), "bias_shape", format!("{:?}", self.bias_shape))
                .kw_if(self.activation != Activation::Linear, "activation", py_str(activation_name(self.activation))),
        );
        module.tensor("kernel", HostTensor::from_tensor(self.kernel.val()).reshaped(self.kernel_shape.clone()));
        if let Some(b) = &self.bias {
            module.tensor("bias", HostTensor::from_tensor(b.val()).reshaped(self.bias_shape.clone()));
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("self.{}({x})", call.attr), "None");
        Ok(format!("EinsumDense({:?})", self.equation))
    }
}
