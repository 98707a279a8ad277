//! Dense, EinsumDense, Embedding, PReLU, and the elementwise layers without variables
//! (activations, dropout and noise, Masking).

use burn::module::{Module, Param};
use burn::tensor::{Device, EinsumOperand};
use burn::tensor::{Distribution, Tensor, activation as act};

use super::{Call, flat_tensor, keep_mask};
use model::error::Result;
use crate::activation::{Activation, elu};
use crate::config::LayerArgs;
use crate::saved::VarReader;
use crate::value::{Binary, DynTensor, Reduce, Unary, Value, map_rank};
use model::weights::HostTensor;

/// `keras.layers.Dense`: `activation(x W + b)` over the last axis of an input of any rank.
#[derive(Module, Debug)]
pub struct Dense {
    /// `[in, units]`, Keras' kernel as saved.
    pub kernel: Param<Tensor<2>>,
    pub bias: Option<Param<Tensor<1>>>,
    #[module(skip)]
    pub activation: Activation,
}

impl Dense {
    pub fn build(args: &mut LayerArgs, vars: Vec<HostTensor>, device: &Device) -> Result<Self> {
        let units = args.take_usize("units", None)?;
        let use_bias = args.take_bool("use_bias", true)?;
        let activation =
            Activation::from_keras(&args.take("activation")).map_err(|e| args.error(format!("activation: {e}")))?;
        let mut vars = VarReader::new(&args.what, vars);
        let kernel = vars.next("kernel", &[None, Some(units)])?.to_tensor("kernel", device)?;
        let bias = if use_bias {
            Some(Param::from_tensor(vars.next("bias", &[Some(units)])?.to_tensor("bias", device)?))
        } else {
            None
        };
        vars.finish()?;
        Ok(Self { kernel: Param::from_tensor(kernel), bias, activation })
    }

    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?;
        let y = dense(x.tensor, self.kernel.val(), self.bias.as_ref().map(|b| b.val()))?;
        // Dense supports masking: the input's mask goes on.
        Ok(vec![keep_mask(Value::float(self.activation.apply(y)), call)])
    }
}

/// `x W + b` over the last axis of `x` (any rank), `W: [in, out]`.
pub fn dense(x: DynTensor, kernel: Tensor<2>, bias: Option<Tensor<1>>) -> Result<DynTensor> {
    let shape = x.shape();
    let [input, output] = kernel.dims();
    let rows = shape[..shape.len() - 1].iter().product::<usize>();
    if shape[shape.len() - 1] != input {
        return Err(model::ModelError::InputShape {
            input: "dense",
            expected: format!("a last axis of {input}"),
            found: shape,
        });
    }
    let flat = x.reshape(&[rows, input])?.rank_n::<2>("dense")?; // [N, in]
    let mut y = flat.matmul(kernel); // [N, out]
    if let Some(bias) = bias {
        y = y + bias.unsqueeze_dim(0);
    }
    DynTensor::from(y).reshape(&[&shape[..shape.len() - 1], &[output]].concat())
}

/// `keras.layers.EinsumDense`: `einsum(equation, x, kernel) + bias`, then the activation.
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

impl EinsumDense {
    pub fn build(args: &mut LayerArgs, vars: Vec<HostTensor>, device: &Device) -> Result<Self> {
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
        let activation =
            Activation::from_keras(&args.take("activation")).map_err(|e| args.error(format!("activation: {e}")))?;
        let mut vars = VarReader::new(&args.what, vars);
        let kernel = vars.next("kernel", &vec![None; kernel_spec.len()])?;
        let bias = match bias_axes.as_str() {
            Some(axes) if !axes.is_empty() => {
                let first = axes.chars().filter_map(|c| output.find(c)).min().unwrap_or(output.len());
                Some(vars.next("bias", &vec![None; output.len() - first])?)
            }
            _ => None,
        };
        vars.finish()?;
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

    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
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
        // EinsumDense does not support masking: the mask stops here.
        Ok(vec![Value::float(self.activation.apply(y))])
    }
}

/// `keras.layers.Embedding`: rows of a table; `mask_zero` masks the id 0.
#[derive(Module, Debug)]
pub struct Embedding {
    /// `[input_dim, output_dim]`
    pub embeddings: Param<Tensor<2>>,
    pub mask_zero: bool,
}

