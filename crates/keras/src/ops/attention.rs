//! `keras.ops.dot_product_attention` (KerasHub's Whisper, and any model calling it) as Keras'
//! TensorFlow backend computes it: `query [B, T, N, H]`, `key` and `value` `[B, S, K, H]` (key
//! and value heads repeated in place up to the query's when fewer), logits `q k^T * scale` plus
//! `bias`, the positions `mask` or `is_causal` hides replaced by `-0.7 * 3.38953e38` (finite: a
//! fully hidden query row attends to every key alike), softmax, the weighted values.

use serde_json::Value as Json;

use crate::config::LayerArgs;
use crate::layers::{Call, Input};
use crate::torch::PyCall;
use crate::value::{Binary, DType, DynTensor, Unary, Value};
use model::error::Result;
use model::weights::HostTensor;

/// The call's arguments after `query, key, value`, by position 3, 4, 5 or by name.
pub const KEYWORDS: &[&str] = &["bias", "mask", "scale"];

/// What a hidden logit becomes: TensorFlow's `_get_large_negative` for float32.
pub const HIDDEN: f32 = (-0.7 * 3.38953e38) as f32;

/// The options of a `DotProductAttention` node: `is_causal`. Flash attention is a way of
/// computing the same values (any setting is accepted); a logits soft cap is refused.
pub fn from_config(args: &mut LayerArgs) -> Result<bool> {
    let is_causal = args.take_bool("is_causal", false)?;
    match args.take("flash_attention") {
        Json::Null | Json::Bool(_) => {}
        other => return Err(args.error(format!("flash_attention = {other}: a boolean or null"))),
    }
    match args.take("attn_logits_soft_cap") {
        Json::Null => {}
        other => return Err(args.error(format!("attn_logits_soft_cap = {other}: not supported (JAX on TPU only)"))),
    }
    Ok(is_causal)
}

/// The attention of the call's `query`, `key`, `value` (`[B, T, N, H]`, `[B, S, K, H]`,
/// `[B, S, K, Hv]`): `[B, T, N, Hv]`.
pub fn call(is_causal: bool, call: &Call) -> Result<Value> {
    let tensor = |index: usize, name: &str| -> Result<Option<DynTensor>> {
        match call.arg(index, name) {
            None | Some(Input::Const(Json::Null)) => Ok(None),
            Some(Input::Tensor(v)) => Ok(Some(v.tensor.clone())),
            Some(other) => Err(call.error(format!("{name}: a tensor, not {:?}", other.constant()))),
        }
    };
    let required = |index: usize, name: &str| {
        tensor(index, name)?.ok_or_else(|| call.error(format!("dot_product_attention without its {name}")))
    };
    let (query, key, value) = (required(0, "query")?, required(1, "key")?, required(2, "value")?);
    let (bias, mask) = (tensor(3, "bias")?, tensor(4, "mask")?);
    let (sq, sk, sv) = (query.shape(), key.shape(), value.shape());
    if sq.len() != 4 || sk.len() != 4 || sv.len() != 4 {
        return Err(call.error(format!(
            "query {sq:?}, key {sk:?}, value {sv:?}: dot_product_attention takes rank-4 [B, T, N, H] tensors"
        )));
    }
    let (t, s, heads, key_heads) = (sq[1], sk[1], sq[2], sk[2]);
    let agrees = sk[0] == sq[0] && sk[3] == sq[3] && sv[..3] == sk[..3];
    if !agrees || key_heads == 0 || !heads.is_multiple_of(key_heads) {
        return Err(call.error(format!(
            "query {sq:?}, key {sk:?}, value {sv:?}: key and value [B, S, K, H] with K dividing the query's heads"
        )));
    }
    let scale = match call.arg(5, "scale") {
        None | Some(Input::Const(Json::Null)) => 1.0 / (sq[3] as f32).sqrt(),
        Some(Input::Const(Json::Number(n))) => n.as_f64().unwrap_or_default() as f32,
        Some(_) => return Err(call.error("scale: a number (a tensor scale is not supported)")),
    };
    // Grouped key heads: each repeated in place (TensorFlow's `repeat` on the heads axis).
    let groups = heads / key_heads;
    let (key, value) =
        if groups > 1 { (key.repeat_axis(2, groups)?, value.repeat_axis(2, groups)?) } else { (key, value) };
    let q = query.permute(&[0, 2, 1, 3])?; // [B, N, T, H]
    let k = key.permute(&[0, 2, 3, 1])?; // [B, N, H, S]
    let v = value.permute(&[0, 2, 1, 3])?; // [B, N, S, Hv]
    let mut logits = DynTensor::matmul(q, k)?.map(Unary::Scale(scale)); // [B, N, T, S]
    if let Some(bias) = bias {
        logits = DynTensor::binary(Binary::Add, logits, bias)?;
    }
    let device = logits.device();
    let causal = is_causal.then(|| {
        let data = (0..t).flat_map(|i| (0..s).map(move |j| if j <= i { 1.0 } else { 0.0 })).collect();
        DynTensor::from_host(&HostTensor::new(vec![t, s], data), &device) // [T, S]
    });
    let shown = match (mask, causal.transpose()?) {
        (Some(mask), Some(causal)) => Some(DynTensor::binary(Binary::LogicalAnd, mask, causal)?),
        (mask, causal) => mask.or(causal),
    };
    if let Some(shown) = shown {
        logits = DynTensor::select(shown, logits, DynTensor::scalar(HIDDEN, &device))?;
    }
    if logits.rank() != 4 {
        return Err(call.error(format!("bias or mask of a rank above 4: logits {:?}", logits.shape())));
    }
    let probs = logits.softmax(3); // [B, N, T, S]
    let attended = DynTensor::matmul(probs, v)?; // [B, N, T, Hv]
    Ok(Value::new(attended.permute(&[0, 2, 1, 3])?, DType::Float)) // [B, T, N, Hv]
}

/// The prelude's `dot_product_attention` on the rendered `query, key, value` and `bias, mask,
/// scale` (`None` where absent).
pub fn torch(is_causal: bool, tensors: [String; 3], options: [String; 3]) -> String {
    let [query, key, value] = tensors;
    let mut call = PyCall::new("dot_product_attention").arg(query).arg(key).arg(value);
    for (name, rendered) in KEYWORDS.iter().zip(options) {
        call = call.kw_if(rendered != "None", name, rendered);
    }
    call.kw_if(is_causal, "is_causal", "True").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hidden_logit_is_tensorflow_s_float32_large_negative() {
        // float(tf.constant(3.38953e38 * -0.7, "float32")) in keras 3.15.1's TensorFlow backend
        assert_eq!(HIDDEN, -2.372_671e38_f32);
        assert!(HIDDEN.is_finite() && (HIDDEN * 1.01).is_finite());
    }

    #[test]
    fn the_torch_call_names_only_what_the_node_gives() {
        let plain = torch(false, ["q".into(), "k".into(), "v".into()], ["None".into(), "None".into(), "None".into()]);
        assert_eq!(plain, "dot_product_attention(q, k, v)");
        let full = torch(true, ["q".into(), "k".into(), "v".into()], ["b".into(), "m".into(), "0.25".into()]);
        assert_eq!(full, "dot_product_attention(q, k, v, bias=b, mask=m, scale=0.25, is_causal=True)");
    }
}
