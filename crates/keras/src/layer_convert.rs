//! `cargo xtask convert`: one attention layer of a user's model file, converted exactly.
//!
//! The source is a Keras 3 `.keras` archive or `.weights.h5` file ([`model::keras_file`]), or a
//! PyTorch `.pt` / `.pth` state dict or checkpoint ([`model::torch_file`]; an
//! `nn.MultiheadAttention` goes through the exact torch -> Keras mapping first). The layer is
//! converted to
//!
//! * `keras`: a `.keras` archive that `keras.saving.load_model` opens, the `.weights.h5` that
//!   `keras.Model.load_weights` loads into that model, and the weights as safetensors in Keras'
//!   names (`keras_*` fixture format);
//! * `projected`: torch's `Linear + nn.MultiheadAttention + Linear` state dict (`projected_*`
//!   fixture format), through the exact Keras -> projected mapping;
//! * `torch`: a bare `nn.MultiheadAttention` state dict, where Keras' sizes allow one (`torch_*`
//!   fixture format: the probe's `query`, `key`, `value`, output and head-averaged weights);
//! * `burn`: the Burn module as burnpack, with the probe beside it.
//!
//! Beside a torch export it writes `<file>.py`, the `nn.Module` that holds the weights
//! ([`crate::layer_torch`]).
//!
//! Every written file carries a probe batch and the *source* layer's output on it, so `cargo
//! xtask verify FILE` (Burn) and `xtask/python/check_export.py FILE` (the real library) check it.
//! Before returning, the written file is read back and run, and the largest difference from the
//! source layer on the probe is reported.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::tensor::{Device, Distribution, Tensor};
use model::ModelError;
use model::convert::{keras_to_projected, keras_to_torch};
use model::fixture::model_weights;
use model::keras_file::{KerasFileLayer, read_keras_file, scan_keras_file, write_keras_archive, write_weights_h5};
use model::keras_mha::{resolve_attention_axes, smallest_input_rank};
use model::projected::ProjectedInput;
use model::torch_file::{TorchFileEntry, TorchFileLayer, TorchFileModel, scan_torch_file};
use model::torch_mha::{AttnWeights, TorchMhaInput};
use model::{HostTensor, KerasMha, KerasMhaInput, KerasMhaNdInput, TensorFile};
use serde_json::json;

use crate::layer_fixture::{keras_fixture, name_keras_files, projected_fixture};
use crate::layer_torch::{TorchModule, python_source};
use model::weights::save_burnpack;

/// Sequences and steps of the probe batch.
const PROBE_BATCH: usize = 2;
const PROBE_QUERY_LEN: usize = 7;
const PROBE_SOURCE_LEN: usize = 9;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    Keras,
    Projected,
    Torch,
    Burn,
}

impl std::str::FromStr for Target {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match s {
            "keras" => Ok(Target::Keras),
            "projected" => Ok(Target::Projected),
            "torch" => Ok(Target::Torch),
            "burn" => Ok(Target::Burn),
            other => bail!("--to {other:?}: expected keras, projected, torch or burn"),
        }
    }
}

impl Target {
    fn file_suffix(self) -> &'static str {
        match self {
            Target::Keras => "keras.safetensors",
            Target::Projected => "projected.safetensors",
            Target::Torch => "torch.safetensors",
            Target::Burn => "bpk",
        }
    }
}

/// What a conversion did, for the user.
#[derive(Debug, Clone)]
pub struct Report {
    pub source: PathBuf,
    pub layer: String,
    pub path: String,
    pub config: String,
    pub target: Target,
    pub source_parameters: usize,
    pub target_parameters: usize,
    pub max_abs_difference: f32,
    pub written: Vec<PathBuf>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "layer {} ({}) of {}", self.layer, self.path, self.source.display())?;
        writeln!(f, "  keras.layers.MultiHeadAttention({})", self.config)?;
        writeln!(
            f,
            "  to {:?}: {} parameters -> {} parameters",
            self.target, self.source_parameters, self.target_parameters
        )?;
        writeln!(
            f,
            "  probe: {PROBE_BATCH} sequences, {PROBE_QUERY_LEN} queries, {PROBE_SOURCE_LEN} keys (self-attention for projected)"
        )?;
        writeln!(f, "  largest |source - converted| on the probe: {:.3e}", self.max_abs_difference)?;
        for path in &self.written {
            writeln!(f, "  wrote {}", path.display())?;
        }
        Ok(())
    }
}

