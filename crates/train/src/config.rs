//! Training configs: TOML files in `configs/`, every field defaulted, unknown keys rejected.
//!
//! A file is a small diff on top of the embedded default (`configs/default.toml`); `--set
//! key=value` overrides (dotted keys, TOML values) are applied on top of the file. Every error
//! names the file, the key and the value.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use model::{Backend, KerasMhaConfig, ProjectedConfig, WgpuKind};
use serde::{Deserialize, Serialize};

use crate::models::{ModelKind, ModelSpec};
use crate::optim::OptimizerConfig;
use crate::task::{INPUT_DIM, OUTPUT_DIM, TaskConfig};

/// The default config, embedded so that `cargo xtask train` needs no file.
pub const DEFAULT_TOML: &str = include_str!("../../../configs/default.toml");

/// A whole training run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Run name: results go to `runs/<name>/`.
    pub name: String,
    /// `ndarray`, `flex` or `wgpu`: the only change needed to move a run between backends.
    pub backend: String,
    /// wgpu adapter: `default`, `cpu`, `discrete[:N]`, `integrated[:N]`.
    pub wgpu_device: String,
    pub model: ModelSection,
    pub task: TaskConfig,
    pub train: TrainSection,
    /// `[optimizer]`: `name = "adam_keras" | "adam_torch" | "sgd" | "sgd_keras"` plus that
    /// optimizer's hyperparameters (see `train::optim`).
    pub optimizer: OptimizerConfig,
}

/// `[model]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSection {
    /// `keras` (Keras-exact layer), `projected` (Linear + torch MHA + Linear head) or `baseline`
    /// (per-position MLP).
    pub kind: ModelKind,
    /// Attention heads (keras, projected).
    pub num_heads: usize,
    /// Per-head query/key size (keras); the projected model's width is `num_heads * key_dim`.
    pub key_dim: usize,
    /// Per-head value size (keras); unset = `key_dim`.
    pub value_dim: Option<usize>,
    /// Biases in every layer.
    pub use_bias: bool,
    /// Causal masking (keras: `use_causal_mask`; projected: the same mask as `attn_mask`).
    pub use_causal_mask: bool,
    /// Dropout on attention probabilities.
    pub dropout: f64,
    /// Hidden width of the baseline MLP.
    pub hidden: usize,
    /// Start from these weights (a safetensors file in the model's library vocabulary, such as an
    /// export of another run) instead of a fresh initialisation.
    pub init_from: Option<PathBuf>,
}

/// `[train]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TrainSection {
    /// Seed of the initial weights and the batch order.
    pub seed: u64,
    pub epochs: usize,
    pub batch_size: usize,
    pub learning_rate: f64,
    /// Steps between checkpoints (a run can resume from the last one).
    pub checkpoint_every: usize,
    /// Steps between progress lines.
    pub log_every: usize,
    /// Sequences of the valid split evaluated after each epoch (all of them when 0).
    pub valid_batches: usize,
    /// The same config and seed give the same weights and losses bit for bit, run twice or
    /// interrupted and resumed, on this machine at its thread count: the kernels' run-time
    /// choices that change rounding follow fixed rules instead of timing
    /// (`kernels::tuning::set_reproducible`). `false` lets them time, a few percent faster where
    /// timing would pick another variant.
    pub reproducible: bool,
}

/// The defaults of every field; `configs/default.toml` spells the same values out (a test checks
/// that they agree).
impl Default for RunConfig {
    fn default() -> Self {
        Self {
            name: "keras-flex".into(),
            backend: "flex".into(),
            wgpu_device: "default".into(),
            model: ModelSection::default(),
            task: TaskConfig::default(),
            train: TrainSection::default(),
            optimizer: OptimizerConfig::default(),
        }
    }
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            kind: ModelKind::Keras,
            num_heads: 6,
            key_dim: 4,
            value_dim: None,
            use_bias: true,
            use_causal_mask: false,
            dropout: 0.0,
            hidden: 64,
            init_from: None,
        }
    }
}

impl Default for TrainSection {
    fn default() -> Self {
        Self {
            seed: 1,
            epochs: 3,
            batch_size: 32,
            learning_rate: 1e-2,
            checkpoint_every: 50,
            log_every: 16,
            valid_batches: 0,
            reproducible: true,
        }
    }
}

