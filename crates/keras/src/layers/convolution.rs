//! What the 2-D convolution layers share: their window arguments as Keras saves them, and a
//! convolution on Keras' layout with TensorFlow's padding (`same`: `ceil(L / s)` outputs, the
//! smaller half of the padding first, asymmetric for an even total). A 1-D layer of the same
//! family (`DepthwiseConv1D`, `SeparableConv1D`) runs as a 2-D one of height 1.

use burn::tensor::Tensor;
use burn::tensor::module::conv2d;
use burn::tensor::ops::ConvOptions;

use super::{Build, Call, same_padding};
use crate::activation::Activation;
use crate::torch::{PyCall, TorchModule, activation_name, py_bool, py_str, tuple};
use crate::value::DynTensor;
use model::error::Result;
use model::weights::HostTensor;

/// A 2-D window: `kernel_size`, `strides`, `dilation_rate`, `padding`, `data_format`.
#[derive(Debug, Clone, Copy)]
pub struct Window2D {
    pub kernel: [usize; 2],
    pub stride: [usize; 2],
    pub dilation: [usize; 2],
    /// `padding="same"`; else `valid`.
    pub same: bool,
    pub channels_last: bool,
    /// A 1-D layer (class name ending in `1D`): inputs `[B, L, C]`, the window `[1, k]`.
    pub one_dimensional: bool,
}

impl Window2D {
    /// Reads the window's arguments (`kernel_size` required unless `kernel` is given).
    pub fn take(layer: &mut Build, kernel_argument: &str) -> Result<Self> {
        let one_dimensional = layer.class().ends_with("1D");
        let args = &mut layer.args;
        // A 1-D layer's one size is the width's; its height is 1.
        let mut sizes = |name: &str, default: Option<[usize; 2]>| -> Result<Option<[usize; 2]>> {
            Ok(spatial_sizes(args.take_ints(name)?, one_dimensional, default, 1))
        };
        let kernel = sizes(kernel_argument, None)?;
        let stride = sizes("strides", Some([1, 1]))?;
        let dilation = sizes("dilation_rate", Some([1, 1]))?;
        let kernel =
            kernel.ok_or_else(|| args.error(format!("{kernel_argument}: missing, or not the layer's sizes")))?;
        let stride = stride.ok_or_else(|| args.error("strides: not the layer's sizes"))?;
        let dilation = dilation.ok_or_else(|| args.error("dilation_rate: not the layer's sizes"))?;
        let same = args.take_choice("padding", "valid", &["valid", "same"])? == "same";
        let channels_last = args.take_channels_last()?;
        if stride.iter().any(|&s| s > 1) && dilation.iter().any(|&d| d > 1) {
            return Err(args.error("strides > 1 with dilation_rate > 1: Keras refuses this too"));
        }
        Ok(Self { kernel, stride, dilation, same, channels_last, one_dimensional })
    }

    /// `[B, C, H, W]` from the layer's input (channels moved first if Keras keeps them last; a
    /// 1-D input gains a height of 1).
    pub fn channels_first(&self, x: DynTensor, call: &Call) -> Result<Tensor<4>> {
        let x = if self.one_dimensional {
            if x.rank() != 3 {
                return Err(call.error(format!("an input of shape {:?}; a 1-D convolution takes [B, L, C]", x.shape())));
            }
            x.expand_dims(if self.channels_last { 1 } else { 2 })?
        } else {
            x
        };
        let x = x.rank_n::<4>("a 2-D convolution's input [B, H, W, C]").map_err(|e| call.error(e))?;
        Ok(if self.channels_last { x.permute([0, 3, 1, 2]) } else { x })
    }

    /// Back to the layer's layout.
    pub fn back(&self, y: Tensor<4>) -> Result<DynTensor> {
        let y = DynTensor::from(if self.channels_last { y.permute([0, 2, 3, 1]) } else { y });
        if !self.one_dimensional {
            return Ok(y);
        }
        let mut shape = y.shape();
        shape.remove(if self.channels_last { 1 } else { 2 });
        y.reshape(&shape)
    }

