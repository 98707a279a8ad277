//! Loss-curve plots of a study: one panel per backend, per model the mean over seeds and a band
//! from the best to the worst seed, log-scale loss, the two floors as dashed lines.

use std::path::Path;
use std::sync::Once;

use anyhow::{Result, anyhow};
use model::Backend;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::models::ModelKind;
use crate::study::{StudyResults, smooth};

const WIDTH: u32 = 520;
const HEIGHT: u32 = 440;

/// Writes the same figure as SVG and PNG (each through a temporary file and a rename).
pub fn loss_curves(results: &StudyResults, svg: &Path, png: &Path) -> Result<()> {
    register_font();
    let backends = results.backends();
    let size = (WIDTH * backends.len() as u32, HEIGHT);

    let tmp_svg = svg.with_extension("tmp.svg");
    draw(SVGBackend::new(&tmp_svg, size).into_drawing_area(), results, &backends)?;
    std::fs::rename(&tmp_svg, svg)?;
    let tmp_png = png.with_extension("tmp.png");
    draw(BitMapBackend::new(&tmp_png, size).into_drawing_area(), results, &backends)?;
    std::fs::rename(&tmp_png, png)?;
    Ok(())
}

/// The PNG needs a font; DejaVu Sans is embedded so the plot renders on machines without fonts.
fn register_font() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for style in [FontStyle::Normal, FontStyle::Bold] {
            // The font is a valid TTF shipped in the crate; a failure would only lose the text.
            let _ = plotters::style::register_font("sans-serif", style, dejavu::sans::regular());
        }
    });
}

fn color(model: ModelKind) -> RGBColor {
    match model {
        ModelKind::Keras => RGBColor(31, 119, 180),
        ModelKind::Projected => RGBColor(214, 39, 40),
        ModelKind::Baseline => RGBColor(127, 127, 127),
    }
}

