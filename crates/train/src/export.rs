//! Exports of a trained run that Keras, PyTorch and Burn load.
//!
//! * `keras`: safetensors with Keras' names and shapes (`query.kernel (D, h, k)`, ...), in the
//!   `keras_*` fixture format: a probe batch (`inputs.query`, `inputs.value`) and this model's
//!   output on it (`outputs.output`), with the layer's constructor arguments in the metadata; and
//!   beside it the `.keras` archive and `.weights.h5` that Keras opens itself.
//! * `torch`: safetensors with torch state_dict names (`proj.*`, `in_proj_weight`, ..., `final.*`),
//!   in the `projected_*` fixture format (`inputs.x`, `outputs.output`).
//! * `burn`: burnpack of the Burn module, with the probe beside it (`<file>.probe.safetensors`).
//!
//! A Keras-exact run exports to torch through the exact Keras -> projected mapping, a projected
//! run to Keras through the exact projected -> Keras mapping. Because the probe is in the fixture
//! format, `cargo xtask verify FILE` checks an export in Burn, and
//! `xtask/python/check_export.py FILE` checks it in the real library.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::tensor::Device;
use model::convert::{keras_to_projected, projected_to_keras};
use model::keras_file::{write_keras_archive, write_weights_h5};
use model::{HostTensor, KerasMhaConfig, ProjectedConfig, TensorFile, WeightMap};

use keras::layer_fixture::{keras_fixture, name_keras_files, probe_tensors, projected_fixture};

use crate::config::RunConfig;
use crate::models::ModelSpec;
use crate::run::{read_weights, save_burnpack};

/// Sequences in the probe batch.
const PROBE_SEQUENCES: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Burn,
    Keras,
    Torch,
}

impl std::str::FromStr for Format {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "burn" => Ok(Format::Burn),
            "keras" => Ok(Format::Keras),
            "torch" => Ok(Format::Torch),
            other => bail!("--format {other:?}: expected burn, keras or torch"),
        }
    }
}

impl Format {
    fn extension(self) -> &'static str {
        match self {
            Format::Burn => "bpk",
            Format::Keras | Format::Torch => "safetensors",
        }
    }
}

/// Exports the finished run in `run_dir`; returns the written file.
pub fn export(run_dir: &Path, format: Format, out: Option<PathBuf>, data_dir: &Path) -> Result<PathBuf> {
    let config = RunConfig::load(Some(&run_dir.join("config.toml")), &[])
        .with_context(|| format!("{} is not a run folder", run_dir.display()))?;
    let weights = read_weights(run_dir)?;
    let spec = config.model_spec();
    // The probe runs on flex, the CPU backend every machine has.
    let device = Device::flex();
    let model = spec.init_with_weights(&weights, &device)?;
    let data = config.task.load_or_generate(data_dir)?;
    let (x, _) = data.test.gather(&(0..PROBE_SEQUENCES.min(data.test.len)).collect::<Vec<_>>());
    let output = HostTensor::from_tensor(model.forward(x.to_tensor("probe", &device)?, None, false)?);

    let out =
        out.unwrap_or_else(|| run_dir.join("export").join(format!("{}.{}", format_name(format), format.extension())));
    let file = match format {
        Format::Burn => {
            save_burnpack(model.valid(), &out)?;
            let probe = TensorFile {
                tensors: probe_tensors(&[("inputs.x", &x), ("outputs.output", &output)]),
                metadata: Default::default(),
            };
            probe.write(&PathBuf::from(format!("{}.probe.safetensors", out.display())))?;
            return Ok(out);
        }
        Format::Keras => {
            // Beside the safetensors, the files Keras opens itself: `<stem>.keras` and
            // `<stem>.weights.h5` (a model holding the layer; see `model::keras_file`).
            let (layer, keras_weights, _) = keras_layer(&config, &spec, &weights)?;
            let stem = out
                .file_name()
                .map(|n| n.to_string_lossy().trim_end_matches(".safetensors").to_string())
                .unwrap_or_default();
            let (h5, archive) =
                (out.with_file_name(format!("{stem}.weights.h5")), out.with_file_name(format!("{stem}.keras")));
            write_weights_h5(&h5, &layer, &keras_weights)?;
            write_keras_archive(
                &archive,
                &format!("export_{}", config.name.replace(|c: char| !c.is_alphanumeric(), "_")),
                &layer,
                &keras_weights,
            )?;
            let mut file = keras_file(&config, &spec, &weights, &x, &output)?;
            name_keras_files(&mut file, &h5, &archive)?;
            file
        }
        Format::Torch => torch_file(&config, &spec, &weights, &x, &output)?,
    };
    file.write(&out)?;
    Ok(out)
}

fn format_name(format: Format) -> &'static str {
    match format {
        Format::Burn => "model",
        Format::Keras => "keras",
        Format::Torch => "torch",
    }
}

/// The torch-vocabulary file in the `projected_*` fixture format.
fn torch_file(
    config: &RunConfig,
    spec: &ModelSpec,
    weights: &WeightMap,
    x: &HostTensor,
    output: &HostTensor,
) -> Result<TensorFile> {
    let (projected, state_dict): (ProjectedConfig, WeightMap) = match spec {
        ModelSpec::Projected(projected) => (projected.clone(), weights.clone()),
        ModelSpec::Keras { layer, use_causal_mask } => {
            if *use_causal_mask {
                bail!("a causal Keras run has no torch export yet (use --format keras)");
            }
            let converted = keras_to_projected(layer, weights)?;
            (converted.config, converted.weights)
        }
        ModelSpec::Baseline { .. } => bail!("the baseline MLP has no attention model to export to (use --format burn)"),
    };
    let case = format!("export_{}", config.name);
    let description =
        format!("export of run {} ({} model) as Linear + nn.MultiheadAttention + Linear", config.name, spec.kind());
    projected_fixture(&case, &description, &projected, state_dict, x, output)
}

/// The Keras-vocabulary file in the `keras_*` fixture format.
fn keras_file(
    config: &RunConfig,
    spec: &ModelSpec,
    weights: &WeightMap,
    x: &HostTensor,
    output: &HostTensor,
) -> Result<TensorFile> {
    let (layer, keras_weights, causal) = keras_layer(config, spec, weights)?;
    let case = format!("export_{}", config.name);
    let description =
        format!("export of run {} ({} model) as keras.layers.MultiHeadAttention", config.name, spec.kind());
    let probe = [("inputs.query", x), ("inputs.value", x), ("outputs.output", output)];
    keras_fixture(&case, &description, &layer, causal, keras_weights, &probe)
}

/// The run's model as a Keras layer: its config, its weights in Keras' names, and whether it is
/// called with `use_causal_mask`.
fn keras_layer(config: &RunConfig, spec: &ModelSpec, weights: &WeightMap) -> Result<(KerasMhaConfig, WeightMap, bool)> {
    Ok(match spec {
        ModelSpec::Keras { layer, use_causal_mask } => (layer.clone(), weights.clone(), *use_causal_mask),
        ModelSpec::Projected(projected) => {
            if config.model.use_causal_mask {
                bail!("a causal projected run has no Keras export yet (use --format torch)");
            }
            let converted = projected_to_keras(projected, weights)?;
            (converted.config, converted.weights, false)
        }
        ModelSpec::Baseline { .. } => {
            bail!("the baseline MLP has no Keras attention layer to export to (use --format burn)")
        }
    })
}
