//! The study's design, runs, statistics and report writing (to be split by concern).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use model::weights::write_atomic;
use model::{Backend, TensorFile};
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::models::ModelKind;
use crate::run::{RunOptions, Summary, train};
use crate::task::{Teacher, per_position_floor};

/// One task of the ladder: a teacher and how sharp and noisy it is.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rung {
    pub name: String,
    pub description: String,
    pub teacher: Teacher,
    pub beta: f64,
    pub noise_std: f64,
}

/// The default ladder, easiest first: the project's lookup task, then rungs that need more of
/// the layer.
pub fn ladder() -> Vec<Rung> {
    let rung = |name: &str, description: &str, teacher, beta, noise_std| Rung {
        name: name.into(),
        description: description.into(),
        teacher,
        beta,
        noise_std,
    };
    vec![
        rung(
            "lookup",
            "two content lookups, beta 3 (the project's task; one layer with two heads represents it)",
            Teacher::Lookup,
            3.0,
            0.1,
        ),
        rung(
            "sharp",
            "the same lookups at beta 8: near-argmax attention, steeper and flatter regions of the loss",
            Teacher::Lookup,
            8.0,
            0.1,
        ),
        rung(
            "noisy",
            "the same lookups under target noise 0.5: 25x less signal per position",
            Teacher::Lookup,
            3.0,
            0.5,
        ),
        rung(
            "four_heads",
            "four lookups, one per target, each reading features the others use as queries, keys and values: the heads interfere",
            Teacher::FourHeads,
            3.0,
            0.1,
        ),
        rung(
            "two_hop",
            "a lookup whose query is another lookup's answer: one attention layer cannot represent it",
            Teacher::TwoHop,
            3.0,
            0.1,
        ),
    ]
}

/// A model of the study.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Variant {
    /// The Keras-exact `MultiHeadAttention(h, k)` of the base config.
    Keras,
    /// The popular port `Linear + nn.MultiheadAttention + Linear`.
    Projected,
    /// The positive control: the Keras layer with one head, which the two-lookup teachers need
    /// two of.
    OneHead,
}

impl Variant {
    pub const ALL: [Variant; 3] = [Variant::Keras, Variant::Projected, Variant::OneHead];

    pub fn name(self) -> &'static str {
        match self {
            Variant::Keras => "keras",
            Variant::Projected => "projected",
            Variant::OneHead => "keras_1head",
        }
    }

    fn configure(self, config: &mut RunConfig) {
        config.model.kind = match self {
            Variant::Keras | Variant::OneHead => ModelKind::Keras,
            Variant::Projected => ModelKind::Projected,
        };
        if self == Variant::OneHead {
            config.model.num_heads = 1;
        }
    }
}

impl std::fmt::Display for Variant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where on a rung a run trains: its learning rate and training-set size.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Condition {
    pub rung: String,
    pub learning_rate: f64,
    pub train_size: usize,
}

/// What to run.
#[derive(Debug, Clone)]
pub struct StudyConfig {
    /// Report folder name: `reports/<name>/`; runs are `runs/<name>-<rung>-lr<lr>-n<size>-<variant>-<backend>-s<seed>/`.
    pub name: String,
    /// Every run is this config with the rung, condition, variant, backend, seed and initial
    /// weights set; its learning rate and training-set size are the base condition.
    pub base: RunConfig,
    pub rungs: Vec<Rung>,
    /// Swept at the base training-set size.
    pub learning_rates: Vec<f64>,
    /// Swept at the base learning rate.
    pub train_sizes: Vec<usize>,
    /// Optimizer steps of every run (the epochs follow from the training-set size).
    pub steps: usize,
    pub seeds: Vec<u64>,
    /// Backends that run every condition.
    pub backends: Vec<Backend>,
    /// Backends that run the subset: `subset_rungs` at the base condition, `subset_seeds`, the
    /// two compared variants.
    pub subset_backends: Vec<Backend>,
    pub subset_rungs: Vec<String>,
    pub subset_seeds: Vec<u64>,
    /// Train every run again instead of reusing finished (or resuming interrupted) ones: after a
    /// change to the code, whose results a run with the same config would otherwise stand for.
    pub fresh: bool,
}

/// One run of the plan.
#[derive(Debug, Clone)]
pub struct PlannedRun {
    pub condition: Condition,
    pub variant: Variant,
    pub backend: Backend,
    pub seed: u64,
}

