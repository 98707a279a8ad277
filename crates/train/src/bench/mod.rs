//! Benchmarks: the forward pass (inference) and a full training step (forward, MSE, backward,
//! Keras Adam) of the Keras-exact layer and the projected port, at any shape and mask
//! ([`Case`]), with each row's arithmetic floor from the cores' measured FMA peak ([`peak`]).

pub mod case;
pub mod peak;

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
    fn from_samples(mut ms: Vec<f64>, batch: usize) -> Self {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
        let median = at(0.5);
        Self { median_ms: median, p10_ms: at(0.1), p90_ms: at(0.9), reps: ms.len(), samples_per_s: batch as f64 * 1000.0 / median }
    }
}

/// Repetitions of a measurement: `warmup` untimed, then up to `measured` timed ones, fewer
/// (but at least 3) once `budget` is spent, so that large rows do not take minutes each.
#[derive(Debug, Clone, Copy)]
pub struct Reps {
    pub warmup: usize,
    pub measured: usize,
    pub budget: Duration,
}

impl Reps {
    /// A measurement: up to 10 warm-up calls (stopping after 1.5 s), up to 50 timed ones in 3 s.
    pub const FULL: Reps = Reps { warmup: 10, measured: 50, budget: Duration::from_secs(3) };
    /// A check that the benchmark works, not a measurement.
    pub const QUICK: Reps = Reps { warmup: 1, measured: 3, budget: Duration::from_millis(200) };
}

fn time(reps: Reps, batch: usize, mut f: impl FnMut() -> Result<()>) -> Result<Timing> {
    let start = Instant::now();
    for _ in 0..reps.warmup {
        f()?;
        if start.elapsed() > reps.budget / 2 {
            break;
        }
    }
    let start = Instant::now();
    let mut samples = Vec::with_capacity(reps.measured);
    while samples.len() < reps.measured && (samples.len() < 3 || start.elapsed() < reps.budget) {
        let call = Instant::now();
        f()?;
        samples.push(call.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(Timing::from_samples(samples, batch))
}

/// Inference: the row's model without autodiff, its output read back to the host.
pub fn forward(case: Case, device: &Device, reps: Reps) -> Result<Timing> {
    device.seed(0);
    let net = case.init(device)?;
    let masks = case.masks(device);
    let s = case.shape;
    let x = Tensor::<3>::random([s.batch, s.seq_len, s.features], Distribution::Normal(0.0, 1.0), device);
    time(reps, s.batch, || {
        let out = case::call(&net, x.clone(), &masks, case.call, false)?;
        out.sum().into_scalar::<f32>();
        Ok(())
    })
}

/// A training step: forward, MSE, backward, Keras Adam; the loss read back to the host.
pub fn train_step(case: Case, device: &Device, reps: Reps) -> Result<Timing> {
    let ad = device.clone().autodiff();
    ad.seed(0);
    let mut net = case.init(&ad)?;
    let masks = case.masks(&ad);
    let mut optim = OptimizerConfig::default().init();
    let s = case.shape;
    let x = Tensor::<3>::random([s.batch, s.seq_len, s.features], Distribution::Normal(0.0, 1.0), &ad);
    let y = Tensor::<3>::random([s.batch, s.seq_len, s.features], Distribution::Normal(0.0, 1.0), &ad);
    time(reps, s.batch, || {
        let loss = mse(case::call(&net, x.clone(), &masks, case.call, true)?, y.clone());
        loss.clone().into_scalar::<f32>();
        let grads = GradientsParams::from_grads(loss.backward(), &net);
        net = optim.step(1e-3, net.clone(), grads);
        Ok(())
    })
}

/// Peak resident memory of this process so far (Linux `VmHWM`), in MB.
pub fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Parameter count of a row's model.
pub fn parameters(case: Case) -> Result<usize> {
    Ok(case.init(&Device::flex())?.num_params())
}
