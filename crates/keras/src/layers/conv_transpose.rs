//! `keras.layers.Conv1DTranspose` and `Conv2DTranspose(filters, kernel_size, strides, padding,
//! output_padding, data_format, dilation_rate, activation, use_bias)`, as TensorFlow's
//! `conv2d_transpose` computes them: the full transposed convolution (each input step spread
//! over `kernel` outputs, `strides` apart), cut to Keras' output length (`deconv_output_length`)
//! from TensorFlow's padding start, then the bias and the activation. Keras keeps the kernel as
//! `(k..., filters, in)`; Burn's `conv_transpose2d` takes `[in, filters, kh, kw]`. A 1-D layer
//! runs as a 2-D one of height 1. Neither supports masking. torch: the prelude's
//! `ConvTranspose` (`nn.ConvTranspose2d` and the same cut).

use burn::module::{Module, Param};
use burn::tensor::Tensor;
use burn::tensor::module::conv_transpose2d;
use burn::tensor::ops::ConvTransposeOptions;

use super::convolution::spatial_sizes;
use super::{Build, Call, KerasLayer, Variable};
use crate::activation::Activation;
use crate::torch::{PyCall, TorchCall, TorchModule, activation_name, py_bool, py_str, tuple};
use crate::value::{DynTensor, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct ConvTranspose {
    /// `[in, filters, kh, kw]` (`kh = 1` for the 1-D layer).
    pub weight: Param<Tensor<4>>,
    pub bias: Option<Param<Tensor<1>>>,
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// `padding="same"`; else `valid`.
    pub same: bool,
    #[module(skip)]
    pub output_padding: Option<[usize; 2]>,
    pub channels_last: bool,
    /// `Conv1DTranspose`: inputs `[B, L, C]`.
    pub one_dimensional: bool,
    #[module(skip)]
    pub activation: Activation,
}

impl KerasLayer for ConvTranspose {
    fn build(layer: &mut Build) -> Result<Self> {
        let one_dimensional = layer.class() == "Conv1DTranspose";
        let dims = if one_dimensional { 1 } else { 2 };
        let args = &mut layer.args;
        let filters = args.take_usize("filters", None)?;
        // Sizes of the spatial axes as two, the height 1 for the 1-D layer.
        let mut sizes = |name: &str, default: Option<[usize; 2]>, smallest: i64| -> Result<Option<[usize; 2]>> {
            let Some(value) = args.take_ints(name)? else { return Ok(default) };
            let shown = format!("{value:?}");
            let sizes = spatial_sizes(Some(value), one_dimensional, None, smallest);
            sizes.map(Some).ok_or_else(|| args.error(format!("{name} = {shown}: {dims} sizes of at least {smallest}")))
        };
        let kernel = sizes("kernel_size", None, 1)?;
        let stride = sizes("strides", Some([1, 1]), 1)?.unwrap_or([1, 1]);
        let dilation = sizes("dilation_rate", Some([1, 1]), 1)?.unwrap_or([1, 1]);
        let output_padding = sizes("output_padding", None, 0)?.map(|p| if one_dimensional { [0, p[1]] } else { p });
        let args = &mut layer.args;
        let kernel = kernel.ok_or_else(|| args.error("kernel_size is missing"))?;
        let same = args.take_choice("padding", "valid", &["valid", "same"])? == "same";
        let channels_last = args.take_channels_last()?;
        let use_bias = args.take_bool("use_bias", true)?;
        let activation = layer.activation()?;
        let device = layer.device;
        let mut vars = layer.vars()?;
        let spatial: Vec<Option<usize>> =
            if one_dimensional { vec![Some(kernel[1])] } else { vec![Some(kernel[0]), Some(kernel[1])] };
        let shape: Vec<Option<usize>> = spatial.into_iter().chain([Some(filters), None]).collect();
        let saved = vars.next("kernel", &shape)?;
        let bias = if use_bias { Some(vars.next("bias", &[Some(filters)])?.to_tensor::<1>("bias", device)?) } else { None };
        vars.finish()?;
        let inputs = *saved.shape.last().unwrap_or(&0);
        let full = saved.reshaped(vec![kernel[0], kernel[1], filters, inputs]);
        let weight = full.to_tensor::<4>("kernel", device)?.permute([3, 2, 0, 1]); // [in, filters, kh, kw]
        Ok(Self {
            weight: Param::from_tensor(weight),
            bias: bias.map(Param::from_tensor),
            stride,
            dilation,
            same,
            output_padding,
            channels_last,
            one_dimensional,
            activation,
        })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let rank = if self.one_dimensional { 3 } else { 4 };
        if x.rank() != rank {
            return Err(call.error(format!("an input of shape {:?}; this layer takes rank {rank}", x.shape())));
        }
        // [B, C, H, W], the height 1 for the 1-D layer.
        let x = if self.one_dimensional { x.expand_dims(if self.channels_last { 1 } else { 2 })? } else { x };
        let x = x.rank_n::<4>("conv transpose input")?;
        let x = if self.channels_last { x.permute([0, 3, 1, 2]) } else { x };
        let [_, channels, height, width] = x.dims();
        let [inputs, filters, kh, kw] = self.weight.dims();
        if channels != inputs {
            return Err(call.error(format!("{channels} input channels, the kernel takes {inputs}")));
        }
        let options = ConvTransposeOptions::new(self.stride, [0, 0], [0, 0], self.dilation, 1);
        let mut y = DynTensor::from(conv_transpose2d(x, self.weight.val(), None, options)); // [B, F, full h, full w]
        for (axis, (length, kernel)) in [(height, kh), (width, kw)].into_iter().enumerate() {
            let (start, size) = self.cut(axis, length, kernel);
            let full = y.shape()[2 + axis];
            let end = (start + size).min(full);
            y = y.slice_axis(2 + axis, start, end, 1).pad_axis(2 + axis, 0, start + size - end, 0.0)?;
        }
        if let Some(b) = &self.bias {
            y = DynTensor::binary(crate::value::Binary::Add, y, DynTensor::from(b.val()).reshape(&[1, filters, 1, 1])?)?;
        }
        let mut y = y.rank_n::<4>("conv transpose output")?;
        if self.channels_last {
            y = y.permute([0, 2, 3, 1]);
        }
        let y = if self.one_dimensional {
            let axis = if self.channels_last { 1 } else { 2 };
            let mut shape = y.dims().to_vec();
            shape.remove(axis);
            DynTensor::from(y).reshape(&shape)?
        } else {
            DynTensor::from(y)
        };
        Ok(vec![Value::float(self.activation.apply(y))])
    }

    fn variables(&self) -> Vec<Variable> {
        let [inputs, filters, kh, kw] = self.weight.dims();
        let kernel = HostTensor::from_tensor(self.weight.val().permute([2, 3, 1, 0])); // (kh, kw, F, in)
        let kernel = if self.one_dimensional { kernel.reshaped(vec![kh * kw, filters, inputs]) } else { kernel };
        Variable::kernels_and_bias(vec![("kernel", kernel)], &self.bias)
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let [inputs, filters, kh, kw] = self.weight.dims();
        module.construct(
            PyCall::new("ConvTranspose")
                .kw("in_channels", inputs)
                .kw("filters", filters)
                .kw("kernel_size", tuple(&[kh, kw]))
                .kw("strides", tuple(&self.stride))
                .kw("dilation_rate", tuple(&self.dilation))
                .kw("use_bias", py_bool(self.bias.is_some()))
                .kw("padding", py_str(if self.same { "same" } else { "valid" }))
                .kw_if(self.output_padding.is_some(), "output_padding", tuple(&self.output_padding.unwrap_or_default()))
                .kw_if(!self.channels_last, "channels_last", "False")
                .kw_if(self.activation != Activation::Linear, "activation", py_str(activation_name(self.activation)))
                .kw_if(self.one_dimensional, "one_dimensional", "True"),
        );
        module.tensor("conv.weight", HostTensor::from_tensor(self.weight.val()));
        if let Some(b) = &self.bias {
            module.tensor("bias", HostTensor::from_tensor(b.val()));
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("self.{}({x})", call.attr), "None");
        Ok("nn.ConvTranspose2d, cut as TensorFlow".into())
    }
}

impl ConvTranspose {
    /// Where Keras' output starts in the full transposed convolution along spatial `axis`, and
    /// its length (`deconv_output_length`; TensorFlow's padding start for that length).
    fn cut(&self, axis: usize, length: usize, kernel: usize) -> (usize, usize) {
        let (stride, reach) = (self.stride[axis], (kernel - 1) * self.dilation[axis] + 1);
        let size = match self.output_padding {
            None if self.same => length * stride,
            None => length * stride + reach.saturating_sub(stride),
            Some(padding) => {
                let pad = if self.same { reach / 2 } else { 0 };
                ((length - 1) * stride + reach + padding[axis]).saturating_sub(2 * pad)
            }
        };
        let start = if self.same { ((length - 1) * stride + reach).saturating_sub(size) / 2 } else { 0 };
        (start, size)
    }
}
