//! PyTorch checkpoints (`.pt`, `.pth`) read without Python and without executing pickled code,
//! through burn's own `pytorch-reader`: the `nn.MultiheadAttention` layers of a state dict, or of
//! a checkpoint dict that holds one under a key.
//!
//! A state dict names an attention layer's tensors `<prefix>in_proj_weight [3E, E]` (packed, when
//! query, key and value have the embedding width) or `<prefix>{q,k,v}_proj_weight` (`kdim` /
//! `vdim` set), `<prefix>in_proj_bias [3E]`, `<prefix>out_proj.{weight [E, E], bias [E]}`. The
//! head count is not stored anywhere in the file: the caller gives it.
//!
//! An attention layer at `<p>mha.` with Linears `<p>proj.` and `<p>final.` beside it is the
//! projected model (`Linear + nn.MultiheadAttention + Linear`, the module `cargo xtask convert`
//! writes for PyTorch users), and is read as that whole model.

use std::path::{Path, PathBuf};

use pytorch_reader::{DType, PytorchReader};

use crate::convert::{Converted, projected_to_keras, torch_to_keras};
use crate::error::{ModelError, Result};
use crate::keras_mha::KerasMhaConfig;
use crate::projected::ProjectedConfig;
use crate::torch_mha::TorchMhaConfig;
use crate::weights::{HostTensor, WeightMap, f32s_from_le_bytes};

/// Names (after the prefix) of an `nn.MultiheadAttention`'s tensors.
const TORCH_MHA_TENSORS: [&str; 9] = [
    "in_proj_weight",
    "q_proj_weight",
    "k_proj_weight",
    "v_proj_weight",
    "in_proj_bias",
    "out_proj.weight",
    "out_proj.bias",
    "bias_k",
    "bias_v",
];

/// What an attention layer of a checkpoint belongs to.
#[derive(Debug, Clone)]
pub enum TorchFileModel {
    /// A bare `nn.MultiheadAttention`.
    Attention(TorchMhaConfig),
    /// The projected model around it.
    Projected(ProjectedConfig),
}

/// One `nn.MultiheadAttention` (or projected model) found in a checkpoint.
#[derive(Debug, Clone)]
pub struct TorchFileLayer {
    /// The state-dict prefix of its tensors, e.g. `attn.` (empty for a bare layer); for a
    /// projected model, the prefix of its `proj.`, `mha.` and `final.`.
    pub prefix: String,
    pub model: TorchFileModel,
    /// Its tensors under torch's names, prefix removed: `in_proj_weight`, ... for a layer,
    /// `proj.*`, `in_proj_weight`, ..., `final.*` (the projected model's state dict) for a model.
    pub weights: WeightMap,
}

impl TorchFileLayer {
    /// The same layer in Keras' vocabulary, through the exact torch -> Keras or projected ->
    /// Keras mapping ([`crate::convert`]).
    pub fn to_keras(&self) -> Result<Converted<KerasMhaConfig>> {
        match &self.model {
            TorchFileModel::Attention(config) => torch_to_keras(config, &self.weights),
            TorchFileModel::Projected(config) => projected_to_keras(config, &self.weights),
        }
    }
}

/// One `nn.MultiheadAttention` (or projected model) found in a checkpoint, before its head count
/// is known: a state dict does not store it, and each layer of a file may have its own. A layer
/// whose tensors cannot be read keeps the reason here and leaves the file's other layers usable.
#[derive(Debug)]
pub struct TorchFileEntry {
    /// The state-dict prefix, as [`TorchFileLayer::prefix`].
    pub prefix: String,
    /// Whether it is the projected model around an attention layer (at `<prefix>mha.`).
    pub projected: bool,
    /// Its tensors, as [`TorchFileLayer::weights`], or why they cannot be read.
    weights: std::result::Result<WeightMap, String>,
    /// The prefix of the attention layer itself, for messages.
    attention_prefix: String,
    file: PathBuf,
}

impl TorchFileEntry {
    /// The layer read with `num_heads` heads, or why it cannot be (a head count that does not
    /// divide its width, a tensor that cannot be read), as an error naming the file and prefix.
    pub fn layer(&self, num_heads: usize) -> Result<TorchFileLayer> {
        let fail = |e: &dyn std::fmt::Display| {
            ModelError::file(&self.file, format!("nn.MultiheadAttention at {:?}: {e}", self.attention_prefix))
        };
        let weights = self.weights.as_ref().map_err(|e| fail(e))?.clone();
        let config = config_from_weights(&weights, num_heads).map_err(|e| fail(&e))?;
        if !self.projected {
            return Ok(TorchFileLayer {
                prefix: self.prefix.clone(),
                model: TorchFileModel::Attention(config),
                weights,
            });
        }
        let proj = weights.get("proj.weight").map_err(|e| fail(&e))?; // [E, in]
        let in_features = axis(proj, "proj.weight", 1).map_err(|e| fail(&e))?;
        let mut projected = ProjectedConfig::new(in_features, config.embed_dim, num_heads).with_bias(config.bias);
        projected.output_dim =
            weights.get("final.weight").ok().map(|w| axis(w, "final.weight", 0)).transpose().map_err(|e| fail(&e))?;
        Ok(TorchFileLayer { prefix: self.prefix.clone(), model: TorchFileModel::Projected(projected), weights })
    }

