//! `keras.layers.SimpleRNN`: `h' = act(x K + b + h R)` over the steps of `[B, T, in]`
//! (`recurrent.rs`), the output the new state. The variables, under the layer's `cell` group:
//! `kernel [in, u]`, `recurrent_kernel [u, u]`, `bias [u]`. torch: `nn.RNN` (tanh or relu), with
//! the kernels transposed and a second bias (zero).

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::recurrent::{self, Cell, Recurrence, TorchRecurrent, activate};
use super::{Build, Call, KerasLayer, Variable};
use crate::activation::Activation;
use crate::torch::{TorchCall, TorchModule};
use crate::value::Value;
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct SimpleRnn {
    /// `[in, u]`
    pub kernel: Param<Tensor<2>>,
    /// `[u, u]`
    pub recurrent_kernel: Param<Tensor<2>>,
    /// `[u]`
    pub bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    pub activation: Activation,
    #[module(skip)]
    pub recurrence: Recurrence,
}

impl KerasLayer for SimpleRnn {
    fn build(layer: &mut Build) -> Result<Self> {
        let units = layer.args.take_usize("units", None)?;
        let activation = layer.activation_or("activation", "tanh")?;
        let use_bias = layer.args.take_bool("use_bias", true)?;
        let recurrence = Recurrence::take(layer)?;
        let mut vars = layer.vars_in("cell")?;
        let (kernel, recurrent_kernel) = recurrent::read_kernels(&mut vars, 1, units, layer.device)?;
        let bias = recurrent::read_bias(&mut vars, use_bias, units, layer.device)?;
        vars.finish()?;
        Ok(Self {
            kernel,
            recurrent_kernel,
            bias,
            activation,
            recurrence,
        })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        recurrent::call(self, &self.recurrence, call)
    }

    fn variables(&self) -> Vec<Variable> {
        let bias = self.bias.as_ref().map(|b| HostTensor::from_tensor(b.val()));
        recurrent::cell_variables("simple_rnn_cell", &self.kernel, &self.recurrent_kernel, bias)
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        self.torch().module(module)
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        self.torch().call(call)
    }
}

impl SimpleRnn {
    /// How the layer is written in torch.
    pub fn torch(&self) -> TorchRecurrent<'_> {
        TorchRecurrent {
            cell: "simple_rnn",
            activation: self.activation,
            recurrent_activation: None,
            reset_after: true,
            recurrence: &self.recurrence,
            kernel: HostTensor::from_tensor(self.kernel.val()),
            recurrent_kernel: HostTensor::from_tensor(self.recurrent_kernel.val()),
            bias: self.bias.as_ref().map(|b| HostTensor::from_tensor(b.val())),
        }
    }
}

impl Cell for SimpleRnn {
    fn units(&self) -> usize {
        self.recurrent_kernel.dims()[0]
    }

    fn gates(&self) -> usize {
        1
    }

    fn project(&self, x: Tensor<3>, dropout: &[Tensor<2>]) -> Tensor<3> {
        let bias = self.bias.as_ref().map(|b| b.val());
        recurrent::project_dropped(x, self.kernel.val(), bias, dropout, self.units()) // [B, T, u]
    }

    fn step(&self, projected: Tensor<2>, states: &[Tensor<2>], dropout: &[Tensor<2>]) -> Vec<Tensor<2>> {
        let h = states[0].clone(); // [B, u]
        let recurrent = recurrent::recurrent_product(h, self.recurrent_kernel.val(), dropout, self.units()); // [B, u]
        vec![activate(self.activation, projected + recurrent)] // [B, u]
    }
}
