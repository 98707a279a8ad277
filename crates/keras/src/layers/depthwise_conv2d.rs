//! `keras.layers.DepthwiseConv2D(kernel_size, strides, padding, depth_multiplier, data_format,
//! dilation_rate, activation, use_bias)`: each input channel convolved on its own with
//! `depth_multiplier` filters, output channel `c * depth_multiplier + m`. Keras' kernel is
//! `(kh, kw, C, depth_multiplier)`; Burn runs it as `conv2d` with `groups = C` and a
//! `[C * depth_multiplier, 1, kh, kw]` kernel. It does not support masking. torch: the
//! prelude's `Conv2D` with `groups = C`. `DepthwiseConv1D` (kernel `(k, C, depth_multiplier)`) is
//! the same on a height of 1.

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
pub struct DepthwiseConv2D {
    /// `[C * depth_multiplier, 1, kh, kw]`.
    pub weight: Param<Tensor<4>>,
    pub bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    pub window: Window2D,
    pub channels: usize,
    pub depth_multiplier: usize,
    #[module(skip)]
    pub activation: Activation,
}

impl KerasLayer for DepthwiseConv2D {
    fn build(layer: &mut Build) -> Result<Self> {
        let depth_multiplier = layer.args.take_usize("depth_multiplier", Some(1))?;
        let use_bias = layer.args.take_bool("use_bias", true)?;
        let window = Window2D::take(layer, "kernel_size")?;
        let activation = layer.activation()?;
        let device = layer.device;
        let mut vars = layer.vars()?;
        let [kh, kw] = window.kernel;
        let spatial = if window.one_dimensional { vec![Some(kw)] } else { vec![Some(kh), Some(kw)] };
        let kernel = vars.next("kernel", &[spatial, vec![None, Some(depth_multiplier)]].concat())?;
        let channels = kernel.shape[kernel.shape.len() - 2];
        let kernel = kernel.reshaped(vec![kh, kw, channels, depth_multiplier]);
        let bias = if use_bias {
            Some(vars.next("bias", &[Some(channels * depth_multiplier)])?.to_tensor::<1>("bias", device)?)
        } else {
            None
        };
        vars.finish()?;
        // (kh, kw, C, m) -> (C, m, kh, kw) -> (C * m, 1, kh, kw)
        let weight = kernel.to_tensor::<4>("kernel", device)?.permute([2, 3, 0, 1]).reshape([
            channels * depth_multiplier,
            1,
            kh,
            kw,
        ]);
        Ok(Self {
            weight: Param::from_tensor(weight),
            bias: bias.map(Param::from_tensor),
            window,
            channels,
            depth_multiplier,
            activation,
        })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = self.window.channels_first(call.tensor(0, "inputs")?.tensor, call)?; // [B, C, H, W]
        if x.dims()[1] != self.channels {
            return Err(call.error(format!("{} input channels, the kernel takes {}", x.dims()[1], self.channels)));
        }
        let y = self.window.convolve(x, self.weight.val(), self.bias.as_ref().map(|b| b.val()), self.channels, call)?;
        Ok(vec![Value::float(self.activation.apply(self.window.back(y)?))])
    }

    fn variables(&self) -> Vec<Variable> {
        let [kh, kw] = self.window.kernel;
        let kernel = self.weight.val().reshape([self.channels, self.depth_multiplier, kh, kw]).permute([2, 3, 0, 1]);
        let kernel = HostTensor::from_tensor(kernel);
        let kernel = if self.window.one_dimensional { kernel.reshaped(kernel.shape[1..].to_vec()) } else { kernel };
        Variable::kernels_and_bias(vec![("kernel", kernel)], &self.bias)
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let bias = self.bias.as_ref().map(|b| b.val());
        self.window.torch_conv2d(module, self.weight.val(), bias, self.channels, self.activation);
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("self.{}({x})", call.attr), "None");
        Ok(format!("nn.Conv2d(groups={}), depthwise", self.channels))
    }
}
