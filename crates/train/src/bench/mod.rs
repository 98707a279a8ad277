//! Benchmarks: the forward pass (inference) and a full training step (forward, MSE, backward,
//! Keras Adam) of the Keras-exact layer and the projected port, at any shape and mask
//! ([`Case`]), with each row's arithmetic floor from the cores' measured FMA peak ([`peak`]), and
//! the scaling figure ([`plot`]).

pub mod case;
pub mod peak;
pub mod plot;

use std::time::{Duration, Instant};

use anyhow::Result;
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Distribution, Tensor};
use serde::Serialize;

pub use case::{CallKind, Case, MaskKind, Shape, padding_lengths};

use crate::loss::mse;
use crate::optim::OptimizerConfig;

/// Timing statistics in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timing {
    pub median_ms: f64,
    pub p10_ms: f64,
    pub p90_ms: f64,
    pub reps: usize,
    pub samples_per_s: f64,
}

impl Timing {
    /// The statistics of `ms`, the times of calls that each process `batch` samples.
    pub fn from_samples(mut ms: Vec<f64>, batch: usize) -> Self {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
        let median = median(&ms);
        Self {
            median_ms: median,
            p10_ms: at(0.1),
            p90_ms: at(0.9),
            reps: ms.len(),
            samples_per_s: batch as f64 * 1000.0 / median,
        }
    }
}