/// An attention layer of the input file, in Keras' vocabulary, and the torch layer it came from.
struct SourceLayer {
    keras: KerasFileLayer,
    torch: Option<TorchFileLayer>,
}

/// An attention layer of the input file as listed: its name and where it is, and the layer, or
/// why it cannot be converted. One layer that cannot be read leaves the others convertible.
struct ListedLayer {
    name: String,
    path: String,
    source: std::result::Result<SourceLayer, String>,
}

impl ListedLayer {
    /// `  name (path): arguments`, or the reason instead of the arguments.
    fn line(&self) -> String {
        match &self.source {
            Ok(source) => format!("  {} ({}): {}", self.name, self.path, arguments(&source.keras)),
            Err(why) => format!("  {} ({}): {why}", self.name, self.path),
        }
    }
}

/// The attention layers of a model file, one line each, for `--layer`: each that cannot be
/// converted with the reason.
pub fn list_layers(input: &Path, num_heads: Option<usize>) -> Result<String> {
    let layers = read_layers(input, num_heads)?;
    Ok(layers.iter().map(|l| format!("{}\n", l.line())).collect())
}

/// Converts the chosen attention layer of `input` to `target`, writes it (default: beside the
/// input, `<stem>.<layer>.<target suffix>`) and checks what was written against the source.
/// `num_heads` is needed for a layer of a PyTorch file (a state dict does not store it); the
/// file's other layers need not fit it.
pub fn convert(
    input: &Path,
    target: Target,
    layer: Option<&str>,
    num_heads: Option<usize>,
    out: Option<PathBuf>,
) -> Result<Report> {
    let layers = read_layers(input, num_heads)?;
    let SourceLayer { keras: chosen, torch: torch_source } = choose(input, &layers, layer)?;
    let device = Device::flex();
    let source = chosen
        .config
        .init_with_weights(&chosen.weights, &device)
        .with_context(|| format!("layer {} of {}", chosen.name, input.display()))?;
    let dims = chosen.config.dims()?;
    // Refuse an inexact conversion before anything runs or is written.
    let projected =
        (target == Target::Projected).then(|| keras_to_projected(&chosen.config, &chosen.weights)).transpose()?;
    let torch = (target == Target::Torch).then(|| keras_to_torch(&chosen.config, &chosen.weights)).transpose()?;
    let out = match out {
        Some(out) => with_target_extension(out, target),
        None => default_output(input, &chosen.name, target),
    };

    // [B, T, D] probes, or of the smallest rank the layer's attention axes fit.
    let probe_shape = |axis_len: fn(usize) -> usize, width: usize| {
        let rank = smallest_input_rank(chosen.config.attention_axes.as_deref());
        [vec![PROBE_BATCH], (1..rank - 1).map(axis_len).collect(), vec![width]].concat()
    };
    let probe = |shape: Vec<usize>| -> HostTensor {
        let values = Tensor::<1>::random([shape.iter().product::<usize>()], Distribution::Normal(0.0, 1.0), &device);
        HostTensor::from_tensor(values).reshaped(shape)
    };
    let attention_axes = resolve_attention_axes(
        chosen.config.attention_axes.as_deref(),
        smallest_input_rank(chosen.config.attention_axes.as_deref()),
    )?;
    let query = probe(probe_shape(|axis| if axis == 1 { PROBE_QUERY_LEN } else { 3 }, dims.query_dim));
    let projected_source = torch_source.as_ref().is_some_and(|t| matches!(t.model, TorchFileModel::Projected(_)));
    // The projected model is self-attention on one input. The value and key differ from the
    // query on the attention axes only.
    let source_len = |axis: usize| match (axis == 1, attention_axes.contains(&axis)) {
        (true, true) => PROBE_SOURCE_LEN,
        (true, false) => PROBE_QUERY_LEN,
        (false, true) => 2,
        (false, false) => 3,
    };
    let source_shape = |width: usize| {
        let rank = query.shape.len();
        [vec![PROBE_BATCH], (1..rank - 1).map(source_len).collect(), vec![width]].concat()
    };
    let (value, key) = match projected_source || target == Target::Projected {
        true => (query.clone(), query.clone()),
        false => (probe(source_shape(dims.value_input_dim)), probe(source_shape(dims.key_input_dim))),
    };
    let keras_run =
        |layer: &KerasMha| run_keras_probe(layer, [&query, &value, &key], false, &device).map(|(output, _)| output);
    let torch_call = || -> Result<TorchMhaInput> {
        Ok(TorchMhaInput::new(
            query.to_tensor("query", &device)?,
            key.to_tensor("key", &device)?,
            value.to_tensor("value", &device)?,
        ))
    };
    let run_source = |scores: bool| run_keras_probe(&source, [&query, &value, &key], scores, &device);
    // The source's own output: the torch layer itself for a PyTorch file.
    let (expected, source_parameters) = match torch_source {
        Some(torch_layer) => match &torch_layer.model {
            TorchFileModel::Attention(config) => {
                let layer = config.init_with_state_dict(&torch_layer.weights, &device)?;
                (
                    HostTensor::from_tensor(layer.forward(torch_call()?.need_weights(false))?.output),
                    Module::num_params(&layer),
                )
            }
            TorchFileModel::Projected(config) => {
                let model = config.init_with_state_dict(&torch_layer.weights, &device)?;
                (
                    HostTensor::from_tensor(model.forward(ProjectedInput::new(query.to_tensor("x", &device)?))?.output),
                    Module::num_params(&model),
                )
            }
        },
        None => (keras_run(&source)?, source.num_params()),
    };
    let case = format!("convert_{}", chosen.name);
    let description = format!("layer {} of {}, converted to {target:?}", chosen.name, input.display());

    let (target_parameters, converted_output, written) = match target {
        Target::Keras => {
            // The Keras-named safetensors (with the probe) and a .weights.h5 beside it that
            // `keras.Model.load_weights` loads; check_export.py finds it through the metadata.
            let (out, h5, archive) = keras_files(&out);
            write_weights_h5(&h5, &chosen.config, &chosen.weights)?;
            write_keras_archive(
                &archive,
                &format!("converted_{}", chosen.name.replace(|c: char| !c.is_alphanumeric(), "_")),
                &chosen.config,
                &chosen.weights,
            )?;
            let probe = [
                ("inputs.query", &query),
                ("inputs.value", &value),
                ("inputs.key", &key),
                ("outputs.output", &expected),
            ];
            let mut file = keras_fixture(&case, &description, &chosen.config, false, chosen.weights.clone(), &probe)?;
            name_keras_files(&mut file, &h5, &archive)?;
            file.write(&out)?;
            // Every file read back: the safetensors by name, the .weights.h5 and .keras by Keras' layout.
            let back = model_weights(&TensorFile::read(&out)?.tensors);
            // A weights file holds no call-time arguments: the source's dropout and window apply.
            let config = model::KerasMhaConfig::from_weights(&back)?
                .with_dropout(chosen.config.dropout)
                .with_sliding_window(chosen.config.sliding_window)
                .with_attention_axes(chosen.config.attention_axes.clone());
            let from_safetensors = keras_run(&config.init_with_weights(&back, &device)?)?;
            let mut worst = from_safetensors;
            let mut parameters = 0;
            for written in [&h5, &archive] {
                let [back] = <[KerasFileLayer; 1]>::try_from(read_keras_file(written)?)
                    .map_err(|l| anyhow::anyhow!("{}: {} layers read back", written.display(), l.len()))?;
                // A .weights.h5 holds neither the window nor the axes: the source's apply.
                let config = back
                    .config
                    .with_sliding_window(chosen.config.sliding_window)
                    .with_attention_axes(chosen.config.attention_axes.clone());
                let layer = config.init_with_weights(&back.weights, &device)?;
                let output = keras_run(&layer)?;
                parameters = layer.num_params();
                if max_difference(&expected, &output) > max_difference(&expected, &worst) {
                    worst = output;
                }
            }
            (parameters, worst, vec![out, h5, archive])
        }
        Target::Projected => {
            let converted = projected.expect("converted above");
            projected_fixture(&case, &description, &converted.config, converted.weights, &query, &expected)?
                .write(&out)?;
            let module = write_module_source(&out, TorchModule::Projected(&converted.config), &description)?;
            let back = model_weights(&TensorFile::read(&out)?.tensors);
            let model = converted.config.init_with_state_dict(&back, &device)?;
            let output = model.forward(ProjectedInput::new(query.to_tensor("x", &device)?).need_weights(false))?.output;
            (Module::num_params(&model), HostTensor::from_tensor(output), vec![out, module])
        }
        Target::Torch => {
            let converted = torch.expect("converted above");
            let (_, weights) = run_source(true)?;
            let weights = weights.expect("scores were asked for");
            let config = &converted.config;
            let metadata = json!({
                "framework": "torch",
                "case": case,
                "description": description,
                "embed_dim": config.embed_dim,
                "num_heads": config.num_heads,
                "kdim": config.kdim,
                "vdim": config.vdim,
                "bias": config.bias,
                "dropout": config.dropout,
                "batch_first": true,
                "tolerance": 1e-5,
            });
            let mut tensors = converted.weights.clone();
            for (name, tensor) in [
                ("inputs.query", &query),
                ("inputs.key", &key),
                ("inputs.value", &value),
                ("outputs.output", &expected),
                ("outputs.attention_weights", &weights),
            ] {
                tensors.insert(name, tensor.clone());
            }
            TensorFile { tensors, metadata: [("config".to_string(), metadata.to_string())].into() }.write(&out)?;
            let module = write_module_source(&out, TorchModule::Attention(config), &description)?;
            let back = model_weights(&TensorFile::read(&out)?.tensors);
            let layer = config.init_with_state_dict(&back, &device)?;
            let result = layer.forward(torch_call()?)?;
            debug_assert!(matches!(result.attn_weights, Some(AttnWeights::Averaged(_))));
            (Module::num_params(&layer), HostTensor::from_tensor(result.output), vec![out, module])
        }
        Target::Burn => {
            save_burnpack(source.clone(), &out)?;
            let probe_path = PathBuf::from(format!("{}.probe.safetensors", out.display()));
            let probe = [
                ("inputs.query", &query),
                ("inputs.value", &value),
                ("inputs.key", &key),
                ("outputs.output", &expected),
            ];
            keras_fixture(&case, &description, &chosen.config, false, Default::default(), &probe)?
                .write(&probe_path)?;
            let layer: KerasMha = chosen
                .config
                .init(&device)?
                .try_load_file(&out)
                .map_err(|e| anyhow::anyhow!("cannot read back {}: {e:?}", out.display()))?;
            (layer.num_params(), keras_run(&layer)?, vec![out, probe_path])
        }
    };
    let max_abs_difference = max_difference(&expected, &converted_output);
    Ok(Report {
        source: input.to_path_buf(),
        layer: chosen.name.clone(),
        path: chosen.path.clone(),
        config: arguments(chosen),
        target,
        source_parameters,
        target_parameters,
        max_abs_difference,
        written,
    })
}

