//! `keras.layers.SeparableConv2D(filters, kernel_size, strides, padding, data_format,
//! dilation_rate, depth_multiplier, activation, use_bias)`: a depthwise convolution (as
//! [`super::depthwise_conv2d`], no bias) then a 1x1 pointwise one with the bias, as TensorFlow's
//! `separable_conv2d`. Keras saves `depthwise_kernel (kh, kw, C, m)`, `pointwise_kernel
//! (1, 1, C m, filters)` and `bias`. It does not support masking. torch: the prelude's
//! `SeparableConv2D`. `SeparableConv1D` (kernels `(k, C, m)`, `(1, C m, filters)`) is the same on a
//! height of 1.

use burn::module::{Module, Param};
use burn::tensor::Tensor;
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;

use super::convolution::Window2D;
use super::{Build, Call, KerasLayer, Variable};
use crate::activation::Activation;
use crate::torch::{PyCall, TorchCall, TorchModule, activation_name, py_bool, py_str};
use crate::value::Value;
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct SeparableConv2D {
    /// `[C m, 1, kh, kw]`.
    pub depthwise: Param<Tensor<4>>,
    /// `[filters, C m, 1, 1]`.
    pub pointwise: Param<Tensor<4>>,
    pub bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    pub window: Window2D,
    pub channels: usize,
    pub depth_multiplier: usize,
    #[module(skip)]
    pub activation: Activation,
}

impl KerasLayer for SeparableConv2D {
    fn build(layer: &mut Build) -> Result<Self> {
        let filters = layer.args.take_usize("filters", None)?;
        let depth_multiplier = layer.args.take_usize("depth_multiplier", Some(1))?;
        let use_bias = layer.args.take_bool("use_bias", true)?;
        let window = Window2D::take(layer, "kernel_size")?;
        let activation = layer.activation()?;
        let device = layer.device;
        let mut vars = layer.vars()?;
        let [kh, kw] = window.kernel;
        let (spatial, unit) = if window.one_dimensional {
            (vec![Some(kw)], vec![Some(1)])
        } else {
            (vec![Some(kh), Some(kw)], vec![Some(1), Some(1)])
        };
        let depthwise = vars.next("depthwise_kernel", &[spatial, vec![None, Some(depth_multiplier)]].concat())?;
        let channels = depthwise.shape[depthwise.shape.len() - 2];
        let depthwise = depthwise.reshaped(vec![kh, kw, channels, depth_multiplier]);
        let inner = channels * depth_multiplier;
        let pointwise = vars.next("pointwise_kernel", &[unit, vec![Some(inner), Some(filters)]].concat())?;
        let pointwise = pointwise.reshaped(vec![1, 1, inner, filters]);
        let bias =
            if use_bias { Some(vars.next("bias", &[Some(filters)])?.to_tensor::<1>("bias", device)?) } else { None };
        vars.finish()?;
        let depthwise =
            depthwise.to_tensor::<4>("depthwise_kernel", device)?.permute([2, 3, 0, 1]).reshape([inner, 1, kh, kw]);
        let pointwise = pointwise.to_tensor::<4>("pointwise_kernel", device)?.permute([3, 2, 0, 1]); // [F, C m, 1, 1]
        Ok(Self {
            depthwise: Param::from_tensor(depthwise),
            pointwise: Param::from_tensor(pointwise),
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
        let spread = self.window.convolve(x, self.depthwise.val(), None, self.channels, call)?; // [B, C m, H', W']
        let options = ConvOptions::new([1, 1], [0, 0], [1, 1], 1);
        let y = conv2d(spread, self.pointwise.val(), self.bias.as_ref().map(|b| b.val()), options); // [B, F, H', W']
        Ok(vec![Value::float(self.activation.apply(self.window.back(y)?))])
    }

    fn variables(&self) -> Vec<Variable> {
        let [kh, kw] = self.window.kernel;
        let depthwise =
            self.depthwise.val().reshape([self.channels, self.depth_multiplier, kh, kw]).permute([2, 3, 0, 1]);
        let (depthwise, pointwise) =
            (HostTensor::from_tensor(depthwise), HostTensor::from_tensor(self.pointwise.val().permute([2, 3, 1, 0])));
        // A 1-D layer saves (k, C, m) and (1, C m, filters).
        let squeeze = |t: HostTensor| if self.window.one_dimensional { t.reshaped(t.shape[1..].to_vec()) } else { t };
        let kernels = vec![("depthwise_kernel", squeeze(depthwise)), ("pointwise_kernel", squeeze(pointwise))];
        Variable::kernels_and_bias(kernels, &self.bias)
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let w = &self.window;
        let filters = self.pointwise.dims()[0];
        let constructor = PyCall::new("SeparableConv2D").kw("in_channels", self.channels).kw("filters", filters);
        module.construct(
            w.torch_arguments(constructor.kw("depth_multiplier", self.depth_multiplier))
                .kw("use_bias", py_bool(self.bias.is_some()))
                .kw("padding", w.torch_padding())
                .kw_if(!w.channels_last, "channels_last", "False")
                .kw_if(self.activation != Activation::Linear, "activation", py_str(activation_name(self.activation)))
                .kw_if(w.one_dimensional, "one_dimensional", "True"),
        );
        module.tensor("depthwise.weight", HostTensor::from_tensor(self.depthwise.val()));
        module.tensor("pointwise.weight", HostTensor::from_tensor(self.pointwise.val()));
        if let Some(b) = &self.bias {
            module.tensor("pointwise.bias", HostTensor::from_tensor(b.val()));
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("self.{}({x})", call.attr), "None");
        Ok("depthwise nn.Conv2d, then a 1x1 nn.Conv2d".into())
    }
}