impl StudyConfig {
    /// The default study (`cargo xtask compare`): every rung of the [`ladder`], learning rates
    /// 3e-3 to 3e-1 (two decades) at 4096 sequences, 256 to 4096 sequences at 1e-2, 128 steps of
    /// batch 32 each (one epoch of the largest set, sixteen of the smallest), five seeds, on
    /// `backends`; the lookup and two-hop rungs' base condition with seed 1 on
    /// `subset_backends`. `base` is `configs/default.toml` or the user's config.
    pub fn standard(name: &str, base: RunConfig, backends: Vec<Backend>, subset_backends: Vec<Backend>) -> Self {
        Self {
            name: name.into(),
            base,
            rungs: ladder(),
            learning_rates: vec![3e-3, 1e-2, 3e-2, 1e-1, 3e-1],
            train_sizes: vec![256, 1024, 4096],
            steps: 128,
            seeds: (1..=5).collect(),
            backends,
            subset_backends,
            subset_rungs: vec!["lookup".into(), "two_hop".into()],
            subset_seeds: vec![1],
            fresh: false,
        }
    }

    /// The reduced study of `--quick` and CI, on `configs/tiny.toml` (16 positions, batches of
    /// 8): every rung, three learning rates, two training-set sizes, 16 steps, two seeds.
    pub fn quick(name: &str, base: RunConfig, backends: Vec<Backend>, subset_backends: Vec<Backend>) -> Self {
        Self {
            learning_rates: vec![3e-3, 1e-2, 3e-2],
            train_sizes: vec![32, 64],
            steps: 16,
            seeds: vec![1, 2],
            subset_rungs: vec!["lookup".into()],
            ..Self::standard(name, base, backends, subset_backends)
        }
    }

    /// The base condition of a rung.
    pub fn base_condition(&self, rung: &str) -> Condition {
        Condition {
            rung: rung.into(),
            learning_rate: self.base.train.learning_rate,
            train_size: self.base.task.train_size,
        }
    }

    /// Every condition: per rung, the learning-rate sweep, then the data-size sweep (the base
    /// condition once).
    pub fn conditions(&self) -> Vec<Condition> {
        let mut conditions = Vec::new();
        for rung in &self.rungs {
            let base = self.base_condition(&rung.name);
            let sweep_lr = self.learning_rates.iter().map(|&learning_rate| Condition { learning_rate, ..base.clone() });
            let sweep_size = self.train_sizes.iter().map(|&train_size| Condition { train_size, ..base.clone() });
            for condition in sweep_lr.chain(sweep_size).chain([base.clone()]) {
                if !conditions.contains(&condition) {
                    conditions.push(condition);
                }
            }
        }
        conditions
    }

    /// Every run, in the order they are trained: the subset last, since a wgpu device's threads
    /// stay busy after its runs and would slow the CPU backends' runs that follow.
    pub fn plan(&self) -> Vec<PlannedRun> {
        let (mut plan, mut subset) = (Vec::new(), Vec::new());
        for condition in self.conditions() {
            let is_base = condition == self.base_condition(&condition.rung);
            for variant in Variant::ALL {
                if variant == Variant::OneHead && !is_base {
                    continue;
                }
                for &seed in &self.seeds {
                    for &backend in &self.backends {
                        plan.push(PlannedRun { condition: condition.clone(), variant, backend, seed });
                    }
                }
            }
            if is_base && self.subset_rungs.contains(&condition.rung) {
                for variant in [Variant::Keras, Variant::Projected] {
                    for &seed in &self.subset_seeds {
                        for &backend in &self.subset_backends {
                            subset.push(PlannedRun { condition: condition.clone(), variant, backend, seed });
                        }
                    }
                }
            }
        }
        plan.extend(subset);
        plan
    }

    fn rung(&self, name: &str) -> &Rung {
        self.rungs.iter().find(|r| r.name == name).expect("conditions name the study's rungs")
    }

    /// Epochs of a run on `train_size` sequences: the study's steps in whole epochs of whole
    /// batches, or an error that names the size.
    fn epochs(&self, train_size: usize) -> Result<usize> {
        let batch = self.base.train.batch_size;
        let steps_per_epoch = train_size / batch;
        if steps_per_epoch == 0 || !train_size.is_multiple_of(batch) || !self.steps.is_multiple_of(steps_per_epoch) {
            bail!(
                "training-set size {train_size}: the study's {} steps must be whole epochs of whole batches of {batch} (sizes {batch}, {}, ... that divide {})",
                self.steps,
                2 * batch,
                self.steps * batch
            );
        }
        Ok(self.steps / steps_per_epoch)
    }

    /// Errors before anything trains: an empty sweep, or a size that does not fit the steps.
    fn check(&self) -> Result<()> {
        if self.rungs.is_empty()
            || self.seeds.is_empty()
            || self.backends.is_empty()
            || self.learning_rates.is_empty()
            || self.steps == 0
        {
            bail!(
                "study {}: it needs at least one rung, seed, backend and learning rate, and a positive number of steps",
                self.name
            );
        }
        for condition in self.conditions() {
            self.epochs(condition.train_size)?;
        }
        Ok(())
    }