/// A Keras layer on the probe `[query, value, key]`: [`KerasMha::forward`] on `[B, T, D]`
/// probes, [`KerasMha::forward_nd`] on probes of rank 4 to 6; with `scores`, the head-averaged
/// probabilities `[B, T, S]` too (for a torch export: `[B, T, D]` probes only).
fn run_keras_probe(
    layer: &KerasMha,
    [query, value, key]: [&HostTensor; 3],
    scores: bool,
    device: &Device,
) -> Result<(HostTensor, Option<HostTensor>)> {
    fn nd<const D: usize>(
        layer: &KerasMha,
        [query, value, key]: [&HostTensor; 3],
        device: &Device,
    ) -> Result<HostTensor> {
        let mut input = KerasMhaNdInput::new(query.to_tensor::<D>("query", device)?, value.to_tensor("value", device)?);
        input.key = Some(key.to_tensor("key", device)?);
        Ok(HostTensor::from_tensor(layer.forward_nd(input)?.output))
    }
    let probe = [query, value, key];
    match query.shape.len() {
        3 => {
            let input = KerasMhaInput::new(query.to_tensor("query", device)?, value.to_tensor("value", device)?)
                .key(key.to_tensor("key", device)?);
            let output = layer.forward(input.return_attention_scores(scores))?;
            Ok((
                HostTensor::from_tensor(output.output),
                output.attention_scores.map(|s| HostTensor::from_tensor(s.mean_dim(1).squeeze_dim::<3>(1))),
            ))
        }
        4 => Ok((nd::<4>(layer, probe, device)?, None)),
        5 => Ok((nd::<5>(layer, probe, device)?, None)),
        6 => Ok((nd::<6>(layer, probe, device)?, None)),
        rank => bail!("a probe of rank {rank}: ranks 3 to 6 are run"),
    }
}

