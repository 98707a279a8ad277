//! `keras.layers.MultiHeadAttention` inside a model: this crate's Keras-exact layer
//! ([`model::KerasMha`], on the fused kernel) with the masks the graph hands it.
//!
//! Keras reads the query's, value's and key's masks off the tensors (a `key` left out is the
//! value, mask included), and hands the query's mask on to the output; the scores, when
//! returned, carry none. Once called, it takes the masks off its input tensors
//! (`set_keras_mask(query, None)`): later readers of them see none.
//!
//! torch: the prelude's `MultiHeadAttention`, Keras' widths and mask rules written out
//! (`nn.MultiheadAttention` cannot express `key_dim` apart from the model width).

use burn::module::Module;
use burn::tensor::{Bool, Tensor};

use super::{Build, Call, KerasLayer, Variable};
use crate::graph::Arg;
use crate::torch::{PyCall, TorchCall, TorchModule, py_bool, py_float, var};
use crate::value::{DynTensor, Value};
use model::error::Result;
use model::keras_file::{ATTENTION_SUBLAYERS, config_from_arguments};
use model::weights::HostTensor;
use model::{KerasMha, KerasMhaInput, KerasMhaNdInput, NdMask};

#[derive(Module, Debug)]
pub struct MultiHeadAttention {
    pub layer: KerasMha,
}

