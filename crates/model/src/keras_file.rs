//! Keras 3 model files without Python: `.keras` archives and `.weights.h5` files read, and
//! written so that `keras.Model.load_weights` and `keras.saving.load_model` open them.
//!
//! A `.keras` file is a zip archive of `config.json` (the model's architecture), `metadata.json`
//! and `model.weights.h5`. Keras 3 stores a layer's variables in HDF5 at a path built from the
//! *class names* of the layers that hold it, never their user-given names (`saving_lib`'s
//! `_save_container_state`): a model's layers live under `layers/<snake_case(class)>[_N]`, `_N`
//! counting earlier layers of the same class in the same list, a nested model under its own
//! path (`layers/functional/layers/...`), and a layer's own variables in `<path>/vars/0, 1, ...`.
//! A `MultiHeadAttention` keeps its four `EinsumDense` sublayers at
//!
//! ```text
//! <path>/query_dense/vars/{0: kernel (Dq, h, k), 1: bias (h, k)}
//! <path>/key_dense/vars/{0: kernel (Dk, h, k), 1: bias (h, k)}
//! <path>/value_dense/vars/{0: kernel (Dv, h, v), 1: bias (h, v)}
//! <path>/output_dense/vars/{0: kernel (h, v, O), 1: bias (O)}
//! ```
//!
//! (and `<path>/_gate_dense/vars/{0: kernel (Dq, h, v), 1: bias (h, v)}` with `use_gate`), and
//! `<path>/vars` carries the layer's own name as an attribute. The archive's config gives
//! each attention layer's constructor arguments; a bare `.weights.h5` has no config, so its
//! layers are found by that layout and their sizes read off the kernels.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use hdf5_pure::AttrValue;
use serde_json::Value;

use crate::error::{ModelError, Result};
use crate::initializer::KerasInitializer;
use crate::keras_mha::KerasMhaConfig;
use crate::weights::{HostTensor, WeightMap, write_atomic};

/// The four sublayers of a Keras attention layer and the names this crate gives their variables.
const SUBLAYERS: [(&str, &str); 4] =
    [("query_dense", "query"), ("key_dense", "key"), ("value_dense", "value"), ("output_dense", "attention_output")];

/// Every sublayer's HDF5 group and this crate's name for it, the gate last.
pub const ATTENTION_SUBLAYERS: [(&str, &str); 5] = [SUBLAYERS[0], SUBLAYERS[1], SUBLAYERS[2], SUBLAYERS[3], GATE];
pub const ATTENTION_GATE: &str = GATE.0;

/// The sublayer `use_gate` adds.
const GATE: (&str, &str) = ("_gate_dense", "gate"); // no public property: Keras keeps the underscore

/// Constructor arguments that do not change what a trained layer computes.
const INERT_ARGUMENTS: [&str; 9] = [
    "name",
    "trainable",
    "dtype",
    "kernel_regularizer",
    "bias_regularizer",
    "activity_regularizer",
    "kernel_constraint",
    "bias_constraint",
    "is_causal",
];

/// One `MultiHeadAttention` layer found in a Keras file.
#[derive(Debug, Clone)]
pub struct KerasFileLayer {
    /// The layer's own name (`MultiHeadAttention(name=...)`).
    pub name: String,
    /// Where its variables are in the HDF5 file, e.g. `layers/multi_head_attention_1`.
    pub path: String,
    /// Its constructor arguments and input widths.
    pub config: KerasMhaConfig,
    /// Its variables in this crate's Keras vocabulary (`query.kernel`, ..., `attention_output.bias`).
    pub weights: WeightMap,
}

/// An attention layer found in a Keras file, read on its own: the layer, or why it cannot be read
/// (an argument this crate refuses, weights that do not match its config), which leaves the
/// file's other layers usable.
#[derive(Debug)]
pub struct KerasFileEntry {
    /// The layer's own name, as [`KerasFileLayer::name`].
    pub name: String,
    /// Where its variables are, as [`KerasFileLayer::path`].
    pub path: String,
    /// The layer, or an error naming the file, the layer and why.
    pub layer: Result<KerasFileLayer>,
}

/// Every attention layer of a `.keras` archive or a `.weights.h5` file, in the file's order: the
/// first layer that cannot be read is the error. [`scan_keras_file`] reads each layer on its own.
pub fn read_keras_file(path: &Path) -> Result<Vec<KerasFileLayer>> {
    scan_keras_file(path)?.into_iter().map(|entry| entry.layer).collect()
}

