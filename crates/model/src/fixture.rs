//! Forward-pass fixtures made with the real Keras and PyTorch (`datasets/reference/FORMAT.md`):
//! load one, run this crate's module on a device, and compare every output with the library's.
//!
//! Kinds, told apart by `config.framework` (and `config.kind`):
//! `keras_*` ([`KerasMha`](crate::KerasMha)), `torch_*` ([`TorchMha`](crate::TorchMha)), `projected_*` ([`ProjectedModel`](crate::ProjectedModel)) and
//! `conversion_*` (the mappings of [`crate::convert`], checked tensor by tensor and by running the
//! converted model against the source model's output).

use std::path::{Path, PathBuf};

use burn::tensor::{Bool, Device, Tensor};
use serde_json::Value;

use crate::convert::{self, Converted};
use crate::error::{ModelError, Result};
use crate::keras_mha::{KerasMha, KerasMhaConfig, KerasMhaInput};
use crate::keras_nd::KerasMhaNdInput;
use crate::nd_mask::NdMask;
use crate::projected::{ProjectedConfig, ProjectedInput};
use crate::torch_mha::{AttnMask, AttnWeights, TorchMhaConfig, TorchMhaInput};
use crate::weights::{HostTensor, StoredDtype, TensorFile, WeightMap};

/// A fixture file: its tensors and its parsed `__metadata__["config"]`.
#[derive(Debug, Clone)]
pub struct Fixture {
    pub path: PathBuf,
    pub case: String,
    pub config: Value,
    pub tensors: WeightMap,
}

/// What a fixture checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FixtureKind {
    Keras,
    Torch,
    Projected,
    Conversion,
    /// A training trajectory (`train_*`), run by the `train` crate.
    Train,
}

impl Fixture {
    pub fn read(path: &Path) -> Result<Self> {
        let file = TensorFile::read(path)?;
        let raw = file
            .metadata
            .get("config")
            .ok_or_else(|| ModelError::file(path, "no `config` in the safetensors metadata: not a fixture"))?;
        let config: Value = serde_json::from_str(raw)
            .map_err(|e| ModelError::file(path, format!("metadata `config` is not JSON: {e}")))?;
        let case = config
            .get("case")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| path.file_stem().unwrap_or_default().to_string_lossy().into_owned());
        Ok(Self { path: path.to_path_buf(), case, config, tensors: file.tensors })
    }

    pub fn kind(&self) -> Result<FixtureKind> {
        if self.config.get("steps").is_some() && self.config.get("optimizer").is_some() {
            return Ok(FixtureKind::Train);
        }
        match (self.str("framework")?, self.config.get("kind").and_then(Value::as_str)) {
            ("keras", _) => Ok(FixtureKind::Keras),
            ("torch", Some("projected")) => Ok(FixtureKind::Projected),
            ("torch", _) => Ok(FixtureKind::Torch),
            ("conversion", _) => Ok(FixtureKind::Conversion),
            (other, _) => Err(self.error(format!("unknown config.framework {other:?}"))),
        }
    }

    /// The fixture's absolute tolerance (`config.tolerance`).
    pub fn tolerance(&self) -> Result<f64> {
        self.f64("tolerance")
    }

    pub fn error(&self, message: impl std::fmt::Display) -> ModelError {
        ModelError::file(&self.path, message)
    }

    pub fn field(&self, name: &str) -> Result<&Value> {
        self.config.get(name).ok_or_else(|| self.error(format!("config has no `{name}`")))
    }

    pub fn str(&self, name: &str) -> Result<&str> {
        self.field(name)?.as_str().ok_or_else(|| self.error(format!("config `{name}` is not a string")))
    }

    pub fn f64(&self, name: &str) -> Result<f64> {
        self.field(name)?.as_f64().ok_or_else(|| self.error(format!("config `{name}` is not a number")))
    }

    pub fn usize(&self, name: &str) -> Result<usize> {
        self.field(name)?
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| self.error(format!("config `{name}` is not a count")))
    }

    pub fn bool(&self, name: &str) -> Result<bool> {
        self.field(name)?.as_bool().ok_or_else(|| self.error(format!("config `{name}` is not a boolean")))
    }

    /// An optional count: absent or `null` is `None`.
    pub fn opt_usize(&self, name: &str) -> Result<Option<usize>> {
        match self.config.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.usize(name).map(Some),
        }
    }

    pub fn tensor(&self, name: &str) -> Result<&HostTensor> {
        self.tensors.get(name).map_err(|e| self.error(e))
    }

    /// The model's weights: every tensor outside `inputs.`, `outputs.` and `intermediates.`.
    pub fn weights(&self) -> WeightMap {
        model_weights(&self.tensors)
    }

    /// The output width of a projected model's head, `name` (`final.weight [out, E]`) in
    /// `weights`; `None` without a head. A head weight that is not a matrix (a scalar, say, in a
    /// damaged or hand-made file) is an error naming this file and the tensor.
    pub fn head_width(&self, weights: &WeightMap, name: &str) -> Result<Option<usize>> {
        let Ok(weight) = weights.get(name) else { return Ok(None) };
        match weight.shape[..] {
            [out, _] => Ok(Some(out)),
            _ => Err(self.error(ModelError::TensorRank {
                name: name.to_string(),
                expected: 2,
                found: weight.shape.clone(),
            })),
        }
    }
}