fn draw<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, results: &StudyResults, backends: &[Backend]) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plotting failed: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let window = results.smoothing;
    let curves: Vec<_> = results.runs.iter().map(|r| (r, smooth(&r.losses, window))).collect();
    let steps = curves.iter().map(|(_, c)| c.len()).max().unwrap_or(1).max(2);
    let all = curves.iter().flat_map(|(_, c)| c.iter().copied()).filter(|v| *v > 0.0);
    let (lo, hi) = all.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let floors = [("Bayes floor", results.runs[0].summary.bayes_floor), ("per-position floor", results.runs[0].summary.per_position_floor)];
    let lo = floors.iter().map(|f| f.1).fold(lo, f64::min) * 0.8;
    let hi = hi.max(floors[1].1) * 1.25;

    for (panel, &backend) in root.split_evenly((1, backends.len())).iter().zip(backends) {
        let mut chart = ChartBuilder::on(panel)
            .caption(format!("{backend}"), ("sans-serif", 22))
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
            .y_labels(12)
            .light_line_style(TRANSPARENT)
            .bold_line_style(BLACK.mix(0.12))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 15))
            .draw()
            .map_err(err)?;

        for model in results.models() {
            let runs: Vec<&Vec<f64>> = curves.iter().filter(|(r, _)| r.model == model && r.backend == backend).map(|(_, c)| c).collect();
            if runs.is_empty() {
                continue;
            }
            let n = runs.iter().map(|c| c.len()).min().unwrap_or(0);
            let at = |i: usize| runs.iter().map(|c| c[i]).collect::<Vec<_>>();
            let mean: Vec<(f64, f64)> = (0..n).map(|i| ((i + 1) as f64, at(i).iter().sum::<f64>() / runs.len() as f64)).collect();
            let upper = (0..n).map(|i| ((i + 1) as f64, at(i).into_iter().fold(f64::MIN, f64::max)));
            let lower = (0..n).rev().map(|i| ((i + 1) as f64, at(i).into_iter().fold(f64::MAX, f64::min)));
            let c = color(model);
            chart.draw_series(std::iter::once(Polygon::new(upper.chain(lower).collect::<Vec<_>>(), c.mix(0.2).filled()))).map_err(err)?;
            chart
                .draw_series(LineSeries::new(mean, c.stroke_width(2)))
                .map_err(err)?
                .label(format!("{model} (mean, band: seeds)"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
        }
        for (label, level) in floors {
            let style = BLACK.mix(0.6).stroke_width(1);
            chart
                .draw_series(DashedLineSeries::new(vec![(1.0, level), (steps as f64, level)], 6, 4, style))
                .map_err(err)?
                .label(format!("{label} {level:.3}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::MiddleRight)
            .label_font(("sans-serif", 12))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.4))
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Labels a log axis at 1, 2 and 5 times a power of ten only, so that labels never crowd.
fn nice_log_label(v: f64) -> String {
    let mantissa = v / 10f64.powf(v.log10().floor());
    match [1.0, 2.0, 5.0].iter().any(|m| (mantissa - m).abs() < 0.05) {
        true => format!("{v}"),
        false => String::new(),
    }
}

/// One sequence length of the benchmark's scaling series (training step).
#[derive(Debug, Clone, Copy)]
pub struct ScalingPoint {
    pub seq_len: usize,
    pub ours_ms: f64,
    pub torch_ms: Option<f64>,
    pub ours_mb: Option<f64>,
    pub torch_mb: Option<f64>,
}

/// The scaling figure: training-step time and peak memory against sequence length (log-log),
/// ours beside torch, written as PNG through a temporary file and a rename.
pub fn scaling(points: &[ScalingPoint], png: &Path) -> Result<()> {
    register_font();
    let tmp = png.with_extension("tmp.png");
    draw_scaling(BitMapBackend::new(&tmp, (2 * WIDTH, HEIGHT)).into_drawing_area(), points)?;
    std::fs::rename(&tmp, png)?;
    Ok(())
}

fn draw_scaling<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, points: &[ScalingPoint]) -> Result<()> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow!("plotting failed: {e:?}");
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((1, 2));
    // The x axis is log2(T): one labelled step per doubling.
    let log2 = |t: usize| (t.max(1) as f64).log2();
    let lengths = (points.first().map_or(0.0, |p| log2(p.seq_len)), points.last().map_or(1.0, |p| log2(p.seq_len)));
    type Series = fn(&ScalingPoint) -> (Option<f64>, Option<f64>);
    let specs: [(&str, &str, Series); 2] = [
        ("training step time", "ms", |p| (Some(p.ours_ms), p.torch_ms)),
        ("peak memory (process)", "MB", |p| (p.ours_mb, p.torch_mb)),
    ];
    for (panel, (title, unit, series)) in panels.iter().zip(specs) {
        let values: Vec<f64> = points.iter().flat_map(|p| [series(p).0, series(p).1]).flatten().filter(|v| *v > 0.0).collect();
        let (lo, hi) = values.iter().fold((f64::INFINITY, 0.0f64), |(lo, hi), v| (lo.min(*v), hi.max(*v)));
        let (lo, hi) = if values.is_empty() { (1.0, 10.0) } else { (lo / 1.5, hi * 1.5) };
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(56)
            .build_cartesian_2d(lengths.0 - 0.3..lengths.1 + 0.3, (lo..hi).log_scale())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("sequence length T (8192 tokens per batch)")
            .y_desc(unit)
            .x_labels((lengths.1 - lengths.0) as usize + 3)
            .x_label_formatter(&|v| if (v - v.round()).abs() < 1e-6 { format!("{}", 2f64.powf(v.round())) } else { String::new() })
            .y_label_formatter(&|v| nice_log_label(*v))
            .y_labels(12)
            .light_line_style(TRANSPARENT)
            .draw()
            .map_err(err)?;
        let lines = [("ours (flex, fused kernel)", RGBColor(31, 119, 180), 0), ("torch SDPA", RGBColor(214, 39, 40), 1)];
        for (name, color, which) in lines {
            let line: Vec<(f64, f64)> = points
                .iter()
                .filter_map(|p| {
                    let (ours, torch) = series(p);
                    Some((log2(p.seq_len), if which == 0 { ours? } else { torch? }))
                })
                .collect();
            chart
                .draw_series(LineSeries::new(line.clone(), color.stroke_width(2)))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
            chart.draw_series(line.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(err)?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_plot_is_written_as_a_png() {
        let points: Vec<ScalingPoint> = [128, 256, 512, 1024]
            .iter()
            .map(|&t| ScalingPoint { seq_len: t, ours_ms: t as f64 * 0.1, torch_ms: Some(t as f64 * 0.12), ours_mb: Some(80.0), torch_mb: None })
            .collect();
        let dir = std::env::temp_dir().join(format!("scaling-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let png = dir.join("scaling.png");
        scaling(&points, &png).unwrap();
        let bytes = std::fs::read(&png).unwrap();
        assert!(bytes.len() > 1000 && bytes.starts_with(b"\x89PNG"), "{} bytes", bytes.len());
        std::fs::copy(&png, std::env::temp_dir().join("scaling-plot-latest.png")).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
