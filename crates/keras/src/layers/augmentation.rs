//! Keras' random augmentation layers at inference: `RandomFlip`, `RandomRotation`, `RandomZoom`,
//! `RandomContrast`, `RandomTranslation`, `RandomBrightness`, `RandomCrop`. With `training=False`
//! each returns its input (as float32) unchanged; `RandomCrop` too, even when the input is
//! larger than the crop (keras 3.15). Their arguments shape only the random transformations, so
//! none is refused. In training they would draw Keras' random transformations, which this
//! converter does not reproduce: a training call is an error naming the layer. None supports
//! masking. torch: the input, in eval mode.

use burn::module::Module;

use super::{Build, Call, KerasLayer};
use crate::torch::TorchCall;
use crate::value::Value;
use model::error::Result;

#[derive(Module, Debug)]
pub struct Augmentation {
    /// The Keras class, for the training error.
    pub class: String,
}

impl KerasLayer for Augmentation {
    fn build(layer: &mut Build) -> Result<Self> {
        layer.args.take_all(); // factors, fill modes, seeds: the random transformations' only
        Ok(Self { class: layer.class().to_string() })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        if call.training() {
            return Err(call.error(format!(
                "{} in training: Keras' random augmentation is not reproduced; train with the layer removed, or run it at inference",
                self.class
            )));
        }
        let x = call.tensor(0, "inputs")?.tensor;
        Ok(vec![Value::float(x)])
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        call.line(format!("assert not self.training, \"{}: random augmentation is not ported\"", self.class));
        call.assign(&format!("{x}.float()"), "None");
        Ok(format!("{} (identity at inference)", self.class))
    }
}