    /// `conv2d` of `x: [B, C, H, W]` with `weight: [F, C / groups, kh, kw]` and TensorFlow's
    /// padding; `[B, F, H', W']`.
    pub fn convolve(
        &self,
        x: Tensor<4>,
        weight: Tensor<4>,
        bias: Option<Tensor<1>>,
        groups: usize,
        call: &Call,
    ) -> Result<Tensor<4>> {
        let [_, _, height, width] = x.dims();
        let mut padding = [(0, 0); 2];
        for (axis, length) in [height, width].into_iter().enumerate() {
            let reach = (self.kernel[axis] - 1) * self.dilation[axis] + 1;
            if self.same {
                let (_, before, after) = same_padding(length, reach, self.stride[axis]);
                padding[axis] = (before, after);
            } else if length < reach {
                return Err(call.error(format!(
                    "an input of {length} along axis {axis} is shorter than the kernel's reach {reach}"
                )));
            }
        }
        let options = ConvOptions::new(self.stride, [0, 0], self.dilation, groups);
        Ok(conv2d(x, weight, bias, ConvOptions { padding, ..options }))
    }
}

impl Window2D {
    /// The window's `kernel_size`, `strides` and `dilation_rate` as keyword arguments of a
    /// prelude constructor.
    pub fn torch_arguments(&self, call: PyCall) -> PyCall {
        call.kw("kernel_size", tuple(&self.kernel))
            .kw("strides", tuple(&self.stride))
            .kw("dilation_rate", tuple(&self.dilation))
    }

    /// The window's padding as a prelude constructor takes it: `"same"` or `"valid"`.
    pub fn torch_padding(&self) -> String {
        py_str(if self.same { "same" } else { "valid" })
    }

    /// The prelude's `Conv2D` (`nn.Conv2d` behind TensorFlow's padding and Keras' layout) with
    /// `weight: [F, C / groups, kh, kw]` and the bias in its state dict.
    pub fn torch_conv2d(
        &self,
        module: &mut TorchModule,
        weight: Tensor<4>,
        bias: Option<Tensor<1>>,
        groups: usize,
        activation: Activation,
    ) {
        let [filters, per_group, _, _] = weight.dims();
        module.construct(
            self.torch_arguments(PyCall::new("Conv2D").kw("in_channels", per_group * groups).kw("filters", filters))
                .kw("groups", groups)
                .kw("use_bias", py_bool(bias.is_some()))
                .kw("padding", self.torch_padding())
                .kw_if(!self.channels_last, "channels_last", "False")
                .kw_if(activation != Activation::Linear, "activation", py_str(activation_name(activation)))
                .kw_if(self.one_dimensional, "one_dimensional", "True"),
        );
        module.tensor("conv.weight", HostTensor::from_tensor(weight));
        if let Some(b) = bias {
            module.tensor("conv.bias", HostTensor::from_tensor(b));
        }
    }
}

/// A Keras size argument of one or two positive integers as two (`default` when absent).
pub fn two_sizes(value: Option<Vec<i64>>, default: Option<[usize; 2]>) -> Option<[usize; 2]> {
    spatial_sizes(value, false, default, 1)
}

/// A size argument of a 2-D layer (one size for both axes, or two) or of a 1-D one (its one size
/// is the width's; the height is 1), as two; each at least `smallest`. `default` when absent,
/// `None` when the value is none of these.
pub fn spatial_sizes(
    value: Option<Vec<i64>>,
    one_dimensional: bool,
    default: Option<[usize; 2]>,
    smallest: i64,
) -> Option<[usize; 2]> {
    let size = |v: i64| (v >= smallest).then_some(v as usize);
    match (one_dimensional, value.as_deref()) {
        (_, None) => default,
        (true, Some(&[one])) => Some([1, size(one)?]),
        (false, Some(&[one])) => Some([size(one)?; 2]),
        (false, Some(&[a, b])) => Some([size(a)?, size(b)?]),
        _ => None,
    }
}
