//! `keras.layers.ReversibleEmbedding` (KerasHub's token embedding): rows of a table, and with
//! `reverse=True` logits over the vocabulary, `x @ embeddingsᵀ` (tied weights) or `x @
//! reverse_embeddings`, soft-capped as `tanh(logits / cap) * cap` where `logit_soft_cap` is set
//! (Gemma 2). torch: the prelude's `ReversibleEmbedding`, an `nn.Embedding` whose `reverse=True`
//! call is that product.

use burn::module::{Module, Param};
use burn::tensor::Tensor;

use super::embedding::Embedding;
use super::{Build, Call, KerasLayer, Variable};
use crate::torch::{PyCall, TorchCall, TorchModule, py_float};
use crate::value::{Binary, DynTensor, Unary, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct ReversibleEmbedding {
    /// The table `[input_dim, output_dim]` and its lookup.
    pub embedding: Embedding,
    /// `[output_dim, input_dim]`, where the weights are not tied.
    pub reverse_embeddings: Option<Param<Tensor<2>>>,
    pub logit_soft_cap: Option<f64>,
}

impl KerasLayer for ReversibleEmbedding {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
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
        let embedding = Embedding::read(layer, &mut vars)?;
        let [input_dim, output_dim] = embedding.embeddings.dims();
        let reverse = if tie_weights {
            None
        } else {
            let kernel = vars.next("reverse_embeddings", &[Some(output_dim), Some(input_dim)])?;
            Some(Param::from_tensor(kernel.to_tensor("reverse_embeddings", layer.device)?))
        };
        vars.finish()?;
        Ok(Self { embedding, reverse_embeddings: reverse, logit_soft_cap })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?.tensor;
        if !call.flag("reverse", false) {
            return Ok(vec![self.embedding.look_up(x)?]);
        }
        let device = x.device();
        let kernel = match &self.reverse_embeddings {
            Some(reverse) => reverse.val(),                      // [output_dim, input_dim]
            None => self.embedding.embeddings.val().transpose(), // [output_dim, input_dim]
        };
        let mut logits = DynTensor::matmul(x, DynTensor::from(kernel))?; // [..., input_dim]
        if let Some(cap) = self.logit_soft_cap {
            let cap = cap as f32;
            let divided = DynTensor::binary(Binary::Divide, logits, DynTensor::scalar(cap, &device))?;
            logits = divided.map(Unary::Tanh).map(Unary::Scale(cap));
        }
        Ok(vec![Value::float(logits)])
    }

    fn variables(&self) -> Vec<Variable> {
        let mut variables = vec![Variable::new("embeddings", HostTensor::from_tensor(self.embedding.embeddings.val()))];
        if let Some(reverse) = &self.reverse_embeddings {
            variables.push(Variable::new("reverse_embeddings", HostTensor::from_tensor(reverse.val())));
        }
        variables
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let [vocabulary, width] = self.embedding.embeddings.dims();
        module.construct(
            PyCall::new("ReversibleEmbedding")
                .arg(vocabulary)
                .arg(width)
                .kw_if(self.reverse_embeddings.is_some(), "tie_weights", "False")
                .kw_if(self.logit_soft_cap.is_some(), "logit_soft_cap", py_float(self.logit_soft_cap.unwrap_or_default())),
        );
        module.tensor("weight", HostTensor::from_tensor(self.embedding.embeddings.val()));
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
        self.embedding.torch_look_up(call, &format!("self.{}({x})", call.attr), &x)
    }
}
