//! `keras.layers.Conv1D`, with TensorFlow's padding rules written out.
//!
//! Keras keeps the kernel as `(k, in / groups, filters)` and the data channels-last `[B, L, C]`
//! by default; Burn's `conv1d` takes `[B, C, L]` and a `[filters, in / groups, k]` kernel. `same`
//! pads `max((out - 1) s + (k - 1) d + 1 - L, 0)` in total, the smaller half first (TensorFlow's
//! rule, asymmetric for an even total); `causal` pads `(k - 1) d` on the left only. Conv1D does
//! not support masking. torch: the prelude's `Conv1D` (`nn.Conv1d` with these paddings).

use burn::module::{Module, Param};
use burn::tensor::ops::ConvOptions;
use burn::tensor::{Tensor, module::conv1d};

use super::{Build, Call, KerasLayer, Variable, same_padding};
use crate::activation::Activation;
use crate::torch::{PyCall, TorchCall, TorchModule, activation_name, py_bool, py_str};
use crate::value::{DynTensor, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct Conv1D {
    /// `[filters, in / groups, k]` (Keras' kernel permuted).
    pub weight: Param<Tensor<3>>,
    pub bias: Option<Param<Tensor<1>>>,
    pub stride: usize,
    pub dilation: usize,
    pub groups: usize,
    #[module(skip)]
    pub padding: String,
    pub channels_last: bool,
    #[module(skip)]
    pub activation: Activation,
}

impl KerasLayer for Conv1D {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        let filters = args.take_usize("filters", None)?;
        let kernel_size = args.take_usize("kernel_size", None)?;
        let stride = args.take_usize("strides", Some(1))?;
        let dilation = args.take_usize("dilation_rate", Some(1))?;
        let groups = args.take_usize("groups", Some(1))?;
        let padding = args.take_choice("padding", "valid", &["valid", "same", "causal"])?;
        let channels_last = args.take_channels_last()?;
        let use_bias = args.take_bool("use_bias", true)?;
        if stride > 1 && dilation > 1 {
            return Err(args.error("strides > 1 with dilation_rate > 1: Keras refuses this too"));
        }
        let activation = layer.activation()?;
        let device = layer.device;
        let mut vars = layer.vars()?;
        let kernel = vars.next("kernel", &[Some(kernel_size), None, Some(filters)])?;
        let bias =
            if use_bias { Some(vars.next("bias", &[Some(filters)])?.to_tensor::<1>("bias", device)?) } else { None };
        vars.finish()?;
        // (k, in/g, out) -> (out, in/g, k)
        let weight = kernel.to_tensor::<3>("kernel", device)?.permute([2, 1, 0]);
        Ok(Self {
            weight: Param::from_tensor(weight),
            bias: bias.map(Param::from_tensor),
            stride,
            dilation,
            groups,
            padding,
            channels_last,
            activation,
        })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor.rank_n::<3>("Conv1D's input [B, L, C]")?;
        let x = if self.channels_last { x.swap_dims(1, 2) } else { x }; // [B, C, L]
        let [_, channels, length] = x.dims();
        let [_, per_group, kernel] = self.weight.dims();
        if channels != per_group * self.groups {
            return Err(call.error(format!("{channels} input channels, the kernel takes {}", per_group * self.groups)));
        }
        let reach = (kernel - 1) * self.dilation + 1;
        let (left, right) = match self.padding.as_str() {
            "same" => {
                let (_, left, right) = same_padding(length, reach, self.stride);
                (left, right)
            }
            "causal" => (reach - 1, 0),
            _ => (0, 0),
        };
        if length + left + right < reach {
            return Err(call.error(format!("a sequence of {length} is shorter than the kernel's reach {reach}")));
        }
        let options = ConvOptions::new([self.stride], [0], [self.dilation], self.groups);
        let options = ConvOptions { padding: [(left, right)], ..options };
        let y = conv1d(x, self.weight.val(), self.bias.as_ref().map(|b| b.val()), options); // [B, F, L']
        let y = if self.channels_last { y.swap_dims(1, 2) } else { y };
        Ok(vec![Value::float(self.activation.apply(DynTensor::from(y)))])
    }

    fn variables(&self) -> Vec<Variable> {
        // Burn's [filters, in / groups, k] back to Keras' (k, in / groups, filters)
        Variable::kernels_and_bias(vec![("kernel", HostTensor::from_tensor(self.weight.val().permute([2, 1, 0])))], &self.bias)
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let [filters, per_group, kernel] = self.weight.dims();
        module.construct(
            PyCall::new("Conv1D")
                .kw("in_channels", per_group * self.groups)
                .kw("filters", filters)
                .kw("kernel_size", kernel)
                .kw("strides", self.stride)
                .kw("dilation_rate", self.dilation)
                .kw("groups", self.groups)
                .kw("use_bias", py_bool(self.bias.is_some()))
                .kw("padding", py_str(&self.padding))
                .kw_if(!self.channels_last, "channels_last", "False")
                .kw_if(self.activation != Activation::Linear, "activation", py_str(activation_name(self.activation))),
        );
        module.tensor("conv.weight", HostTensor::from_tensor(self.weight.val()));
        if let Some(b) = &self.bias {
            module.tensor("conv.bias", HostTensor::from_tensor(b.val()));
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("self.{}({x})", call.attr), "None");
        let [filters, per_group, kernel] = self.weight.dims();
        Ok(format!("nn.Conv1d({}, {filters}, {kernel}) with padding {:?}", per_group * self.groups, self.padding))
    }
}