/// Every attention layer of `input`, each read on its own (a PyTorch file's with `num_heads`
/// heads): one that cannot be read or converted is listed with the reason.
fn read_layers(input: &Path, num_heads: Option<usize>) -> Result<Vec<ListedLayer>> {
    let is_torch = input.extension().is_some_and(|e| e == "pt" || e == "pth");
    let refused =
        |name: &str, path: &str, e: ModelError| format!("cannot be converted: {}", reason(input, name, path, &e));
    let layers: Vec<ListedLayer> = if is_torch {
        let mut layers = Vec::new();
        for entry in scan_torch_file(input)? {
            let name = entry.prefix.trim_end_matches('.').to_string();
            let fallback = if entry.projected { "projected" } else { "mha" };
            let name = if name.is_empty() { fallback.to_string() } else { name };
            let refused = |e| refused(&name, &entry.prefix, e);
            let source = match num_heads {
                Some(heads) => torch_source(&entry, heads, &name).map_err(refused),
                // One head divides every width: what is refused then is refused for any count.
                None => match torch_source(&entry, 1, &name) {
                    Err(e) => Err(refused(e)),
                    Ok(_) => Err(format!(
                        "embed_dim={}; a state dict does not store the head count: pass --num-heads (a divisor of it)",
                        entry.embed_dim().map(|e| e.to_string()).unwrap_or_else(|_| "?".into())
                    )),
                },
            };
            layers.push(ListedLayer { name, path: entry.prefix.clone(), source });
        }
        layers
    } else {
        scan_keras_file(input)?
            .into_iter()
            .map(|entry| {
                let source = entry.layer.map(|keras| SourceLayer { keras, torch: None });
                let source = source.map_err(|e| refused(&entry.name, &entry.path, e));
                ListedLayer { name: entry.name, path: entry.path, source }
            })
            .collect()
    };
    if layers.is_empty() {
        bail!(
            "{}: no {} layer in this model",
            input.display(),
            if is_torch { "nn.MultiheadAttention" } else { "MultiHeadAttention" }
        );
    }
    Ok(layers)
}

