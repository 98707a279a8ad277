//! The study's `report.md`: the ladder with its floors, a verdict per condition with its 95%
//! interval, the learning-rate picture per rung, the positive control, the study's power, and the
//! cross-backend agreement. Every sentence is computed from the runs. [`write_report`] writes it
//! with `results.json` and the figures.

use std::fmt::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use model::Backend;
use model::weights::write_atomic;

use super::analysis::{Cell, conditions, cross_backend_max_diff, pair_difference, primary_backend};
use super::design::{Condition, Variant};
use super::plot;
use super::runner::{BLOW_UP, StudyResults};
use super::stats::{Difference, mean_std, steps_to};

/// Writes `reports/<name>/`: `report.md`, `results.json`, the loss curves per rung and the two
/// heat maps (SVG and PNG).
pub fn write_report(results: &StudyResults, dir: &Path, command: &str) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    write_atomic(&dir.join("results.json"), serde_json::to_string_pretty(results)?.as_bytes())?;
    plot::loss_curves(results, &dir.join("loss_curves.svg"), &dir.join("loss_curves.png"))?;
    plot::heat_maps(results, dir)?;
    let report = markdown(results, command);
    let path = dir.join("report.md");
    write_atomic(&path, report.as_bytes())?;
    Ok(path)
}

fn pm(values: &[f64]) -> String {
    match values.len() {
        0 => "—".into(),
        _ => {
            let (mean, std) = mean_std(values);
            format!("{} ± {}", sig(mean), sig(std))
        }
    }
}

/// Four significant digits, fixed-point where it reads well.
fn sig(v: f64) -> String {
    if v == 0.0 || (1e-3..1e4).contains(&v.abs()) {
        format!("{v:.4}").trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        format!("{v:.3e}")
    }
}

fn interval(d: &Difference) -> String {
    format!("{:+.5} [{:+.5}, {:+.5}]", d.estimate, d.estimate - d.half_width, d.estimate + d.half_width)
}

/// The verdict of one condition for the pair.
pub fn verdict_of(difference: Option<Difference>, keras: &Cell, projected: &Cell) -> String {
    match difference {
        _ if keras.diverged > 0 || projected.diverged > 0 => {
            format!(
                "diverged (keras {}/{}, projected {}/{} seeds)",
                keras.diverged,
                keras.seeds(),
                projected.diverged,
                projected.seeds()
            )
        }
        None => "too few seeds".into(),
        Some(d) if !d.significant() => format!("equal (within ±{:.5})", d.half_width),
        Some(d) if d.estimate < 0.0 => format!("**keras lower** by {:.5}", -d.estimate),
        Some(d) => format!("**projected lower** by {:.5}", d.estimate),
    }
}

fn lr(v: f64) -> String {
    format!("{v:e}")
}

