//! The synthetic task: content-addressed lookup over sequences of 136 positions with 4 features.
//!
//! Every position `t` holds `x_t ~ N(0, I_4)`. Two lookups read other positions by content:
//!
//! ```text
//! head A: p_A(t, s) = softmax_s(beta * x_t[0] * x_s[1])     y_t[0..2] = sum_s p_A(t, s) (x_s[2], x_s[3])
//! head B: p_B(t, s) = softmax_s(beta * x_t[1] * x_s[0])     y_t[2..4] = sum_s p_B(t, s) (x_s[3], x_s[2])
//! target  = y_t + noise_std * N(0, I_4)
//! ```
//!
//! Position `t` asks, with its feature 0 (head A) or 1 (head B), for the positions whose feature
//! 1 (or 0) answers most strongly, and recalls their features 2 and 3. The answer depends on the
//! whole sequence, so a model that sees one position at a time can only learn `E[target | x_t]`;
//! one attention layer with two heads can represent the teacher exactly.
//!
//! Floors (per-element MSE): the Bayes floor is `noise_std^2` (the teacher is deterministic);
//! the per-position floor is `E[Var(y_t | x_t)] + noise_std^2`, estimated by Monte Carlo in
//! [`per_position_floor`].

use std::path::{Path, PathBuf};

use model::{HostTensor, TensorFile, WeightMap};
use serde::{Deserialize, Serialize};

use crate::rng::Rng;

/// Features per position.
pub const INPUT_DIM: usize = 4;
/// Targets per position.
pub const OUTPUT_DIM: usize = 4;

/// The task's parameters (`[task]` in a config).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TaskConfig {
    /// Positions per sequence.
    pub seq_len: usize,
    /// Seed of the data; each sequence is drawn from `(seed, split, index)`, so a split does not
    /// change when another split's size does.
    pub seed: u64,
    pub train_size: usize,
    pub valid_size: usize,
    pub test_size: usize,
    /// Sharpness `beta` of the teacher's lookups.
    pub beta: f64,
    /// Standard deviation of the target noise.
    pub noise_std: f64,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self { seq_len: 136, seed: 20240611, train_size: 4096, valid_size: 512, test_size: 512, beta: 3.0, noise_std: 0.1 }
    }
}

/// One split: `x [n, T, 4]` and `y [n, T, 4]`, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct Split {
    pub x: Vec<f32>,
    pub y: Vec<f32>,
    pub len: usize,
    pub seq_len: usize,
}

impl Split {
    /// The sequences at `indices`, stacked: `([B, T, 4], [B, T, 4])` as host tensors.
    pub fn gather(&self, indices: &[usize]) -> (HostTensor, HostTensor) {
        let (xs, ys) = (self.seq_len * INPUT_DIM, self.seq_len * OUTPUT_DIM);
        let x = indices.iter().flat_map(|&i| self.x[i * xs..(i + 1) * xs].iter().copied()).collect();
        let y = indices.iter().flat_map(|&i| self.y[i * ys..(i + 1) * ys].iter().copied()).collect();
        let b = indices.len();
        (HostTensor::new(vec![b, self.seq_len, INPUT_DIM], x), HostTensor::new(vec![b, self.seq_len, OUTPUT_DIM], y))
    }
}

/// The three splits.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskData {
    pub train: Split,
    pub valid: Split,
    pub test: Split,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitName {
    Train = 0,
    Valid = 1,
    Test = 2,
}

impl TaskConfig {
    pub fn validate(&self) -> Result<(), (&'static str, String, &'static str)> {
        let positive = |field, v: usize| if v > 0 { Ok(()) } else { Err((field, v.to_string(), "must be at least 1")) };
        positive("seq_len", self.seq_len)?;
        positive("train_size", self.train_size)?;
        positive("valid_size", self.valid_size)?;
        positive("test_size", self.test_size)?;
        if !(self.beta.is_finite() && self.beta >= 0.0) {
            return Err(("beta", self.beta.to_string(), "must be a finite number >= 0"));
        }
        if !(self.noise_std.is_finite() && self.noise_std >= 0.0) {
            return Err(("noise_std", self.noise_std.to_string(), "must be a finite number >= 0"));
        }
        Ok(())
    }

    /// Draws the inputs of sequence `index` of `split`: `[T, 4]`.
    fn inputs(&self, split: SplitName, index: usize) -> Vec<f64> {
        let mut rng = Rng::from_parts(&[self.seed, split as u64, index as u64]);
        (0..self.seq_len * INPUT_DIM).map(|_| rng.normal()).collect()
    }

    fn split(&self, name: SplitName, len: usize) -> Split {
        let mut x = Vec::with_capacity(len * self.seq_len * INPUT_DIM);
        let mut y = Vec::with_capacity(len * self.seq_len * OUTPUT_DIM);
        for index in 0..len {
            let inputs = self.inputs(name, index);
            let clean = teacher(&inputs, self.seq_len, self.beta);
            let mut noise = Rng::from_parts(&[self.seed, name as u64, index as u64, 1]);
            x.extend(inputs.iter().map(|&v| v as f32));
            y.extend(clean.iter().map(|&v| (v + self.noise_std * noise.normal()) as f32));
        }
        Split { x, y, len, seq_len: self.seq_len }
    }

