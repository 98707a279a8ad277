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
//! This is [`Teacher::Lookup`], the first rung of the study's ladder; [`Teacher::FourHeads`]
//! (four interfering lookups) and [`Teacher::TwoHop`] (a lookup whose query is another lookup's
//! answer) are the harder ones, and `beta` and `noise_std` make any of them sharper or noisier.
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

/// The function the targets come from: the study's ladder of tasks (see [`teacher_row`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Teacher {
    /// Two lookups (the module docs): one attention layer with two heads represents it exactly.
    #[default]
    Lookup,
    /// Four lookups, one per target feature, each reading features the others use as queries,
    /// keys or values (`q = x[i]`, `k = x[i+1]`, `v = x[i+2]`, mod 4): the heads interfere.
    FourHeads,
    /// Head A's lookup, then a second lookup whose query is its result (`y_A[0]`) instead of
    /// an input feature: a two-hop read that one attention layer cannot represent.
    TwoHop,
}

impl Teacher {
    pub fn name(self) -> &'static str {
        match self {
            Teacher::Lookup => "lookup",
            Teacher::FourHeads => "four_heads",
            Teacher::TwoHop => "two_hop",
        }
    }
}

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
    /// The function of the inputs the targets are.
    pub teacher: Teacher,
}

impl Default for TaskConfig {
    fn default() -> Self {
        Self {
            seq_len: 136,
            seed: 20240611,
            train_size: 4096,
            valid_size: 512,
            test_size: 512,
            beta: 3.0,
            noise_std: 0.1,
            teacher: Teacher::Lookup,
        }
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
            let clean = teacher(self.teacher, &inputs, self.seq_len, self.beta);
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
            "{}-T{}-seed{}-n{}-{}-{}-b{beta:x}-s{noise:x}.safetensors",
            self.teacher.name(),
            self.seq_len,
            self.seed,
            self.train_size,
            self.valid_size,
            self.test_size
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
pub fn teacher(teacher: Teacher, x: &[f64], seq_len: usize, beta: f64) -> Vec<f64> {
    (0..seq_len).flat_map(|t| teacher_row(teacher, x, seq_len, beta, t)).collect()
}

/// One lookup of position `t`: `sum_s softmax_s(beta * q * x_s[key]) x_s[values]`.
fn lookup<const V: usize>(x: &[f64], seq_len: usize, beta: f64, q: f64, key: usize, values: [usize; V]) -> [f64; V] {
    let q = beta * q;
    let max = (0..seq_len).map(|s| q * x[s * INPUT_DIM + key]).fold(f64::NEG_INFINITY, f64::max);
    let mut total = 0.0;
    let mut acc = [0.0; V];
    for s in 0..seq_len {
        let p = (q * x[s * INPUT_DIM + key] - max).exp();
        total += p;
        for (a, &v) in acc.iter_mut().zip(&values) {
            *a += p * x[s * INPUT_DIM + v];
        }
    }
    acc.map(|a| a / total)
}

/// The noiseless target of position `t` of `x [T, 4]`.
pub fn teacher_row(teacher: Teacher, x: &[f64], seq_len: usize, beta: f64, t: usize) -> [f64; OUTPUT_DIM] {
    let feature = |i: usize| x[t * INPUT_DIM + i];
    match teacher {
        Teacher::Lookup | Teacher::TwoHop => {
            // (query feature, key feature, value features) of the two heads.
            let [a0, a1] = lookup(x, seq_len, beta, feature(0), 1, [2, 3]);
            let [b0, b1] = lookup(x, seq_len, beta, feature(1), 0, [3, 2]);
            match teacher {
                Teacher::TwoHop => {
                    // The second hop asks with head A's answer.
                    let [c0, c1] = lookup(x, seq_len, beta, a0, 1, [2, 3]);
                    [c0, c1, b0, b1]
                }
                _ => [a0, a1, b0, b1],
            }
        }
        Teacher::FourHeads => {
            std::array::from_fn(|i| lookup(x, seq_len, beta, feature(i), (i + 1) % 4, [(i + 2) % 4])[0])
        }
    }
}

/// Monte-Carlo estimate of the best loss a per-position model can reach,
/// `E_t[Var(y_t | x_t)] + noise_std^2`: for `queries` draws of one position, the variance of its
/// clean target over `contexts` draws of the other positions.
/// Remembered per task within a process: a study runs hundreds of runs on a few tasks.
pub fn per_position_floor(config: &TaskConfig, queries: usize, contexts: usize) -> f64 {
    use std::sync::Mutex;
    static KNOWN: Mutex<Vec<(TaskConfig, usize, usize, f64)>> = Mutex::new(Vec::new());
    // Only the teacher, its parameters and the data seed matter, not the split sizes.
    let key = TaskConfig { train_size: 0, valid_size: 0, test_size: 0, ..config.clone() };
    let mut known = KNOWN.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((.., floor)) = known.iter().find(|(k, q, c, _)| *k == key && *q == queries && *c == contexts) {
        return *floor;
    }
    let floor = estimate_per_position_floor(config, queries, contexts);
    known.push((key, queries, contexts, floor));
    floor
}

fn estimate_per_position_floor(config: &TaskConfig, queries: usize, contexts: usize) -> f64 {
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
            let y = teacher_row(config.teacher, &x, t, config.beta, 0);
            for j in 0..OUTPUT_DIM {
                sum[j] += y[j];
                sum_sq[j] += y[j] * y[j];
            }
        }
        let n = contexts as f64;
        total_variance += (0..OUTPUT_DIM).map(|j| sum_sq[j] / n - (sum[j] / n).powi(2)).sum::<f64>() * n
            / (n - 1.0)
            / OUTPUT_DIM as f64;
    }
    total_variance / queries as f64 + config.noise_std.powi(2)
}