/// The markdown report.
pub fn markdown(results: &StudyResults, command: &str) -> String {
    let mut out = String::new();
    let backend = primary_backend(results);
    let window = results.smoothing;
    let seeds: std::collections::BTreeSet<u64> =
        results.runs.iter().filter(|r| r.backend == backend).map(|r| r.seed).collect();
    let _ = writeln!(out, "# Study `{}`: Keras-exact vs projected attention on a ladder of tasks\n", results.name);
    let _ = writeln!(out, "Made by `{command}`.\n");
    let _ = writeln!(
        out,
        "Every run: {} optimizer steps of batch {} on {}-position sequences (the epochs follow from the training-set size), seeds {seeds:?}; per model and seed the initial weights are shared by every condition and backend. Learning rates {} at {} training sequences; training-set sizes {} at learning rate {}. {} runs, {:.1} minutes of training in all.\n",
        results.steps,
        results.batch_size,
        results.seq_len,
        results.learning_rates.iter().map(|&v| lr(v)).collect::<Vec<_>>().join(", "),
        results.base_train_size,
        results.train_sizes.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", "),
        lr(results.base_learning_rate),
        results.runs.len(),
        results.training_seconds / 60.0
    );

    let _ = writeln!(out, "## The ladder\n");
    let _ = writeln!(
        out,
        "At the base condition, on {backend}; \"steps to\" counts to the rung's threshold (a quarter of the way from the Bayes floor to the per-position floor) in the running mean over {window} steps.\n"
    );
    let _ = writeln!(
        out,
        "| rung | task | per-position floor | Bayes floor | keras test | projected test | keras_1head test | steps to threshold (keras / projected) |"
    );
    let _ = writeln!(out, "|---|---|---:|---:|---:|---:|---:|---:|");
    for floors in &results.rungs {
        let base = results.base_condition(&floors.rung.name);
        let cells: Vec<Cell> = Variant::ALL.iter().map(|&v| Cell::of(results, &base, v, backend)).collect();
        let steps = |cell: &Cell| {
            let reached: Vec<f64> = cell
                .finished
                .iter()
                .filter_map(|r| steps_to(&r.losses, floors.threshold, window))
                .map(|s| s as f64)
                .collect();
            match reached.len() {
                0 => "not reached".to_string(),
                n if n == cell.seeds() => format!("{:.0}", mean_std(&reached).0),
                n => format!("{:.0} ({n}/{})", mean_std(&reached).0, cell.seeds()),
            }
        };
        let _ = writeln!(
            out,
            "| {} | {} | {:.4} | {:.4} | {} | {} | {} | {} / {} |",
            floors.rung.name,
            floors.rung.description,
            floors.per_position_floor,
            floors.bayes_floor,
            pm(&cells[0].test_losses()),
            pm(&cells[1].test_losses()),
            pm(&cells[2].test_losses()),
            steps(&cells[0]),
            steps(&cells[1])
        );
    }

    let _ = writeln!(out, "\n## Verdict per condition\n");
    let _ = writeln!(
        out,
        "Test loss, mean ± sd over seeds, on {backend}; the difference keras - projected with its 95% Welch interval, and the same for the area under the training curve (mean smoothed train loss over the run). A condition where a seed diverged has no interval.\n"
    );
    let _ = writeln!(
        out,
        "| rung | lr | train size | keras test | projected test | keras - projected [95% CI] | verdict | curve area keras - projected [95% CI] |"
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---|---:|");
    let conditions = conditions(results);
    let (mut equal, mut keras_better, mut projected_better, mut diverged) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut half_widths = Vec::new();
    for condition in &conditions {
        let keras = Cell::of(results, condition, Variant::Keras, backend);
        let projected = Cell::of(results, condition, Variant::Projected, backend);
        let difference = pair_difference(results, condition, backend);
        let verdict = verdict_of(difference, &keras, &projected);
        let area = Difference::welch(&keras.areas(window), &projected.areas(window));
        let place = format!("{} lr {} n {}", condition.rung, lr(condition.learning_rate), condition.train_size);
        match difference {
            _ if keras.diverged + projected.diverged > 0 => diverged.push(place),
            Some(d) if !d.significant() => {
                half_widths.push((d.half_width, mean_std(&[keras.test_losses(), projected.test_losses()].concat()).0));
                equal.push(place)
            }
            Some(d) if d.estimate < 0.0 => keras_better.push(format!(
                "{place} (by {:.5}, {:.1}%)",
                -d.estimate,
                -100.0 * d.estimate / projected.mean_test().unwrap_or(1.0)
            )),
            Some(d) => projected_better.push(format!(
                "{place} (by {:.5}, {:.1}%)",
                d.estimate,
                100.0 * d.estimate / keras.mean_test().unwrap_or(1.0)
            )),
            None => {}
        }
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {verdict} | {} |",
            condition.rung,
            lr(condition.learning_rate),
            condition.train_size,
            pm(&keras.test_losses()),
            pm(&projected.test_losses()),
            difference.map(|d| interval(&d)).unwrap_or_else(|| "—".into()),
            area.map(|d| interval(&d)).unwrap_or_else(|| "—".into()),
        );
    }

    let _ = writeln!(out, "\n## Learning rates per rung\n");
    let _ = writeln!(
        out,
        "\"Trains\": every seed finished and beat the per-position floor. The blow-up point is the smallest learning rate at which a seed's train loss rose above {BLOW_UP}x its first step's or stopped being finite (diverged).\n"
    );
    let _ = writeln!(out, "| rung | model | best lr (test loss) | learning rates that train | blow-up point |");
    let _ = writeln!(out, "|---|---|---:|---|---:|");
    let mut best_lrs = Vec::new();
    for floors in &results.rungs {
        let mut best_of = Vec::new();
        for variant in [Variant::Keras, Variant::Projected] {
            let sweep = lr_sweep(results, &floors.rung.name, variant, backend);
            let best = sweep
                .iter()
                .filter(|(_, c)| c.diverged == 0)
                .filter_map(|(l, c)| c.mean_test().map(|m| (*l, m)))
                .min_by(|a, b| a.1.total_cmp(&b.1));
            let training: Vec<String> =
                sweep.iter().filter(|(_, c)| c.trains(floors.per_position_floor)).map(|(l, _)| lr(*l)).collect();
            let blow_up = sweep.iter().find(|(_, c)| c.blew_up > 0).map(|(l, c)| {
                let diverged = if c.diverged > 0 { format!(", {} diverged", c.diverged) } else { String::new() };
                format!("{} ({}/{} seeds{diverged})", lr(*l), c.blew_up, c.seeds())
            });
            let _ = writeln!(
                out,
                "| {} | {variant} | {} | {} | {} |",
                floors.rung.name,
                best.map(|(l, m)| format!("{} ({m:.5})", lr(l))).unwrap_or_else(|| "—".into()),
                if training.is_empty() { "none".into() } else { training.join(", ") },
                blow_up.unwrap_or_else(|| format!(
                    "none up to {}",
                    lr(results.learning_rates.iter().copied().fold(0.0, f64::max))
                ))
            );
            best_of.push(best.map(|(l, _)| l));
        }
        best_lrs.push((floors, best_of[0], best_of[1]));
    }

    let _ = writeln!(out, "\n## At each model's own best learning rate\n");
    let _ = writeln!(
        out,
        "Each model at the learning rate of its lowest mean test loss (from the table above), {} training sequences: the comparison a user who tunes the learning rate for each model makes.\n",
        results.base_train_size
    );
    let _ = writeln!(out, "| rung | keras (lr) | projected (lr) | keras - projected [95% CI] | verdict |");
    let _ = writeln!(out, "|---|---:|---:|---:|---|");
    let mut tuned = (0usize, Vec::new(), Vec::new());
    for (floors, keras_lr, projected_lr) in &best_lrs {
        let (Some(keras_lr), Some(projected_lr)) = (keras_lr, projected_lr) else { continue };
        let at = |learning_rate: f64, variant| {
            Cell::of(
                results,
                &Condition { rung: floors.rung.name.clone(), learning_rate, train_size: results.base_train_size },
                variant,
                backend,
            )
        };
        let (keras, projected) = (at(*keras_lr, Variant::Keras), at(*projected_lr, Variant::Projected));
        let difference = Difference::welch(&keras.test_losses(), &projected.test_losses());
        let verdict = verdict_of(difference, &keras, &projected);
        match difference {
            Some(d) if !d.significant() => tuned.0 += 1,
            Some(d) if d.estimate < 0.0 => tuned.1.push(format!("{} (by {:.5})", floors.rung.name, -d.estimate)),
            Some(d) => tuned.2.push(format!("{} (by {:.5})", floors.rung.name, d.estimate)),
            None => {}
        }
        let _ = writeln!(
            out,
            "| {} | {} ({}) | {} ({}) | {} | {verdict} |",
            floors.rung.name,
            pm(&keras.test_losses()),
            lr(*keras_lr),
            pm(&projected.test_losses()),
            lr(*projected_lr),
            difference.map(|d| interval(&d)).unwrap_or_else(|| "—".into()),
        );
    }

    let _ = writeln!(out, "\n## Positive control: one head\n");
    let _ = writeln!(
        out,
        "The Keras layer with one head instead of {} (the two-lookup teachers need two), at each rung's base condition, against the Keras layer: the study must flag it.\n",
        results.num_heads
    );
    let _ = writeln!(out, "| rung | keras test | keras_1head test | keras_1head - keras [95% CI] | flagged |");
    let _ = writeln!(out, "|---|---:|---:|---:|---|");
    let mut flagged = 0;
    for floors in &results.rungs {
        let base = results.base_condition(&floors.rung.name);
        let keras = Cell::of(results, &base, Variant::Keras, backend);
        let control = Cell::of(results, &base, Variant::OneHead, backend);
        let difference = Difference::welch(&control.test_losses(), &keras.test_losses());
        let is_flagged = difference.is_some_and(|d| d.significant());
        flagged += is_flagged as usize;
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            floors.rung.name,
            pm(&keras.test_losses()),
            pm(&control.test_losses()),
            difference.map(|d| interval(&d)).unwrap_or_else(|| "—".into()),
            if is_flagged { "yes" } else { "no" }
        );
    }

    let _ = writeln!(out, "\n## Verdict\n");
    let total = conditions.len();
    let _ = writeln!(
        out,
        "- Over {total} conditions ({} rungs x learning rates and training-set sizes), on {backend}: the two models are equal within the 95% interval in {}, keras is lower in {}, projected is lower in {}, and at least one seed diverged in {}.",
        results.rungs.len(),
        equal.len(),
        keras_better.len(),
        projected_better.len(),
        diverged.len()
    );
    if !keras_better.is_empty() {
        let _ = writeln!(out, "- Keras-exact lower: {}.", keras_better.join("; "));
    }
    if !projected_better.is_empty() {
        let _ = writeln!(out, "- Projected lower: {}.", projected_better.join("; "));
    }
    if !diverged.is_empty() {
        let _ = writeln!(out, "- Diverged: {}.", diverged.join("; "));
    }
    let _ = writeln!(
        out,
        "- At each model's own best learning rate: equal on {} of {} rungs{}{}.",
        tuned.0,
        best_lrs.len(),
        if tuned.1.is_empty() { String::new() } else { format!("; keras lower on {}", tuned.1.join(", ")) },
        if tuned.2.is_empty() { String::new() } else { format!("; projected lower on {}", tuned.2.join(", ")) },
    );
    let _ = writeln!(
        out,
        "- The positive control (one head) is flagged as different on {flagged} of {} rungs.",
        results.rungs.len()
    );
    if !half_widths.is_empty() {
        let mut relative: Vec<f64> = half_widths.iter().map(|(h, m)| h / m).collect();
        relative.sort_by(f64::total_cmp);
        let mut absolute: Vec<f64> = half_widths.iter().map(|(h, _)| *h).collect();
        absolute.sort_by(f64::total_cmp);
        let _ = writeln!(
            out,
            "- Power: where the models came out equal, the 95% interval's half-width has median {:.5} ({:.1}% of the loss; range {:.1}% to {:.1}%): a difference in test loss larger than that would have been flagged.",
            absolute[absolute.len() / 2],
            100.0 * relative[relative.len() / 2],
            100.0 * relative[0],
            100.0 * relative[relative.len() - 1]
        );
    }

    let _ = writeln!(out, "\n## Cross-backend agreement\n");
    let _ = writeln!(
        out,
        "Same initial weights and batches on every backend: the largest difference of the per-step train loss between two backends, over every run both have, apart from the runs that blew up (chaotic, where rounding differences grow without bound).\n"
    );
    let _ = writeln!(
        out,
        "| model | backends | max \\|Δ loss\\|, stable runs | where | max \\|Δ loss\\|, runs that blew up |"
    );
    let _ = writeln!(out, "|---|---|---:|---|---:|");
    // The primary backend first: flex vs ndarray, flex vs wgpu, then ndarray vs wgpu.
    let mut backends = results.backends();
    backends.sort_by_key(|b| *b != backend);
    for variant in Variant::ALL {
        for (i, &a) in backends.iter().enumerate() {
            for &b in &backends[i + 1..] {
                let chaotic = cross_backend_max_diff(results, variant, (a, b), false)
                    .map_or("—".into(), |(diff, _)| format!("{diff:.2e}"));
                if let Some((diff, place)) = cross_backend_max_diff(results, variant, (a, b), true) {
                    let _ = writeln!(out, "| {variant} | {a} vs {b} | {diff:.2e} | {place} | {chaotic} |");
                }
            }
        }
    }
    let _ = writeln!(out, "\n![loss curves per rung](loss_curves.png)\n");
    let _ = writeln!(out, "![keras - projected per rung and learning rate](heat_lr.png)\n");
    let _ = writeln!(out, "![keras - projected per rung and training-set size](heat_size.png)");
    out
}

/// A rung's learning-rate sweep for one variant: `(learning rate, its cell)`.
fn lr_sweep<'a>(results: &'a StudyResults, rung: &str, variant: Variant, backend: Backend) -> Vec<(f64, Cell<'a>)> {
    results
        .learning_rates
        .iter()
        .map(|&learning_rate| {
            let condition = Condition { rung: rung.into(), learning_rate, train_size: results.base_train_size };
            (learning_rate, Cell::of(results, &condition, variant, backend))
        })
        .collect()
}
