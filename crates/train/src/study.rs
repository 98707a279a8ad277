//! The study behind the project's claim: do the Keras-exact and the projected model train equally
//! well, on every backend?
//!
//! The matrix {keras, projected, baseline} x backends x seeds runs through the same code as
//! `cargo xtask train`, on the same data, with equal step budgets. For each model and seed the
//! initial weights are drawn once (on flex) and every backend starts from them, with the same
//! host-generated batches, so the loss curves of one model on different backends are comparable
//! step by step. Finished runs are reused, interrupted ones resumed, unless the study is fresh:
//! reuse matches configs, not the code that ran them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use model::weights::write_atomic;
use model::{Backend, TensorFile};
use serde::Serialize;

use crate::config::RunConfig;
use crate::models::ModelKind;
use crate::run::{RunOptions, Summary, train};

/// What to run.
#[derive(Debug, Clone)]
pub struct StudyConfig {
    /// Report folder name: `reports/<name>/`; runs are `runs/<name>-<model>-<backend>-s<seed>/`.
    pub name: String,
    /// Every run is this config with model kind, backend, seed and initial weights set.
    pub base: RunConfig,
    pub models: Vec<ModelKind>,
    pub backends: Vec<Backend>,
    pub seeds: Vec<u64>,
    /// The loss the "steps to threshold" column counts to (smoothed train loss).
    pub threshold: f64,
    /// Train every run again instead of reusing finished (or resuming interrupted) ones: after a
    /// change to the code, whose results a run with the same config would otherwise stand for.
    pub fresh: bool,
}

/// One finished run of the matrix.
#[derive(Debug, Clone, Serialize)]
pub struct RunResult {
    pub model: ModelKind,
    pub backend: Backend,
    pub seed: u64,
    pub summary: Summary,
    /// Train loss per step.
    pub losses: Vec<f64>,
}

/// Everything the report is made of.
#[derive(Debug, Clone, Serialize)]
pub struct StudyResults {
    pub name: String,
    pub seq_len: usize,
    pub threshold: f64,
    pub smoothing: usize,
    pub runs: Vec<RunResult>,
}

impl StudyResults {
    /// The models that have runs, in order.
    pub fn models(&self) -> Vec<ModelKind> {
        let mut models: Vec<ModelKind> = self.runs.iter().map(|r| r.model).collect();
        models.sort();
        models.dedup();
        models
    }

    /// The backends that have runs, in order.
    pub fn backends(&self) -> Vec<Backend> {
        let mut backends: Vec<Backend> = self.runs.iter().map(|r| r.backend).collect();
        backends.sort();
        backends.dedup();
        backends
    }
}

/// Runs (or reuses) every run of the matrix, printing one line per run.
pub fn run_study(study: &StudyConfig, runs_dir: &Path, data_dir: &Path) -> Result<StudyResults> {
    let init_dir = runs_dir.join(format!("{}-init", study.name));
    let mut results = Vec::new();
    let total = study.models.len() * study.backends.len() * study.seeds.len();
    let mut index = 0;
    for &model in &study.models {
        for &seed in &study.seeds {
            let init = initial_weights(study, model, seed, &init_dir)?;
            for &backend in &study.backends {
                index += 1;
                let mut config = study.base.clone();
                config.name = format!("{}-{model}-{backend}-s{seed}", study.name);
                config.backend = backend.to_string();
                config.model.kind = model;
                config.train.seed = seed;
                config.model.init_from = Some(init.clone());
                config.validate().with_context(|| format!("run {}", config.name))?;
                let (summary, reused) = run_or_reuse(&config, runs_dir, data_dir, study.fresh)?;
                println!(
                    "[{index}/{total}] {}: valid {:.5} test {:.5}, {:.0} samples/s, {:.1}s{}",
                    config.name,
                    summary.valid_loss,
                    summary.test_loss,
                    summary.samples_per_second,
                    summary.wall_seconds,
                    if reused { " (reused: finished earlier with this config; --fresh trains it again)" } else { "" }
                );
                let losses = read_losses(&runs_dir.join(&config.name).join("steps.csv"))?;
                results.push(RunResult { model, backend, seed, summary, losses });
            }
        }
    }
    Ok(StudyResults { name: study.name.clone(), seq_len: study.base.task.seq_len, threshold: study.threshold, smoothing: study.base.train.log_every, runs: results })
}

/// The initial weights of one model and seed, drawn once on flex and shared by every backend.
fn initial_weights(study: &StudyConfig, model: ModelKind, seed: u64, dir: &Path) -> Result<PathBuf> {
    let path = dir.join(format!("{model}-s{seed}.safetensors"));
    if path.exists() {
        return Ok(path);
    }
    let mut config = study.base.clone();
    config.model.kind = model;
    let device = Backend::Flex.device(Default::default())?;
    device.seed(seed);
    let weights = config.model_spec().init(&device)?.library_weights();
    TensorFile { tensors: weights, metadata: Default::default() }.write(&path)?;
    Ok(path)
}