/// Every attention layer of a `.keras` archive or a `.weights.h5` file, in the file's order,
/// each read on its own (see [`KerasFileEntry`]). A file that cannot be read at all is the error.
pub fn scan_keras_file(path: &Path) -> Result<Vec<KerasFileEntry>> {
    let bytes = std::fs::read(path).map_err(|e| ModelError::file(path, e))?;
    if bytes.starts_with(b"PK") {
        read_archive(path, bytes)
    } else if bytes.starts_with(b"\x89HDF\r\n\x1a\n") {
        let weights = hdf5_pure::File::from_bytes(bytes)
            .map_err(|e| ModelError::file(path, format!("not a readable HDF5 file: {e}")))?;
        let mut layers = Vec::new();
        find_by_layout(path, &weights, "", 0, &[], &mut 0, &mut layers)?;
        Ok(layers)
    } else {
        Err(ModelError::file(path, "neither a .keras archive (zip) nor a Keras .weights.h5 file (HDF5)"))
    }
}

/// A `.keras` archive: the attention layers its config names, with the variables at their paths.
fn read_archive(path: &Path, bytes: Vec<u8>) -> Result<Vec<KerasFileEntry>> {
    let (config, weights) = open_archive(path, bytes)?;
    let mut layers = Vec::new();
    walk_config(path, &config, "", &weights, &mut layers)?;
    // Attention layers held as attributes of custom layers have no entry in the config's layer
    // lists; the weights' layout still finds them (the layers found above, readable or not, are
    // not read again: a refused argument is not bypassed by reading the sizes alone).
    let known: Vec<String> = layers.iter().map(|l| l.path.clone()).collect();
    find_by_layout(path, &weights, "", 0, &known, &mut 0, &mut layers)?;
    Ok(layers)
}

/// A `.keras` archive's `config.json` and `model.weights.h5`, each read or a file error.
pub fn open_archive(path: &Path, bytes: Vec<u8>) -> Result<(Value, hdf5_pure::File)> {
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes))
        .map_err(|e| ModelError::file(path, format!("not a readable zip archive: {e}")))?;
    let mut member = |name: &str| -> Result<Vec<u8>> {
        let mut file =
            archive.by_name(name).map_err(|e| ModelError::file(path, format!("archive member {name}: {e}")))?;
        let mut out = Vec::new();
        file.read_to_end(&mut out).map_err(|e| ModelError::file(path, format!("archive member {name}: {e}")))?;
        Ok(out)
    };
    let config: Value = serde_json::from_slice(&member("config.json")?)
        .map_err(|e| ModelError::file(path, format!("config.json: {e}")))?;
    let weights = hdf5_pure::File::from_bytes(member("model.weights.h5")?)
        .map_err(|e| ModelError::file(path, format!("model.weights.h5 is not a readable HDF5 file: {e}")))?;
    Ok((config, weights))
}

/// Walks a model config's layer list (and the lists of nested models), recording every
/// `MultiHeadAttention` with the HDF5 path Keras saved it under.
fn walk_config(
    file: &Path,
    model: &Value,
    prefix: &str,
    h5: &hdf5_pure::File,
    out: &mut Vec<KerasFileEntry>,
) -> Result<()> {
    let Some(entries) = model.pointer("/config/layers").and_then(Value::as_array) else {
        return Ok(());
    };
    let mut used: HashMap<String, usize> = HashMap::new();
    for entry in entries {
        let class = entry.get("class_name").and_then(Value::as_str).unwrap_or_default();
        let path = join(prefix, &format!("layers/{}", unique_name(snake_case(class), &mut used)));
        if class == "MultiHeadAttention" {
            let arguments = entry.get("config").cloned().unwrap_or(Value::Null);
            let name = arguments.get("name").and_then(Value::as_str).unwrap_or(&path).to_string();
            let layer = read_attention_weights(file, h5, &path, &name).and_then(|weights| {
                let config = config_from_arguments(file, &name, &arguments, &weights)?;
                Ok(KerasFileLayer { name: name.clone(), path: path.clone(), config, weights })
            });
            out.push(KerasFileEntry { name, path, layer });
        } else if entry.pointer("/config/layers").is_some() {
            walk_config(file, entry, &path, h5, out)?;
        }
    }
    Ok(())
}

/// How deep and how many groups `find_by_layout` follows: far beyond any Keras model, and a
/// bound on a damaged file whose links form a cycle.
const MAX_GROUP_DEPTH: usize = 64;
const MAX_GROUPS: usize = 100_000;

