//! `LayerNormalization` and `BatchNormalization`, in the order of operations Keras' TensorFlow
//! backend uses (`inv = rsqrt(var + eps) * gamma; y = x * inv + (beta - mean * inv)`).

use burn::module::{Module, Param, RunningState};
use burn::tensor::{Device, Tensor};

use super::{Call, flat_tensor, keep_mask};
use model::error::Result;
use crate::config::LayerArgs;
use crate::saved::VarReader;
use crate::value::{Binary, DynTensor, Reduce, Unary, Value};
use model::weights::HostTensor;

/// `keras.layers.LayerNormalization(axis, epsilon, center, scale, rms_scaling)`.
#[derive(Module, Debug)]
pub struct LayerNorm {
    pub gamma: Option<Param<Tensor<1>>>,
    pub beta: Option<Param<Tensor<1>>>,
    #[module(skip)]
    pub axes: Vec<i64>,
    pub epsilon: f64,
    /// Keras' deprecated `rms_scaling`: `x * rsqrt(var + eps) * gamma`, no centring.
    pub rms_scaling: bool,
    /// gamma's and beta's shape as saved: the sizes of the normalized axes.
    #[module(skip)]
    pub param_shape: Vec<usize>,
}

impl LayerNorm {
    pub fn build(args: &mut LayerArgs, vars: Vec<HostTensor>, device: &Device) -> Result<Self> {
        let axes = args.take_ints("axis")?.unwrap_or(vec![-1]);
        let epsilon = args.take_f64("epsilon", 1e-3)?;
        let center = args.take_bool("center", true)?;
        let scale = args.take_bool("scale", true)?;
        let rms_scaling = args.take_bool("rms_scaling", false)?;
        let mut vars = VarReader::new(&args.what, vars);
        let any = vec![None; axes.len()];
        let gamma = if scale || rms_scaling { Some(vars.next("gamma", &any)?) } else { None };
        let beta = if center && !rms_scaling { Some(vars.next("beta", &any)?) } else { None };
        vars.finish()?;
        let param_shape = gamma.as_ref().or(beta.as_ref()).map(|p| p.shape.clone()).unwrap_or_default();
        let param = |p: Option<HostTensor>| p.map(|p| flat_tensor(&p, device).map(Param::from_tensor)).transpose();
        Ok(Self { gamma: param(gamma)?, beta: param(beta)?, axes, epsilon, rms_scaling, param_shape })
    }

    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let shape = x.shape();
        let rank = shape.len();
        let mut axes = call.axes(&self.axes, rank)?;
        axes.sort();
        // gamma and beta broadcast over the other axes.
        let broadcast: Vec<usize> = (0..rank).map(|i| if axes.contains(&i) { shape[i] } else { 1 }).collect();
        let param =
            |p: &Option<Param<Tensor<1>>>| p.as_ref().map(|p| DynTensor::from(p.val()).reshape(&broadcast)).transpose();
        let (gamma, beta) = (param(&self.gamma)?, param(&self.beta)?);
        let (mean, variance) = moments(&x, &axes, None)?;
        let y = if self.rms_scaling {
            // Keras' deprecated rms_scaling: x * rsqrt(var + eps) * gamma
            let y = DynTensor::binary(Binary::Multiply, x, inverse_deviation(variance, self.epsilon))?;
            match gamma {
                Some(g) => DynTensor::binary(Binary::Multiply, y, g)?,
                None => y,
            }
        } else {
            normalize(x, mean, variance, self.epsilon, gamma, beta)?
        };
        Ok(vec![keep_mask(Value::float(y), call)])
    }
}

/// `1 / sqrt(variance + epsilon)`.
fn inverse_deviation(variance: DynTensor, epsilon: f64) -> DynTensor {
    variance.map(Unary::Shift(epsilon as f32)).map(Unary::Sqrt).map(Unary::PowScalar(-1.0))
}

/// Keras' order of operations (TensorFlow's `batch_normalization`):
/// `inv = rsqrt(var + eps) * gamma; y = x * inv + (beta - mean * inv)`.
fn normalize(
    x: DynTensor,
    mean: DynTensor,
    variance: DynTensor,
    epsilon: f64,
    gamma: Option<DynTensor>,
    beta: Option<DynTensor>,
) -> Result<DynTensor> {
    let mut inv = inverse_deviation(variance, epsilon);
    if let Some(g) = gamma {
        inv = DynTensor::binary(Binary::Multiply, inv, g)?;
    }
    let mut offset = DynTensor::binary(Binary::Multiply, mean.map(Unary::Negative), inv.clone())?;
    if let Some(b) = beta {
        offset = DynTensor::binary(Binary::Add, offset, b)?;
    }
    DynTensor::binary(Binary::Add, DynTensor::binary(Binary::Multiply, x, inv)?, offset)
}