    /// Generates all three splits.
    pub fn generate(&self) -> TaskData {
        TaskData {
            train: self.split(SplitName::Train, self.train_size),
            valid: self.split(SplitName::Valid, self.valid_size),
            test: self.split(SplitName::Test, self.test_size),
        }
    }

    /// The cache file of this config under `dir`.
    pub fn cache_path(&self, dir: &Path) -> PathBuf {
        let beta = self.beta.to_bits();
        let noise = self.noise_std.to_bits();
        dir.join(format!(
            "lookup-T{}-seed{}-n{}-{}-{}-b{beta:x}-s{noise:x}.safetensors",
            self.seq_len, self.seed, self.train_size, self.valid_size, self.test_size
        ))
    }

    /// The data, from the cache under `dir` when it is there, generated (and cached) otherwise.
    pub fn load_or_generate(&self, dir: &Path) -> model::Result<TaskData> {
        let path = self.cache_path(dir);
        if path.exists() {
            let file = TensorFile::read(&path)?;
            let split = |name: &str, len: usize| -> model::Result<Split> {
                let x = file.tensors.expect(&format!("{name}.x"), &[len, self.seq_len, INPUT_DIM])?.data.clone();
                let y = file.tensors.expect(&format!("{name}.y"), &[len, self.seq_len, OUTPUT_DIM])?.data.clone();
                Ok(Split { x, y, len, seq_len: self.seq_len })
            };
            return Ok(TaskData {
                train: split("train", self.train_size)?,
                valid: split("valid", self.valid_size)?,
                test: split("test", self.test_size)?,
            });
        }
        let data = self.generate();
        let mut tensors = WeightMap::new();
        for (name, s) in [("train", &data.train), ("valid", &data.valid), ("test", &data.test)] {
            tensors.insert(format!("{name}.x"), HostTensor::new(vec![s.len, s.seq_len, INPUT_DIM], s.x.clone()));
            tensors.insert(format!("{name}.y"), HostTensor::new(vec![s.len, s.seq_len, OUTPUT_DIM], s.y.clone()));
        }
        let metadata = [("task".to_string(), serde_json::to_string(self).expect("the task config serialises"))].into();
        TensorFile { tensors, metadata }.write(&path)?;
        Ok(data)
    }
}

/// The noiseless targets of one sequence `x [T, 4]`: `[T, 4]`, in float64.
pub fn teacher(x: &[f64], seq_len: usize, beta: f64) -> Vec<f64> {
    (0..seq_len).flat_map(|t| teacher_row(x, seq_len, beta, t)).collect()
}

/// The noiseless target of position `t` of `x [T, 4]`.
pub fn teacher_row(x: &[f64], seq_len: usize, beta: f64, t: usize) -> [f64; OUTPUT_DIM] {
    let mut y = [0.0; OUTPUT_DIM];
    // (query feature, key feature, value features, output offset) of the two heads.
    let heads = [(0, 1, [2, 3], 0), (1, 0, [3, 2], 2)];
    for (query, key, values, offset) in heads {
        let q = beta * x[t * INPUT_DIM + query];
        let max = (0..seq_len).map(|s| q * x[s * INPUT_DIM + key]).fold(f64::NEG_INFINITY, f64::max);
        let mut total = 0.0;
        let mut acc = [0.0; 2];
        for s in 0..seq_len {
            let p = (q * x[s * INPUT_DIM + key] - max).exp();
            total += p;
            for (a, &v) in acc.iter_mut().zip(&values) {
                *a += p * x[s * INPUT_DIM + v];
            }
        }
        y[offset] = acc[0] / total;
        y[offset + 1] = acc[1] / total;
    }
    y
}

/// Monte-Carlo estimate of the best loss a per-position model can reach,
/// `E_t[Var(y_t | x_t)] + noise_std^2`: for `queries` draws of one position, the variance of its
/// clean target over `contexts` draws of the other positions.
pub fn per_position_floor(config: &TaskConfig, queries: usize, contexts: usize) -> f64 {
    let t = config.seq_len;
    let mut rng = Rng::from_parts(&[config.seed, 99]);
    let mut total_variance = 0.0;
    for _ in 0..queries {
        let query: Vec<f64> = (0..INPUT_DIM).map(|_| rng.normal()).collect();
        let mut sum = [0.0; OUTPUT_DIM];
        let mut sum_sq = [0.0; OUTPUT_DIM];
        for _ in 0..contexts {
            let mut x: Vec<f64> = (0..t * INPUT_DIM).map(|_| rng.normal()).collect();
            x[..INPUT_DIM].copy_from_slice(&query);
            let y = teacher_row(&x, t, config.beta, 0);
            for j in 0..OUTPUT_DIM {
                sum[j] += y[j];
                sum_sq[j] += y[j] * y[j];
            }
        }
        let n = contexts as f64;
        total_variance += (0..OUTPUT_DIM).map(|j| sum_sq[j] / n - (sum[j] / n).powi(2)).sum::<f64>() * n / (n - 1.0) / OUTPUT_DIM as f64;
    }
    total_variance / queries as f64 + config.noise_std.powi(2)
}
