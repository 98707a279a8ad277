//! The benchmark's scaling figure: training-step time and the memory a step adds against sequence length,
//! ours beside torch.

use std::path::Path;

use anyhow::{Result, anyhow};
use model::weights::write_atomic_with;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::figure::{HEIGHT, WIDTH, nice_log_label, register_font};

/// One sequence length of the benchmark's scaling series (training step).
#[derive(Debug, Clone, Copy)]
pub struct ScalingPoint {
    pub seq_len: usize,
    pub ours_ms: f64,
    pub torch_ms: Option<f64>,
    pub ours_mb: Option<f64>,
    pub torch_mb: Option<f64>,
}

/// The scaling figure: training-step time and the memory a step adds to the idle process against sequence length (log-log),
/// ours beside torch, written as PNG through a temporary file and a rename.
pub fn scaling(points: &[ScalingPoint], png: &Path) -> Result<()> {
    register_font();
    write_atomic_with(png, |tmp| draw_scaling(BitMapBackend::new(tmp, (2 * WIDTH, HEIGHT)).into_drawing_area(), points))
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
        ("memory a step adds", "MB", |p| (p.ours_mb, p.torch_mb)),
    ];
    for (panel, (title, unit, series)) in panels.iter().zip(specs) {
        let values: Vec<f64> =
            points.iter().flat_map(|p| [series(p).0, series(p).1]).flatten().filter(|v| *v > 0.0).collect();
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
            .x_label_formatter(&|v| {
                if (v - v.round()).abs() < 1e-6 { format!("{}", 2f64.powf(v.round())) } else { String::new() }
            })
            .y_label_formatter(&|v| nice_log_label(*v))
            .y_labels(8)
            .light_line_style(TRANSPARENT)
            .draw()
            .map_err(err)?;
        let lines =
            [("ours (flex, fused kernel)", RGBColor(31, 119, 180), 0), ("torch SDPA", RGBColor(214, 39, 40), 1)];
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
            .map(|&t| ScalingPoint {
                seq_len: t,
                ours_ms: t as f64 * 0.1,
                torch_ms: Some(t as f64 * 0.12),
                ours_mb: Some(80.0),
                torch_mb: None,
            })
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
