//! [`KerasModel`]: a whole Keras 3 model, built from its `.keras` archive at run time, as one
//! Burn module (every layer's variables are its parameters, so it trains on any backend).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use burn::module::Module;
use burn::tensor::Device;

use super::graph::{Arg, CallMask, Graph, InputSpec};
use super::layers::input_layer::InputLayer;
use super::layers::{Call, Input, Layer};
use super::saved::{SavedWeights, Store};
use super::value::{DType, DynTensor, Value, constant_tensor};
use model::error::{ModelError, Result};
use model::weights::{HostTensor, WeightMap};

/// A Keras model: its layers as Burn modules and its graph of calls.
#[derive(Module, Debug)]
pub struct KerasModel {
    /// One entry per layer of the graph ([`Graph::layers`]), operations included.
    pub layers: Vec<Layer>,
    #[module(skip)]
    pub graph: Arc<Graph>,
    /// The archive's `config.json`, kept for [`Self::save_burnpack`].
    #[module(skip)]
    pub config: Arc<serde_json::Value>,
}

/// The burnpack metadata key that holds a whole model's `config.json`.
const CONFIG_KEY: &str = "keras.config.json";

/// The outputs of a call, and optionally every node's first output (for finding where a port
/// goes wrong).
pub struct ModelOutputs {
    pub outputs: Vec<Value>,
    /// `(node label, its first output)` in execution order, when asked for.
    pub nodes: Vec<(String, Value)>,
}