/// A PyTorch file's layer with `num_heads` heads, in Keras' vocabulary (named `name`).
fn torch_source(entry: &TorchFileEntry, num_heads: usize, name: &str) -> model::Result<SourceLayer> {
    let torch = entry.layer(num_heads)?;
    let keras = torch.to_keras()?;
    let keras = KerasFileLayer {
        name: name.to_string(),
        path: torch.prefix.clone(),
        config: keras.config,
        weights: keras.weights,
    };
    Ok(SourceLayer { keras, torch: Some(torch) })
}

/// Why the layer `name` at `path` of `input` cannot be converted, for a line that already names
/// the file and the layer.
fn reason(input: &Path, name: &str, path: &str, error: &ModelError) -> String {
    let message = match error {
        ModelError::File { path, message } if path == input => message.clone(),
        other => other.to_string(),
    };
    let named =
        [format!("layer {name}: "), format!("layer {name} ({path}): "), format!("nn.MultiheadAttention at {path:?}: ")];
    named.iter().find_map(|prefix| message.strip_prefix(prefix.as_str())).map(str::to_string).unwrap_or(message)
}

/// The layer `--layer` names (by name, HDF5 path or state-dict prefix), or the only one; an
/// error with the reason when it cannot be converted.
fn choose<'a>(input: &Path, layers: &'a [ListedLayer], wanted: Option<&str>) -> Result<&'a SourceLayer> {
    let listing = || layers.iter().map(|l| format!("\n{}", l.line())).collect::<String>();
    let listed = match wanted {
        Some(wanted) => layers.iter().find(|l| l.name == wanted || l.path == wanted).with_context(|| {
            format!("{}: no attention layer named {wanted:?}; it holds:{}", input.display(), listing())
        })?,
        None if layers.len() == 1 => &layers[0],
        None => bail!("{}: {} attention layers; choose one with --layer:{}", input.display(), layers.len(), listing()),
    };
    listed
        .source
        .as_ref()
        .map_err(|why| anyhow::anyhow!("{}: layer {} ({}): {why}", input.display(), listed.name, listed.path))
}

