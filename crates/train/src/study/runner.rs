//! Running the study: every planned run trained or reused, from initial weights drawn once per
//! variant and seed, its losses read back, and the results types the report is made of
//! ([`RunResult`], [`RungFloors`], [`StudyResults`]).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result};
use model::{Backend, TensorFile};
use serde::{Deserialize, Serialize};

use super::design::{Condition, Rung, StudyConfig, Variant};
use crate::config::RunConfig;
use crate::run::{RunOptions, Summary, train};
use crate::task::{TaskConfig, per_position_floor};

/// One finished run.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub condition: Condition,
    pub variant: Variant,
    pub backend: Backend,
    pub seed: u64,
    pub summary: Summary,
    /// Train loss per step (shorter than the budget when the run diverged).
    pub losses: Vec<f64>,
}

impl RunResult {
    /// The loss stopped being finite: the run ended there, with no test loss.
    pub fn diverged(&self) -> bool {
        self.summary.diverged_at_step.is_some() || !self.summary.test_loss.is_finite()
    }

    /// The run diverged, or its train loss rose above [`BLOW_UP`] times its first step's at
    /// some step: it left the basin it started in, even if it came back.
    pub fn blew_up(&self) -> bool {
        let first = self.losses.first().copied().unwrap_or(f64::NAN);
        self.diverged() || self.losses.iter().any(|&l| !l.is_finite() || l > BLOW_UP * first)
    }
}

/// A train loss this many times the first step's is a blow-up.
pub const BLOW_UP: f64 = 10.0;

/// A rung with its floors, as the report states them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RungFloors {
    pub rung: Rung,
    /// Best loss of a model that sees one position at a time (Monte Carlo).
    pub per_position_floor: f64,
    /// The noise: `noise_std^2`.
    pub bayes_floor: f64,
    /// "Steps to threshold" counts to this smoothed train loss: a quarter of the way from the
    /// Bayes floor to the per-position floor.
    pub threshold: f64,
}

/// Everything the report is made of.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StudyResults {
    pub name: String,
    pub seq_len: usize,
    pub steps: usize,
    pub batch_size: usize,
    /// Running-mean window of the plotted and thresholded train loss.
    pub smoothing: usize,
    pub base_learning_rate: f64,
    pub base_train_size: usize,
    /// Heads of the Keras and projected models (the control has one).
    pub num_heads: usize,
    pub learning_rates: Vec<f64>,
    pub train_sizes: Vec<usize>,
    pub rungs: Vec<RungFloors>,
    /// Seconds the study's runs trained (reused runs count their recorded time).
    pub training_seconds: f64,
    pub runs: Vec<RunResult>,
}

impl StudyResults {
    /// The runs of one variant at one condition on one backend.
    pub fn cell(&self, condition: &Condition, variant: Variant, backend: Backend) -> Vec<&RunResult> {
        self.runs.iter().filter(|r| &r.condition == condition && r.variant == variant && r.backend == backend).collect()
    }

    /// The backends that have runs, in order.
    pub fn backends(&self) -> Vec<Backend> {
        let mut backends: Vec<Backend> = self.runs.iter().map(|r| r.backend).collect();
        backends.sort();
        backends.dedup();
        backends
    }

    pub fn floors(&self, rung: &str) -> &RungFloors {
        self.rungs.iter().find(|r| r.rung.name == rung).expect("every run's rung has floors")
    }

    pub fn base_condition(&self, rung: &str) -> Condition {
        Condition { rung: rung.into(), learning_rate: self.base_learning_rate, train_size: self.base_train_size }
    }
}

/// Runs (or reuses) every run of the plan, printing one line per run with the time left.
pub fn run_study(study: &StudyConfig, runs_dir: &Path, data_dir: &Path) -> Result<StudyResults> {
    study.check()?;
    let init_dir = runs_dir.join(format!("{}-init", study.name));
    let plan = study.plan();
    let started = Instant::now();
    let mut results = Vec::new();
    let (mut trained, mut trained_seconds) = (0usize, 0.0f64);
    for (index, run) in plan.iter().enumerate() {
        let init = initial_weights(study, run.variant, run.seed, &init_dir)?;
        let config = study.run_config(run, &init)?;
        let (summary, reused) = run_or_reuse(&config, runs_dir, data_dir, study.fresh)?;
        if !reused {
            trained += 1;
            trained_seconds = started.elapsed().as_secs_f64();
        }
        let left = plan.len() - index - 1;
        let eta = if trained > 0 { trained_seconds / trained as f64 * left as f64 } else { 0.0 };
        let outcome = match summary.diverged_at_step {
            Some(step) => format!("diverged at step {step}"),
            None => format!("test {:.5}", summary.test_loss),
        };
        println!(
            "[{}/{}] {}: {outcome}, {:.1}s{} (about {:.0} min left)",
            index + 1,
            plan.len(),
            config.name,
            summary.wall_seconds,
            if reused { " (reused)" } else { "" },
            eta / 60.0
        );
        let losses = read_losses(&runs_dir.join(&config.name).join("steps.csv"))?;
        results.push(RunResult {
            condition: run.condition.clone(),
            variant: run.variant,
            backend: run.backend,
            seed: run.seed,
            summary,
            losses,
        });
    }
    let rungs = study
        .rungs
        .iter()
        .map(|rung| {
            let task = TaskConfig {
                teacher: rung.teacher,
                beta: rung.beta,
                noise_std: rung.noise_std,
                ..study.base.task.clone()
            };
            let per_position = per_position_floor(&task, 256, 256);
            let bayes = rung.noise_std.powi(2);
            RungFloors {
                rung: rung.clone(),
                per_position_floor: per_position,
                bayes_floor: bayes,
                threshold: bayes + 0.25 * (per_position - bayes),
            }
        })
        .collect();
    Ok(StudyResults {
        name: study.name.clone(),
        seq_len: study.base.task.seq_len,
        steps: study.steps,
        batch_size: study.base.train.batch_size,
        smoothing: study.base.train.log_every,
        base_learning_rate: study.base.train.learning_rate,
        base_train_size: study.base.task.train_size,
        num_heads: study.base.model.num_heads,
        learning_rates: study.learning_rates.clone(),
        train_sizes: study.train_sizes.clone(),
        rungs,
        training_seconds: results.iter().map(|r| r.summary.wall_seconds).sum(),
        runs: results,
    })
}

/// The initial weights of one variant and seed, drawn once on flex and shared by every
/// condition and backend.
fn initial_weights(study: &StudyConfig, variant: Variant, seed: u64, dir: &Path) -> Result<PathBuf> {
    let path = dir.join(format!("{variant}-s{seed}.safetensors"));
    if path.exists() {
        return Ok(path);
    }
    let mut config = study.base.clone();
    variant.configure(&mut config);
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
    let same_config =
        !fresh && std::fs::read_to_string(dir.join("config.toml")).is_ok_and(|saved| saved == config.to_toml());
    if same_config && let Ok(text) = std::fs::read_to_string(dir.join("summary.json")) {
        let summary = serde_json::from_str(&text).with_context(|| format!("{}/summary.json", dir.display()))?;
        return Ok((summary, true));
    }
    let options = RunOptions {
        runs_dir: runs_dir.to_path_buf(),
        data_dir: data_dir.to_path_buf(),
        resume: same_config,
        stop_after: None,
        progress: false,
        stop_on_divergence: true,
    };
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