impl Embedding {
    pub fn build(args: &mut LayerArgs, vars: Vec<HostTensor>, device: &Device) -> Result<Self> {
        let input_dim = args.take_usize("input_dim", None)?;
        let output_dim = args.take_usize("output_dim", None)?;
        let mask_zero = args.take_bool("mask_zero", false)?;
        if args.take_bool("sparse", false)? {
            return Err(args.error("sparse = true: sparse gradients are not supported"));
        }
        args.take("input_length"); // Keras 2's, ignored by Keras 3 as well
        let mut vars = VarReader::new(&args.what, vars);
        let table = vars.next("embeddings", &[Some(input_dim), Some(output_dim)])?.to_tensor("embeddings", device)?;
        vars.finish()?;
        Ok(Self { embeddings: Param::from_tensor(table), mask_zero })
    }

    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let ids = call.tensor(0, "inputs")?;
        let out = DynTensor::gather_rows(self.embeddings.val(), ids.tensor.clone())?;
        let mask = if self.mask_zero {
            let device = ids.tensor.device();
            Some(DynTensor::binary(Binary::NotEqual, ids.tensor, DynTensor::scalar(0.0, &device))?)
        } else {
            None
        };
        Ok(vec![Value::float(out).with_mask(mask)])
    }
}

/// `keras.layers.PReLU`: `relu(x) - alpha relu(-x)`, `alpha` shared over `shared_axes`.
#[derive(Module, Debug)]
pub struct PRelu {
    pub alpha: Param<Tensor<1>>,
    /// The saved `alpha`'s shape: the input's without the batch axis, 1 on shared axes.
    #[module(skip)]
    pub alpha_shape: Vec<usize>,
}

impl PRelu {
    pub fn build(args: &mut LayerArgs, vars: Vec<HostTensor>, device: &Device) -> Result<Self> {
        args.take("shared_axes"); // visible in the saved alpha's shape
        let mut vars = VarReader::new(&args.what, vars);
        let alpha = vars.next_any("alpha")?;
        vars.finish()?;
        Ok(Self { alpha_shape: alpha.shape.clone(), alpha: Param::from_tensor(flat_tensor(&alpha, device)?) })
    }

    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let alpha = DynTensor::from(self.alpha.val()).reshape(&self.alpha_shape)?;
        let positive = x.clone().map(Unary::Relu);
        let negative = x.map(Unary::Negative).map(Unary::Relu);
        let y = DynTensor::binary(Binary::Subtract, positive, DynTensor::binary(Binary::Multiply, alpha, negative)?)?;
        Ok(vec![keep_mask(Value::float(y), call)])
    }
}

/// The elementwise layers without variables.
#[derive(Debug, Clone)]
pub enum Elementwise {
    Activation(Activation),
    /// `ReLU(max_value, negative_slope, threshold)`.
    Relu {
        max_value: Option<f64>,
        negative_slope: f64,
        threshold: f64,
    },
    LeakyRelu {
        negative_slope: f64,
    },
    Elu {
        alpha: f64,
    },
    /// `Softmax(axis)`, with its input's mask.
    Softmax {
        axes: Vec<i64>,
    },
    Identity,
    /// `Dropout`, `SpatialDropout1D` (whole channels) in training; identity otherwise.
    Dropout {
        rate: f64,
        spatial: bool,
    },
    GaussianNoise {
        stddev: f64,
    },
    GaussianDropout {
        rate: f64,
    },
    Masking {
        mask_value: f64,
    },
}