/// Mean and (biased) variance over `axes`, kept as size 1; with `weights`, weighted by them.
fn moments(x: &DynTensor, axes: &[usize], weights: Option<&DynTensor>) -> Result<(DynTensor, DynTensor)> {
    match weights {
        None => {
            let mean = x.clone().reduce(Reduce::Mean, axes, true)?;
            let centred = DynTensor::binary(Binary::Subtract, x.clone(), mean.clone())?;
            let variance = centred.map(Unary::Square).reduce(Reduce::Mean, axes, true)?;
            Ok((mean, variance))
        }
        Some(w) => {
            let w = w.clone().broadcast_to(&x.shape())?;
            let total = w.clone().reduce(Reduce::Sum, axes, true)?;
            let mean = DynTensor::binary(
                Binary::Divide,
                DynTensor::binary(Binary::Multiply, x.clone(), w.clone())?.reduce(Reduce::Sum, axes, true)?,
                total.clone(),
            )?;
            let centred = DynTensor::binary(Binary::Subtract, x.clone(), mean.clone())?;
            let weighted = DynTensor::binary(Binary::Multiply, centred.map(Unary::Square), w)?;
            let variance = DynTensor::binary(Binary::Divide, weighted.reduce(Reduce::Sum, axes, true)?, total)?;
            Ok((mean, variance))
        }
    }
}

/// `keras.layers.BatchNormalization(axis, momentum, epsilon, center, scale)`: the moving
/// statistics in inference, the batch's (over the unmasked steps) in training.
#[derive(Module, Debug)]
pub struct BatchNorm {
    pub gamma: Option<Param<Tensor<1>>>,
    pub beta: Option<Param<Tensor<1>>>,
    /// Updated by every training call, as Keras' `assign` does (not trained by gradients).
    pub moving_mean: RunningState<Tensor<1>>,
    pub moving_variance: RunningState<Tensor<1>>,
    pub axis: i64,
    pub epsilon: f64,
    pub momentum: f64,
}

impl BatchNorm {
    pub fn build(args: &mut LayerArgs, vars: Vec<HostTensor>, device: &Device) -> Result<Self> {
        let axis = match args.take_ints("axis")?.as_deref() {
            None => -1,
            Some([one]) => *one,
            Some(many) => return Err(args.error(format!("axis = {many:?}: one axis is supported"))),
        };
        let momentum = args.take_f64("momentum", 0.99)?;
        let epsilon = args.take_f64("epsilon", 1e-3)?;
        let center = args.take_bool("center", true)?;
        let scale = args.take_bool("scale", true)?;
        for refused in ["synchronized", "renorm"] {
            if args.take_bool(refused, false)? {
                return Err(args.error(format!("{refused} = true is not supported")));
            }
        }
        args.take("renorm_clipping");
        args.take("renorm_momentum");
        let mut vars = VarReader::new(&args.what, vars);
        let gamma = if scale { Some(flat_tensor(&vars.next("gamma", &[None])?, device)?) } else { None };
        let beta = if center { Some(flat_tensor(&vars.next("beta", &[None])?, device)?) } else { None };
        let moving_mean = flat_tensor(&vars.next("moving_mean", &[None])?, device)?;
        let moving_variance = flat_tensor(&vars.next("moving_variance", &[None])?, device)?;
        vars.finish()?;
        Ok(Self {
            gamma: gamma.map(Param::from_tensor),
            beta: beta.map(Param::from_tensor),
            moving_mean: RunningState::new(moving_mean),
            moving_variance: RunningState::new(moving_variance),
            axis,
            epsilon,
            momentum,
        })
    }

    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let shape = x.shape();
        let rank = shape.len();
        let channel = call.axis(self.axis, rank)?;
        let broadcast: Vec<usize> = (0..rank).map(|i| if i == channel { shape[i] } else { 1 }).collect();
        let as_shape = |t: Tensor<1>| DynTensor::from(t).reshape(&broadcast);
        let (mean, variance) = if call.training() {
            let reduce: Vec<usize> = (0..rank).filter(|&i| i != channel).collect();
            // Keras weights the moments by the mask (its shape is the input's without the last axis).
            let weights = match &call.previous_mask {
                Some(mask) if mask.rank() == rank - 1 => Some(mask.clone().expand_dims(rank - 1)?),
                _ => None,
            };
            let (mean, variance) = moments(&x, &reduce, weights.as_ref())?;
            // moving = moving * momentum + batch * (1 - momentum), outside the gradient
            let momentum = self.momentum as f32;
            for (state, batch) in [(&self.moving_mean, &mean), (&self.moving_variance, &variance)] {
                let batch = batch.clone().reshape(&[shape[channel]])?.rank_n::<1>("moments")?.detach();
                state.update(state.value_sync().mul_scalar(momentum) + batch.mul_scalar(1.0 - momentum));
            }
            (mean, variance)
        } else {
            (as_shape(self.moving_mean.value_sync())?, as_shape(self.moving_variance.value_sync())?)
        };
        let gamma = self.gamma.as_ref().map(|g| as_shape(g.val())).transpose()?;
        let beta = self.beta.as_ref().map(|b| as_shape(b.val())).transpose()?;
        let y = normalize(x, mean, variance, self.epsilon, gamma, beta)?;
        Ok(vec![keep_mask(Value::float(y), call)])
    }
}
