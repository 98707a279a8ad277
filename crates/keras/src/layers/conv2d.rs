//! `keras.layers.Conv2D(filters, kernel_size, strides, padding, data_format, dilation_rate,
//! groups, activation, use_bias)`. Keras keeps the kernel as `(kh, kw, in / groups, filters)`
//! and images channels-last `[B, H, W, C]`; Burn's `conv2d` takes `[B, C, H, W]` and a
//! `[filters, in / groups, kh, kw]` kernel. TensorFlow's padding: [`super::convolution`]. Conv2D
//! does not support masking. torch: the prelude's `Conv2D` (`nn.Conv2d` with that padding).

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::convolution::Window2D;
use super::{Build, Call, KerasLayer, Variable};
use crate::activation::Activation;
use crate::torch::{TorchCall, TorchModule};
use crate::value::Value;
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct Conv2D {
    /// `[filters, in / groups, kh, kw]` (Keras' kernel permuted).
    pub weight: Param<Tensor<4>>,
    pub bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    pub window: Window2D,
    pub groups: usize,
    #[module(skip)]
    pub activation: Activation,
}

impl KerasLayer for Conv2D {
    fn build(layer: &mut Build) -> Result<Self> {
        let filters = layer.args.take_usize("filters", None)?;
        let groups = layer.args.take_usize("groups", Some(1))?;
        let use_bias = layer.args.take_bool("use_bias", true)?;
        let window = Window2D::take(layer, "kernel_size")?;
        let activation = layer.activation()?;
        let device = layer.device;
        let mut vars = layer.vars()?;
        let [kh, kw] = window.kernel;
        let kernel = vars.next("kernel", &[Some(kh), Some(kw), None, Some(filters)])?;
        let bias =
            if use_bias { Some(vars.next("bias", &[Some(filters)])?.to_tensor::<1>("bias", device)?) } else { None };
        vars.finish()?;
        // (kh, kw, in/g, out) -> (out, in/g, kh, kw)
        let weight = kernel.to_tensor::<4>("kernel", device)?.permute([3, 2, 0, 1]);
        Ok(Self { weight: Param::from_tensor(weight), bias: bias.map(Param::from_tensor), window, groups, activation })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = self.window.channels_first(call.tensor(0, "inputs")?.tensor, call)?; // [B, C, H, W]
        let [_, per_group, _, _] = self.weight.dims();
        if x.dims()[1] != per_group * self.groups {
            return Err(call.error(format!("{} input channels, the kernel takes {}", x.dims()[1], per_group * self.groups)));
        }
        let y = self.window.convolve(x, self.weight.val(), self.bias.as_ref().map(|b| b.val()), self.groups, call)?;
        Ok(vec![Value::float(self.activation.apply(self.window.back(y)?))])
    }

    fn variables(&self) -> Vec<Variable> {
        // Burn's [filters, in / groups, kh, kw] back to Keras' (kh, kw, in / groups, filters)
        Variable::kernels_and_bias(vec![("kernel", HostTensor::from_tensor(self.weight.val().permute([2, 3, 1, 0])))], &self.bias)
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let bias = self.bias.as_ref().map(|b| b.val());
        self.window.torch_conv2d(module, self.weight.val(), bias, self.groups, self.activation);
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("self.{}({x})", call.attr), "None");
        let [filters, per_group, kh, kw] = self.weight.dims();
        Ok(format!("nn.Conv2d({}, {filters}, ({kh}, {kw}))", per_group * self.groups))
    }
}