impl KerasModel {
    /// Reads a `.keras` archive and builds every layer on `device`.
    pub fn from_file(path: &Path, device: &Device) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| ModelError::file(path, e))?;
        let (config, store) = if bytes.starts_with(b"PK") {
            let (config, h5) = model::keras_file::open_archive(path, bytes)?;
            (config, Store::H5(h5))
        } else {
            read_burnpack(path, bytes)?
        };
        let graph = Graph::from_config(path, &config)?;
        let saved = SavedWeights::new(path, store);
        let layers = graph
            .layers
            .iter()
            .map(|spec| {
                if spec.config.get("layers").is_some() {
                    // A nested model: its inner layers are in the graph already.
                    return Ok(Layer::InputLayer(InputLayer));
                }
                let place = place_in_graph(&graph, spec);
                Layer::build(path, spec, &saved, device, &place).map_err(|e| match e {
                    ModelError::File { .. } => e,
                    other => ModelError::file(path, format!("layer {} ({}): {other}", spec.name, spec.class_name)),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self { layers, graph: Arc::new(graph), config: Arc::new(config) })
    }

    /// The model's inputs, in the order `forward` takes them.
    pub fn inputs(&self) -> &[InputSpec] {
        &self.graph.inputs
    }

    /// The output layers' names, in the order `forward` returns them.
    pub fn output_names(&self) -> Vec<String> {
        self.graph.outputs.iter().map(|(name, _)| name.clone()).collect()
    }

    /// Every variable under its HDF5 path in Keras' saving layout (`layers/dense/vars/0`,
    /// `layers/multi_head_attention/query_dense/vars/1`): what [`Self::save_burnpack`] stores
    /// and [`Self::from_file`] reads back.
    pub fn saved_variables(&self) -> WeightMap {
        let mut out = WeightMap::new();
        for (layer, spec) in self.layers.iter().zip(&self.graph.layers) {
            let Some(path) = &spec.h5_path else { continue };
            let mut index_in_group: BTreeMap<String, usize> = BTreeMap::new();
            for var in layer.variables() {
                let index = index_in_group.entry(var.group.clone()).or_insert(0);
                out.insert(format!("{path}{}/vars/{index}", var.group), var.tensor);
                *index += 1;
            }
        }
        out
    }

    /// Writes the model as a burnpack that [`Self::from_file`] and `cargo xtask predict` load:
    /// its variables by their HDF5 paths, and `config.json` in the metadata. Atomic.
    pub fn save_burnpack(&self, path: &Path) -> Result<()> {
        let tensors = self
            .saved_variables()
            .iter()
            .map(|(name, t)| {
                let bytes = t.data.iter().flat_map(|v| v.to_le_bytes()).collect();
                burn_pack::Tensor::new(
                    name.to_string(),
                    burn_pack::DType::F32,
                    t.shape.clone(),
                    None,
                    burn_pack::Bytes::from_bytes_vec(bytes),
                )
            })
            .collect();
        let writer = burn_pack::Writer::new(tensors)
            .with_metadata(CONFIG_KEY, &self.config.to_string())
            .with_metadata("format", "a whole Keras model: variables by their model.weights.h5 paths");
        let bytes =
            writer.into_bytes().map_err(|e| ModelError::file(path, format!("cannot encode burnpack: {e:?}")))?;
        model::weights::write_atomic(path, &bytes)
    }

    /// Every variable under its Keras path (`dense/kernel`, `mha/query/kernel`; a nested model's
    /// layers as `outer/inner/...`) in Keras' layout, as `layer.weights[i].path` names them. Map
    /// the parameters to their gradients first to read gradients the same way.
    pub fn keras_variables(&self) -> WeightMap {
        let mut out = WeightMap::new();
        for (layer, spec) in self.layers.iter().zip(&self.graph.layers) {
            for var in layer.variables() {
                out.insert(format!("{}/{}", spec.name, var.path), var.tensor);
            }
        }
        out
    }

    /// Runs the model on `inputs` (in [`Self::inputs`]' order), in inference or training mode.
    pub fn forward(&self, inputs: Vec<DynTensor>, training: bool) -> Result<Vec<Value>> {
        Ok(self.run(inputs, training, false)?.outputs)
    }

    /// [`Self::forward`] on host tensors, outputs back on the host.
    pub fn predict(&self, inputs: &[HostTensor], device: &Device) -> Result<Vec<HostTensor>> {
        let tensors = inputs.iter().map(|h| DynTensor::from_host(h, device)).collect::<Result<Vec<_>>>()?;
        Ok(self.forward(tensors, false)?.into_iter().map(|v| v.tensor.to_host()).collect())
    }

    /// Runs the graph; with `keep_nodes`, also returns every node's first output.
    pub fn run(&self, inputs: Vec<DynTensor>, training: bool, keep_nodes: bool) -> Result<ModelOutputs> {
        let graph = &self.graph;
        if inputs.len() != graph.inputs.len() {
            return Err(ModelError::InvalidConfig {
                field: "inputs",
                value: inputs.len().to_string(),
                reason: format!(
                    "the model takes {} inputs: {:?}",
                    graph.inputs.len(),
                    graph.inputs.iter().map(|i| &i.name).collect::<Vec<_>>()
                ),
            });
        }
        let Some(device) = inputs.first().map(DynTensor::device) else {
            return Err(ModelError::InvalidConfig {
                field: "inputs",
                value: "none".into(),
                reason: "the model takes none".into(),
            });
        };
        let mut values: Vec<Option<Vec<Value>>> = vec![None; graph.nodes.len()];
        for (spec, tensor) in graph.inputs.iter().zip(inputs) {
            check_input_shape(spec, &tensor.shape())?;
            let dtype = DType::parse(&spec.dtype).unwrap_or(DType::Float);
            values[spec.node] = Some(vec![Value::new(tensor, dtype)]);
        }
        let mut nodes = Vec::new();
        for (index, node) in graph.nodes.iter().enumerate() {
            if values[index].is_none() {
                let what = format!("layer {} ({})", node.label, graph.layer_of(node).class_name);
                let resolve = |arg: &Arg| resolve(arg, &values, &what, &device);
                let args = node.args.iter().map(resolve).collect::<Result<Vec<_>>>()?;
                let kwargs =
                    node.kwargs.iter().map(|(k, a)| Ok((k.clone(), resolve(a)?))).collect::<Result<Vec<_>>>()?;
                let explicit_mask = match kwargs.iter().find(|(k, _)| k == "mask") {
                    Some((_, Input::Tensor(mask))) => Some(mask.tensor.clone()),
                    _ => None,
                };
                let first_mask = match args.first() {
                    Some(Input::Tensor(first)) => first.mask.clone(),
                    _ => None,
                };
                let mask = match node.call_mask() {
                    CallMask::Explicit(_) => explicit_mask.clone(),
                    CallMask::OfArgument(_) => first_mask.clone(),
                    CallMask::None => None,
                };
                let previous_mask = explicit_mask.or(first_mask);
                let call = Call { what: &what, args, kwargs, training, mask, previous_mask, node: Some(node) };
                let outputs = self.layers[node.layer].call(&call)?;
                values[index] = Some(outputs);
                if self.layers[node.layer].clears_input_masks() {
                    // Keras' MultiHeadAttention takes the masks off its input tensors
                    // (`set_keras_mask(query, None)`): later readers of them see none.
                    for port in node.args.iter().chain(node.kwargs.iter().map(|(_, a)| a)).flat_map(Arg::ports) {
                        if let Some(value) = values[port.node].as_mut().and_then(|v| v.get_mut(port.index)) {
                            value.mask = None;
                        }
                    }
                }
            }
            if keep_nodes && let Some(first) = values[index].as_ref().and_then(|v| v.first()) {
                nodes.push((node.label.clone(), first.clone()));
            }
        }
        let outputs = graph
            .outputs
            .iter()
            .map(|(name, port)| {
                values[port.node].as_ref().and_then(|v| v.get(port.index)).cloned().ok_or_else(|| {
                    ModelError::InvalidConfig {
                        field: "outputs",
                        value: name.clone(),
                        reason: format!("layer {name} has no output {}", port.index),
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ModelOutputs { outputs, nodes })
    }
}

/// Where a layer sits: what its first call reads, for errors (`called on embedding, dense`).
fn place_in_graph(graph: &Graph, spec: &super::graph::LayerSpec) -> String {
    let Some(node) = graph.nodes.iter().find(|n| graph.layers[n.layer].name == spec.name) else {
        return "not on a path to an output".to_string();
    };
    let sources: Vec<&str> = node
        .args
        .iter()
        .chain(node.kwargs.iter().map(|(_, a)| a))
        .flat_map(Arg::ports)
        .map(|p| graph.nodes[p.node].label.as_str())
        .collect();
    format!("called on {}", if sources.is_empty() { "nothing".to_string() } else { sources.join(", ") })
}

/// A burnpack written by [`KerasModel::save_burnpack`]: its config and variables.
fn read_burnpack(path: &Path, bytes: Vec<u8>) -> Result<(serde_json::Value, Store)> {
    let not_a_model = || {
        ModelError::file(
            path,
            "neither a .keras archive (zip) nor a burnpack written by `cargo xtask convert MODEL.keras --to burn`",
        )
    };
    let reader = burn_pack::Reader::from_bytes(burn_pack::Bytes::from_bytes_vec(bytes)).map_err(|_| not_a_model())?;
    let config = reader.metadata().get(CONFIG_KEY).ok_or_else(not_a_model)?;
    let config: serde_json::Value =
        serde_json::from_str(config).map_err(|e| ModelError::file(path, format!("{CONFIG_KEY}: {e}")))?;
    let mut map = WeightMap::new();
    for tensor in reader.into_tensors().map_err(|e| ModelError::file(path, format!("{e:?}")))? {
        let (name, dtype, shape, _, bytes) =
            tensor.into_parts().map_err(|e| ModelError::file(path, format!("{e:?}")))?;
        if dtype != burn_pack::DType::F32 {
            return Err(ModelError::file(path, format!("{name}: {dtype:?}, float32 expected")));
        }
        let data = model::weights::f32s_from_le_bytes(&bytes);
        map.insert(name, HostTensor::new(shape.iter().copied().collect(), data));
    }
    Ok((config, Store::Paths(map)))
}

/// A recorded argument with the values computed so far.
/// A node's argument with its tensors in place; a constant tensor saved in the graph (a value
/// computed while Keras traced it) becomes a tensor on `device`.
fn resolve(arg: &Arg, values: &[Option<Vec<Value>>], what: &str, device: &Device) -> Result<Input> {
    Ok(match arg {
        Arg::Tensor(port) => {
            Input::Tensor(values[port.node].as_ref().and_then(|v| v.get(port.index)).cloned().ok_or_else(|| {
                ModelError::InvalidConfig {
                    field: "graph",
                    value: what.to_string(),
                    reason: format!("reads output {} of a node that has none", port.index),
                }
            })?)
        }
        Arg::List(items) => Input::List(items.iter().map(|a| resolve(a, values, what, device)).collect::<Result<_>>()?),
        Arg::Const(c) => match constant_tensor(c) {
            Some((host, dtype)) => Input::Tensor(Value::new(DynTensor::from_host(&host, device)?, dtype)),
            None => Input::Const(c.clone()),
        },
    })
}

/// The input's shape against the input layer's `batch_shape` (`None` entries: any size).
fn check_input_shape(spec: &InputSpec, shape: &[usize]) -> Result<()> {
    let fits =
        spec.shape.len() == shape.len() && spec.shape.iter().zip(shape).all(|(want, got)| *want == 0 || want == got);
    if !fits {
        return Err(ModelError::InvalidConfig {
            field: "inputs",
            value: spec.name.clone(),
            reason: format!(
                "shape {shape:?}, the input layer takes {:?}",
                spec.shape.iter().map(|d| if *d == 0 { "None".to_string() } else { d.to_string() }).collect::<Vec<_>>()
            ),
        });
    }
    Ok(())
}