/// The tensors of a fixture-format file that are model weights: all but `inputs.*`, `outputs.*`
/// and `intermediates.*`.
pub fn model_weights(tensors: &WeightMap) -> WeightMap {
    let mut map = WeightMap::new();
    for (name, t) in tensors.iter() {
        if !["inputs.", "outputs.", "intermediates."].iter().any(|p| name.starts_with(p)) {
            map.insert(name, t.clone());
        }
    }
    map
}

/// One compared output.
#[derive(Debug, Clone)]
pub struct Check {
    pub case: String,
    pub backend: String,
    pub output: String,
    pub max_abs_err: f64,
    pub tol: f64,
    pub passed: bool,
    /// Why a value was left out of the comparison, or why it failed beyond the error.
    pub note: Option<String>,
}

impl std::fmt::Display for Check {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let verdict = if self.passed { "PASS" } else { "FAIL" };
        write!(
            f,
            "{verdict} {} {} {} max_abs_err={:.3e} tol={:.1e}",
            self.case, self.backend, self.output, self.max_abs_err, self.tol
        )?;
        if let Some(note) = &self.note {
            write!(f, " ({note})")?;
        }
        Ok(())
    }
}

/// Compares `ours` with a reference elementwise at absolute tolerance `tol`.
///
/// Entries where the reference is NaN (torch on a fully masked row) are left out, and ours must
/// be finite there. Any non-finite value of ours elsewhere fails.
pub fn compare(case: &str, backend: &str, output: &str, ours: &HostTensor, expected: &HostTensor, tol: f64) -> Check {
    let mut check = Check {
        case: case.to_string(),
        backend: backend.to_string(),
        output: output.to_string(),
        max_abs_err: 0.0,
        tol,
        passed: true,
        note: None,
    };
    if ours.shape != expected.shape {
        check.passed = false;
        check.max_abs_err = f64::INFINITY;
        check.note = Some(format!("shape {:?}, expected {:?}", ours.shape, expected.shape));
        return check;
    }
    let mut skipped = 0usize;
    for (&a, &b) in ours.data.iter().zip(&expected.data) {
        if !a.is_finite() {
            check.max_abs_err = f64::INFINITY;
            check.note = Some("non-finite output".into());
            continue;
        }
        if b.is_nan() {
            skipped += 1;
            continue;
        }
        check.max_abs_err = check.max_abs_err.max((a as f64 - b as f64).abs());
    }
    if skipped > 0 && check.note.is_none() {
        check.note = Some(format!("{skipped} NaN reference entries skipped; ours finite there"));
    }
    check.passed = check.max_abs_err <= tol;
    check
}

