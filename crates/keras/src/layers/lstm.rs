//! `keras.layers.LSTM`: the long short-term memory of Hochreiter & Schmidhuber (1997) as Keras'
//! `LSTMCell` computes it, over the steps of `[B, T, in]` (`recurrent.rs`: masks, direction,
//! what is returned). With `z = x K + h R + b` split in four blocks of `units` columns:
//!
//! ```text
//! i = σ(z_i)   f = σ(z_f)   o = σ(z_o)        (σ: recurrent_activation, sigmoid by default)
//! c' = f c + i act(z_c)     h' = o act(c')    (act: activation, tanh by default)
//! ```
//!
//! The variables, under the layer's `cell` group: `kernel [in, 4u]`, `recurrent_kernel
//! [u, 4u]`, `bias [4u]` (`unit_forget_bias` only initialises it). torch: `nn.LSTM` has the
//! same gate order with the kernels transposed and a second bias (zero).

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::recurrent::{self, Cell, Recurrence, TorchRecurrent, activate, gate};
use super::{Build, Call, KerasLayer, Variable};
use crate::activation::Activation;
use crate::torch::{TorchCall, TorchModule};
use crate::value::Value;
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct Lstm {
    /// `[in, 4u]`, the blocks `i, f, c, o`.
    pub kernel: Param<Tensor<2>>,
    /// `[u, 4u]`
    pub recurrent_kernel: Param<Tensor<2>>,
    /// `[4u]`
    pub bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    pub activation: Activation,
    #[module(skip)]
    pub recurrent_activation: Activation,
    #[module(skip)]
    pub recurrence: Recurrence,
}

impl KerasLayer for Lstm {
    fn build(layer: &mut Build) -> Result<Self> {
        let units = layer.args.take_usize("units", None)?;
        let activation = layer.activation_or("activation", "tanh")?;
        let recurrent_activation = layer.activation_or("recurrent_activation", "sigmoid")?;
        let use_bias = layer.args.take_bool("use_bias", true)?;
        layer.args.take_bool("unit_forget_bias", true)?; // an initialiser of the bias
        layer.args.take_bool("use_cudnn", false)?; // the same values where cuDNN runs
        let recurrence = Recurrence::take(layer)?;
        let mut vars = layer.vars_in("cell")?;
        let (kernel, recurrent_kernel) = recurrent::read_kernels(&mut vars, 4, units, layer.device)?;
        let bias = recurrent::read_bias(&mut vars, use_bias, 4 * units, layer.device)?;
        vars.finish()?;
        Ok(Self {
            kernel,
            recurrent_kernel,
            bias,
            activation,
            recurrent_activation,
            recurrence,
        })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        recurrent::call(self, &self.recurrence, call)
    }

    fn variables(&self) -> Vec<Variable> {
        let bias = self.bias.as_ref().map(|b| HostTensor::from_tensor(b.val()));
        recurrent::cell_variables("lstm_cell", &self.kernel, &self.recurrent_kernel, bias)
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        self.torch().module(module)
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        self.torch().call(call)
    }
}

impl Lstm {
    /// How the layer is written in torch.
    pub fn torch(&self) -> TorchRecurrent<'_> {
        TorchRecurrent {
            cell: "lstm",
            activation: self.activation,
            recurrent_activation: Some(self.recurrent_activation),
            reset_after: true,
            recurrence: &self.recurrence,
            kernel: HostTensor::from_tensor(self.kernel.val()),
            recurrent_kernel: HostTensor::from_tensor(self.recurrent_kernel.val()),
            bias: self.bias.as_ref().map(|b| HostTensor::from_tensor(b.val())),
        }
    }
}

impl Cell for Lstm {
    fn units(&self) -> usize {
        self.recurrent_kernel.dims()[0]
    }

    fn state_count(&self) -> usize {
        2
    }

    fn gates(&self) -> usize {
        4
    }

    fn project(&self, x: Tensor<3>, dropout: &[Tensor<2>]) -> Tensor<3> {
        let bias = self.bias.as_ref().map(|b| b.val());
        recurrent::project_dropped(x, self.kernel.val(), bias, dropout, self.units()) // [B, T, 4u]
    }

    fn step(&self, projected: Tensor<2>, states: &[Tensor<2>], dropout: &[Tensor<2>]) -> Vec<Tensor<2>> {
        let (h, c) = (states[0].clone(), states[1].clone()); // [B, u] each
        let units = self.units();
        let z = projected + recurrent::recurrent_product(h, self.recurrent_kernel.val(), dropout, units); // [B, 4u]
        let sigma = |k: usize| activate(self.recurrent_activation, gate(&z, k, units)); // [B, u]
        let (i, f, o) = (sigma(0), sigma(1), sigma(3));
        let c = f * c + i * activate(self.activation, gate(&z, 2, units)); // [B, u]
        let h = o * activate(self.activation, c.clone()); // [B, u]
        vec![h, c]
    }
}
