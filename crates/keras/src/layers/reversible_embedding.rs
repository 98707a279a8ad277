//! `keras.layers.ReversibleEmbedding` (KerasHub's token embedding): rows of a table, and with
//! `reverse=True` logits over the vocabulary, `x @ embeddingsᵀ` (tied weights) or `x @
//! reverse_embeddings`, soft-capped as `tanh(logits / cap) * cap` where `logit_soft_cap` is set
//! (Gemma 2). torch: the prelude's `ReversibleEmbedding`, an `nn.Embedding` whose `reverse=True`
//! call is that product.

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::{Build, Call, KerasLayer, Variable};
use crate::torch::{PyCall, TorchCall, TorchModule, py_float};
use crate::value::{Binary, DynTensor, Unary, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct ReversibleEmbedding {
    /// `[input_dim, output_dim]`
    pub embeddings: Param<Tensor<2>>,
    /// `[output_dim, input_dim]`, where the weights are not tied.
    pub reverse_embeddings: Option<Param<Tensor<2>>>,
    pub mask_zero: bool,
    pub logit_soft_cap: Option<f64>,
}

impl KerasLayer for ReversibleEmbedding {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        let input_dim = args.take_usize("input_dim", None)?;
        let output_dim = args.take_usize("output_dim", None)?;
        let mask_zero = args.take_bool("mask_zero", false)?;
        let tie_weights = args.take_bool("tie_weights", true)?;
        let logit_soft_cap = match args.take("logit_soft_cap") {
            serde_json::Value::Null => None,
            value => Some(value.as_f64().ok_or_else(|| args.error(format!("logit_soft_cap = {value}: a number")))?),
        };
        match args.take("reverse_dtype") {
            serde_json::Value::Null => {}
            serde_json::Value::String(name) if name == "float32" => {}
            other => return Err(args.error(format!("reverse_dtype = {other}: only float32 is supported"))),
        }
        let mut vars = layer.vars()?;
        let table =
            vars.next("embeddings", &[Some(input_dim), Some(output_dim)])?.to_tensor("embeddings", layer.device)?;
        let reverse = if tie_weights {
            None
        } else {
            let kernel = vars.next("reverse_embeddings", &[Some(output_dim), Some(input_dim)])?;
            Some(Param::from_tensor(kernel.to_tensor("reverse_embeddings", layer.device)?))
        };
        vars.finish()?;
        Ok(Self { embeddings: Param::from_tensor(table), reverse_embeddings: reverse, mask_zero, logit_soft_cap })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?;
        let device = x.tensor.device();
        if !call.flag("reverse", false) {
            let out = DynTensor::gather_rows(self.embeddings.val(), x.tensor.clone())?; // [..., output_dim]
            let mask = if self.mask_zero {
                Some(DynTensor::binary(Binary::NotEqual, x.tensor, DynTensor::scalar(0.0, &device))?)
            } else {
                None
            };
            return Ok(vec![Value::float(out).with_mask(mask)]);
        }
        let kernel = match &self.reverse_embeddings {
            Some(reverse) => reverse.val(),          // [output_dim, input_dim]
            None => self.embeddings.val().transpose(), // [output_dim, input_dim]
        };
        let mut logits = DynTensor::matmul(x.tensor, DynTensor::from(kernel))?; // [..., input_dim]
        if let Some(cap) = self.logit_soft_cap {
            let cap = cap as f32;
            let divided = DynTensor::binary(Binary::Divide, logits, DynTensor::scalar(cap, &device))?;
            logits = divided.map(Unary::Tanh).map(Unary::Scale(cap));
        }
        Ok(vec![Value::float(logits)])
    }

    fn variables(&self) -> Vec<Variable> {
        let mut variables = vec![Variable::new("embeddings", HostTensor::from_tensor(self.embeddings.val()))];
        if let Some(reverse) = &self.reverse_embeddings {
            variables.push(Variable::new("reverse_embeddings", HostTensor::from_tensor(reverse.val())));
        }
        variables
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let [vocabulary, width] = self.embeddings.dims();
        module.construct(
            PyCall::new("ReversibleEmbedding")
                .arg(vocabulary)
                .arg(width)
                .kw_if(self.reverse_embeddings.is_some(), "tie_weights", "False")
                .kw_if(self.logit_soft_cap.is_some(), "logit_soft_cap", py_float(self.logit_soft_cap.unwrap_or_default())),
        );
        module.tensor("weight", HostTensor::from_tensor(self.embeddings.val()));
        if let Some(reverse) = &self.reverse_embeddings {
            module.tensor("reverse_weight", HostTensor::from_tensor(reverse.val()));
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        if call.flag("reverse") {
            call.assign(&format!("self.{}({x}, reverse=True)", call.attr), "None");
            return Ok("logits over the vocabulary".into());
        }
        let mask = if self.mask_zero { format!("{x} != 0") } else { "None".into() };
        call.assign(&format!("self.{}({x})", call.attr), &mask);
        let [vocabulary, width] = self.embeddings.dims();
        Ok(format!("nn.Embedding({vocabulary}, {width}){}", if self.mask_zero { ", mask = ids != 0" } else { "" }))
    }
}
