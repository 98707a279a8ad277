//! `cargo xtask convert MODEL.keras --to torch` without `--layer`: the whole Keras model as
//! PyTorch code (`OUT.py`), its state dict (`OUT.safetensors`) and a probe
//! (`OUT.probe.safetensors`: inputs, and Burn's output of every node) that `python3 OUT.py`
//! checks the port against, naming the first node that differs.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::torch::torch_export;
use crate::{DType, DynTensor, KerasModel};
use anyhow::{Context, Result};
use model::rng::Rng;
use model::{Backend, HostTensor, TensorFile, WeightMap};

/// Sequences in the probe, and the length given to axes the model leaves open.
const PROBE_BATCH: usize = 2;
const OPEN_AXIS: usize = 8;

/// Writes `OUT.py`, `OUT.safetensors` and `OUT.probe.safetensors`; returns the printout.
pub fn convert_model_to_torch(input: &Path, out: Option<PathBuf>) -> Result<String> {
    let device = Backend::Flex.device(Default::default())?;
    let model = KerasModel::from_file(input, &device)?;
    let stem = out.unwrap_or_else(|| input.with_extension("torch"));
    let stem = stem.with_extension(""); // `OUT` for OUT.py, OUT.safetensors, OUT.probe.safetensors
    let name = stem.file_name().and_then(|s| s.to_str()).context("--out needs a file name")?.to_string();
    let (python, weights, probe_path) = (
        stem.with_extension("py"),
        stem.with_extension("safetensors"),
        stem.with_file_name(format!("{name}.probe.safetensors")),
    );

    // The probe: deterministic inputs; token ids padded with zeros at the end so masks matter.
    let mut probe = WeightMap::new();
    let mut inputs = Vec::new();
    for (spec, host) in model.inputs().iter().zip(probe_inputs(&model, &[24, 0x70_72_6f_62_65])) {
        probe.insert(format!("inputs.{}", spec.name), host.clone());
        inputs.push(DynTensor::from_host(&host, &device)?);
    }
    let run = model.run(inputs, false, true).with_context(|| format!("running {} on the probe", input.display()))?;
    let ranks: Vec<usize> = run.nodes.iter().map(|(_, v)| v.shape().len()).collect();
    let masked: Vec<bool> = run.nodes.iter().map(|(_, v)| v.mask.is_some()).collect();
    for (label, value) in &run.nodes {
        probe.insert(format!("nodes.{label}"), value.tensor.to_host());
    }
    for (output_name, value) in model.output_names().iter().zip(&run.outputs) {
        probe.insert(format!("expected.{output_name}"), value.tensor.to_host());
    }

    let weights_file = format!("{name}.safetensors");
    let probe_file = format!("{name}.probe.safetensors");
    let export = torch_export(&model, &ranks, &masked, &weights_file, &probe_file)?;
    model::weights::write_atomic(&python, export.source.as_bytes())?;
    let parameters: usize = export.state_dict.iter().map(|(_, t)| t.data.len()).sum();
    let tensors = export.state_dict.names().count();
    let constructs = export.constructs;
    TensorFile { tensors: export.state_dict, metadata: Default::default() }.write(&weights)?;
    TensorFile { tensors: probe, metadata: Default::default() }.write(&probe_path)?;

    let mut report = String::new();
    writeln!(
        report,
        "{} ({}): {} nodes, {} inputs, {} outputs",
        model.graph.name,
        input.display(),
        model.graph.nodes.len(),
        model.inputs().len(),
        model.output_names().len()
    )?;
    for ((node, construct), layer_index) in constructs.iter().zip(model.graph.nodes.iter().map(|n| n.layer)) {
        let params = burn::module::Module::num_params(&model.layers[layer_index]);
        writeln!(report, "  {node:<40} {params:>8} params -> {construct}")?;
    }
    writeln!(report, "wrote {} ({tensors} tensors, {parameters} values in the state dict)", weights.display())?;
    writeln!(report, "wrote {} and {}", python.display(), probe_path.display())?;
    writeln!(report, "check: python3 {}", python.display())?;
    Ok(report)
}

/// Deterministic probe inputs for `model`: its batch shapes with open axes set (batch
/// [`PROBE_BATCH`], others [`OPEN_AXIS`]); floats uniform in [-1, 1); token ids below the
/// vocabulary, row `r` padded with `r` zeros at its end (at least one id kept) so masks matter.
fn probe_inputs(model: &KerasModel, seed: &[u64]) -> Vec<HostTensor> {
    let mut rng = Rng::from_parts(seed);
    model
        .inputs()
        .iter()
        .map(|spec| {
            let shape: Vec<usize> = spec
                .shape
                .iter()
                .enumerate()
                .map(|(i, &d)| {
                    if d > 0 {
                        d
                    } else if i == 0 {
                        PROBE_BATCH
                    } else {
                        OPEN_AXIS
                    }
                })
                .collect();
            let count: usize = shape.iter().product();
            let data = match DType::parse(&spec.dtype) {
                Some(DType::Float) | None => (0..count).map(|_| rng.uniform() as f32 * 2.0 - 1.0).collect(),
                _ => {
                    let vocabulary = token_range(model, &spec.name);
                    let row = count / shape[0];
                    (0..count)
                        .map(|i| {
                            let (r, c) = (i / row, i % row);
                            let padding = c > 0 && c + r >= row;
                            if padding { 0.0 } else { 1.0 + (rng.next_u64() % (vocabulary - 1).max(1) as u64) as f32 }
                        })
                        .collect()
                }
            };
            HostTensor::new(shape, data)
        })
        .collect()
}

/// Token ids for an integer input: below the smallest `Embedding` it feeds directly, else 2.
fn token_range(model: &KerasModel, input: &str) -> usize {
    let graph = &model.graph;
    let Some(spec) = graph.inputs.iter().find(|i| i.name == input) else { return 2 };
    graph
        .nodes
        .iter()
        .filter(|n| n.args.iter().flat_map(|a| a.ports()).any(|p| p.node == spec.node))
        .filter_map(|n| match &model.layers[n.layer] {
            crate::layers::Layer::Embedding(e) => Some(e.embeddings.dims()[0]),
            _ => None,
        })
        .min()
        .unwrap_or(2)
}

/// Writes the whole model as a burnpack (`OUT.bpk`) that `KerasModel::from_file` and
/// `cargo xtask predict` load, reads it back and compares it with the source on a probe.
pub fn convert_model_to_burn(input: &Path, out: Option<PathBuf>) -> Result<String> {
    let device = Backend::Flex.device(Default::default())?;
    let model = KerasModel::from_file(input, &device)?;
    let out = out.unwrap_or_else(|| input.with_extension("bpk"));
    let out = if out.extension().is_none() { out.with_extension("bpk") } else { out };
    model.save_burnpack(&out)?;
    let back = KerasModel::from_file(&out, &device).with_context(|| format!("reading back {}", out.display()))?;
    let inputs = probe_inputs(&model, &[24, 0x62_70_6b]);
    let (ours, theirs) = (model.predict(&inputs, &device)?, back.predict(&inputs, &device)?);
    let difference = ours
        .iter()
        .zip(&theirs)
        .flat_map(|(a, b)| a.data.iter().zip(&b.data).map(|(x, y)| (x - y).abs()))
        .fold(0.0f32, f32::max);
    let parameters = burn::module::Module::num_params(&back);
    Ok(format!(
        "{} ({}): {} nodes, {parameters} parameters\nwrote {}\nlargest |source - burnpack| on a probe: {difference:.3e}\n",
        model.graph.name,
        input.display(),
        model.graph.nodes.len(),
        out.display()
    ))
}