/// Runs a forward or conversion fixture on `device` and compares every output it holds.
pub fn run(fixture: &Fixture, backend: &str, device: &Device) -> Result<Vec<Check>> {
    let tol = fixture.tolerance()?;
    let mut checks = Vec::new();
    let mut check = |name: &str, ours: HostTensor, expected: &str| -> Result<()> {
        checks.push(compare(&fixture.case, backend, name, &ours, fixture.tensor(expected)?, tol));
        Ok(())
    };
    match fixture.kind()? {
        FixtureKind::Keras => {
            let config = keras_config(fixture)?;
            let outputs = match fixture.tensor("inputs.query")?.shape.len() {
                3 => run_keras(fixture, &config, &fixture.weights(), device)?,
                4 => run_keras_nd::<4>(fixture, &config, device)?,
                5 => run_keras_nd::<5>(fixture, &config, device)?,
                6 => run_keras_nd::<6>(fixture, &config, device)?,
                rank => return Err(fixture.error(format!("inputs.query has rank {rank}; ranks 3 to 6 are run"))),
            };
            for (name, ours) in outputs {
                check(&name, ours, &format!("outputs.{name}"))?;
            }
        }
        FixtureKind::Torch => {
            let config = TorchMhaConfig::new(fixture.usize("embed_dim")?, fixture.usize("num_heads")?)
                .with_kdim(fixture.opt_usize("kdim")?)
                .with_vdim(fixture.opt_usize("vdim")?)
                .with_bias(fixture.bool("bias")?)
                .with_add_zero_attn(fixture.config.get("add_zero_attn").and_then(Value::as_bool).unwrap_or(false))
                .with_add_bias_kv(fixture.config.get("add_bias_kv").and_then(Value::as_bool).unwrap_or(false))
                .with_dropout(fixture.config.get("dropout").and_then(Value::as_f64).unwrap_or(0.0));
            let outputs = run_torch(fixture, &config, device)?;
            for (name, ours) in outputs {
                check(&name, ours, &format!("outputs.{name}"))?;
            }
        }
        FixtureKind::Projected => {
            let config = projected_config(fixture, &fixture.weights())?;
            for (name, ours) in run_projected(fixture, &config, &fixture.weights(), device)? {
                check(&name, ours, &name)?;
            }
        }
        FixtureKind::Conversion => {
            let (converted, outputs) = run_conversion(fixture, device)?;
            for (name, expected) in fixture.tensors.with_prefix_stripped("dst.").iter() {
                let ours = converted
                    .get(name)
                    .map_err(|_| fixture.error(format!("the conversion did not produce `{name}`")))?;
                checks.push(compare(&fixture.case, backend, &format!("dst.{name}"), ours, expected, tol));
            }
            if let Some(extra) = converted.names().find(|n| !fixture.tensors.contains(&format!("dst.{n}"))) {
                return Err(fixture
                    .error(format!("the conversion produced `{extra}`, which the fixture's dst.* does not have")));
            }
            checks.push(compare(&fixture.case, backend, "output", &outputs, fixture.tensor("outputs.output")?, tol));
        }
        FixtureKind::Train => return Err(fixture.error("a training-trajectory fixture: run it with the train crate")),
    }
    Ok(checks)
}

/// The Keras config of a `keras_*` fixture: sizes from the weights, the rest from the config.
fn keras_config(fixture: &Fixture) -> Result<KerasMhaConfig> {
    let config = match burnpack_beside(fixture) {
        // The probe beside a burnpack holds no weights: the sizes come from its config and inputs.
        Some(_) => {
            let width = |name: &str| -> Result<usize> { Ok(*fixture.tensor(name)?.shape.last().unwrap_or(&0)) };
            let value_width = width("inputs.value")?;
            let key_width = if fixture.tensors.contains("inputs.key") { width("inputs.key")? } else { value_width };
            KerasMhaConfig::new(fixture.usize("num_heads")?, fixture.usize("key_dim")?, width("inputs.query")?)
                .with_value_dim(fixture.opt_usize("value_dim")?)
                .with_value_input_dim(Some(value_width))
                .with_key_input_dim(Some(key_width))
                .with_output_shape(Some(width("outputs.output")?))
                .with_use_bias(fixture.bool("use_bias")?)
                .with_use_gate(fixture.config.get("use_gate").and_then(Value::as_bool).unwrap_or(false))
        }
        None => KerasMhaConfig::from_weights(&fixture.weights()).map_err(|e| fixture.error(e))?,
    };
    let dropout = fixture.config.get("dropout").and_then(Value::as_f64).unwrap_or(0.0);
    let sliding_window = fixture.config.get("sliding_window").and_then(Value::as_u64).map(|w| w as usize);
    let attention_axes = match fixture.config.get("attention_axes") {
        None | Some(Value::Null) => None,
        Some(axes) => Some(
            axes.as_array()
                .and_then(|axes| axes.iter().map(Value::as_i64).collect::<Option<Vec<_>>>())
                .ok_or_else(|| fixture.error(format!("config `attention_axes` = {axes} is not a list of axes")))?,
        ),
    };
    Ok(config.with_dropout(dropout).with_sliding_window(sliding_window).with_attention_axes(attention_axes))
}

