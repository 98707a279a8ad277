//! `keras.layers.LayerNormalization(axis, epsilon, center, scale, rms_scaling)`, in Keras' order
//! of operations ([`super::moments`]). It supports masking. torch: `nn.LayerNorm` over the last
//! axis, else the prelude's `LayerNormalization` (any axes, Keras' order of operations).

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::moments::{inverse_deviation, moments, normalize};
use super::{Build, Call, KerasLayer, Variable, flat_tensor, keep_mask};
use crate::torch::{PyCall, TorchCall, TorchModule, py_bool, tuple};
use crate::value::{Binary, DynTensor, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct LayerNormalization {
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

impl KerasLayer for LayerNormalization {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        let axes = args.take_ints("axis")?.unwrap_or(vec![-1]);
        let epsilon = args.take_f64("epsilon", 1e-3)?;
        let center = args.take_bool("center", true)?;
        let scale = args.take_bool("scale", true)?;
        let rms_scaling = args.take_bool("rms_scaling", false)?;
        let mut vars = layer.vars()?;
        let any = vec![None; axes.len()];
        let gamma = if scale || rms_scaling { Some(vars.next("gamma", &any)?) } else { None };
        let beta = if center && !rms_scaling { Some(vars.next("beta", &any)?) } else { None };
        vars.finish()?;
        let param_shape = gamma.as_ref().or(beta.as_ref()).map(|p| p.shape.clone()).unwrap_or_default();
        let param =
            |p: Option<HostTensor>| p.map(|p| flat_tensor(&p, layer.device).map(Param::from_tensor)).transpose();
        Ok(Self { gamma: param(gamma)?, beta: param(beta)?, axes, epsilon, rms_scaling, param_shape })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
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

    fn variables(&self) -> Vec<Variable> {
        self.params()
            .map(|(name, p)| Variable::new(name, HostTensor::from_tensor(p.val()).reshaped(self.param_shape.clone())))
            .collect()
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let width = self.gamma.as_ref().or(self.beta.as_ref()).map_or(1, |p| p.dims()[0]);
        if let Some(constructor) = self.torch_builtin(width) {
            // torch's own layer: the last axis, and an affine part it can hold.
            module.construct(constructor);
            for (name, p) in [("weight", &self.gamma), ("bias", &self.beta)] {
                if let Some(p) = p {
                    module.tensor(name, HostTensor::from_tensor(p.val()));
                }
            }
            return Ok(());
        }
        module.construct(
            PyCall::new("LayerNormalization")
                .kw("param_shape", format!("[{width}]"))
                .kw("axis", tuple(&self.axes))
                .kw("epsilon", format!("{:e}", self.epsilon))
                .kw("center", py_bool(self.beta.is_some() || self.rms_scaling))
                .kw("scale", py_bool(self.gamma.is_some()))
                .kw_if(self.rms_scaling, "rms_scaling", "True"),
        );
        for (name, p) in self.params() {
            module.tensor(name, HostTensor::from_tensor(p.val()));
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("self.{}({x})", call.attr), &call.previous_mask());
        Ok(format!("LayerNormalization(axes {:?}, eps {:e})", self.axes, self.epsilon))
    }
}

impl LayerNormalization {
    /// `nn.LayerNorm(width, eps=...)` where it computes what Keras does: over the last axis only,
    /// with gamma and beta, gamma alone (`bias=False`) or neither; `None` otherwise (other axes,
    /// beta without gamma, `rms_scaling`).
    fn torch_builtin(&self, width: usize) -> Option<String> {
        if self.axes != [-1] || self.rms_scaling {
            return None;
        }
        let affine = match (self.gamma.is_some(), self.beta.is_some()) {
            (true, true) => "",
            (true, false) => ", bias=False",
            (false, false) => ", elementwise_affine=False",
            (false, true) => return None,
        };
        Some(format!("torch.nn.LayerNorm({width}, eps={:e}{affine})", self.epsilon))
    }

    /// `gamma` and `beta`, those that exist, in Keras' order.
    fn params(&self) -> impl Iterator<Item = (&'static str, &Param<Tensor<1>>)> {
        [("gamma", &self.gamma), ("beta", &self.beta)].into_iter().filter_map(|(n, p)| Some((n, p.as_ref()?)))
    }
}
