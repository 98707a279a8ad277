//! `keras.layers.GroupNormalization(groups, axis, epsilon, center, scale)`: the channels of `axis`
//! split into `groups` (`-1`: one per channel), each group normalised over every axis but the
//! batch's, in Keras' order of operations ([`super::moments`]). It supports masking. torch: the
//! prelude's `GroupNormalization` (`nn.GroupNorm` is channels-first and orders the arithmetic
//! differently).

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::moments::{moments, normalize};
use super::{Build, Call, KerasLayer, Variable, flat_tensor, keep_mask};
use crate::torch::{PyCall, TorchCall, TorchModule, py_bool};
use crate::value::{DynTensor, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct GroupNormalization {
    pub gamma: Option<Param<Tensor<1>>>,
    pub beta: Option<Param<Tensor<1>>>,
    pub groups: usize,
    pub axis: i64,
    pub epsilon: f64,
}

impl KerasLayer for GroupNormalization {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        let groups = match args.take_ints("groups")?.as_deref() {
            None => 32,
            Some([-1]) => 0, // one group per channel, known at the call
            Some([g]) if *g > 0 => *g as usize,
            Some(other) => return Err(args.error(format!("groups = {other:?}: a positive number or -1"))),
        };
        let axis = match args.take_ints("axis")?.as_deref() {
            None => -1,
            Some([a]) => *a,
            Some(many) => return Err(args.error(format!("axis = {many:?}: one axis"))),
        };
        let epsilon = args.take_f64("epsilon", 1e-3)?;
        let (center, scale) = (args.take_bool("center", true)?, args.take_bool("scale", true)?);
        let device = layer.device;
        let mut vars = layer.vars()?;
        let gamma = if scale { Some(flat_tensor(&vars.next("gamma", &[None])?, device)?) } else { None };
        let beta = if center { Some(flat_tensor(&vars.next("beta", &[None])?, device)?) } else { None };
        vars.finish()?;
        Ok(Self { gamma: gamma.map(Param::from_tensor), beta: beta.map(Param::from_tensor), groups, axis, epsilon })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let shape = x.shape();
        let rank = shape.len();
        let channel = call.axis(self.axis, rank)?;
        let channels = shape[channel];
        let groups = if self.groups == 0 { channels } else { self.groups };
        if channels % groups != 0 || rank + 1 > 6 {
            return Err(call.error(format!("{channels} channels in {groups} groups (rank {rank})")));
        }
        // [..., C, ...] -> [..., G, C / G, ...]; statistics over all but the batch and the groups.
        let mut grouped = shape.clone();
        grouped.splice(channel..=channel, [groups, channels / groups]);
        let reduce: Vec<usize> = (1..=rank).filter(|&a| a != channel).collect();
        let mut broadcast = vec![1; rank + 1];
        broadcast[channel] = groups;
        broadcast[channel + 1] = channels / groups;
        let param =
            |p: &Option<Param<Tensor<1>>>| p.as_ref().map(|p| DynTensor::from(p.val()).reshape(&broadcast)).transpose();
        let x = x.reshape(&grouped)?;
        let (mean, variance) = moments(&x, &reduce, None)?;
        let y = normalize(x, mean, variance, self.epsilon, param(&self.gamma)?, param(&self.beta)?)?;
        Ok(vec![keep_mask(Value::float(y.reshape(&shape)?), call)])
    }

    fn variables(&self) -> Vec<Variable> {
        [("gamma", &self.gamma), ("beta", &self.beta)]
            .into_iter()
            .filter_map(|(name, p)| Some(Variable::new(name, HostTensor::from_tensor(p.as_ref()?.val()))))
            .collect()
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let channels = self.gamma.as_ref().or(self.beta.as_ref()).map_or(0, |p| p.dims()[0]);
        let groups = if self.groups == 0 { -1 } else { self.groups as i64 };
        module.construct(
            PyCall::new("GroupNormalization")
                .kw("channels", channels)
                .kw("groups", groups)
                .kw("axis", self.axis)
                .kw("epsilon", format!("{:e}", self.epsilon))
                .kw("center", py_bool(self.beta.is_some()))
                .kw("scale", py_bool(self.gamma.is_some())),
        );
        for (name, p) in [("gamma", &self.gamma), ("beta", &self.beta)] {
            if let Some(p) = p {
                module.tensor(name, HostTensor::from_tensor(p.val()));
            }
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("self.{}({x})", call.attr), &call.previous_mask());
        Ok(format!("GroupNormalization(groups {})", self.groups))
    }
}
