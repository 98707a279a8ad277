//! The study's design: the ladder of tasks ([`Rung`]), the models ([`Variant`]), the conditions
//! of each rung, and the [`StudyConfig`] with its planned runs and each run's config.

use std::path::Path;

use anyhow::{Context, Result, bail};
use model::Backend;
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::models::ModelKind;
use crate::task::Teacher;

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

    /// Sets the model of `config` to this variant.
    pub(super) fn configure(self, config: &mut RunConfig) {
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
    pub(super) fn check(&self) -> Result<()> {
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
    pub(super) fn run_config(&self, run: &PlannedRun, init: &Path) -> Result<RunConfig> {
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