    /// The embedding width `E` (`out_proj.weight [E, E]`), which the head count must divide.
    pub fn embed_dim(&self) -> Result<usize> {
        let weights = self.weights.as_ref().map_err(|e| ModelError::file(&self.file, e))?;
        axis(weights.get("out_proj.weight")?, "out_proj.weight", 0)
    }
}

/// Every `nn.MultiheadAttention` of a checkpoint, by prefix, each read on its own (see
/// [`TorchFileEntry`]); a checkpoint dict whose state dict sits under a key
/// (`model_state_dict`, `state_dict`, ...) has that key in the prefix (`model_state_dict.attn.`).
pub fn scan_torch_file(path: &Path) -> Result<Vec<TorchFileEntry>> {
    let reader = PytorchReader::new(path)
        .map_err(|e| ModelError::file(path, format!("not a readable PyTorch checkpoint: {e}")))?;
    let mut names: Vec<String> = reader.keys();
    names.sort();
    let prefixes: Vec<String> = names
        .iter()
        .filter_map(|n| n.strip_suffix("in_proj_weight").or_else(|| n.strip_suffix("q_proj_weight")))
        .map(str::to_string)
        .collect();
    let read = |name: &str| -> std::result::Result<HostTensor, String> {
        let tensor = reader.get(name).ok_or_else(|| format!("no tensor {name}"))?;
        let bytes = tensor.read().map_err(|e| format!("tensor {name}: {e}"))?;
        let data: Vec<f32> = match tensor.dtype() {
            DType::F32 => f32s_from_le_bytes(&bytes),
            DType::F64 => {
                bytes.chunks_exact(8).map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")) as f32).collect()
            }
            other => return Err(format!("tensor {name} is {other:?}; float32 and float64 are supported")),
        };
        let shape = tensor.shape().to_vec();
        if data.len() != shape.iter().product::<usize>() {
            return Err(format!("tensor {name}: {} values for shape {shape:?}", data.len()));
        }
        Ok(HostTensor::new(shape, data))
    };
    let mut entries = Vec::new();
    for prefix in prefixes {
        // `<p>mha.` between `<p>proj.` and `<p>final.`: the projected model.
        let outer = prefix.strip_suffix("mha.").filter(|p| reader.get(&format!("{p}proj.weight")).is_some());
        let weights = (|| -> std::result::Result<WeightMap, String> {
            let mut weights = WeightMap::new();
            for name in names.iter().filter(|n| n.starts_with(&prefix)) {
                let local = &name[prefix.len()..];
                if TORCH_MHA_TENSORS.contains(&local) {
                    weights.insert(local, read(name)?);
                }
            }
            if let Some(outer) = outer {
                for local in ["proj.weight", "proj.bias", "final.weight", "final.bias"] {
                    let name = format!("{outer}{local}");
                    if reader.get(&name).is_some() {
                        weights.insert(local, read(&name)?);
                    }
                }
            }
            Ok(weights)
        })();
        entries.push(TorchFileEntry {
            prefix: outer.unwrap_or(prefix.as_str()).to_string(),
            projected: outer.is_some(),
            weights,
            attention_prefix: prefix.clone(),
            file: path.to_path_buf(),
        });
    }
    Ok(entries)
}

/// Every `nn.MultiheadAttention` of a checkpoint, all read with `num_heads` heads: the first
/// layer that cannot be read is the error. [`scan_torch_file`] reads each layer on its own.
pub fn read_torch_file(path: &Path, num_heads: usize) -> Result<Vec<TorchFileLayer>> {
    scan_torch_file(path)?.iter().map(|entry| entry.layer(num_heads)).collect()
}

/// The layer's config from its tensors' shapes and the given head count.
fn config_from_weights(weights: &WeightMap, num_heads: usize) -> Result<TorchMhaConfig> {
    let embed_dim = axis(weights.get("out_proj.weight")?, "out_proj.weight", 0)?;
    if num_heads == 0 || embed_dim % num_heads != 0 {
        return Err(ModelError::config(
            "num_heads",
            num_heads,
            format!(
                "must divide the embedding width {embed_dim} (the head count is not stored in a state dict: pass it)"
            ),
        ));
    }
    let input_width =
        |name: &str| -> Result<Option<usize>> { weights.get(name).ok().map(|w| axis(w, name, 1)).transpose() };
    let (kdim, vdim) = (input_width("k_proj_weight")?, input_width("v_proj_weight")?);
    Ok(TorchMhaConfig::new(embed_dim, num_heads)
        .with_kdim(kdim)
        .with_vdim(vdim)
        .with_bias(weights.contains("in_proj_bias"))
        .with_add_bias_kv(weights.contains("bias_k")))
}

/// Axis `index` of a 2-D weight's shape, or an error naming the tensor (a damaged file's tensor
/// may have fewer axes than its name implies).
fn axis(weight: &HostTensor, name: &str, index: usize) -> Result<usize> {
    weight.shape.get(index).copied().ok_or_else(|| ModelError::TensorRank {
        name: name.to_string(),
        expected: 2,
        found: weight.shape.clone(),
    })
}