/// The burnpack a weightless `keras_*` probe was written beside (`<file>.bpk.probe.safetensors`).
fn burnpack_beside(fixture: &Fixture) -> Option<PathBuf> {
    let name = fixture.path.to_str()?;
    let burnpack = name.strip_suffix(".probe.safetensors").filter(|b| b.ends_with(".bpk"))?;
    fixture.weights().names().next().is_none().then(|| PathBuf::from(burnpack))
}

/// The layer of a `keras_*` file: built from its weights, or loaded from the burnpack beside it.
fn keras_layer(fixture: &Fixture, config: &KerasMhaConfig, weights: &WeightMap, device: &Device) -> Result<KerasMha> {
    match burnpack_beside(fixture) {
        Some(burnpack) => {
            use burn::module::Module;
            let layer = config.init(device).map_err(|e| fixture.error(e))?;
            layer
                .try_load_file(&burnpack)
                .map_err(|e| ModelError::file(&burnpack, format!("cannot load the burnpack: {e:?}")))
        }
        None => config.init_with_weights(weights, device).map_err(|e| fixture.error(e)),
    }
}

/// Runs a `keras_*` fixture whose inputs have rank 4 or more through [`KerasMha::forward_nd`].
fn run_keras_nd<const D: usize>(
    fixture: &Fixture,
    config: &KerasMhaConfig,
    device: &Device,
) -> Result<Vec<(String, HostTensor)>> {
    let layer = keras_layer(fixture, config, &fixture.weights(), device)?;
    let mask = |name: &str| -> Result<Option<NdMask>> {
        match fixture.tensors.get(name) {
            Ok(t) => Ok(NdMask::new(t.shape.clone(), t.data.iter().map(|v| *v != 0.0).collect())),
            Err(_) => Ok(None),
        }
    };
    let call = || -> Result<KerasMhaNdInput<D>> {
        let tensor = |name: &str| fixture.tensor(name)?.to_tensor::<D>(name, device);
        let mut input = KerasMhaNdInput::new(tensor("inputs.query")?, tensor("inputs.value")?);
        if fixture.tensors.contains("inputs.key") {
            input.key = Some(tensor("inputs.key")?);
        }
        input.use_causal_mask = fixture.config.get("use_causal_mask").and_then(Value::as_bool).unwrap_or(false);
        input.attention_mask = mask("inputs.attention_mask")?;
        input.query_mask = mask("inputs.query_mask")?;
        input.value_mask = mask("inputs.value_mask")?;
        input.key_mask = mask("inputs.key_mask")?;
        Ok(input)
    };
    let mut outputs = vec![("output".to_string(), HostTensor::from_tensor(layer.forward_nd(call()?)?.output))];
    if fixture.tensors.contains("outputs.attention_scores") {
        let mut input = call()?;
        input.return_attention_scores = true;
        let with_scores = layer.forward_nd(input)?;
        let scores = HostTensor::from_tensor(with_scores.attention_scores.expect("scores were requested"));
        outputs.push(("attention_scores".into(), scores.reshaped(with_scores.attention_scores_shape)));
        outputs.push(("output_with_scores".into(), HostTensor::from_tensor(with_scores.output)));
    }
    Ok(outputs)
}