/// Unless `fresh`, a finished run with the same config is reused and an interrupted one resumes;
/// anything else starts over. Returns the summary and whether it was reused.
fn run_or_reuse(config: &RunConfig, runs_dir: &Path, data_dir: &Path, fresh: bool) -> Result<(Summary, bool)> {
    let dir = runs_dir.join(&config.name);
    let same_config = !fresh && std::fs::read_to_string(dir.join("config.toml")).is_ok_and(|saved| saved == config.to_toml());
    if same_config && let Ok(text) = std::fs::read_to_string(dir.join("summary.json")) {
        let summary = serde_json::from_str(&text).with_context(|| format!("{}/summary.json", dir.display()))?;
        return Ok((summary, true));
    }
    let options = RunOptions { runs_dir: runs_dir.to_path_buf(), data_dir: data_dir.to_path_buf(), resume: same_config, stop_after: None, progress: false };
    Ok((train(config, &options)?.expect("runs without stop_after finish"), false))
}

fn read_losses(path: &Path) -> Result<Vec<f64>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .skip(1)
        .map(|line| {
            let loss = line.split(',').nth(2).with_context(|| format!("{}: malformed row {line:?}", path.display()))?;
            loss.parse::<f64>().with_context(|| format!("{}: bad loss {loss:?}", path.display()))
        })
        .collect()
}

/// Mean and sample standard deviation.
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = if values.len() > 1 { values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// Running mean over `window` steps (the curve the plots and the threshold use).
pub fn smooth(losses: &[f64], window: usize) -> Vec<f64> {
    let window = window.max(1);
    let mut out = Vec::with_capacity(losses.len());
    let mut sum = 0.0;
    for (i, &loss) in losses.iter().enumerate() {
        sum += loss;
        if i >= window {
            sum -= losses[i - window];
        }
        out.push(sum / (i + 1).min(window) as f64);
    }
    out
}

/// Welch's two-sample t statistic and its Welch-Satterthwaite degrees of freedom.
pub fn welch(a: &[f64], b: &[f64]) -> Option<(f64, f64)> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let ((ma, sa), (mb, sb)) = (mean_std(a), mean_std(b));
    let (va, vb) = (sa * sa / a.len() as f64, sb * sb / b.len() as f64);
    if va + vb == 0.0 {
        return Some((if ma == mb { 0.0 } else { f64::INFINITY }, f64::INFINITY));
    }
    let t = (ma - mb) / (va + vb).sqrt();
    let df = (va + vb).powi(2) / (va * va / (a.len() as f64 - 1.0) + vb * vb / (b.len() as f64 - 1.0));
    Some((t, df))
}

/// Two-sided 95% critical value of Student's t (table for df 1..30, then the normal limit).
pub fn t_critical_95(df: f64) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101,
        2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    if !df.is_finite() || df > 30.0 {
        return 1.960;
    }
    // Rounding df down is conservative (a larger critical value).
    TABLE[(df.floor() as usize).clamp(1, 30) - 1]
}

/// Largest step-by-step difference of one model's loss curve between backends (same init, same
/// batches), over seeds and backend pairs.
pub fn cross_backend_max_diff(results: &StudyResults, model: ModelKind) -> Option<(f64, String)> {
    let mut by_seed: BTreeMap<u64, Vec<&RunResult>> = BTreeMap::new();
    for run in results.runs.iter().filter(|r| r.model == model) {
        by_seed.entry(run.seed).or_default().push(run);
    }
    let mut worst: Option<(f64, String)> = None;
    for runs in by_seed.values() {
        for (i, a) in runs.iter().enumerate() {
            for b in &runs[i + 1..] {
                let diff = a.losses.iter().zip(&b.losses).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
                if worst.as_ref().is_none_or(|(w, _)| diff > *w) {
                    worst = Some((diff, format!("{} vs {}, seed {}", a.backend, b.backend, a.seed)));
                }
            }
        }
    }
    worst
}

/// Writes `reports/<name>/`: `report.md`, `results.json`, `loss_curves.svg` and `.png`.
pub fn write_report(results: &StudyResults, dir: &Path, command: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    write_atomic(&dir.join("results.json"), serde_json::to_string_pretty(results)?.as_bytes())?;
    crate::plot::loss_curves(results, &dir.join("loss_curves.svg"), &dir.join("loss_curves.png"))?;
    let report = crate::report::markdown(results, command);
    let path = dir.join("report.md");
    write_atomic(&path, report.as_bytes())?;
    Ok(path)
}
