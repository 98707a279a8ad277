//! `keras.layers.Activation(activation)`: one of Keras' activations, elementwise. It supports
//! masking. torch: the activation as [`crate::torch::activate`] writes it (torch's function where
//! it is exact, else the prelude's function of Keras' name).

use burn::module::Module;

use super::{Build, Call, KerasLayer, keep_mask};
use crate::activation::Activation;
use crate::torch::{TorchCall, activate, activation_name};
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct ActivationLayer {
    #[module(skip)]
    pub activation: Activation,
}

impl KerasLayer for ActivationLayer {
    fn build(layer: &mut Build) -> Result<Self> {
        Ok(Self { activation: layer.activation()? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        Ok(vec![keep_mask(Value::float(self.activation.apply(x)), call)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.assign(&activate(self.activation, &x), &call.previous_mask());
        Ok(format!("activation {}", activation_name(self.activation)))
    }
}