impl RunConfig {
    /// The embedded default, or `file`, with `overrides` (`key=value`, dotted keys) applied.
    pub fn load(file: Option<&Path>, overrides: &[String]) -> Result<Self> {
        let (source, text) = match file {
            Some(path) => (
                path.display().to_string(),
                std::fs::read_to_string(path).with_context(|| format!("cannot read config {}", path.display()))?,
            ),
            None => ("configs/default.toml (embedded)".to_string(), DEFAULT_TOML.to_string()),
        };
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| anyhow!("{source}: {e}"))?;
        for assignment in overrides {
            apply_override(&mut table, assignment).with_context(|| format!("--set {assignment}"))?;
        }
        // Deserialised from text (not the table) so that errors carry a span to name the key by.
        let text = toml::to_string(&table).expect("a parsed table serialises");
        let config: RunConfig =
            toml::from_str(&text).map_err(|e| anyhow!("{source}: {}{}", locate(&text, &e), e.message().trim()))?;
        config.validate().map_err(|e| anyhow!("{source}: {e}"))?;
        Ok(config)
    }

    /// Range checks that types cannot express.
    pub fn validate(&self) -> Result<()> {
        let bad = |key: &str, value: &dyn std::fmt::Display, why: &str| Err(anyhow!("{key} = {value}: {why}"));
        if self.name.is_empty() || self.name.contains(['/', '\\']) || self.name.starts_with('.') {
            return bad("name", &format!("{:?}", self.name), "must be a plain directory name");
        }
        let backend: Backend = self
            .backend
            .parse()
            .map_err(|_| anyhow!("backend = {:?}: expected \"ndarray\", \"flex\" or \"wgpu\"", self.backend))?;
        let _: WgpuKind = self.wgpu_device.parse().map_err(|_| {
            anyhow!(
                "wgpu_device = {:?}: expected \"default\", \"cpu\", \"discrete[:N]\" or \"integrated[:N]\"",
                self.wgpu_device
            )
        })?;
        let m = &self.model;
        if m.kind != ModelKind::Baseline {
            if m.num_heads == 0 {
                return bad("model.num_heads", &0, "must be at least 1");
            }
            if m.key_dim == 0 {
                return bad("model.key_dim", &0, "must be at least 1");
            }
        }
        if m.value_dim == Some(0) {
            return bad("model.value_dim", &0, "must be at least 1");
        }
        if m.kind == ModelKind::Baseline && m.hidden == 0 {
            return bad("model.hidden", &0, "must be at least 1");
        }
        if !(0.0..1.0).contains(&m.dropout) {
            return bad("model.dropout", &m.dropout, "must be in [0, 1)");
        }
        if let Some(path) = &m.init_from
            && !path.exists()
        {
            return bad("model.init_from", &path.display(), "no such file");
        }
        self.task.validate().map_err(|(k, v, why)| anyhow!("task.{k} = {v}: {why}"))?;
        let t = &self.train;
        for (key, value) in [
            ("train.epochs", t.epochs),
            ("train.batch_size", t.batch_size),
            ("train.checkpoint_every", t.checkpoint_every),
            ("train.log_every", t.log_every),
        ] {
            if value == 0 {
                return bad(key, &0, "must be at least 1");
            }
        }
        if t.batch_size > self.task.train_size {
            return bad("train.batch_size", &t.batch_size, "is larger than task.train_size");
        }
        if !(t.learning_rate.is_finite() && t.learning_rate > 0.0) {
            return bad("train.learning_rate", &t.learning_rate, "must be > 0");
        }
        self.optimizer.validate().map_err(|(k, v, why)| anyhow!("optimizer.{k} = {v}: {why}"))?;
        if !backend.is_available() {
            bail!(
                "backend = \"wgpu\": no wgpu adapter on this machine (install mesa-vulkan-drivers for lavapipe, or pick ndarray/flex)"
            );
        }
        Ok(())
    }

    pub fn backend(&self) -> Backend {
        self.backend.parse().expect("validated")
    }

    pub fn wgpu_kind(&self) -> WgpuKind {
        self.wgpu_device.parse().expect("validated")
    }

    /// The model's shape on this task.
    pub fn model_spec(&self) -> ModelSpec {
        let m = &self.model;
        match m.kind {
            ModelKind::Keras => ModelSpec::Keras {
                layer: KerasMhaConfig::new(m.num_heads, m.key_dim, INPUT_DIM)
                    .with_value_dim(m.value_dim)
                    .with_output_shape(Some(OUTPUT_DIM))
                    .with_use_bias(m.use_bias)
                    .with_dropout(m.dropout),
                use_causal_mask: m.use_causal_mask,
            },
            ModelKind::Projected => ModelSpec::Projected(
                ProjectedConfig::new(INPUT_DIM, m.num_heads * m.key_dim, m.num_heads)
                    .with_output_dim(Some(OUTPUT_DIM))
                    .with_bias(m.use_bias)
                    .with_dropout(m.dropout),
            ),
            ModelKind::Baseline => {
                ModelSpec::Baseline { in_features: INPUT_DIM, hidden: m.hidden, output_dim: OUTPUT_DIM }
            }
        }
    }

    /// The resolved config as TOML (saved beside the results).
    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("a config serialises")
    }
}

/// Sets `a.b.c = value` in `table`; the value is parsed as TOML (`3`, `1e-3`, `"flex"`, `true`),
/// and a bare word that is not TOML is taken as a string.
fn apply_override(table: &mut toml::Table, assignment: &str) -> Result<()> {
    let (key, raw) = assignment.split_once('=').ok_or_else(|| anyhow!("expected key=value"))?;
    let (key, raw) = (key.trim(), raw.trim());
    let value = match toml::from_str::<toml::Table>(&format!("v = {raw}")) {
        Ok(mut t) => t.remove("v").expect("parsed above"),
        Err(_) => toml::Value::String(raw.to_string()),
    };
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().filter(|k| !k.is_empty()).ok_or_else(|| anyhow!("empty key"))?;
    let mut current = table;
    for part in parts {
        current = current
            .entry(part)
            .or_insert_with(|| toml::Value::Table(Default::default()))
            .as_table_mut()
            .ok_or_else(|| anyhow!("`{part}` is not a table"))?;
    }
    current.insert(last.to_string(), value);
    Ok(())
}

/// `section.key = value: ` for the line a deserialisation error points at (empty without a span).
fn locate(text: &str, error: &toml::de::Error) -> String {
    let Some(span) = error.span() else { return String::new() };
    let line_start = text[..span.start].rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next().unwrap_or("").trim();
    let section =
        text[..line_start].lines().rev().find(|l| l.starts_with('[')).map(|l| l.trim_matches(['[', ']', ' ']));
    if line.is_empty() || line.starts_with('[') {
        return String::new();
    }
    match section {
        Some(section) => format!("{section}.{line}: "),
        None => format!("{line}: "),
    }
}
