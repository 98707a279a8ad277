//! Benchmarks at the seed's shape: forward (inference) and a full training step (forward,
//! backward, optimizer) of the Keras-exact and the projected model, with the arithmetic floor
//! of each (its FLOPs over the machine's measured matrix-multiply rate).

use std::time::Instant;

use anyhow::Result;
use burn::module::Module;
use burn::optim::GradientsParams;
use burn::tensor::{Device, Distribution, Tensor};
use serde::Serialize;

use crate::loss::mse;
use crate::models::{ModelKind, ModelSpec, TaskModel};
use crate::optim::OptimizerConfig;

/// The benchmarked shape: `x [batch, seq_len, features]`, `heads` of `key_dim`.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Shape {
    pub batch: usize,
    pub seq_len: usize,
    pub features: usize,
    pub heads: usize,
    pub key_dim: usize,
}

impl Shape {
    /// The seed's shape: batch 32, 136 steps, 4 features, 6 heads of 4.
    pub const SEED: Shape = Shape { batch: 32, seq_len: 136, features: 4, heads: 6, key_dim: 4 };

    /// FLOPs of one forward pass (multiply-adds count 2; softmax counted as 5 per score).
    pub fn forward_flops(&self, model: ModelKind) -> f64 {
        let (b, t, d, e) = (self.batch as f64, self.seq_len as f64, self.features as f64, (self.heads * self.key_dim) as f64);
        let attention = 2.0 * 2.0 * b * t * t * e; // Q K^T and P V
        let softmax = 5.0 * b * self.heads as f64 * t * t;
        let projections = match model {
            // q, k, v: D -> E; output: E -> D.
            ModelKind::Keras => 2.0 * b * t * (3.0 * d * e + e * d),
            // proj: D -> E; q, k, v, out: E -> E; final: E -> D.
            ModelKind::Projected => 2.0 * b * t * (d * e + 4.0 * e * e + e * d),
            ModelKind::Baseline => 0.0,
        };
        attention + softmax + projections
    }

    /// FLOPs of a training step: the backward pass costs twice the forward.
    pub fn train_flops(&self, model: ModelKind) -> f64 {
        3.0 * self.forward_flops(model)
    }
}

/// Timing statistics in milliseconds.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Timing {
    pub median_ms: f64,
    pub p10_ms: f64,
    pub p90_ms: f64,
    pub samples_per_s: f64,
}

impl Timing {
    fn from_samples(mut ms: Vec<f64>, batch: usize) -> Self {
        ms.sort_by(f64::total_cmp);
        let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
        let median = at(0.5);
        Self { median_ms: median, p10_ms: at(0.1), p90_ms: at(0.9), samples_per_s: batch as f64 * 1000.0 / median }
    }
}

/// Repetitions of a measurement.
#[derive(Debug, Clone, Copy)]
pub struct Reps {
    pub warmup: usize,
    pub measured: usize,
}

fn model_spec(model: ModelKind, shape: Shape) -> ModelSpec {
    let mut config = crate::config::RunConfig::default();
    config.model.kind = model;
    config.model.num_heads = shape.heads;
    config.model.key_dim = shape.key_dim;
    config.model_spec()
}

fn time(reps: Reps, batch: usize, mut f: impl FnMut() -> Result<()>) -> Result<Timing> {
    for _ in 0..reps.warmup {
        f()?;
    }
    let mut samples = Vec::with_capacity(reps.measured);
    for _ in 0..reps.measured {
        let start = Instant::now();
        f()?;
        samples.push(start.elapsed().as_secs_f64() * 1000.0);
    }
    Ok(Timing::from_samples(samples, batch))
}

/// Inference: `model.forward(x)` without autodiff, the output read back to the host.
pub fn forward(model: ModelKind, shape: Shape, device: &Device, reps: Reps) -> Result<Timing> {
    device.seed(0);
    let net: TaskModel = model_spec(model, shape).init(device)?;
    let x = Tensor::<3>::random([shape.batch, shape.seq_len, shape.features], Distribution::Normal(0.0, 1.0), device);
    time(reps, shape.batch, || {
        let out = net.forward(x.clone(), None, false)?;
        out.sum().into_scalar::<f32>();
        Ok(())
    })
}

/// A training step: forward, MSE, backward, Keras Adam; the loss read back to the host.
pub fn train_step(model: ModelKind, shape: Shape, device: &Device, reps: Reps) -> Result<Timing> {
    let ad = device.clone().autodiff();
    ad.seed(0);
    let mut net: TaskModel = model_spec(model, shape).init(&ad)?;
    let mut optim = OptimizerConfig::default().init();
    let x = Tensor::<3>::random([shape.batch, shape.seq_len, shape.features], Distribution::Normal(0.0, 1.0), &ad);
    let y = Tensor::<3>::random([shape.batch, shape.seq_len, shape.features], Distribution::Normal(0.0, 1.0), &ad);
    time(reps, shape.batch, || {
        let loss = mse(net.forward(x.clone(), None, true)?, y.clone());
        loss.clone().into_scalar::<f32>();
        let grads = GradientsParams::from_grads(loss.backward(), &net);
        net = optim.step(1e-3, net.clone(), grads);
        Ok(())
    })
}

/// The measured float32 matrix-multiply rate (GFLOP/s) of `device`: a batch of `[B*h]` products
/// of the attention's own shape `[T, k] x [k, T]` and a square `[512, 512]` product; the larger.
pub fn matmul_gflops(device: &Device, reps: Reps) -> Result<f64> {
    let mut best: f64 = 0.0;
    for (batch, m, k, n) in [(1, 512, 512, 512), (32 * 6, 136, 136, 4)] {
        let a = Tensor::<3>::random([batch, m, k], Distribution::Normal(0.0, 1.0), device);
        let b = Tensor::<3>::random([batch, k, n], Distribution::Normal(0.0, 1.0), device);
        let timing = time(reps, 1, || {
            a.clone().matmul(b.clone()).sum().into_scalar::<f32>();
            Ok(())
        })?;
        best = best.max(2.0 * (batch * m * k * n) as f64 / (timing.median_ms * 1e6));
    }
    Ok(best)
}

/// Peak resident memory of this process so far (Linux `VmHWM`), in MB.
pub fn peak_rss_mb() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Parameter count of a model at `shape`.
pub fn parameters(model: ModelKind, shape: Shape) -> Result<usize> {
    Ok(model_spec(model, shape).init(&Device::flex())?.num_params())
}
