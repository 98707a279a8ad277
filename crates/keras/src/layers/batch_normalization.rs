//! `keras.layers.BatchNormalization(axis, momentum, epsilon, center, scale)`: the moving
//! statistics in inference, the batch's (over the unmasked steps) in training, in Keras' order
//! of operations ([`super::moments`]). It supports masking. torch: the prelude's
//! `BatchNormalization` (any channel axis, the mask-weighted moments).

use burn::module::{Module, Param, RunningState};
use burn::tensor::Tensor;

use super::moments::{moments, normalize};
use super::{Build, Call, KerasLayer, Variable, flat_tensor, keep_mask};
use crate::torch::{PyCall, TorchCall, TorchModule, py_bool};
use crate::value::{DynTensor, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct BatchNormalization {
    pub gamma: Option<Param<Tensor<1>>>,
    pub beta: Option<Param<Tensor<1>>>,
    /// Updated by every training call, as Keras' `assign` does (not trained by gradients).
    pub moving_mean: RunningState<Tensor<1>>,
    pub moving_variance: RunningState<Tensor<1>>,
    pub axis: i64,
    pub epsilon: f64,
    pub momentum: f64,
}

impl KerasLayer for BatchNormalization {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
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
        let device = layer.device;
        let mut vars = layer.vars()?;
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

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
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

    fn variables(&self) -> Vec<Variable> {
        self.tensors().into_iter().map(|(name, t)| Variable::new(name, t)).collect()
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let channels = self.moving_mean.value_sync().dims()[0];
        module.construct(
            PyCall::new("BatchNormalization")
                .kw("channels", channels)
                .kw("axis", self.axis)
                .kw("epsilon", format!("{:e}", self.epsilon))
                .kw("momentum", format!("{:?}", self.momentum))
                .kw("center", py_bool(self.beta.is_some()))
                .kw("scale", py_bool(self.gamma.is_some())),
        );
        for (name, t) in self.tensors() {
            module.tensor(name, t);
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let (x, mask) = (call.input()?, call.previous_mask());
        let invocation = PyCall::new(format!("self.{}", call.attr)).arg(x).kw_if(mask != "None", "mask", &mask);
        call.assign(&invocation.to_string(), &mask);
        Ok(format!("BatchNormalization(axis {}, eps {:e})", self.axis, self.epsilon))
    }
}

impl BatchNormalization {
    /// gamma and beta (those that exist) and the moving statistics, in Keras' order.
    fn tensors(&self) -> Vec<(&'static str, HostTensor)> {
        let host = |t| HostTensor::from_tensor::<1>(t);
        let mut out = Vec::new();
        for (name, p) in [("gamma", &self.gamma), ("beta", &self.beta)] {
            if let Some(p) = p {
                out.push((name, host(p.val())));
            }
        }
        out.push(("moving_mean", host(self.moving_mean.value_sync())));
        out.push(("moving_variance", host(self.moving_variance.value_sync())));
        out
    }
}
