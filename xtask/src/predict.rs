//! `cargo xtask predict MODEL.keras --inputs IN.safetensors`: a whole Keras model run in Burn.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use keras::{DynTensor, KerasModel};
use model::{Backend, TensorFile, WeightMap};

const ABOUT: &str = "Runs a whole Keras 3 model (.keras archive) in Burn on the inputs \
named `inputs.<input layer name>` in a safetensors file (float32, or int32/int64 token ids), and \
writes `outputs.<output layer name>`. With `expected.<output name>` tensors in the inputs file it \
also prints the largest difference per output. Works on attention-only files too.";

/// The help text, with the layer classes a whole model may hold (from `keras`' registry).
pub fn long_about() -> String {
    format!("{ABOUT}\n\nLayer classes of a whole model: {}.", keras::layers::supported_classes())
}

#[derive(clap::Args)]
pub struct Args {
    /// The model: a `.keras` archive written by Keras 3.
    model: PathBuf,
    /// A safetensors file with `inputs.<input layer name>` for every model input.
    #[arg(long)]
    inputs: PathBuf,
    /// Where to write `outputs.<name>` (default: `<inputs stem>.outputs.safetensors` beside it).
    #[arg(long)]
    out: Option<PathBuf>,
    /// ndarray, flex or wgpu.
    #[arg(long, default_value = "flex")]
    backend: Backend,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let device = args.backend.device(Default::default())?;
    let model = KerasModel::from_file(&args.model, &device)?;
    let file = TensorFile::read(&args.inputs)?;
    let mut inputs = Vec::new();
    for input in model.inputs() {
        let key = format!("inputs.{}", input.name);
        let host = file.tensors.get(&key).with_context(|| {
            format!(
                "{}: no tensor {key}; the model takes {}",
                args.inputs.display(),
                model
                    .inputs()
                    .iter()
                    .map(|i| format!("inputs.{} {:?}", i.name, i.shape))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        inputs.push(DynTensor::from_host(host, &device).with_context(|| format!("{}: {key}", args.inputs.display()))?);
    }
    let outputs = model.forward(inputs, false).with_context(|| format!("running {}", args.model.display()))?;

    let mut written = WeightMap::new();
    let mut failed = false;
    println!("{} on {}: {} nodes", model.graph.name, args.backend.name(), model.graph.nodes.len());
    for (name, output) in model.output_names().iter().zip(outputs) {
        let host = output.tensor.to_host();
        let mut line = format!("outputs.{name} {:?}", host.shape);
        if let Ok(expected) = file.tensors.get(&format!("expected.{name}")) {
            if expected.shape != host.shape {
                line += &format!("  expected shape {:?}: MISMATCH", expected.shape);
                failed = true;
            } else {
                let diff = host.data.iter().zip(&expected.data).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
                line += &format!("  max |ours - expected| = {diff:.3e}");
            }
        }
        println!("{line}");
        written.insert(format!("outputs.{name}"), host);
    }
    let out = args.out.unwrap_or_else(|| default_out(&args.inputs));
    let metadata: BTreeMap<String, String> = [
        ("model".to_string(), args.model.display().to_string()),
        ("backend".to_string(), args.backend.name().to_string()),
    ]
    .into();
    TensorFile { tensors: written, metadata }.write(&out)?;
    println!("wrote {}", out.display());
    if failed {
        bail!("an output's shape differs from the expected one");
    }
    Ok(ExitCode::SUCCESS)
}

/// `<dir>/<stem>.outputs.safetensors` for `<dir>/<stem>.safetensors`.
fn default_out(inputs: &Path) -> PathBuf {
    let stem = inputs.file_stem().and_then(|s| s.to_str()).unwrap_or("inputs");
    inputs.with_file_name(format!("{stem}.outputs.safetensors"))
}
