//! `keras.layers.Attention(use_scale, score_mode, dropout)`: dot-product (Luong) attention of a
//! query `[B, Tq, D]` over a value `[B, Tv, D]` (and an optional key, else the value): scores
//! `q k^T` (times `scale`), or with `score_mode="concat"` `concat_score_weight * sum(tanh(scale
//! (q + k)))`; then [`apply_scores`], which [`super::additive_attention`] shares. Masks: the
//! value's mask (and `use_causal_mask`) hide keys, the query's zeroes the output's rows and goes
//! on to it. torch: the prelude's `Attention`.

use burn::module::{Module, Param};
use burn::tensor::{Distribution, Tensor};

use super::{Build, Call, Input, KerasLayer, Variable, random};
use crate::graph::Arg;
use crate::torch::{PyCall, TorchCall, TorchModule, py_bool, py_float, py_str, var};
use crate::value::{Binary, DynTensor, Reduce, Unary, Value};
use model::error::Result;
use model::weights::HostTensor;

#[derive(Module, Debug)]
pub struct Attention {
    /// `use_scale`: a trained scalar.
    pub scale: Option<Param<Tensor<1>>>,
    /// `score_mode="concat"`: a trained scalar weighing the summed scores.
    pub concat_score_weight: Option<Param<Tensor<1>>>,
    pub dropout: f64,
}

impl KerasLayer for Attention {
    fn build(layer: &mut Build) -> Result<Self> {
        let args = &mut layer.args;
        let use_scale = args.take_bool("use_scale", false)?;
        let concat = args.take_choice("score_mode", "dot", &["dot", "concat"])? == "concat";
        let dropout = args.take_f64("dropout", 0.0)?;
        let device = layer.device;
        let mut vars = layer.vars()?;
        let scalar = |t: HostTensor| t.reshaped(vec![1]).to_tensor::<1>("scalar", device).map(Param::from_tensor);
        let scale = if use_scale { Some(scalar(vars.next("scale", &[])?)?) } else { None };
        let concat_score_weight = if concat { Some(scalar(vars.next("concat_score_weight", &[])?)?) } else { None };
        vars.finish()?;
        Ok(Self { scale, concat_score_weight, dropout })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let inputs = AttentionInputs::read(call)?;
        let (query, key) = (inputs.query.tensor.clone(), inputs.key.tensor.clone());
        let scores = match &self.concat_score_weight {
            None => {
                let scores = DynTensor::matmul(query, key.permute(&[0, 2, 1])?)?; // [B, Tq, Tv]
                match &self.scale {
                    Some(s) => DynTensor::binary(Binary::Multiply, scores, DynTensor::from(s.val()))?,
                    None => scores,
                }
            }
            Some(weight) => {
                let mut sum = pairwise_sum(query, key)?; // [B, Tq, Tv, D]
                if let Some(s) = &self.scale {
                    sum = DynTensor::binary(Binary::Multiply, DynTensor::from(s.val()), sum)?;
                }
                let total = sum.map(Unary::Tanh).reduce(Reduce::Sum, &[3], false)?;
                DynTensor::binary(Binary::Multiply, DynTensor::from(weight.val()), total)?
            }
        };
        apply_scores(scores, &inputs, self.dropout, call)
    }

