//! The study's figures: loss curves per rung (per model the mean over seeds and a band from the
//! best to the worst seed, log-scale loss, the two floors as dashed lines), and heat maps of the
//! difference between the two models per rung and learning rate, and per rung and training-set
//! size.

use std::path::Path;

use anyhow::{Result, anyhow};
use model::weights::write_atomic_with;
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::analysis::{Cell, pair_difference, primary_backend};
use super::design::{Condition, Variant};
use super::runner::StudyResults;
use super::stats::smooth;
use crate::figure::{HEIGHT, WIDTH, nice_log_label, register_font};

/// Writes the loss curves at each rung's base condition, one panel per rung.
pub fn loss_curves(results: &StudyResults, svg: &Path, png: &Path) -> Result<()> {
    register_font();
    let size = (WIDTH * results.rungs.len().max(1) as u32, HEIGHT);
    write_atomic_with(svg, |tmp| draw_curves(SVGBackend::new(tmp, size).into_drawing_area(), results))?;
    write_atomic_with(png, |tmp| draw_curves(BitMapBackend::new(tmp, size).into_drawing_area(), results))
}

fn color(variant: Variant) -> RGBColor {
    match variant {
        Variant::Keras => RGBColor(31, 119, 180),
        Variant::Projected => RGBColor(214, 39, 40),
        Variant::OneHead => RGBColor(127, 127, 127),
    }
}