/// Every group below `prefix` laid out as an attention layer, sizes read off its kernels,
/// except the groups at the `known` paths; `visited` counts the groups walked so far.
fn find_by_layout(
    file: &Path,
    h5: &hdf5_pure::File,
    prefix: &str,
    depth: usize,
    known: &[String],
    visited: &mut usize,
    out: &mut Vec<KerasFileEntry>,
) -> Result<()> {
    *visited += 1;
    if depth > MAX_GROUP_DEPTH || *visited > MAX_GROUPS {
        return Err(ModelError::file(
            file,
            format!(
                "more than {MAX_GROUPS} groups or nesting deeper than {MAX_GROUP_DEPTH} at {prefix:?}: a damaged file (cyclic links?)"
            ),
        ));
    }
    if known.iter().any(|k| k == prefix) {
        return Ok(());
    }
    let group = if prefix.is_empty() {
        h5.root()
    } else {
        h5.group(prefix).map_err(|e| ModelError::file(file, format!("{prefix}: {e}")))?
    };
    let children = group.groups().map_err(|e| ModelError::file(file, format!("{prefix}: {e}")))?;
    if SUBLAYERS.iter().all(|(sublayer, _)| children.iter().any(|c| c == sublayer)) {
        let name = layer_name(h5, prefix).unwrap_or_else(|| prefix.to_string());
        let path = prefix.to_string();
        let layer = read_attention_weights(file, h5, prefix, &name).and_then(|weights| {
            let config = KerasMhaConfig::from_weights(&weights)
                .map_err(|e| ModelError::file(file, format!("layer {name} ({prefix}): {e}")))?;
            Ok(KerasFileLayer { name: name.clone(), path: path.clone(), config, weights })
        });
        out.push(KerasFileEntry { name, path, layer });
        return Ok(());
    }
    for child in children {
        find_by_layout(file, h5, &join(prefix, &child), depth + 1, known, visited, out)?;
    }
    Ok(())
}

/// The name Keras keeps as an attribute of a layer's `vars` group.
fn layer_name(h5: &hdf5_pure::File, path: &str) -> Option<String> {
    let attributes = h5.group(&join(path, "vars")).ok()?.attrs().ok()?;
    match attributes.get("name")? {
        AttrValue::String(name) | AttrValue::AsciiString(name) => Some(name.clone()),
        _ => None,
    }
}

/// The four sublayers' variables of the attention layer at `path`.
pub fn read_attention_weights(file: &Path, h5: &hdf5_pure::File, path: &str, name: &str) -> Result<WeightMap> {
    let context = |what: &str, e: &dyn std::fmt::Display| ModelError::file(file, format!("layer {name}: {what}: {e}"));
    let mut weights = WeightMap::new();
    let has_gate = h5.group(&format!("{path}/{}", GATE.0)).is_ok();
    for (sublayer, ours) in SUBLAYERS.into_iter().chain(has_gate.then_some(GATE)) {
        let vars_path = format!("{path}/{sublayer}/vars");
        let vars = h5.group(&vars_path).map_err(|e| context(&format!("no group {vars_path}"), &e))?;
        let datasets = vars.datasets().map_err(|e| context(&vars_path, &e))?;
        for (index, variable) in ["kernel", "bias"].into_iter().enumerate() {
            let index = index.to_string();
            if !datasets.contains(&index) {
                continue;
            }
            let dataset = vars.dataset(&index).map_err(|e| context(&format!("{vars_path}/{index}"), &e))?;
            let shape: Vec<usize> = dataset
                .shape()
                .map_err(|e| context(&format!("{vars_path}/{index}"), &e))?
                .into_iter()
                .map(|d| d as usize)
                .collect();
            let data = dataset.read_f32().map_err(|e| context(&format!("{vars_path}/{index}"), &e))?;
            if data.len() != shape.iter().product::<usize>() {
                return Err(context(
                    &format!("{vars_path}/{index}"),
                    &format!("{} values for shape {shape:?}", data.len()),
                ));
            }
            weights.insert(format!("{ours}.{variable}"), HostTensor::new(shape, data));
        }
    }
    Ok(weights)
}

