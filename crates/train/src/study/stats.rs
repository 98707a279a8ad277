//! The statistics of the study, over plain numbers: mean and standard deviation, the smoothed
//! loss curve and what is read off it (steps to a threshold, the area under it), and the Welch
//! difference of two means with its 95% interval. Nothing here knows about runs or models.

/// Mean and sample standard deviation (divided by `n - 1`; 0 for one value). The mean of no values
/// is NaN: callers check for an empty slice first.
pub fn mean_std(values: &[f64]) -> (f64, f64) {
    let n = values.len() as f64;
    let mean = values.iter().sum::<f64>() / n;
    let var = if values.len() > 1 { values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (n - 1.0) } else { 0.0 };
    (mean, var.sqrt())
}

/// Running mean over `window` steps (the curve the plots and the threshold use). The first
/// `window - 1` steps average the steps so far; a window of 0 counts as 1.
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

/// Two-sided 95% critical value of Student's t, `t_{0.975, df}`: the published three-decimal
/// table, every df from 1 to 30, then the rows 40, 60 and 120, and the normal limit 1.960 for an
/// infinite df.
///
/// Welch's df is fractional; it takes the table's row at or below it, which is conservative (a
/// larger critical value, a wider interval): df 35 gets 30's 2.042 (exact 2.030), df 1000 gets
/// 120's 1.980 (exact 1.962). Welch's df is at least `min(n_a, n_b) - 1`, never below 1; a df
/// below 1 would get the df 1 value, and NaN the normal limit.
pub fn t_critical_95(df: f64) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    const LARGE: [(f64, f64); 3] = [(40.0, 2.021), (60.0, 2.000), (120.0, 1.980)];
    if df.is_nan() || df == f64::INFINITY {
        return 1.960;
    }
    if let Some(&(_, t)) = LARGE.iter().rev().find(|(row, _)| df >= *row) {
        return t;
    }
    TABLE[(df.floor() as usize).clamp(1, 30) - 1]
}

/// First step (1-based) at which the smoothed train loss is below `threshold`.
pub fn steps_to(losses: &[f64], threshold: f64, window: usize) -> Option<usize> {
    smooth(losses, window).iter().position(|&l| l < threshold).map(|i| i + 1)
}

