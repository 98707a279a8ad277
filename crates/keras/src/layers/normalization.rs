//! `keras.layers.Normalization(axis, mean, variance, invert)`: `(x - mean) / max(sqrt(variance),
//! 1e-7)`, or with `invert` `mean + x * max(sqrt(variance), 1e-7)`. The statistics are the adapted
//! variables `mean`, `variance` (and `count`), shaped by the kept axes, or the config's `mean` and
//! `variance`, aligned with the last kept axes and broadcast. It supports masking. torch: the
//! same arithmetic, the statistics as buffers.

use burn::module::{Module, Param};
use burn::tensor::Tensor;
use serde_json::Value as Json;

use super::{Build, Call, KerasLayer, Variable, flat_tensor, keep_mask};
use crate::torch::{PyCall, TorchCall, TorchModule, py_bool, tuple};
use crate::value::{Binary, DynTensor, Unary, Value, json_array};
use model::error::Result;
use model::weights::HostTensor;

/// Keras' `backend.epsilon()`.
const EPSILON: f32 = 1e-7;

#[derive(Module, Debug)]
pub struct Normalization {
    /// Not trained (Keras' statistics are non-trainable).
    pub mean: Param<Tensor<1>>,
    pub variance: Param<Tensor<1>>,
    /// The statistics' shape: the kept axes' sizes (adapted), or the config's arrays' shape.
    #[module(skip)]
    pub shape: Vec<usize>,
    /// Keras' `count` of an adapted layer (kept for its variables); `None` for config statistics.
    #[module(skip)]
    pub count: Option<f32>,
    #[module(skip)]
    pub axes: Vec<i64>,
    pub invert: bool,
}

impl KerasLayer for Normalization {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        let axes = match args.take("axis") {
            Json::Null => vec![],
            Json::Number(n) => vec![n.as_i64().ok_or_else(|| args.error("axis: not an integer"))?],
            Json::Array(items) => items.iter().map(Json::as_i64).collect::<Option<_>>().ok_or_else(|| args.error("axis: not integers"))?,
            other => return Err(args.error(format!("axis = {other}: not an integer or a list"))),
        };
        let invert = args.take_bool("invert", false)?;
        let (mean, variance) = (args.take("mean"), args.take("variance"));
        let device = layer.device;
        let frozen = |t: Tensor<1>| Param::from_tensor(t).set_require_grad(false);
        if mean.is_null() {
            let mut vars = layer.vars()?;
            let mean = vars.next_any("mean")?;
            let variance = vars.next("variance", &mean.shape.iter().map(|&d| Some(d)).collect::<Vec<_>>())?;
            let count = vars.next("count", &[])?.data.first().copied();
            vars.finish()?;
            return Ok(Self {
                shape: mean.shape.clone(),
                mean: frozen(flat_tensor(&mean, device)?),
                variance: frozen(flat_tensor(&variance, device)?),
                count,
                axes,
                invert,
            });
        }
        let array = |value: &Json, name: &str| -> Result<HostTensor> {
            json_array(value, false)
                .ok_or_else(|| layer.args.error(format!("{name} = {value}: not a number or a rectangular array")))
        };
        let (mean, variance) = (array(&mean, "mean")?, array(&variance, "variance")?);
        if mean.shape != variance.shape {
            return Err(layer.args.error("mean and variance have different shapes"));
        }
        Ok(Self {
            shape: mean.shape.clone(),
            mean: frozen(flat_tensor(&mean, device)?),
            variance: frozen(flat_tensor(&variance, device)?),
            count: None,
            axes,
            invert,
        })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let rank = x.rank();
        let mut kept = call.axes(&self.axes, rank)?;
        kept.sort();
        if self.shape.len() > kept.len() {
            return Err(call.error(format!("statistics of shape {:?} for {} kept axes", self.shape, kept.len())));
        }
        // The statistics' axes are the last kept axes; the others broadcast.
        let mut broadcast = vec![1; rank];
        for (size, &axis) in self.shape.iter().rev().zip(kept.iter().rev()) {
            broadcast[axis] = *size;
        }
        let statistic = |p: &Param<Tensor<1>>| DynTensor::from(p.val()).reshape(&broadcast);
        let deviation = statistic(&self.variance)?.map(Unary::Sqrt).map(Unary::Clip(EPSILON, f32::INFINITY));
        let y = if self.invert {
            DynTensor::binary(Binary::Add, statistic(&self.mean)?, DynTensor::binary(Binary::Multiply, x, deviation)?)?
        } else {
            DynTensor::binary(Binary::Divide, DynTensor::binary(Binary::Subtract, x, statistic(&self.mean)?)?, deviation)?
        };
        Ok(vec![keep_mask(Value::float(y), call)])
    }

    fn variables(&self) -> Vec<Variable> {
        let Some(count) = self.count else { return Vec::new() };
        let host = |p: &Param<Tensor<1>>| HostTensor::from_tensor(p.val()).reshaped(self.shape.clone());
        vec![
            Variable::new("mean", host(&self.mean)),
            Variable::new("variance", host(&self.variance)),
            Variable::new("count", HostTensor::new(vec![], vec![count])),
        ]
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        module.construct(
            PyCall::new("Normalization")
                .kw("mean_and_var_shape", format!("{:?}", self.shape))
                .kw("axis", tuple(&self.axes))
                .kw("invert", py_bool(self.invert)),
        );
        module.tensor("mean", HostTensor::from_tensor(self.mean.val()).reshaped(self.shape.clone()));
        module.tensor("variance", HostTensor::from_tensor(self.variance.val()).reshaped(self.shape.clone()));
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&format!("self.{}({x})", call.attr), &call.previous_mask());
        Ok("(x - mean) / sqrt(variance)".into())
    }
}