/// The layer's config from its constructor arguments, checked against its variables: an
/// argument this crate cannot honour, or weights that do not match the arguments, are errors
/// naming the layer.
pub fn config_from_arguments(
    file: &Path,
    name: &str,
    arguments: &Value,
    weights: &WeightMap,
) -> Result<KerasMhaConfig> {
    let bad = |argument: &str, why: String| ModelError::file(file, format!("layer {name}: {argument}: {why}"));
    // A refused output_shape is the reason, not the output kernel's shape that follows from it.
    if let Some(value) = arguments.get("output_shape") {
        output_width(value).map_err(|why| bad("output_shape", why))?;
    }
    let sizes =
        KerasMhaConfig::from_weights(weights).map_err(|e| ModelError::file(file, format!("layer {name}: {e}")))?;
    let Some(arguments) = arguments.as_object() else {
        return Err(bad("config", "not a JSON object".into()));
    };
    let mut config = sizes.clone();
    for (argument, value) in arguments {
        let size = || value.as_u64().map(|v| v as usize);
        match argument.as_str() {
            "num_heads" => config.num_heads = size().ok_or_else(|| bad(argument, format!("{value} is not a count")))?,
            "key_dim" => config.key_dim = size().ok_or_else(|| bad(argument, format!("{value} is not a size")))?,
            "value_dim" if !value.is_null() => {
                config.value_dim = Some(size().ok_or_else(|| bad(argument, format!("{value} is not a size")))?)
            }
            "value_dim" => config.value_dim = Some(config.key_dim),
            "output_shape" => {
                config.output_shape = output_width(value).map_err(|why| bad(argument, why))?.or(Some(sizes.query_dim))
            }
            "use_bias" => {
                config.use_bias = value.as_bool().ok_or_else(|| bad(argument, format!("{value} is not a boolean")))?
            }
            "dropout" => {
                config.dropout = value.as_f64().ok_or_else(|| bad(argument, format!("{value} is not a rate")))?
            }
            "attention_axes" if value.is_null() => config.attention_axes = None,
            "attention_axes" => {
                let axes: Option<Vec<i64>> = value.as_array().and_then(|a| a.iter().map(Value::as_i64).collect());
                config.attention_axes =
                    Some(axes.ok_or_else(|| bad(argument, format!("{value} is not a list of axes")))?);
            }
            "use_gate" => {
                config.use_gate = value.as_bool().ok_or_else(|| bad(argument, format!("{value} is not a boolean")))?
            }
            "sliding_window" => config.sliding_window = value.as_u64().map(|w| w as usize),
            "kernel_initializer" => {
                config.kernel_initializer =
                    KerasInitializer::from_keras(value).map_err(|e| bad(argument, e.to_string()))?
            }
            "bias_initializer" => {
                config.bias_initializer =
                    KerasInitializer::from_keras(value).map_err(|e| bad(argument, e.to_string()))?
            }
            "seed" if value.is_null() => config.seed = None,
            "seed" => {
                config.seed = Some(
                    value.as_u64().ok_or_else(|| bad(argument, format!("{value} is not a non-negative integer")))?,
                )
            }
            "flash_attention" => config.flash_attention = value.as_bool().unwrap_or(false),
            inert if INERT_ARGUMENTS.contains(&inert) => {}
            other => {
                return Err(bad(
                    other,
                    format!("{value}: an argument this crate does not know; refusing rather than guessing its meaning"),
                ));
            }
        }
    }
    // The arguments must describe the variables that were saved.
    let got = config.dims().map_err(|e| ModelError::file(file, format!("layer {name}: {e}")))?;
    let want = sizes.dims()?;
    if got != want || config.use_bias != sizes.use_bias || config.use_gate != sizes.use_gate {
        return Err(ModelError::file(
            file,
            format!(
                "layer {name}: its weights do not match its config (config gives {got:?}, use_bias {}, use_gate {}; the weights give {want:?}, use_bias {}, use_gate {})",
                config.use_bias, config.use_gate, sizes.use_bias, sizes.use_gate
            ),
        ));
    }
    Ok(config)
}

/// Writes `weights` (Keras' names) as the `.weights.h5` of the model that holds the layer (see
/// [`write_keras_archive`]), which `model.load_weights(path)` loads. Atomic.
pub fn write_weights_h5(path: &Path, config: &KerasMhaConfig, weights: &WeightMap) -> Result<()> {
    write_atomic(path, &weights_h5_bytes(config, weights).map_err(|e| ModelError::file(path, e))?)
}

