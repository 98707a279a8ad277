//! `keras.layers.Rescaling(scale, offset)`: `float(x) * scale + offset`, each a number or an array
//! broadcast over the last axes (Keras saves an array as a `__numpy__` object). It supports
//! masking. torch: the same arithmetic.

use burn::module::Module;
use serde_json::Value as Json;

use super::{Build, Call, KerasLayer, keep_mask};
use crate::config::LayerArgs;
use crate::torch::TorchCall;
use crate::value::{Binary, DType, DynTensor, Value, json_array};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct Rescaling {
    #[module(skip)]
    pub scale: HostTensor,
    #[module(skip)]
    pub offset: HostTensor,
}

impl KerasLayer for Rescaling {
    fn build(layer: &mut Build) -> Result<Self> {
        let scale = constant(&mut layer.args, "scale", None)?;
        let offset = constant(&mut layer.args, "offset", Some(0.0))?;
        Ok(Self { scale, offset })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        let device = x.device();
        let scaled = DynTensor::binary(Binary::Multiply, x, DynTensor::from_host(&self.scale, &device)?)?;
        let y = DynTensor::binary(Binary::Add, scaled, DynTensor::from_host(&self.offset, &device)?)?;
        Ok(vec![keep_mask(Value::new(y, DType::Float), call)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let (scale, offset) = (python_constant(&self.scale), python_constant(&self.offset));
        call.assign(&format!("{x}.float() * {scale} + {offset}"), &call.previous_mask());
        Ok("x * scale + offset".into())
    }
}

/// A number, a list, or Keras' serialised numpy array (`{"class_name": "__numpy__", "config":
/// {"value": ...}}`), as a tensor; `default` when absent.
fn constant(args: &mut LayerArgs, argument: &str, default: Option<f32>) -> Result<HostTensor> {
    let value = args.take(argument);
    let value = match &value {
        Json::Object(o) if o.get("class_name").and_then(Json::as_str) == Some("__numpy__") => {
            o.get("config").and_then(|c| c.get("value")).cloned().unwrap_or(Json::Null)
        }
        _ => value,
    };
    match (&value, default) {
        (Json::Null, Some(d)) => Ok(HostTensor::new(vec![1], vec![d])),
        _ => match json_array(&value, false) {
            Some(t) if !t.data.is_empty() => {
                let shape = if t.shape.is_empty() { vec![1] } else { t.shape.clone() };
                Ok(t.reshaped(shape))
            }
            _ => Err(args.error(format!("{argument} = {value}: not a number or an array of numbers"))),
        },
    }
}

/// The constant as a Python number or `torch.tensor`.
fn python_constant(t: &HostTensor) -> String {
    if t.data.len() == 1 {
        format!("{:?}", t.data[0])
    } else {
        format!("torch.tensor({:?}).reshape({:?})", t.data, t.shape)
    }
}
