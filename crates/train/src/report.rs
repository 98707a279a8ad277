//! The study's `report.md`: the table, the verdict computed from the numbers, and the
//! cross-backend agreement.

use std::fmt::Write;

use model::Backend;

use crate::models::ModelKind;
use crate::study::{RunResult, StudyResults, cross_backend_max_diff, mean_std, smooth, t_critical_95, welch};

/// The runs of one model on one backend.
fn cell(results: &StudyResults, model: ModelKind, backend: Backend) -> Vec<&RunResult> {
    results.runs.iter().filter(|r| r.model == model && r.backend == backend).collect()
}

/// First step (1-based) at which the smoothed train loss is below `threshold`.
pub fn steps_to(losses: &[f64], threshold: f64, window: usize) -> Option<usize> {
    smooth(losses, window).iter().position(|&l| l < threshold).map(|i| i + 1)
}

fn pm(values: &[f64], digits: usize) -> String {
    let (mean, std) = mean_std(values);
    format!("{mean:.digits$} ± {std:.digits$}")
}

/// The markdown report.
pub fn markdown(results: &StudyResults, command: &str) -> String {
    let mut out = String::new();
    let first = &results.runs[0].summary;
    let seeds = results.runs.iter().map(|r| r.seed).collect::<std::collections::BTreeSet<_>>();
    let _ = writeln!(out, "# Study `{}`: Keras-exact vs projected attention, on every backend\n", results.name);
    let _ = writeln!(out, "Made by `{command}`.\n");
    let _ = writeln!(
        out,
        "Task: content-addressed lookup over {}-position sequences (see `cargo xtask train --help`). Every run: {} steps of batch {}, the same data, seeds {:?}; per model and seed the initial weights are shared by all backends. Floors: per-position model {:.4}, Bayes {:.4}. Threshold for \"steps to\": smoothed train loss (running mean over {} steps) < {:.4}.\n",
        results.seq_len,
        first.steps,
        first.batch_size,
        seeds,
        first.per_position_floor,
        first.bayes_floor,
        results.smoothing,
        results.threshold
    );
    let _ = writeln!(out, "| model | parameters | backend | valid loss | test loss | steps to < {:.4} | samples/s | wall s |", results.threshold);
    let _ = writeln!(out, "|---|---:|---|---:|---:|---:|---:|---:|");
    for model in results.models() {
        for backend in results.backends() {
            let runs = cell(results, model, backend);
            if runs.is_empty() {
                continue;
            }
            let field = |f: fn(&RunResult) -> f64| runs.iter().map(|r| f(r)).collect::<Vec<_>>();
            let reached: Vec<f64> = runs.iter().filter_map(|r| steps_to(&r.losses, results.threshold, results.smoothing)).map(|s| s as f64).collect();
            let steps = match reached.len() {
                0 => "not reached".to_string(),
                n if n == runs.len() => pm(&reached, 0),
                n => format!("{} ({n}/{} seeds)", pm(&reached, 0), runs.len()),
            };
            let _ = writeln!(
                out,
                "| {model} | {} | {backend} | {} | {} | {steps} | {:.0} | {:.1} |",
                runs[0].summary.parameters,
                pm(&field(|r| r.summary.valid_loss), 5),
                pm(&field(|r| r.summary.test_loss), 5),
                mean_std(&field(|r| r.summary.samples_per_second)).0,
                mean_std(&field(|r| r.summary.wall_seconds)).0,
            );
        }
    }
    let _ = writeln!(out, "\nValues are mean ± sample standard deviation over seeds.\n");
    let _ = writeln!(out, "## Verdict\n");
    for line in verdict(results) {
        let _ = writeln!(out, "- {line}");
    }
    let _ = writeln!(out, "\n## Cross-backend agreement\n");
    let _ = writeln!(out, "Same initial weights and batches on every backend; the largest difference of the per-step train loss between any two backends, over all steps and seeds.\n");
    let _ = writeln!(out, "| model | max \\|Δ loss\\| | where |");
    let _ = writeln!(out, "|---|---:|---|");
    for model in results.models() {
        match cross_backend_max_diff(results, model) {
            Some((diff, place)) => {
                let _ = writeln!(out, "| {model} | {diff:.2e} | {place} |");
            }
            None => {
                let _ = writeln!(out, "| {model} | n/a | one backend only |");
            }
        }
    }
    let _ = writeln!(out, "\n![loss curves](loss_curves.png)");
    out
}

/// The verdict lines, each computed from the table's numbers.
pub fn verdict(results: &StudyResults) -> Vec<String> {
    let mut lines = Vec::new();
    let test_losses = |model, backend| cell(results, model, backend).iter().map(|r| r.summary.test_loss).collect::<Vec<_>>();
    for backend in results.backends() {
        let keras = test_losses(ModelKind::Keras, backend);
        let projected = test_losses(ModelKind::Projected, backend);
        if keras.is_empty() || projected.is_empty() {
            continue;
        }
        let (mk, mp) = (mean_std(&keras).0, mean_std(&projected).0);
        let mut line = format!("{backend}: test loss keras {mk:.5} vs projected {mp:.5} (difference {:+.5}); ", mk - mp);
        match welch(&keras, &projected) {
            Some((t, df)) => {
                let critical = t_critical_95(df);
                let same = t.abs() <= critical;
                let _ = write!(
                    line,
                    "Welch's t = {t:.2} (df {df:.1}), 95% critical value {critical:.2}: {}",
                    if same { "the difference is within the seed-to-seed spread (train equally well)" } else { "the difference is larger than the seed-to-seed spread" }
                );
            }
            None => line.push_str("one seed only: no spread to compare against"),
        }
        lines.push(line);
        let baseline = test_losses(ModelKind::Baseline, backend);
        if !baseline.is_empty() {
            let mb = mean_std(&baseline).0;
            lines.push(format!(
                "{backend}: the per-position baseline reaches {mb:.5}; attention is {:.1}x (keras) and {:.1}x (projected) lower",
                mb / mk,
                mb / mp
            ));
        }
    }
    lines
}
