//! What the report and the figures read from the results: the primary backend, the seeds of one
//! variant at one condition ([`Cell`]), the compared pair's difference, the conditions that ran,
//! and the agreement of the loss curves between backends.

use std::collections::BTreeMap;

use model::Backend;

use super::design::{Condition, Variant};
use super::runner::{RunResult, StudyResults};
use super::stats::{Difference, curve_area, mean_std};

/// The backend whose runs the verdicts are computed on: flex when it ran everything.
pub fn primary_backend(results: &StudyResults) -> Backend {
    let backends = results.backends();
    if backends.contains(&Backend::Flex) { Backend::Flex } else { backends[0] }
}

/// One variant at one condition: its finished (not diverged) runs and how many diverged.
pub struct Cell<'a> {
    pub finished: Vec<&'a RunResult>,
    pub diverged: usize,
    /// Seeds that [blew up](RunResult::blew_up), diverged ones included.
    pub blew_up: usize,
}

impl<'a> Cell<'a> {
    pub fn of(results: &'a StudyResults, condition: &Condition, variant: Variant, backend: Backend) -> Self {
        let runs = results.cell(condition, variant, backend);
        let diverged = runs.iter().filter(|r| r.diverged()).count();
        let blew_up = runs.iter().filter(|r| r.blew_up()).count();
        Self { finished: runs.into_iter().filter(|r| !r.diverged()).collect(), diverged, blew_up }
    }

    pub fn seeds(&self) -> usize {
        self.finished.len() + self.diverged
    }

    pub fn test_losses(&self) -> Vec<f64> {
        self.finished.iter().map(|r| r.summary.test_loss).collect()
    }

    pub fn areas(&self, window: usize) -> Vec<f64> {
        self.finished.iter().map(|r| curve_area(&r.losses, window)).collect()
    }

    /// Mean test loss, `None` when every seed diverged.
    pub fn mean_test(&self) -> Option<f64> {
        (!self.finished.is_empty()).then(|| mean_std(&self.test_losses()).0)
    }

    /// Every seed finished and beat the per-position floor: the model trains here.
    pub fn trains(&self, per_position_floor: f64) -> bool {
        self.diverged == 0 && !self.finished.is_empty() && self.test_losses().iter().all(|&l| l < per_position_floor)
    }
}

/// The compared pair's difference in test loss (keras - projected) at a condition.
pub fn pair_difference(results: &StudyResults, condition: &Condition, backend: Backend) -> Option<Difference> {
    let keras = Cell::of(results, condition, Variant::Keras, backend);
    let projected = Cell::of(results, condition, Variant::Projected, backend);
    Difference::welch(&keras.test_losses(), &projected.test_losses())
}

/// Every condition with runs on the primary backend, in the study's order.
pub fn conditions(results: &StudyResults) -> Vec<Condition> {
    let backend = primary_backend(results);
    let mut conditions: Vec<Condition> = Vec::new();
    for run in results.runs.iter().filter(|r| r.backend == backend && r.variant == Variant::Keras) {
        if !conditions.contains(&run.condition) {
            conditions.push(run.condition.clone());
        }
    }
    conditions
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