/// The area under the smoothed training curve, per step: lower is faster and better (0 for an
/// empty curve).
pub fn curve_area(losses: &[f64], window: usize) -> f64 {
    let curve = smooth(losses, window);
    curve.iter().sum::<f64>() / curve.len().max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(actual: f64, expected: f64, tolerance: f64) -> bool {
        (actual - expected).abs() <= tolerance
    }

    /// Two-sided 95% Student t critical values as published in three-decimal tables (e.g. NIST/
    /// SEMATECH e-Handbook, table 1.3.6.7.2, column 0.975).
    #[test]
    fn t_critical_95_is_the_published_student_t_value() {
        for (df, published) in [(1.0, 12.706), (2.0, 4.303), (5.0, 2.571), (10.0, 2.228), (30.0, 2.042)] {
            assert_eq!(t_critical_95(df), published, "df {df}");
        }
        // The rows most tables print above 30 (scipy: 2.021075, 2.000298, 1.979930).
        for (df, published) in [(40.0, 2.021), (60.0, 2.000), (120.0, 1.980)] {
            assert_eq!(t_critical_95(df), published, "df {df}");
        }
        // The large-df limit: the normal quantile 1.95996..., to three decimals.
        assert_eq!(t_critical_95(f64::INFINITY), 1.960);
    }

    /// Every row of the table against scipy 1.17.1's `scipy.stats.t.ppf(0.975, df)`, rounded to
    /// six decimals: within half a unit of the table's third decimal.
    #[test]
    fn t_table_agrees_with_scipy_at_every_integer_df() {
        const SCIPY: [f64; 30] = [
            12.706205, 4.302653, 3.182446, 2.776445, 2.570582, 2.446912, 2.364624, 2.306004, 2.262157, 2.228139,
            2.200985, 2.178813, 2.160369, 2.144787, 2.131450, 2.119905, 2.109816, 2.100922, 2.093024, 2.085963,
            2.079614, 2.073873, 2.068658, 2.063899, 2.059539, 2.055529, 2.051831, 2.048407, 2.045230, 2.042272,
        ];
        for (i, exact) in SCIPY.iter().enumerate() {
            let df = (i + 1) as f64;
            assert!(close(t_critical_95(df), *exact, 5e-4), "df {df}: {} vs scipy {exact}", t_critical_95(df));
        }
    }

    /// A fractional df (Welch's) takes the table's row below it, never a smaller value than the
    /// exact quantile (scipy 1.17.1's `t.ppf(0.975, df)`, less the table's rounding of 5e-4).
    #[test]
    fn t_critical_95_rounds_fractional_df_down_which_is_conservative() {
        for (df, row, exact) in
            [(1.5, 1.0, 6.016663), (3.234718826405868, 3.0, 3.055713), (7.5, 7.0, 2.333040), (29.5, 29.0, 2.043725)]
        {
            assert_eq!(t_critical_95(df), t_critical_95(row), "df {df}");
            assert!(t_critical_95(df) >= exact - 5e-4, "df {df}: {} below scipy's {exact}", t_critical_95(df));
        }
    }

    /// scipy 1.17.1: `ttest_ind([1, 2, 3, 4], [2, 4, 6], equal_var=False)` has statistic
    /// -1.1338934190276817 (so SE = 1.5 / 1.1338934 = 1.3228756555322954, i.e. sqrt(1.75)), df
    /// 3.234718826405868, and 95% interval [-5.542328, 2.542328] (half-width 4.042328 from the
    /// exact t quantile 3.0557). The table rounds df down to 3: half-width 3.182 * SE.
    #[test]
    fn welch_interval_matches_scipy_on_a_small_example() {
        let d = Difference::welch(&[1.0, 2.0, 3.0, 4.0], &[2.0, 4.0, 6.0]).unwrap();
        assert!(close(d.estimate, -1.5, 1e-12), "{d:?}");
        assert!(close(d.half_width, 3.182 * 1.3228756555322954, 1e-9), "{d:?}");
        assert!(d.half_width >= 4.042327954923024, "narrower than scipy's exact interval: {d:?}");
        assert!(!d.significant(), "scipy's p is 0.334: {d:?}");
    }

    /// scipy 1.17.1: `ttest_ind([.50, .52, .48, .51, .49], [.60, .63, .58, .61, .59],
    /// equal_var=False)` has statistic -9.15987 (SE 0.011135528725660053), df 7.711133 and
    /// interval [-0.127847, -0.076153], which excludes 0 (p 2.1e-5). The table's row is df 7.
    #[test]
    fn welch_interval_flags_a_clear_difference_like_scipy() {
        let d = Difference::welch(&[0.50, 0.52, 0.48, 0.51, 0.49], &[0.60, 0.63, 0.58, 0.61, 0.59]).unwrap();
        assert!(close(d.estimate, -0.102, 1e-12), "{d:?}");
        assert!(close(d.half_width, 2.365 * 0.011135528725660053, 1e-9), "{d:?}");
        assert!(d.significant(), "{d:?}");
    }

    #[test]
    fn welch_needs_two_values_a_side_and_has_no_width_without_spread() {
        assert_eq!(Difference::welch(&[1.0], &[1.0, 2.0]), None);
        assert_eq!(Difference::welch(&[1.0, 2.0], &[]), None);
        let d = Difference::welch(&[2.0, 2.0], &[1.0, 1.0, 1.0]).unwrap();
        assert_eq!(d, Difference { estimate: 1.0, half_width: 0.0 });
        assert!(d.significant());
    }

    /// [2, 4, 4, 4, 5, 5, 7, 9]: mean 5, squared deviations summing to 32; the sample standard
    /// deviation is sqrt(32 / 7) = 2.13809 (numpy's `std(ddof=1)`), not the population's 2.
    #[test]
    fn mean_std_is_the_mean_and_sample_standard_deviation() {
        let (mean, std) = mean_std(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]);
        assert!(close(mean, 5.0, 1e-12) && close(std, (32.0f64 / 7.0).sqrt(), 1e-12), "{mean} {std}");
        assert_eq!(mean_std(&[3.5]), (3.5, 0.0));
        assert!(mean_std(&[]).0.is_nan());
    }

    /// Window 3 over [4, 2, 6, 8, 10]: the first two steps average what there is (4, then
    /// (4 + 2) / 2), then full windows ((4 + 2 + 6) / 3, (2 + 6 + 8) / 3, (6 + 8 + 10) / 3).
    #[test]
    fn smooth_averages_the_steps_so_far_at_the_start() {
        let losses = [4.0, 2.0, 6.0, 8.0, 10.0];
        let expected = [4.0, 3.0, 4.0, 16.0 / 3.0, 8.0];
        let smoothed = smooth(&losses, 3);
        assert!(smoothed.iter().zip(expected).all(|(a, b)| close(*a, b, 1e-12)), "{smoothed:?}");
        assert_eq!(smooth(&losses, 0), losses, "a window of 0 counts as 1");
        assert_eq!(smooth(&losses, 1), losses);
        let cumulative = [4.0, 3.0, 4.0, 5.0, 6.0];
        let long = smooth(&losses, 10);
        assert!(long.iter().zip(cumulative).all(|(a, b)| close(*a, b, 1e-12)), "{long:?}");
        assert!(smooth(&[], 3).is_empty());
    }

    /// On the curve above (smoothed with window 3: 4, 3, 4, 5.33, 8): the first step below 3.5 is
    /// step 2; nothing is below 3; the area is the smoothed curve's mean, 24.33 / 5.
    #[test]
    fn steps_to_and_curve_area_read_the_smoothed_curve() {
        let losses = [4.0, 2.0, 6.0, 8.0, 10.0];
        assert_eq!(steps_to(&losses, 3.5, 3), Some(2));
        assert_eq!(steps_to(&losses, 3.0, 3), None);
        assert_eq!(steps_to(&losses, 2.5, 1), Some(2), "unsmoothed, step 2's loss 2 is below 2.5");
        assert!(close(curve_area(&losses, 3), (4.0 + 3.0 + 4.0 + 16.0 / 3.0 + 8.0) / 5.0, 1e-12));
        assert_eq!(curve_area(&[], 3), 0.0);
    }
}