impl Elementwise {
    pub fn build(class: &str, args: &mut LayerArgs) -> Result<Option<Self>> {
        Ok(Some(match class {
            "Activation" => Self::Activation(
                Activation::from_keras(&args.take("activation")).map_err(|e| args.error(format!("activation: {e}")))?,
            ),
            "ReLU" => Self::Relu {
                max_value: args.take_opt_f64("max_value")?,
                negative_slope: args.take_f64("negative_slope", 0.0)?,
                threshold: args.take_f64("threshold", 0.0)?,
            },
            "LeakyReLU" => Self::LeakyRelu { negative_slope: args.take_f64("negative_slope", 0.3)? },
            "ELU" => Self::Elu { alpha: args.take_f64("alpha", 1.0)? },
            "Softmax" => Self::Softmax { axes: args.take_ints("axis")?.unwrap_or(vec![-1]) },
            "Identity" => Self::Identity,
            "Dropout" | "SpatialDropout1D" => {
                if !args.take("noise_shape").is_null() {
                    return Err(args.error("noise_shape: only the default (None) is supported"));
                }
                Self::Dropout { rate: args.take_f64("rate", 0.0)?, spatial: class == "SpatialDropout1D" }
            }
            "GaussianNoise" => Self::GaussianNoise { stddev: args.take_f64("stddev", 0.0)? },
            "GaussianDropout" => Self::GaussianDropout { rate: args.take_f64("rate", 0.0)? },
            "Masking" => Self::Masking { mask_value: args.take_f64("mask_value", 0.0)? },
            _ => return Ok(None),
        }))
    }

    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let training = call.training();
        let y = match self {
            Self::Activation(a) => a.apply(x),
            Self::Relu { max_value, negative_slope, threshold } => {
                map_rank!(x, t => relu(t, *max_value, *negative_slope, *threshold))
            }
            Self::LeakyRelu { negative_slope } => map_rank!(x, t => act::leaky_relu(t, *negative_slope)),
            Self::Elu { alpha } => map_rank!(x, t => elu(t, *alpha)),
            Self::Softmax { axes } => return softmax(x, axes, call),
            Self::Identity => x,
            Self::Dropout { rate, spatial } if training && *rate > 0.0 => {
                let shape = x.shape();
                let noise_shape = if *spatial { vec![shape[0], 1, shape[shape.len() - 1]] } else { shape.clone() };
                let keep = DynTensor::from(Tensor::<1>::random(
                    [noise_shape.iter().product::<usize>()],
                    Distribution::Bernoulli(1.0 - rate),
                    &x.device(),
                ))
                .reshape(&noise_shape)?;
                DynTensor::binary(Binary::Multiply, x, keep.map(Unary::Scale((1.0 / (1.0 - rate)) as f32)))?
            }
            Self::GaussianNoise { stddev } if training && *stddev > 0.0 => {
                let noise = DynTensor::from(Tensor::<1>::random(
                    [x.shape().iter().product::<usize>()],
                    Distribution::Normal(0.0, *stddev),
                    &x.device(),
                ))
                .reshape(&x.shape())?;
                DynTensor::binary(Binary::Add, x, noise)?
            }
            Self::GaussianDropout { rate } if training && *rate > 0.0 && *rate < 1.0 => {
                let stddev = (rate / (1.0 - rate)).sqrt();
                let noise = DynTensor::from(Tensor::<1>::random(
                    [x.shape().iter().product::<usize>()],
                    Distribution::Normal(1.0, stddev),
                    &x.device(),
                ))
                .reshape(&x.shape())?;
                DynTensor::binary(Binary::Multiply, x, noise)?
            }
            Self::Dropout { .. } | Self::GaussianNoise { .. } | Self::GaussianDropout { .. } => x,
            Self::Masking { mask_value } => {
                // keep = any(x != mask_value, axis=-1); outputs = x * keep; the mask is `keep`.
                let last = x.rank() - 1;
                let differs =
                    DynTensor::binary(Binary::NotEqual, x.clone(), DynTensor::scalar(*mask_value as f32, &x.device()))?;
                let keep = differs.reduce(Reduce::Any, &[last], true)?;
                let y = DynTensor::binary(Binary::Multiply, x, keep.clone())?;
                let mask = keep.reduce(Reduce::Max, &[last], false)?;
                return Ok(vec![Value::float(y).with_mask(Some(mask))]);
            }
        };
        Ok(vec![keep_mask(Value::float(y), call)])
    }
}

/// Keras' `ReLU.static_call`, step by step.
fn relu<const D: usize>(x: Tensor<D>, max_value: Option<f64>, negative_slope: f64, threshold: f64) -> Tensor<D> {
    if negative_slope != 0.0 && max_value.is_none() && threshold == 0.0 {
        return act::leaky_relu(x, negative_slope);
    }
    let negative_part = (negative_slope != 0.0).then(|| act::relu(x.clone().neg().add_scalar(threshold)));
    let mut y = if threshold != 0.0 {
        x.clone().zeros_like().mask_where(x.clone().greater_elem(threshold), x)
    } else {
        act::relu(x)
    };
    if let Some(max) = max_value {
        y = y.clamp(0.0, max);
    }
    if let Some(negative) = negative_part {
        y = y - negative.mul_scalar(negative_slope);
    }
    y
}

/// `Softmax(axis)` with the mask Keras passes it: masked positions get -1e9 first.
fn softmax(x: DynTensor, axes: &[i64], call: &Call) -> Result<Vec<Value>> {
    let rank = x.rank();
    let mut x = x;
    if let Some(mask) = &call.previous_mask {
        if mask.rank() > rank {
            return Err(call.error(format!("a mask of shape {:?} for inputs of shape {:?}", mask.shape(), x.shape())));
        }
        let device = x.device();
        x = DynTensor::select(mask.clone(), x, DynTensor::scalar(-1e9, &device))?;
    }
    let resolved: Vec<usize> = call.axes(axes, rank)?;
    let y = match resolved.as_slice() {
        [one] => x.softmax(*one),
        many => {
            // exp(x - logsumexp(x, axes)), the maximum taken out first for range
            let max = x.clone().reduce(Reduce::Max, many, true)?;
            let shifted = DynTensor::binary(Binary::Subtract, x, max)?;
            let log_sum = shifted.clone().map(Unary::Exp).reduce(Reduce::Sum, many, true)?.map(Unary::Log);
            DynTensor::binary(Binary::Subtract, shifted, log_sum)?.map(Unary::Exp)
        }
    };
    Ok(vec![keep_mask(Value::float(y), call)])
}
