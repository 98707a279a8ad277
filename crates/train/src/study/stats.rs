//! The statistics of the study, over plain numbers: mean and standard deviation, the smoothed
//! loss curve and what is read off it (steps to a threshold, the area under it), and the Welch
//! difference of two means with its 95% interval. Nothing here knows about runs or models.

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

/// First step (1-based) at which the smoothed train loss is below `threshold`.
pub fn steps_to(losses: &[f64], threshold: f64, window: usize) -> Option<usize> {
    smooth(losses, window).iter().position(|&l| l < threshold).map(|i| i + 1)
}

/// The area under the smoothed training curve, per step: lower is faster and better.
pub fn curve_area(losses: &[f64], window: usize) -> f64 {
    let curve = smooth(losses, window);
    curve.iter().sum::<f64>() / curve.len().max(1) as f64
}