/// The layer's constructor arguments as Keras would print them.
fn arguments(layer: &KerasFileLayer) -> String {
    let c = &layer.config;
    match c.dims() {
        Ok(d) => format!(
            "num_heads={}, key_dim={}, value_dim={}, output_shape={}, use_bias={}, dropout={}{}{}{}; query/key/value widths {}/{}/{}",
            d.num_heads,
            d.key_dim,
            d.value_dim,
            d.output_dim,
            if c.use_bias { "True" } else { "False" },
            c.dropout,
            if c.use_gate { ", use_gate=True" } else { "" },
            c.sliding_window.map(|w| format!(", sliding_window={w}")).unwrap_or_default(),
            c.attention_axes.as_ref().map(|a| format!(", attention_axes={a:?}")).unwrap_or_default(),
            d.query_dim,
            d.key_input_dim,
            d.value_input_dim
        ),
        Err(e) => format!("invalid: {e}"),
    }
}

/// `<dir>/<stem>.<layer>.<suffix>` beside the input.
fn default_output(input: &Path, layer: &str, target: Target) -> PathBuf {
    let name = input.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = [".keras", ".weights.h5", ".h5", ".pt", ".pth"]
        .iter()
        .fold(name.as_str(), |stem, suffix| stem.trim_end_matches(suffix));
    input.with_file_name(format!("{stem}.{layer}.{}", target.file_suffix()))
}

/// `--out` as given, or with the target's extension when it has none (`mha0` ->
/// `mha0.safetensors`, `mha0.bpk`): the written file says what it is, and the module written
/// beside a torch export names that file. A Keras export is named from the stem whatever
/// `--out` ends in ([`keras_files`]).
fn with_target_extension(out: PathBuf, target: Target) -> PathBuf {
    match (target, out.extension()) {
        (Target::Keras, _) | (_, Some(_)) => out,
        (Target::Burn, None) => out.with_extension("bpk"),
        (Target::Projected | Target::Torch, None) => out.with_extension("safetensors"),
    }
}

/// `<out>.py` beside a torch export: the module that holds its weights ([`python_source`]).
fn write_module_source(out: &Path, module: TorchModule, description: &str) -> Result<PathBuf> {
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let path = out.with_file_name(format!("{}.py", name.trim_end_matches(".safetensors")));
    model::weights::write_atomic(&path, python_source(module, &name, description).as_bytes())?;
    Ok(path)
}

fn max_difference(a: &HostTensor, b: &HostTensor) -> f32 {
    a.data.iter().zip(&b.data).map(|(a, b)| (a - b).abs()).fold(0.0, f32::max)
}

/// The three files of a Keras export named by `--out` (`x`, `x.keras`, `x.weights.h5` or
/// `x.keras.safetensors`): `x.keras.safetensors`, `x.weights.h5` and `x.keras`.
fn keras_files(out: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let stem = [".safetensors", ".keras", ".weights.h5", ".h5"]
        .iter()
        .fold(name.as_str(), |stem, suffix| stem.trim_end_matches(suffix));
    let beside = |suffix: &str| out.with_file_name(format!("{stem}{suffix}"));
    (beside(".keras.safetensors"), beside(".weights.h5"), beside(".keras"))
}