    /// The run config of one planned run.
    fn run_config(&self, run: &PlannedRun, init: &Path) -> Result<RunConfig> {
        let rung = self.rung(&run.condition.rung);
        let mut config = self.base.clone();
        config.name = format!(
            "{}-{}-lr{:e}-n{}-{}-{}-s{}",
            self.name,
            rung.name,
            run.condition.learning_rate,
            run.condition.train_size,
            run.variant,
            run.backend,
            run.seed
        );
        config.backend = run.backend.to_string();
        run.variant.configure(&mut config);
        config.task.teacher = rung.teacher;
        config.task.beta = rung.beta;
        config.task.noise_std = rung.noise_std;
        config.task.train_size = run.condition.train_size;
        config.train.learning_rate = run.condition.learning_rate;
        config.train.seed = run.seed;
        config.train.epochs = self.epochs(run.condition.train_size)?;
        config.model.init_from = Some(init.to_path_buf());
        config.validate().with_context(|| format!("run {}", config.name))?;
        Ok(config)
    }
}

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
            let task = crate::task::TaskConfig {
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

/// A difference of means `a - b` with its 95% confidence interval (Welch).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Difference {
    pub estimate: f64,
    /// Half-width of the 95% interval: `t_{0.975, df} * SE`.
    pub half_width: f64,
}

impl Difference {
    /// Welch's interval for `mean(a) - mean(b)`; `None` with fewer than two values on a side.
    pub fn welch(a: &[f64], b: &[f64]) -> Option<Self> {
        if a.len() < 2 || b.len() < 2 {
            return None;
        }
        let ((ma, sa), (mb, sb)) = (mean_std(a), mean_std(b));
        let (va, vb) = (sa * sa / a.len() as f64, sb * sb / b.len() as f64);
        if va + vb == 0.0 {
            return Some(Self { estimate: ma - mb, half_width: 0.0 });
        }
        let df = (va + vb).powi(2) / (va * va / (a.len() as f64 - 1.0) + vb * vb / (b.len() as f64 - 1.0));
        Some(Self { estimate: ma - mb, half_width: t_critical_95(df) * (va + vb).sqrt() })
    }

    /// The interval excludes 0.
    pub fn significant(&self) -> bool {
        self.estimate.abs() > self.half_width
    }
}

/// Two-sided 95% critical value of Student's t (table for df 1..30, then the normal limit).
pub fn t_critical_95(df: f64) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    if !df.is_finite() || df > 30.0 {
        return 1.960;
    }
    // Rounding df down is conservative (a larger critical value).
    TABLE[(df.floor() as usize).clamp(1, 30) - 1]
}

/// Largest step-by-step difference of the train loss between two backends' runs of the same
/// variant, condition and seed (same initial weights, same batches), over every such pair whose
/// runs are `stable` (neither [blew up](RunResult::blew_up)) or not: a run that blows up is
/// chaotic, and float rounding differences between backends grow without bound in it.
pub fn cross_backend_max_diff(
    results: &StudyResults,
    variant: Variant,
    pair: (Backend, Backend),
    stable: bool,
) -> Option<(f64, String)> {
    let mut by_run: BTreeMap<String, Vec<&RunResult>> = BTreeMap::new();
    for run in results.runs.iter().filter(|r| r.variant == variant && !r.diverged()) {
        let key = format!(
            "{} lr {:e} n {} seed {}",
            run.condition.rung, run.condition.learning_rate, run.condition.train_size, run.seed
        );
        by_run.entry(key).or_default().push(run);
    }
    let mut worst: Option<(f64, String)> = None;
    for (key, runs) in &by_run {
        let find = |backend| runs.iter().find(|r| r.backend == backend);
        let (Some(a), Some(b)) = (find(pair.0), find(pair.1)) else { continue };
        if stable == (a.blew_up() || b.blew_up()) {
            continue;
        }
        let diff = a.losses.iter().zip(&b.losses).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
        if worst.as_ref().is_none_or(|(w, _)| diff > *w) {
            worst = Some((diff, key.clone()));
        }
    }
    worst
}

/// Writes `reports/<name>/`: `report.md`, `results.json`, the loss curves per rung and the two
/// heat maps (SVG and PNG).
pub fn write_report(results: &StudyResults, dir: &Path, command: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    write_atomic(&dir.join("results.json"), serde_json::to_string_pretty(results)?.as_bytes())?;
    super::plot::loss_curves(results, &dir.join("loss_curves.svg"), &dir.join("loss_curves.png"))?;
    super::plot::heat_maps(results, dir)?;
    let report = super::report::markdown(results, command);
    let path = dir.join("report.md");
    write_atomic(&path, report.as_bytes())?;
    Ok(path)
}