/// Writes a `.keras` archive that `keras.saving.load_model(path)` opens: the functional model
/// `keras.Model([query, value, key], MultiHeadAttention(...)(query, value, key=key))` named
/// `name`, its config and its weights. Atomic.
pub fn write_keras_archive(path: &Path, name: &str, config: &KerasMhaConfig, weights: &WeightMap) -> Result<()> {
    use std::io::Write;
    let h5 = weights_h5_bytes(config, weights).map_err(|e| ModelError::file(path, e))?;
    let model_config = serde_json::to_vec(&functional_config(name, config)?).map_err(|e| ModelError::file(path, e))?;
    let metadata = serde_json::to_vec(
        &serde_json::json!({ "keras_version": "3.15.1", "date_saved": "written by keras-mha-burn" }),
    )
    .map_err(|e| ModelError::file(path, e))?;
    let mut archive = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    // Keras writes its archives uncompressed.
    let options = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (member, bytes) in [("metadata.json", &metadata), ("config.json", &model_config), ("model.weights.h5", &h5)] {
        archive.start_file(member, options).map_err(|e| ModelError::file(path, e))?;
        archive.write_all(bytes).map_err(|e| ModelError::file(path, e))?;
    }
    let bytes = archive.finish().map_err(|e| ModelError::file(path, e))?.into_inner();
    write_atomic(path, &bytes)
}

/// The HDF5 image: the model's only layer with variables, an attention layer, sits at
/// `layers/multi_head_attention` (its three inputs, `layers/input_layer[_N]`, have none).
fn weights_h5_bytes(config: &KerasMhaConfig, weights: &WeightMap) -> std::result::Result<Vec<u8>, String> {
    let dims = config.dims().map_err(|e| e.to_string())?;
    let mut builder = hdf5_pure::FileBuilder::new();
    let mut layers = builder.create_group("layers");
    let mut layer = layers.create_group("multi_head_attention");
    let gate = config.use_gate.then_some((GATE, dims.gate_shape()));
    for ((sublayer, ours), kernel_shape) in SUBLAYERS.into_iter().zip(dims.kernel_shapes()).chain(gate) {
        let mut dense = layer.create_group(sublayer);
        let mut vars = dense.create_group("vars");
        let mut variables = vec![weights.expect(&format!("{ours}.kernel"), &kernel_shape).map_err(|e| e.to_string())?];
        if config.use_bias {
            variables.push(weights.get(&format!("{ours}.bias")).map_err(|e| e.to_string())?);
        }
        for (index, tensor) in variables.into_iter().enumerate() {
            let shape: Vec<u64> = tensor.shape.iter().map(|&d| d as u64).collect();
            vars.create_dataset(&index.to_string()).with_f32_data(&tensor.data).with_shape(&shape);
        }
        dense.add_group(vars.finish());
        layer.add_group(dense.finish());
    }
    layers.add_group(layer.finish());
    builder.add_group(layers.finish());
    builder.finish().map_err(|e| format!("cannot encode HDF5: {e}"))
}

/// `config.json` of the one-layer functional model, in the form Keras 3.15 writes it.
fn functional_config(name: &str, config: &KerasMhaConfig) -> Result<Value> {
    use serde_json::json;
    let d = config.dims()?;
    // The smallest input rank the layer's attention axes fit: [B, T, D] for the default.
    let rank = crate::keras_mha::smallest_input_rank(config.attention_axes.as_deref());
    let shape = |width: usize| [vec![Value::Null; rank - 1], vec![json!(width)]].concat();
    let input = |input_name: &str, width: usize| {
        json!({
            "module": "keras.layers", "class_name": "InputLayer", "registered_name": null, "name": input_name, "inbound_nodes": [],
            "config": { "batch_shape": shape(width), "dtype": "float32", "sparse": false, "ragged": false, "name": input_name, "optional": false },
        })
    };
    let tensor = |input_name: &str, width: usize| json!({ "class_name": "__keras_tensor__", "config": { "shape": shape(width), "dtype": "float32", "keras_history": [input_name, 0, 0] } });
    let attention_axes = match &config.attention_axes {
        Some(axes) => json!(axes),
        None => json!((1..rank as i64 - 1).collect::<Vec<_>>()),
    };
    let output_shape = if d.output_dim == d.query_dim { Value::Null } else { json!([d.output_dim]) };
    let attention = json!({
        "module": "keras.layers", "class_name": "MultiHeadAttention", "registered_name": null, "name": "attention",
        "config": {
            "name": "attention", "trainable": true,
            "dtype": { "module": "keras", "class_name": "DTypePolicy", "config": { "name": "float32" }, "registered_name": null },
            "num_heads": d.num_heads, "key_dim": d.key_dim, "value_dim": d.value_dim, "dropout": config.dropout,
            "use_bias": config.use_bias, "use_gate": config.use_gate, "output_shape": output_shape, "attention_axes": attention_axes, "sliding_window": config.sliding_window,
            "kernel_initializer": config.kernel_initializer.to_keras(), "bias_initializer": config.bias_initializer.to_keras(),
            "kernel_regularizer": null, "bias_regularizer": null, "activity_regularizer": null, "kernel_constraint": null, "bias_constraint": null,
            "seed": config.seed, "flash_attention": config.flash_attention,
        },
        "build_config": { "shapes_dict": {
            "query_shape": shape(d.query_dim), "value_shape": shape(d.value_input_dim), "key_shape": shape(d.key_input_dim),
        } },
        "inbound_nodes": [{
            "args": [tensor("query", d.query_dim), tensor("value", d.value_input_dim)],
            "kwargs": { "key": tensor("key", d.key_input_dim) },
        }],
    });
    Ok(json!({
        "module": "keras.src.models.functional", "class_name": "Functional", "registered_name": "Functional",
        "config": {
            "name": name, "trainable": true,
            "layers": [input("query", d.query_dim), input("value", d.value_input_dim), input("key", d.key_input_dim), attention],
            "input_layers": [["query", 0, 0], ["value", 0, 0], ["key", 0, 0]],
            "output_layers": ["attention", 0, 0],
        },
        "build_config": { "input_shape": null }, "compile_config": {},
    }))
}

