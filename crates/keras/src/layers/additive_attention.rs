//! `keras.layers.AdditiveAttention(use_scale, dropout)`: Bahdanau attention, scores
//! `sum(scale * tanh(q + k))` over the features (`scale`: a trained `[D]` vector), then what
//! [`super::attention`] does with them (masks, softmax, dropout, the weighted values). torch:
//! the prelude's `AdditiveAttention`.

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::attention::{AttentionInputs, apply_scores, pairwise_sum, torch_attention_call};
use super::{Build, Call, KerasLayer, Variable, flat_tensor};
use crate::torch::{PyCall, TorchCall, TorchModule, py_bool, py_float};
use crate::value::{Binary, DynTensor, Reduce, Unary, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct AdditiveAttention {
    /// `use_scale`: `[D]`.
    pub scale: Option<Param<Tensor<1>>>,
    pub dropout: f64,
}

impl KerasLayer for AdditiveAttention {
    fn build(layer: &mut Build) -> Result<Self> {
        let use_scale = layer.args.take_bool("use_scale", true)?;
        let dropout = layer.args.take_f64("dropout", 0.0)?;
        let device = layer.device;
        let mut vars = layer.vars()?;
        let scale = if use_scale { Some(Param::from_tensor(flat_tensor(&vars.next("scale", &[None])?, device)?)) } else { None };
        vars.finish()?;
        Ok(Self { scale, dropout })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let inputs = AttentionInputs::read(call)?;
        let mut tanh = pairwise_sum(inputs.query.tensor.clone(), inputs.key.tensor.clone())?.map(Unary::Tanh); // [B, Tq, Tv, D]
        if let Some(s) = &self.scale {
            tanh = DynTensor::binary(Binary::Multiply, DynTensor::from(s.val()), tanh)?;
        }
        let scores = tanh.reduce(Reduce::Sum, &[3], false)?; // [B, Tq, Tv]
        apply_scores(scores, &inputs, self.dropout, call)
    }

    fn variables(&self) -> Vec<Variable> {
        self.scale.iter().map(|s| Variable::new("scale", HostTensor::from_tensor(s.val()))).collect()
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let features = self.scale.as_ref().map(|s| s.dims()[0]);
        module.construct(
            PyCall::new("AdditiveAttention")
                .kw_if(features.is_some(), "features", features.unwrap_or(0))
                .kw("use_scale", py_bool(self.scale.is_some()))
                .kw("dropout", py_float(self.dropout)),
        );
        if let Some(s) = &self.scale {
            module.tensor("scale", HostTensor::from_tensor(s.val()));
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        torch_attention_call(call)?;
        Ok("Keras' AdditiveAttention".into())
    }
}
