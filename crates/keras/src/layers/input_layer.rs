//! `keras.layers.InputLayer`: where a model input enters the graph. Also the stand-in for a
//! nested model, whose own layers the graph has expanded already.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::TorchCall;
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct InputLayer;

impl KerasLayer for InputLayer {
    fn build(layer: &mut Build) -> Result<Self> {
        // The shape and dtype are the graph's (`InputSpec`); the rest changes nothing here.
        for inert in ["batch_shape", "batch_input_shape", "sparse", "ragged", "optional", "input_shape", "batch_size"] {
            layer.args.take(inert);
        }
        Ok(Self)
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        Ok(vec![call.tensor(0, "inputs")?])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let input = call.model_input.ok_or_else(|| call.refuse("an input layer that is not a model input"))?;
        call.assign(input, "None");
        Ok("input".into())
    }
}