    fn variables(&self) -> Vec<Variable> {
        [("scale", &self.scale), ("concat_score_weight", &self.concat_score_weight)]
            .into_iter()
            .filter_map(|(name, p)| Some(Variable::new(name, HostTensor::from_tensor(p.as_ref()?.val()).reshaped(vec![]))))
            .collect()
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        module.construct(
            PyCall::new("Attention")
                .kw("use_scale", py_bool(self.scale.is_some()))
                .kw("score_mode", py_str(if self.concat_score_weight.is_some() { "concat" } else { "dot" }))
                .kw("dropout", py_float(self.dropout)),
        );
        for (name, p) in [("scale", &self.scale), ("concat_score_weight", &self.concat_score_weight)] {
            if let Some(p) = p {
                module.tensor(name, HostTensor::from_tensor(p.val()).reshaped(vec![]));
            }
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        torch_attention_call(call)?;
        Ok("Keras' dot-product Attention".into())
    }
}

/// `q[:, :, None, :] + k[:, None, :, :]`: `[B, Tq, Tv, D]`.
pub fn pairwise_sum(query: DynTensor, key: DynTensor) -> Result<DynTensor> {
    DynTensor::binary(Binary::Add, query.expand_dims(2)?, key.expand_dims(1)?)
}

/// The query, value and key of an attention call (`inputs=[query, value, key]`), with their
/// Keras masks (or an explicit `mask=[query_mask, value_mask]`), and `use_causal_mask`.
pub struct AttentionInputs {
    pub query: Value,
    pub value: Value,
    pub key: Value,
    pub query_mask: Option<DynTensor>,
    pub value_mask: Option<DynTensor>,
    pub causal: bool,
    pub return_scores: bool,
}

impl AttentionInputs {
    pub fn read(call: &Call) -> Result<Self> {
        let inputs = call.tensor_list()?;
        if !(2..=3).contains(&inputs.len()) || inputs.iter().any(|v| v.shape().len() != 3) {
            return Err(call.error("inputs: [query, value] or [query, value, key], each [B, T, D]"));
        }
        let (query, value) = (inputs[0].clone(), inputs[1].clone());
        let key = inputs.get(2).cloned().unwrap_or_else(|| value.clone());
        let (query_mask, value_mask) = match call.kwarg("mask") {
            Some(Input::List(masks)) => {
                let mask = |i: usize| match masks.get(i) {
                    Some(Input::Tensor(m)) => Some(m.tensor.clone()),
                    _ => None,
                };
                (mask(0), mask(1))
            }
            _ => (query.mask.clone(), value.mask.clone()),
        };
        Ok(Self {
            query,
            value,
            key,
            query_mask,
            value_mask,
            causal: call.flag("use_causal_mask", false),
            return_scores: call.flag("return_attention_scores", false),
        })
    }
}

/// Keras' `Attention._apply_scores` and what `call` does around it: hidden keys get `-1e9`
/// added, softmax over the keys, dropout in training, the weighted sum of the values, the rows
/// of masked queries zeroed. Outputs: the result (with the query's mask) and, when asked, the
/// weights.
pub fn apply_scores(scores: DynTensor, inputs: &AttentionInputs, dropout: f64, call: &Call) -> Result<Vec<Value>> {
    let device = scores.device();
    let shape = scores.shape(); // [B, Tq, Tv]
    let mut visible = inputs.value_mask.clone().map(|m| m.expand_dims(1)).transpose()?; // [B, 1, Tv]
    if inputs.causal {
        let (tq, tv) = (shape[1], shape[2]);
        let rule: Vec<f32> = (0..tq).flat_map(|i| (0..tv).map(move |j| if i >= j { 1.0 } else { 0.0 })).collect();
        let causal = DynTensor::from_host(&HostTensor::new(vec![1, tq, tv], rule), &device)?;
        visible = Some(match visible {
            Some(v) => DynTensor::binary(Binary::LogicalAnd, v, causal)?,
            None => causal,
        });
    }
    let scores = match visible {
        Some(visible) => {
            let lowered = scores.clone().map(Unary::Shift(-1e9));
            DynTensor::select(visible, scores, lowered)?
        }
        None => scores,
    };
    let mut weights = scores.softmax(2);
    if call.training() && dropout > 0.0 {
        let keep = random(&weights.shape(), Distribution::Bernoulli(1.0 - dropout), &device)?;
        let scaled = keep.map(Unary::Scale((1.0 / (1.0 - dropout)) as f32));
        weights = DynTensor::binary(Binary::Multiply, weights, scaled)?;
    }
    let mut output = DynTensor::matmul(weights.clone(), inputs.value.tensor.clone())?; // [B, Tq, D]
    if let Some(mask) = &inputs.query_mask {
        let zeros = DynTensor::scalar(0.0, &device);
        output = DynTensor::select(mask.clone().expand_dims(2)?, output, zeros)?;
    }
    let mut outputs = vec![Value::float(output).with_mask(inputs.query_mask.clone())];
    if inputs.return_scores {
        outputs.push(Value::float(weights));
    }
    Ok(outputs)
}

/// `x<i>[, x<i>_1], m<i> = self.<attr>(query, value, key, query_mask, value_mask, ...)`.
pub fn torch_attention_call(call: &mut TorchCall) -> Result<()> {
    let ports = call.node.args.first().map(Arg::ports).unwrap_or_default();
    if !(2..=3).contains(&ports.len()) {
        return Err(call.refuse("inputs: [query, value] or [query, value, key]"));
    }
    let (query, value) = (ports[0], ports[1]);
    let (query_mask, value_mask) = match call.kwarg("mask") {
        Some(Arg::List(masks)) => {
            let mask = |i: usize| match masks.get(i) {
                Some(Arg::Tensor(p)) => var(*p),
                _ => "None".into(),
            };
            (mask(0), mask(1))
        }
        _ => (call.mask_of(query), call.mask_of(value)),
    };
    let (causal, scores) = (call.flag("use_causal_mask"), call.flag("return_attention_scores"));
    let invocation = PyCall::new(format!("self.{}", call.attr))
        .arg(var(query))
        .arg(var(value))
        .kw_if(ports.len() == 3, "key", ports.get(2).map_or(String::new(), |&key| var(key)))
        .kw_if(query_mask != "None", "query_mask", &query_mask)
        .kw_if(value_mask != "None", "value_mask", &value_mask)
        .kw_if(causal, "use_causal_mask", "True")
        .kw_if(scores, "return_attention_scores", "True");
    call.assign_outputs(if scores { 2 } else { 1 }, &invocation.to_string(), &query_mask);
    Ok(())
}