/// Keras' `output_shape`: `None`, an integer or a one-element list; a multi-axis output is not
/// supported.
fn output_width(value: &Value) -> std::result::Result<Option<usize>, String> {
    match value {
        Value::Null => Ok(None),
        Value::Number(n) => n.as_u64().map(|n| Some(n as usize)).ok_or_else(|| format!("{value} is not a width")),
        Value::Array(axes) => match axes.as_slice() {
            [width] => width.as_u64().map(|n| Some(n as usize)).ok_or_else(|| format!("{value} is not a width")),
            _ => Err(format!("{value}: multi-axis outputs are not supported")),
        },
        _ => Err(format!("{value} is not a width")),
    }
}

/// `name` or `name_N`, as Keras' `_get_unique_name` numbers repeats within one list.
pub fn unique_name(name: String, used: &mut HashMap<String, usize>) -> String {
    match used.get_mut(&name) {
        Some(count) => {
            *count += 1;
            format!("{name}_{count}")
        }
        None => {
            used.insert(name.clone(), 0);
            name
        }
    }
}

/// Keras' `naming.to_snake_case`: drop non-word characters, `_` before an upper-case letter that
/// starts a lower-case run or follows a lower-case letter, then lower-case everything.
pub fn snake_case(name: &str) -> String {
    let chars: Vec<char> = name.chars().filter(|c| c.is_alphanumeric() || *c == '_').collect();
    let mut out = String::with_capacity(chars.len() + 4);
    for (i, &c) in chars.iter().enumerate() {
        let starts_word = chars.get(i + 1).is_some_and(|n| n.is_ascii_lowercase());
        let after_lower = i > 0 && chars[i - 1].is_ascii_lowercase();
        if i > 0 && c.is_ascii_uppercase() && (starts_word || after_lower) {
            out.push('_');
        }
        out.extend(c.to_lowercase());
    }
    out
}

fn join(prefix: &str, child: &str) -> String {
    if prefix.is_empty() { child.to_string() } else { format!("{prefix}/{child}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snake_case_follows_keras() {
        // Expected values printed by keras.src.utils.naming.to_snake_case (keras 3.15.1).
        for (class, snake) in [
            ("MultiHeadAttention", "multi_head_attention"),
            ("Functional", "functional"),
            ("Dense", "dense"),
            ("LayerNormalization", "layer_normalization"),
            ("EinsumDense", "einsum_dense"),
            ("HTTPServer2Layer", "http_server2_layer"),
            ("My_Class", "my__class"),
            ("Conv2DTranspose", "conv2d_transpose"),
        ] {
            assert_eq!(snake_case(class), snake, "{class}");
        }
    }

    #[test]
    fn repeats_are_numbered_per_class() {
        let mut used = HashMap::new();
        let names: Vec<String> = ["dense", "multi_head_attention", "dense", "dense"]
            .iter()
            .map(|n| unique_name(n.to_string(), &mut used))
            .collect();
        assert_eq!(names, ["dense", "multi_head_attention", "dense_1", "dense_2"]);
    }
}
