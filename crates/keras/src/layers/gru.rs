//! `keras.layers.GRU`: the gated recurrent unit of Cho et al. (2014) as Keras' `GRUCell`
//! computes it, over the steps of `[B, T, in]` (`recurrent.rs`). The kernels' three blocks of
//! `units` columns are the update gate `z`, the reset gate `r` and the candidate `h̃`:
//!
//! ```text
//! z = σ(x K_z + b_z + h R_z + b'_z)     r = σ(x K_r + b_r + h R_r + b'_r)
//! h̃ = act(x K_h + b_h + r (h R_h + b'_h))     (reset_after=True, the default)
//! h̃ = act(x K_h + b_h + (r h) R_h)            (reset_after=False: no b')
//! h' = z h + (1 - z) h̃
//! ```
//!
//! The variables, under the layer's `cell` group: `kernel [in, 3u]`, `recurrent_kernel
//! [u, 3u]`, `bias` (`[2, 3u]`: the input and the recurrent bias with `reset_after`, else
//! `[3u]`). torch: `nn.GRU` is the `reset_after=True` form with the blocks in the order
//! `r, z, n`.

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
pub struct Gru {
    /// `[in, 3u]`, the blocks `z, r, h`.
    pub kernel: Param<Tensor<2>>,
    /// `[u, 3u]`
    pub recurrent_kernel: Param<Tensor<2>>,
    /// `[2, 3u]` (input bias, recurrent bias) with `reset_after`, else `[1, 3u]`.
    pub bias: Option<Param<Tensor<2>>>,
    #[module(skip)]
    pub reset_after: bool,
    #[module(skip)]
    pub activation: Activation,
    #[module(skip)]
    pub recurrent_activation: Activation,
    #[module(skip)]
    pub recurrence: Recurrence,
}

impl KerasLayer for Gru {
    fn build(layer: &mut Build) -> Result<Self> {
        let units = layer.args.take_usize("units", None)?;
        let activation = layer.activation_or("activation", "tanh")?;
        let recurrent_activation = layer.activation_or("recurrent_activation", "sigmoid")?;
        let use_bias = layer.args.take_bool("use_bias", true)?;
        let reset_after = layer.args.take_bool("reset_after", true)?;
        layer.args.take_bool("use_cudnn", false)?; // the same values where cuDNN runs
        let recurrence = Recurrence::take(layer)?;
        let mut vars = layer.vars_in("cell")?;
        let (kernel, recurrent_kernel) = recurrent::read_kernels(&mut vars, 3, units, layer.device)?;
        let bias = match (use_bias, reset_after) {
            (false, _) => None,
            (true, true) => Some(vars.next("bias", &[Some(2), Some(3 * units)])?.to_tensor::<2>("bias", layer.device)?),
            (true, false) => {
                let bias = vars.next("bias", &[Some(3 * units)])?;
                Some(bias.reshaped(vec![1, 3 * units]).to_tensor::<2>("bias", layer.device)?)
            }
        };
        vars.finish()?;
        Ok(Self {
            kernel,
            recurrent_kernel,
            bias: bias.map(Param::from_tensor),
            reset_after,
            activation,
            recurrent_activation,
            recurrence,
        })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        recurrent::call(self, &self.recurrence, call)
    }

    fn variables(&self) -> Vec<Variable> {
        let bias = self.bias.as_ref().map(|b| {
            let bias = HostTensor::from_tensor(b.val());
            if self.reset_after { bias } else { bias.reshaped(vec![3 * self.units()]) }
        });
        recurrent::cell_variables("gru_cell", &self.kernel, &self.recurrent_kernel, bias)
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        self.torch().module(module)
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        self.torch().call(call)
    }
}

impl Gru {
    /// Row `row` of the bias (`0`: the input bias, `1`: the recurrent one), `[3u]`.
    fn bias_row(&self, row: usize) -> Option<Tensor<1>> {
        let bias = self.bias.as_ref()?.val();
        let [rows, width] = bias.dims();
        (row < rows).then(|| bias.slice([row..row + 1, 0..width]).reshape([width]))
    }
}

impl Gru {
    /// How the layer is written in torch.
    pub fn torch(&self) -> TorchRecurrent<'_> {
        TorchRecurrent {
            cell: "gru",
            activation: self.activation,
            recurrent_activation: Some(self.recurrent_activation),
            reset_after: self.reset_after,
            recurrence: &self.recurrence,
            kernel: HostTensor::from_tensor(self.kernel.val()),
            recurrent_kernel: HostTensor::from_tensor(self.recurrent_kernel.val()),
            bias: self.variables().into_iter().find(|v| v.path.ends_with("/bias")).map(|v| v.tensor),
        }
    }
}

impl Cell for Gru {
    fn units(&self) -> usize {
        self.recurrent_kernel.dims()[0]
    }

    fn gates(&self) -> usize {
        3
    }

    fn project(&self, x: Tensor<3>, dropout: &[Tensor<2>]) -> Tensor<3> {
        recurrent::project_dropped(x, self.kernel.val(), self.bias_row(0), dropout, self.units()) // [B, T, 3u]
    }

    fn step(&self, projected: Tensor<2>, states: &[Tensor<2>], dropout: &[Tensor<2>]) -> Vec<Tensor<2>> {
        let h = states[0].clone(); // [B, u]
        let units = self.units();
        let recurrent_kernel = self.recurrent_kernel.val(); // [u, 3u]
        let x = |k: usize| gate(&projected, k, units); // [B, u]
        let (z, candidate) = if self.reset_after {
            let mut inner = recurrent::recurrent_product(h.clone(), recurrent_kernel, dropout, units); // [B, 3u]
            if let Some(bias) = self.bias_row(1) {
                inner = inner + bias.unsqueeze_dim(0);
            }
            let z = activate(self.recurrent_activation, x(0) + gate(&inner, 0, units));
            let r = activate(self.recurrent_activation, x(1) + gate(&inner, 1, units));
            (z, activate(self.activation, x(2) + r * gate(&inner, 2, units)))
        } else {
            let [_, width] = recurrent_kernel.dims();
            let gates_zr = recurrent_kernel.clone().slice([0..units, 0..2 * units]); // [u, 2u]
            let inner = recurrent::recurrent_product(h.clone(), gates_zr, dropout.get(..2).unwrap_or(&[]), units); // [B, 2u]
            let z = activate(self.recurrent_activation, x(0) + gate(&inner, 0, units));
            let r = activate(self.recurrent_activation, x(1) + gate(&inner, 1, units));
            let h_dropped = match dropout.get(2) {
                Some(mask) => h.clone() * mask.clone(),
                None => h.clone(),
            };
            let reset = (r * h_dropped).matmul(recurrent_kernel.slice([0..units, 2 * units..width])); // [B, u]
            (z, activate(self.activation, x(2) + reset))
        };
        let h = z.clone() * h + z.neg().add_scalar(1.0) * candidate; // z h + (1 - z) h̃
        vec![h]
    }
}