/// The median of `ms` as every timing here takes it: the sample at rank `len / 2` of the sorted
/// samples (the upper of the two middle ones for an even count); NaN for no samples.
pub fn median(ms: &[f64]) -> f64 {
    let mut sorted = ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted.get(sorted.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Repetitions of a measurement: `warmup` untimed calls (stopping early once `budget / 2` is
/// spent), then up to `settling` more while the kernels measure their run-time choices
/// ([`kernels::tuning::measuring`]: a class chooses after 10 calls, and a row's call makes at
/// least one of each class it has), then up to `measured` timed ones, fewer (but at least
/// `minimum`) once `budget` is spent, so that large rows do not take minutes each.
#[derive(Debug, Clone, Copy)]
pub struct Reps {
    pub warmup: usize,
    pub settling: usize,
    pub measured: usize,
    pub minimum: usize,
    pub budget: Duration,
}

impl Reps {
    /// A measurement: up to 10 warm-up calls (stopping after 1.5 s) and 12 while the kernels
    /// measure, up to 50 timed ones in 3 s.
    pub const FULL: Reps = Reps { warmup: 10, settling: 12, measured: 50, minimum: 3, budget: Duration::from_secs(3) };
    /// A check that the benchmark works, not a measurement.
    pub const QUICK: Reps =
        Reps { warmup: 1, settling: 0, measured: 3, minimum: 3, budget: Duration::from_millis(200) };

    /// Round `round` of `rounds` that share this measurement: the first warms up, each later one
    /// makes one untimed call (the cores were just handed over by the other side), and the timed
    /// calls and the budget are split between the rounds.
    pub fn round(self, round: usize, rounds: usize) -> Reps {
        let rounds = rounds.max(1);
        Reps {
            warmup: if round == 0 { self.warmup } else { 1 },
            settling: self.settling,
            measured: self.measured.div_ceil(rounds),
            minimum: self.minimum.div_ceil(rounds),
            budget: self.budget / rounds as u32,
        }
    }
}

/// Times `f` as `reps` says, appending each timed call's milliseconds to `samples`. The warm-up
/// goes on while the kernels are measuring their run-time choices, so that the timed calls run
/// the choices and not the trials: the projected model's training step at 4,512,768,12x64 took
/// 320-410 ms while its products tried the caller's thread alone, against 240-280 after (AMD
/// EPYC Zen 4), and the warm-up of a step that large is one or two calls (its time budget).
pub fn time_into(reps: Reps, samples: &mut Vec<f64>, mut f: impl FnMut() -> Result<()>) -> Result<()> {
    let start = Instant::now();
    for _ in 0..reps.warmup {
        f()?;
        if start.elapsed() > reps.budget / 2 {
            break;
        }
    }
    for _ in 0..reps.settling {
        if !kernels::tuning::measuring() {
            break;
        }
        f()?;
    }
    let (start, first) = (Instant::now(), samples.len());
    while samples.len() - first < reps.measured
        && (samples.len() - first < reps.minimum || start.elapsed() < reps.budget)
    {
        let call = Instant::now();
        f()?;
        samples.push(call.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(())
}

fn time(reps: Reps, batch: usize, f: impl FnMut() -> Result<()>) -> Result<Timing> {
    let mut samples = Vec::with_capacity(reps.measured);
    time_into(reps, &mut samples, f)?;
    Ok(Timing::from_samples(samples, batch))
}

/// One call of a row, built once and run as often as it is timed.
pub type Call = Box<dyn FnMut() -> Result<()>>;

/// Inference: the row's model without autodiff, its output read back to the host.
pub fn forward(case: Case, device: &Device) -> Result<Call> {
    device.seed(0);
    let net = case.init(device)?;
    let masks = case.masks(device);
    let s = case.shape;
    let x = Tensor::<3>::random([s.batch, s.seq_len, s.features], Distribution::Normal(0.0, 1.0), device);
    Ok(Box::new(move || {
        let out = case::call(&net, x.clone(), &masks, case.call, false)?;
        out.sum().into_scalar::<f32>();
        Ok(())
    }))
}

/// A training step: forward, MSE, backward, Keras Adam; the loss read back to the host. Each
/// call takes one more step from where the last one left the weights.
pub fn train_step(case: Case, device: &Device) -> Result<Call> {
    let ad = device.clone().autodiff();
    ad.seed(0);
    let mut net = case.init(&ad)?;
    let masks = case.masks(&ad);
    let mut optim = OptimizerConfig::default().init();
    let s = case.shape;
    let x = Tensor::<3>::random([s.batch, s.seq_len, s.features], Distribution::Normal(0.0, 1.0), &ad);
    let y = Tensor::<3>::random([s.batch, s.seq_len, s.features], Distribution::Normal(0.0, 1.0), &ad);
    Ok(Box::new(move || {
        let loss = mse(case::call(&net, x.clone(), &masks, case.call, true)?, y.clone());
        loss.clone().into_scalar::<f32>();
        let grads = GradientsParams::from_grads(loss.backward(), &net);
        net = optim.step(1e-3, net.clone(), grads);
        Ok(())
    }))
}

/// What a row's training steps take, in MB: the process's peak resident memory, and what the
/// steps added to the idle process (the peak over the resident memory once the model and data
/// are built). The second compares fairly with a reference process that holds its libraries
/// before any attention (torch and TensorFlow: about 700 MB).
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct Memory {
    pub peak_mb: Option<f64>,
    pub step_mb: Option<f64>,
}

/// Takes `steps` calls of `step` (built, not yet called) and measures their [`Memory`]. Linux
/// only: elsewhere both are `None`.
pub fn step_memory(mut step: Call, steps: usize) -> Result<Memory> {
    let idle = resident_mb("VmRSS:");
    let reset = reset_peak_rss();
    for _ in 0..steps {
        step()?;
    }
    let peak_mb = resident_mb("VmHWM:");
    let step_mb = match (reset, idle, peak_mb) {
        (true, Some(idle), Some(peak)) => Some(peak - idle),
        _ => None,
    };
    Ok(Memory { peak_mb, step_mb })
}

/// A memory line of this process's status (Linux `VmRSS`: now, `VmHWM`: at the peak), in MB.
fn resident_mb(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Sets the peak resident memory to the current one (Linux `clear_refs` 5); false where the
/// system does not allow it.
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Parameter count of a row's model.
pub fn parameters(case: Case) -> Result<usize> {
    Ok(case.init(&Device::flex())?.num_params())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_median_is_the_sample_at_the_middle_rank_as_in_the_timings() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 3.0);
        assert!(median(&[]).is_nan());
        for samples in [vec![5.0, 1.0, 4.0, 2.0, 3.0, 6.0], vec![9.0, 7.0, 8.0]] {
            assert_eq!(Timing::from_samples(samples.clone(), 1).median_ms, median(&samples));
        }
    }

    #[test]
    fn rounds_split_the_timed_calls_and_warm_up_once() {
        let rounds: Vec<Reps> = (0..3).map(|r| Reps::FULL.round(r, 3)).collect();
        assert_eq!(rounds.iter().map(|r| r.warmup).collect::<Vec<_>>(), [10, 1, 1]);
        assert!(rounds.iter().all(|r| r.measured == 17 && r.minimum == 1 && r.budget == Duration::from_secs(1)));

        // Calls that outlast the budget: each round still times `minimum` of them, after its warm-up.
        let slow = Reps { warmup: 1, settling: 0, measured: 17, minimum: 1, budget: Duration::ZERO };
        let (mut samples, mut calls) = (Vec::new(), 0);
        for _ in 0..3 {
            time_into(slow, &mut samples, || {
                calls += 1;
                Ok(())
            })
            .unwrap();
        }
        assert_eq!((samples.len(), calls), (3, 6));

        // Fast calls: each round stops at `measured`.
        let fast = Reps { warmup: 0, settling: 0, measured: 4, minimum: 1, budget: Duration::from_secs(60) };
        let mut samples = Vec::new();
        time_into(fast, &mut samples, || Ok(())).unwrap();
        time_into(fast, &mut samples, || Ok(())).unwrap();
        assert_eq!(samples.len(), 8);
    }

    #[test]
    fn the_warm_up_goes_on_while_the_kernels_measure_their_choices() {
        use kernels::gemm::{View, matmul};
        // A shape of product no other test makes, large enough for the GEMM to split it over
        // threads: its class tries each place to run it for 10 calls, then keeps one.
        let (m, k, n) = (331, 77, 557);
        let (a, b) = (vec![0.5f32; m * k], vec![0.25f32; k * n]);
        let reps = Reps { warmup: 1, settling: 12, measured: 1, minimum: 1, budget: Duration::from_secs(60) };
        let (mut samples, mut calls) = (Vec::new(), 0);
        time_into(reps, &mut samples, || {
            calls += 1;
            assert_eq!(matmul(View::new(&a, m, k), View::new(&b, k, n))[0], 0.5 * 0.25 * k as f32);
            Ok(())
        })
        .unwrap();
        let chosen =
            kernels::tuning::gemm_choices().into_iter().find(|c| (c.class.m, c.class.k, c.class.n) == (m, k, n));
        match std::env::var(kernels::tuning::THREADS_VARIABLE).is_ok_and(|forced| !forced.is_empty()) {
            // Forced: nothing measures, nothing settles.
            true => assert_eq!((calls, chosen), (2, None)),
            // The class chose within the warm-up; the timed call ran its choice.
            false => {
                assert!(chosen.as_ref().is_some_and(|c| c.chosen.is_some()), "{chosen:?}");
                assert!((10..=14).contains(&calls), "{calls} calls");
            }
        }
    }
}