/// Runs the Keras default call and, when the fixture has scores, the `return_attention_scores`
/// call; returns `(output name, value)` pairs named as the fixture's `outputs.*`.
fn run_keras(
    fixture: &Fixture,
    config: &KerasMhaConfig,
    weights: &WeightMap,
    device: &Device,
) -> Result<Vec<(String, HostTensor)>> {
    let layer = keras_layer(fixture, config, weights, device)?;
    let causal = fixture.config.get("use_causal_mask").and_then(Value::as_bool).unwrap_or(false);
    let call = || -> Result<KerasMhaInput> {
        let (query, value) = (fixture.tensor("inputs.query")?, fixture.tensor("inputs.value")?);
        // A value that is the query, and no key: self-attention, which takes the packed path.
        let one_input = query == value && !fixture.tensors.contains("inputs.key");
        let input =
            KerasMhaInput::new(query.to_tensor("inputs.query", device)?, value.to_tensor("inputs.value", device)?);
        let mut input = KerasMhaInput { self_attention: one_input, ..input }.use_causal_mask(causal);
        if fixture.tensors.contains("inputs.key") {
            input = input.key(fixture.tensor("inputs.key")?.to_tensor("inputs.key", device)?);
        }
        if fixture.tensors.contains("inputs.attention_mask") {
            input = input.attention_mask(
                fixture.tensor("inputs.attention_mask")?.to_bool_tensor("inputs.attention_mask", device)?,
            );
        }
        // The implicit masks: the query tensor's Keras mask, `value_mask`, `key_mask`.
        let implicit = |name: &str| -> Result<Option<Tensor<2, Bool>>> {
            match fixture.tensors.contains(name) {
                true => Ok(Some(fixture.tensor(name)?.to_bool_tensor(name, device)?)),
                false => Ok(None),
            }
        };
        input.query_mask = implicit("inputs.query_mask")?;
        input.value_mask = implicit("inputs.value_mask")?;
        input.key_mask = implicit("inputs.key_mask")?;
        Ok(input)
    };
    let mut outputs = vec![("output".to_string(), HostTensor::from_tensor(layer.forward(call()?)?.output))];
    if fixture.tensors.contains("outputs.attention_scores") {
        let with_scores = layer.forward(call()?.return_attention_scores(true))?;
        let scores = with_scores.attention_scores.expect("scores were requested");
        outputs.push(("attention_scores".into(), HostTensor::from_tensor(scores)));
        outputs.push(("output_with_scores".into(), HostTensor::from_tensor(with_scores.output)));
    }
    Ok(outputs)
}

fn run_torch(fixture: &Fixture, config: &TorchMhaConfig, device: &Device) -> Result<Vec<(String, HostTensor)>> {
    let layer = config.init_with_state_dict(&fixture.weights(), device).map_err(|e| fixture.error(e))?;
    let call = || -> Result<TorchMhaInput> {
        let input = |name: &str| fixture.tensor(name)?.to_tensor::<3>(name, device);
        let is_causal = fixture.config.get("is_causal").and_then(Value::as_bool).unwrap_or(false);
        let mut call = TorchMhaInput::new(input("inputs.query")?, input("inputs.key")?, input("inputs.value")?)
            .is_causal(is_causal);
        // Query, key and value of one tensor: self-attention, which takes the packed path.
        let parts = ["inputs.query", "inputs.key", "inputs.value"].map(|name| fixture.tensor(name));
        call.self_attention = matches!(&parts, [Ok(q), Ok(k), Ok(v)] if q == k && k == v);
        if fixture.tensors.contains("inputs.key_padding_mask") {
            call = call.key_padding_mask(
                fixture.tensor("inputs.key_padding_mask")?.to_bool_tensor("inputs.key_padding_mask", device)?,
            );
        }
        if let Ok(mask) = fixture.tensor("inputs.attn_mask") {
            call = call.attn_mask(torch_attn_mask(mask, device)?);
        }
        Ok(call)
    };
    let result = layer.forward(call()?)?;
    let Some(AttnWeights::Averaged(weights)) = result.attn_weights else {
        unreachable!("need_weights and averaging are the defaults")
    };
    let mut outputs = vec![
        ("output".to_string(), HostTensor::from_tensor(result.output)),
        ("attention_weights".into(), HostTensor::from_tensor(weights)),
    ];
    if fixture.tensors.contains("outputs.output_need_weights_false") {
        let fast = layer.forward(call()?.need_weights(false))?;
        outputs.push(("output_need_weights_false".into(), HostTensor::from_tensor(fast.output)));
    }
    Ok(outputs)
}

/// A torch `attn_mask` tensor: `u8` is boolean (1 = not allowed), `f32` is added to the logits.
/// `[T, S]` or `[B*h, T, S]`.
fn torch_attn_mask(mask: &HostTensor, device: &Device) -> Result<AttnMask> {
    let mask = match mask.shape.len() {
        2 => mask.reshaped([vec![1], mask.shape.clone()].concat()),
        _ => mask.clone(),
    };
    Ok(match mask.dtype {
        StoredDtype::U8 => AttnMask::Bool(mask.to_bool_tensor("inputs.attn_mask", device)?),
        StoredDtype::F32 => AttnMask::Additive(mask.to_tensor("inputs.attn_mask", device)?),
    })
}

/// The projected model's config: sizes from the fixture config and the weights (a `final.*` head
/// when present).
fn projected_config(fixture: &Fixture, weights: &WeightMap) -> Result<ProjectedConfig> {
    let output_dim = fixture.head_width(weights, "final.weight")?;
    let bias = fixture.config.get("bias").and_then(Value::as_bool).unwrap_or(weights.contains("in_proj_bias"));
    Ok(ProjectedConfig::new(fixture.usize("in_features")?, fixture.usize("embed_dim")?, fixture.usize("num_heads")?)
        .with_output_dim(output_dim)
        .with_bias(bias))
}

