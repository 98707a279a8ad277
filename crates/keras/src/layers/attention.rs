//! `keras.layers.MultiHeadAttention` inside a model: this crate's Keras-exact layer
//! ([`model::KerasMha`], on the fused kernel) with the masks the graph hands it.
//!
//! Keras reads the query's, value's and key's masks off the tensors (a `key` left out is the
//! value, mask included), and hands the query's mask on to the output; the scores, when
//! returned, carry none.

use std::path::Path;

use burn::module::Module;
use burn::tensor::{Bool, Device, Tensor};

use super::Call;
use model::error::Result;
use crate::config::LayerArgs;
use crate::graph::LayerSpec;
use crate::saved::SavedWeights;
use crate::value::{DynTensor, Value};
use model::keras_file::config_from_arguments;
use model::{KerasMha, KerasMhaInput, KerasMhaNdInput, NdMask};

#[derive(Module, Debug)]
pub struct Attention {
    pub layer: KerasMha,
}

impl Attention {
    pub fn build(
        file: &Path,
        spec: &LayerSpec,
        saved: &SavedWeights,
        args: &mut LayerArgs,
        device: &Device,
    ) -> Result<Self> {
        let path = spec.h5_path.as_deref().unwrap_or_default();
        let weights = saved.attention_weights(path, &spec.name)?;
        let config = config_from_arguments(file, &spec.name, &spec.config, &weights)?;
        args.take_all(); // every argument was honoured or refused by the layer's own reader
        Ok(Self { layer: config.init_with_weights(&weights, device)? })
    }

    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let query = call.tensor(0, "query")?;
        let value = call.tensor(1, "value")?;
        let key = call.opt_tensor(2, "key");
        let attention_mask = call.opt_tensor(usize::MAX, "attention_mask").map(|v| v.tensor);
        let scores_wanted = call.flag("return_attention_scores", false);
        let causal = call.flag("use_causal_mask", false);
        let key_mask = key.as_ref().map_or(value.mask.clone(), |k| k.mask.clone());
        let rank = query.shape().len();
        let (output, scores) = if rank == 3 {
            let bool2 = |m: Option<DynTensor>| -> Result<Option<Tensor<2, Bool>>> {
                m.map(|m| Ok(m.rank_n::<2>("a [B, T] mask")?.not_equal_elem(0.0))).transpose()
            };
            let mut input = KerasMhaInput::new(query.tensor.rank_n::<3>("query")?, value.tensor.rank_n::<3>("value")?)
                .use_causal_mask(causal)
                .training(call.training())
                .return_attention_scores(scores_wanted);
            input.key = key.map(|k| k.tensor.rank_n::<3>("key")).transpose()?;
            input.attention_mask = attention_mask
                .map(|m| Ok::<_, model::ModelError>(m.rank_n::<3>("attention_mask [B, T, S]")?.not_equal_elem(0.0)))
                .transpose()?;
            input.query_mask = bool2(query.mask.clone())?;
            input.value_mask = bool2(value.mask.clone())?;
            input.key_mask = bool2(key_mask)?;
            let out = self.layer.forward(input)?;
            (DynTensor::from(out.output), out.attention_scores.map(DynTensor::from))
        } else {
            let nd = |m: Option<DynTensor>| {
                m.map(|m| {
                    let host = m.to_host();
                    NdMask::new(host.shape.clone(), host.data.iter().map(|&v| v != 0.0).collect())
                        .expect("shape and data agree")
                })
            };
            macro_rules! nd_call {
                ($d:literal) => {{
                    let mut input = KerasMhaNdInput::<$d>::new(
                        query.tensor.clone().rank_n::<$d>("query")?,
                        value.tensor.clone().rank_n::<$d>("value")?,
                    );
                    input.key = key.clone().map(|k| k.tensor.rank_n::<$d>("key")).transpose()?;
                    input.attention_mask = nd(attention_mask.clone());
                    input.query_mask = nd(query.mask.clone());
                    input.value_mask = nd(value.mask.clone());
                    input.key_mask = nd(key_mask.clone());
                    input.use_causal_mask = causal;
                    input.training = call.training();
                    input.return_attention_scores = scores_wanted;
                    let out = self.layer.forward_nd(input)?;
                    let scores = match out.attention_scores {
                        Some(s) => Some(DynTensor::from(s).reshape(&out.attention_scores_shape)?),
                        None => None,
                    };
                    (DynTensor::from(out.output), scores)
                }};
            }
            match rank {
                4 => nd_call!(4),
                5 => nd_call!(5),
                6 => nd_call!(6),
                _ => return Err(call.error(format!("a query of shape {:?}", query.shape()))),
            }
        };
        let mut outputs = vec![Value::float(output).with_mask(query.mask.clone())];
        if let Some(scores) = scores {
            outputs.push(Value::float(scores));
        }
        Ok(outputs)
    }
}
