//! The fixture files one converted attention layer is written as (`cargo xtask convert --layer`,
//! `cargo xtask export`): `keras_*` (a layer's weights in Keras' names, a probe and the layer's
//! output on it, its constructor arguments) and `projected_*` (the projected port's torch state
//! dict and probe), the formats `model::fixture` reads and `cargo xtask verify` checks.

use std::path::Path;

use anyhow::Result;
use model::{HostTensor, KerasMhaConfig, ProjectedConfig, TensorFile, WeightMap};
use serde_json::json;

/// Names, in a `keras_*` fixture's metadata, the `.weights.h5` and `.keras` written beside it, so
/// that `check_export.py` loads them in the real Keras too.
pub fn name_keras_files(file: &mut TensorFile, h5: &Path, archive: &Path) -> Result<()> {
    let file_name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let mut metadata: serde_json::Value = serde_json::from_str(&file.metadata["config"])?;
    metadata["weights_h5"] = file_name(h5).into();
    metadata["keras_archive"] = file_name(archive).into();
    file.metadata.insert("config".into(), metadata.to_string());
    Ok(())
}

/// A file in the `keras_*` fixture format: a layer's weights in Keras' names and shapes, a probe
/// (`inputs.query`, `inputs.value`, optionally `inputs.key`), the layer's output on it
/// (`outputs.output`) and its constructor arguments in the metadata.
pub fn keras_fixture(
    case: &str,
    description: &str,
    layer: &KerasMhaConfig,
    causal: bool,
    weights: WeightMap,
    probe: &[(&str, &HostTensor)],
) -> Result<TensorFile> {
    let dims = layer.dims()?;
    let has_key = probe.iter().any(|(name, _)| *name == "inputs.key");
    let metadata = json!({
        "framework": "keras",
        "case": case,
        "description": description,
        "num_heads": dims.num_heads,
        "key_dim": dims.key_dim,
        "value_dim": dims.value_dim,
        "use_bias": layer.use_bias,
        "output_shape": dims.output_dim,
        "use_causal_mask": causal,
        "dropout": layer.dropout,
        "use_gate": layer.use_gate,
        "sliding_window": layer.sliding_window,
        "attention_axes": layer.attention_axes,
        "self_attention": !has_key,
        "has_key": has_key,
        "has_attention_mask": false,
        "tolerance": 1e-5,
    });
    let mut tensors = weights;
    tensors.extend(probe_tensors(probe));
    Ok(TensorFile { tensors, metadata: [("config".to_string(), metadata.to_string())].into() })
}

/// A file in the `projected_*` fixture format: the projected model's torch state dict, a probe
/// `inputs.x` and the model's output on it (`outputs.output`), its sizes in the metadata.
pub fn projected_fixture(
    case: &str,
    description: &str,
    projected: &ProjectedConfig,
    state_dict: WeightMap,
    x: &HostTensor,
    output: &HostTensor,
) -> Result<TensorFile> {
    let metadata = json!({
        "framework": "torch",
        "kind": "projected",
        "case": case,
        "description": description,
        "in_features": projected.in_features,
        "embed_dim": projected.embed_dim,
        "num_heads": projected.num_heads,
        "output_dim": projected.output_dim,
        "bias": projected.bias,
        "dropout": projected.dropout,
        "batch_first": true,
        "tolerance": 1e-5,
    });
    let mut tensors = state_dict;
    tensors.extend(probe_tensors(&[("inputs.x", x), ("outputs.output", output)]));
    Ok(TensorFile { tensors, metadata: [("config".to_string(), metadata.to_string())].into() })
}

/// `entries` as a map of tensors by name.
pub fn probe_tensors(entries: &[(&str, &HostTensor)]) -> WeightMap {
    let mut map = WeightMap::new();
    for (name, t) in entries {
        map.insert(*name, (*t).clone());
    }
    map
}