impl KerasLayer for MultiHeadAttention {
    fn build(layer: &mut Build) -> Result<Self> {
        let spec = layer.spec;
        let path = spec.h5_path.as_deref().unwrap_or_default();
        let weights = layer.saved.attention_weights(path, &spec.name)?;
        let config = config_from_arguments(layer.file, &spec.name, &spec.config, &weights)?;
        layer.args.take_all(); // every argument was honoured or refused by the layer's own reader
        Ok(Self { layer: config.init_with_weights(&weights, layer.device)? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let query = call.tensor(0, "query")?;
        let value = call.tensor(1, "value")?;
        // `layer(x, x)` (or `layer(x, x, x)`): one tensor, which the projections read once.
        let query_port = call.port(0, "query");
        let one_input = query_port.is_some() && call.port(1, "value") == query_port;
        let key = call.opt_tensor(2, "key").filter(|_| !(one_input && call.port(2, "key") == query_port));
        let attention_mask = call.opt_tensor(usize::MAX, "attention_mask").map(|v| v.tensor);
        let scores_wanted = call.flag("return_attention_scores", false);
        let causal = call.flag("use_causal_mask", false);
        let key_mask = key.as_ref().map_or(value.mask.clone(), |k| k.mask.clone());
        let rank = query.shape().len();
        let (output, scores) = if rank == 3 {
            let bool2 = |m: Option<DynTensor>| -> Result<Option<Tensor<2, Bool>>> {
                m.map(|m| Ok(m.rank_n::<2>("a [B, T] mask")?.not_equal_elem(0.0))).transpose()
            };
            let (batch, query_len, source_len) = (query.shape()[0], query.shape()[1], value.shape()[1]);
            let input = KerasMhaInput::new(query.tensor.rank_n::<3>("query")?, value.tensor.rank_n::<3>("value")?);
            let mut input = KerasMhaInput { self_attention: one_input, ..input }
                .use_causal_mask(causal)
                .training(call.training())
                .return_attention_scores(scores_wanted);
            input.key = key.map(|k| k.tensor.rank_n::<3>("key")).transpose()?;
            // Keras broadcasts the mask against the scores: `[B, 1, S]` (a padding mask, as
            // KerasHub's DistilBERT and RoBERTa pass it) or `[T, S]` serve every row or batch.
            input.attention_mask = attention_mask
                .map(|m| {
                    let m = m.lift_to(3)?.broadcast_to(&[batch, query_len, source_len])?;
                    Ok::<_, model::ModelError>(m.rank_n::<3>("attention_mask [B, T, S]")?.not_equal_elem(0.0))
                })
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

    fn clears_input_masks(&self) -> bool {
        true
    }

    fn variables(&self) -> Vec<Variable> {
        let weights = self.layer.keras_weights();
        let mut vars = Vec::new();
        for (group, ours) in ATTENTION_SUBLAYERS {
            for name in ["kernel", "bias"] {
                if let Ok(tensor) = weights.get(&format!("{ours}.{name}")) {
                    let path = format!("{ours}/{name}");
                    vars.push(Variable { path, group: format!("/{group}"), tensor: tensor.clone() });
                }
            }
        }
        vars
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        let layer = &self.layer;
        let d = layer.dims();
        // Keras' arguments, then the input widths Keras reads off the first call's shapes.
        module.construct(
            PyCall::new("MultiHeadAttention")
                .kw("query_dim", d.query_dim)
                .kw("num_heads", d.num_heads)
                .kw("key_dim", d.key_dim)
                .kw_if(d.value_dim != d.key_dim, "value_dim", d.value_dim)
                .kw("dropout", py_float(layer.dropout))
                .kw("use_bias", py_bool(layer.query.bias.is_some()))
                .kw_if(d.output_dim != d.query_dim, "output_dim", d.output_dim)
                .kw_if(d.value_input_dim != d.query_dim, "value_input_dim", d.value_input_dim)
                .kw_if(d.key_input_dim != d.value_input_dim, "key_input_dim", d.key_input_dim),
        );
        for (name, linear) in
            [("query", &layer.query), ("key", &layer.key), ("value", &layer.value), ("output", &layer.output)]
        {
            module.tensor(&format!("{name}.weight"), HostTensor::from_tensor(linear.weight.val()).transposed());
            if let Some(b) = &linear.bias {
                module.tensor(&format!("{name}.bias"), HostTensor::from_tensor(b.val()));
            }
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let layer = &self.layer;
        if layer.gate.is_some() || layer.sliding_window.is_some() {
            return Err(call.refuse("use_gate and sliding_window are not written for torch yet"));
        }
        let query = call.port(0, "query").ok_or_else(|| call.refuse("no query tensor"))?;
        let value = call.port(1, "value").ok_or_else(|| call.refuse("no value tensor"))?;
        let key = call.port(2, "key");
        let rank = call.ranks.get(query.node).copied().unwrap_or(3);
        let axes = model::keras_mha::resolve_attention_axes(layer.attention_axes.as_deref(), rank)
            .map_err(|e| call.refuse(e))?;
        let causal = call.flag("use_causal_mask");
        let scores = call.flag("return_attention_scores");
        // The call as a user would write it: the query and value, then only what is not a default.
        let mut arguments = vec![var(query), var(value)];
        let mut keyword = |name: &str, value: String| {
            if value != "None" && value != "False" {
                arguments.push(format!("{name}={value}"));
            }
        };
        keyword("key", key.map_or("None".into(), var));
        keyword("query_mask", call.mask_of(query));
        keyword("value_mask", call.mask_of(value));
        keyword("key_mask", key.map_or("None".into(), |k| call.mask_of(k)));
        let node = call.node;
        let attention_mask = node.kwargs.iter().find(|(k, _)| k == "attention_mask").map(|(_, a)| a);
        keyword("attention_mask", attention_mask.map_or("None".into(), |a| call.render(a)));
        keyword("use_causal_mask", py_bool(causal).into());
        keyword("return_attention_scores", py_bool(scores).into());
        // Left out only where it is Keras' default for this rank: every axis between the batch
        // and the features (`[1]` at rank 3 alone).
        if axes != (1..rank - 1).collect::<Vec<_>>() {
            keyword("attention_axes", format!("{axes:?}"));
        }
        let invocation = format!("self.{}({})", call.attr, arguments.join(", "));
        call.assign_outputs(if scores { 2 } else { 1 }, &invocation, &call.mask_of(query));
        let mut cleared = Vec::new();
        let node = call.node;
        for port in node.args.iter().chain(node.kwargs.iter().map(|(_, a)| a)).flat_map(Arg::ports) {
            if port.index == 0 && call.is_masked(port.node) && !cleared.contains(&port.node) {
                cleared.push(port.node);
                call.line(format!("m{} = None  # Keras' attention clears its inputs' masks", port.node));
            }
        }
        Ok("MultiHeadAttention (Keras' rules, written in torch)".into())
    }
}