/// Runs the projected model; returns pairs named as the fixture's tensors.
fn run_projected(
    fixture: &Fixture,
    config: &ProjectedConfig,
    weights: &WeightMap,
    device: &Device,
) -> Result<Vec<(String, HostTensor)>> {
    let model = config.init_with_state_dict(weights, device).map_err(|e| fixture.error(e))?;
    let x = fixture.tensor("inputs.x")?.to_tensor("inputs.x", device)?;
    let mut input = ProjectedInput::new(x).need_weights(true);
    if fixture.tensors.contains("inputs.key_padding_mask") {
        input.key_padding_mask =
            Some(fixture.tensor("inputs.key_padding_mask")?.to_bool_tensor("inputs.key_padding_mask", device)?);
    }
    if let Ok(mask) = fixture.tensor("inputs.attn_mask") {
        input.attn_mask = Some(torch_attn_mask(mask, device)?);
    }
    let result = model.forward(input)?;
    let mut outputs = vec![("outputs.output".to_string(), HostTensor::from_tensor(result.output))];
    if fixture.tensors.contains("intermediates.proj_output") {
        outputs.push(("intermediates.proj_output".into(), HostTensor::from_tensor(result.proj_output)));
    }
    if fixture.tensors.contains("outputs.attention_weights") {
        let Some(AttnWeights::Averaged(weights)) = result.attention.attn_weights else {
            unreachable!("need_weights was set")
        };
        outputs.push(("outputs.attention_weights".into(), HostTensor::from_tensor(weights)));
    }
    Ok(outputs)
}

/// Converts `src.*` in the fixture's direction and runs the converted model on the inputs.
fn run_conversion(fixture: &Fixture, device: &Device) -> Result<(WeightMap, HostTensor)> {
    let src = fixture.tensors.with_prefix_stripped("src.");
    let output_of = |outputs: Vec<(String, HostTensor)>, name: &str| {
        outputs.into_iter().find(|(n, _)| n == name).map(|(_, t)| t).expect("the runner returns its main output")
    };
    match fixture.str("direction")? {
        "keras_to_torch" => {
            let keras = KerasMhaConfig::from_weights(&src).map_err(|e| fixture.error(e))?;
            let Converted { config, weights } = convert::keras_to_torch(&keras, &src).map_err(|e| fixture.error(e))?;
            let mut as_fixture = fixture.clone();
            as_fixture.tensors = weights.clone();
            for (name, t) in fixture.tensors.iter().filter(|(n, _)| n.starts_with("inputs.")) {
                as_fixture.tensors.insert(name, t.clone());
            }
            let out = output_of(run_torch(&as_fixture, &config, device)?, "output");
            Ok((weights, out))
        }
        "keras_to_projected" => {
            let keras = KerasMhaConfig::from_weights(&src).map_err(|e| fixture.error(e))?;
            let Converted { config, weights } =
                convert::keras_to_projected(&keras, &src).map_err(|e| fixture.error(e))?;
            let out = output_of(run_projected(fixture, &config, &weights, device)?, "outputs.output");
            Ok((weights, out))
        }
        "projected_to_keras" => {
            let projected = projected_config(fixture, &src)?;
            let Converted { config, weights } =
                convert::projected_to_keras(&projected, &src).map_err(|e| fixture.error(e))?;
            let mut as_fixture = fixture.clone();
            let x = fixture.tensor("inputs.x")?.clone();
            as_fixture.tensors.insert("inputs.query", x.clone());
            as_fixture.tensors.insert("inputs.value", x);
            let out = output_of(run_keras(&as_fixture, &config, &weights, device)?, "output");
            Ok((weights, out))
        }
        other => Err(fixture.error(format!("unknown conversion direction {other:?}"))),
    }
}

/// Every `*.safetensors` file under `dir`, recursively, sorted.
pub fn discover(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| ModelError::file(dir, e))?;
    for entry in entries {
        let path = entry.map_err(|e| ModelError::file(dir, e))?.path();
        if path.is_dir() {
            files.extend(discover(&path)?);
        } else if path.extension().is_some_and(|e| e == "safetensors") {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}