fn draw_curves<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, results: &StudyResults) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plotting failed: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let window = results.smoothing;
    let backend = primary_backend(results);
    for (panel, floors) in root.split_evenly((1, results.rungs.len().max(1))).iter().zip(&results.rungs) {
        let base = results.base_condition(&floors.rung.name);
        let curves: Vec<(Variant, Vec<Vec<f64>>)> = Variant::ALL
            .iter()
            .map(|&v| {
                (v, Cell::of(results, &base, v, backend).finished.iter().map(|r| smooth(&r.losses, window)).collect())
            })
            .collect();
        let steps = curves.iter().flat_map(|(_, c)| c.iter().map(Vec::len)).max().unwrap_or(1).max(2);
        let all = curves.iter().flat_map(|(_, c)| c.iter().flatten().copied()).filter(|v| *v > 0.0 && v.is_finite());
        let (lo, hi) = all.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let floor_lines = [("Bayes floor", floors.bayes_floor), ("per-position floor", floors.per_position_floor)];
        let lo = floor_lines.iter().map(|f| f.1).fold(lo, f64::min) * 0.8;
        let hi = hi.max(floors.per_position_floor) * 1.25;
        let mut chart = ChartBuilder::on(panel)
            .caption(&floors.rung.name, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(62)
            .build_cartesian_2d(1f64..steps as f64, (lo..hi).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("optimizer step")
            .y_desc(format!("train loss (mean of {window} steps)"))
            .x_label_formatter(&|v| format!("{v:.0}"))
            .y_label_formatter(&|v| nice_log_label(*v))
            .y_labels(8)
            .light_line_style(TRANSPARENT)
            .bold_line_style(BLACK.mix(0.12))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 15))
            .draw()
            .map_err(err)?;
        for (variant, runs) in &curves {
            if runs.is_empty() {
                continue;
            }
            let n = runs.iter().map(Vec::len).min().unwrap_or(0);
            let at = |i: usize| runs.iter().map(|c| c[i]).collect::<Vec<_>>();
            let mean: Vec<(f64, f64)> =
                (0..n).map(|i| ((i + 1) as f64, at(i).iter().sum::<f64>() / runs.len() as f64)).collect();
            let upper = (0..n).map(|i| ((i + 1) as f64, at(i).into_iter().fold(f64::MIN, f64::max)));
            let lower = (0..n).rev().map(|i| ((i + 1) as f64, at(i).into_iter().fold(f64::MAX, f64::min)));
            let c = color(*variant);
            chart
                .draw_series(std::iter::once(Polygon::new(upper.chain(lower).collect::<Vec<_>>(), c.mix(0.2).filled())))
                .map_err(err)?;
            chart
                .draw_series(LineSeries::new(mean, c.stroke_width(2)))
                .map_err(err)?
                .label(format!("{variant} (mean, band: seeds)"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        }
        for (label, level) in floor_lines {
            let style = BLACK.mix(0.6).stroke_width(1);
            chart
                .draw_series(DashedLineSeries::new(vec![(1.0, level), (steps as f64, level)], 6, 4, style))
                .map_err(err)?
                .label(format!("{label} {level:.3}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .label_font(("sans-serif", 12))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// The condition of a rung (by name) in a heat map's column (by index).
type ColumnCondition = Box<dyn Fn(&str, usize) -> Condition>;

/// One heat map's columns: a label and the condition of each rung in that column.
struct Columns {
    title: &'static str,
    labels: Vec<String>,
    condition: ColumnCondition,
}

/// Writes `heat_lr.{svg,png}` (rung x learning rate) and `heat_size.{svg,png}` (rung x
/// training-set size): the relative difference in test loss, (keras - projected) / projected,
/// blue where keras is lower, red where projected is; a star marks a 95% interval that excludes
/// 0, "div" a condition where a seed diverged.
pub fn heat_maps(results: &StudyResults, dir: &Path) -> Result<()> {
    register_font();
    let learning_rates = results.learning_rates.clone();
    let train_sizes = results.train_sizes.clone();
    let (base_lr, base_n) = (results.base_learning_rate, results.base_train_size);
    let maps = [
        (
            "heat_lr",
            Columns {
                title: "learning rate",
                labels: learning_rates.iter().map(|v| format!("{v:e}")).collect(),
                condition: Box::new(move |rung, i| Condition {
                    rung: rung.into(),
                    learning_rate: learning_rates[i],
                    train_size: base_n,
                }),
            },
        ),
        (
            "heat_size",
            Columns {
                title: "training sequences",
                labels: train_sizes.iter().map(|n| n.to_string()).collect(),
                condition: Box::new(move |rung, i| Condition {
                    rung: rung.into(),
                    learning_rate: base_lr,
                    train_size: train_sizes[i],
                }),
            },
        ),
    ];
    for (name, columns) in &maps {
        let size = ((160 + 110 * columns.labels.len() as u32).max(440), 110 + 60 * results.rungs.len() as u32);
        write_atomic_with(&dir.join(format!("{name}.svg")), |tmp| {
            draw_heat(SVGBackend::new(tmp, size).into_drawing_area(), results, columns)
        })?;
        write_atomic_with(&dir.join(format!("{name}.png")), |tmp| {
            draw_heat(BitMapBackend::new(tmp, size).into_drawing_area(), results, columns)
        })?;
    }
    Ok(())
}

fn draw_heat<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    results: &StudyResults,
    columns: &Columns,
) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plotting failed: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let backend = primary_backend(results);
    let (rows, cols) = (results.rungs.len(), columns.labels.len());
    if rows == 0 || cols == 0 {
        return Ok(()); // nothing was swept
    }
    // Segmented axes (0..n-1 has n segments): cell c spans Exact(c)..Exact(c + 1), and its
    // label sits at CenterOf(c).
    let mut chart = ChartBuilder::on(&root)
        .caption("(keras - projected) / projected test loss", ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(100)
        .build_cartesian_2d((0..cols - 1).into_segmented(), (0..rows - 1).into_segmented())
        .map_err(err)?;
    // Row 0 is drawn at the bottom: the ladder's first rung goes on top.
    let rung_at = |row: usize| {
        rows.checked_sub(row + 1).and_then(|r| results.rungs.get(r)).map(|r| r.rung.name.clone()).unwrap_or_default()
    };
    let label = |value: &SegmentValue<usize>, names: &dyn Fn(usize) -> String| match value {
        SegmentValue::CenterOf(i) => names(*i),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(cols)
        .y_labels(rows)
        .x_label_formatter(&|v| label(v, &|i| columns.labels.get(i).cloned().unwrap_or_default()))
        .y_label_formatter(&|v| label(v, &rung_at))
        .x_desc(columns.title)
        .label_style(("sans-serif", 13))
        .draw()
        .map_err(err)?;
    let centered = ("sans-serif", 14).into_font().color(&BLACK).pos(Pos::new(HPos::Center, VPos::Center));
    for (r, floors) in results.rungs.iter().enumerate() {
        let row = rows - r - 1;
        for col in 0..cols {
            let condition = (columns.condition)(&floors.rung.name, col);
            let keras = Cell::of(results, &condition, Variant::Keras, backend);
            let projected = Cell::of(results, &condition, Variant::Projected, backend);
            let difference = pair_difference(results, &condition, backend);
            let (fill, text) = match (keras.mean_test(), projected.mean_test()) {
                _ if keras.diverged + projected.diverged > 0 => (RGBColor(200, 200, 200), "div".to_string()),
                (Some(k), Some(p)) => {
                    let relative = (k - p) / p;
                    let star = if difference.is_some_and(|d| d.significant()) { "*" } else { "" };
                    (diverging(relative), format!("{:+.1}%{star}", 100.0 * relative))
                }
                _ => (WHITE, "—".to_string()),
            };
            let cell = [
                (SegmentValue::Exact(col), SegmentValue::Exact(row)),
                (SegmentValue::Exact(col + 1), SegmentValue::Exact(row + 1)),
            ];
            chart.draw_series(std::iter::once(Rectangle::new(cell, fill.filled()))).map_err(err)?;
            let center = (SegmentValue::CenterOf(col), SegmentValue::CenterOf(row));
            chart.draw_series(std::iter::once(Text::new(text, center, centered.clone()))).map_err(err)?;
        }
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Blue (keras lower) through white to red (projected lower), saturating at ±20%.
fn diverging(relative: f64) -> RGBColor {
    let t = (relative / 0.2).clamp(-1.0, 1.0);
    let mix = |a: f64, b: f64, w: f64| (a + (b - a) * w).round() as u8;
    match t < 0.0 {
        true => RGBColor(mix(255.0, 49.0, -t), mix(255.0, 130.0, -t), mix(255.0, 189.0, -t)),
        false => RGBColor(mix(255.0, 214.0, t), mix(255.0, 39.0, t), mix(255.0, 40.0, t)),
    }
}
