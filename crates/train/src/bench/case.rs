//! One benchmarked row: a shape, a mask and a model, with its FLOPs and its inputs.
//!
//! The Python reference (`xtask/python/bench_reference.py`) builds the same rows: the same
//! shapes, the same padding lengths ([`padding_lengths`]) and the same masks in each library's
//! own form.

use std::fmt;
use std::str::FromStr;

use anyhow::{Result, bail};
use burn::tensor::{Bool, Device, Tensor, TensorData};
use model::projected::ProjectedInput;
use model::torch_mha::AttnMask;
use model::{KerasMhaConfig, KerasMhaInput, ProjectedConfig};
use serde::Serialize;

use crate::models::{KerasSelfAttention, ModelKind, TaskModel};

/// `x [batch, seq_len, features]` through `heads` heads of `key_dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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

    /// The default sweep: the seed, and real models' widths and lengths.
    pub const SWEEP: [Shape; 4] = [
        Shape::SEED,
        Shape { batch: 8, seq_len: 512, features: 256, heads: 8, key_dim: 32 },
        Shape { batch: 4, seq_len: 1024, features: 512, heads: 8, key_dim: 64 },
        Shape { batch: 1, seq_len: 4096, features: 64, heads: 4, key_dim: 16 },
    ];

    /// Attention width `E = heads * key_dim` (the projected model's embedding).
    pub fn width(&self) -> usize {
        self.heads * self.key_dim
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{},{},{}x{}", self.batch, self.seq_len, self.features, self.heads, self.key_dim)
    }
}

impl FromStr for Shape {
    type Err = anyhow::Error;

    /// `B,T,D,H,K`, e.g. `32,136,4,6,4`.
    fn from_str(s: &str) -> Result<Self> {
        let parts: Vec<usize> =
            s.split(',').map(|p| p.trim().parse::<usize>()).collect::<Result<_, _>>().unwrap_or_default();
        match parts[..] {
            [batch, seq_len, features, heads, key_dim] if parts.iter().all(|&p| p > 0) => {
                Ok(Shape { batch, seq_len, features, heads, key_dim })
            }
            _ => bail!(
                "--shape {s:?}: expected B,T,D,H,K (batch, sequence length, features, heads, key_dim), five positive integers"
            ),
        }
    }
}

/// The mask a row's calls carry, in each model's own form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MaskKind {
    None,
    /// Keras `use_causal_mask=True`; torch a boolean `attn_mask [T, S]`, true above the diagonal.
    Causal,
    /// Sequences of [`padding_lengths`]: Keras an `attention_mask [B, T, S]`, torch a
    /// `key_padding_mask [B, S]`.
    Padding,
}

impl MaskKind {
    pub const ALL: [MaskKind; 3] = [MaskKind::None, MaskKind::Causal, MaskKind::Padding];

    pub fn name(self) -> &'static str {
        match self {
            MaskKind::None => "none",
            MaskKind::Causal => "causal",
            MaskKind::Padding => "padding",
        }
    }

    /// The fraction of (query, key) pairs the mask allows at `shape`.
    pub fn density(self, shape: Shape) -> f64 {
        let t = shape.seq_len as f64;
        match self {
            MaskKind::None => 1.0,
            MaskKind::Causal => (t + 1.0) / (2.0 * t),
            MaskKind::Padding => padding_lengths(shape).iter().sum::<usize>() as f64 / (shape.batch as f64 * t),
        }
    }
}

impl FromStr for MaskKind {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match Self::ALL.into_iter().find(|m| m.name() == s) {
            Some(mask) => Ok(mask),
            None => bail!("--mask {s:?}: expected none, causal or padding"),
        }
    }
}

impl fmt::Display for MaskKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which call of the layer a row makes: the plain call, or one of those that ask for more of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CallKind {
    /// The layer's default call (Keras `layer(x, x)`, torch `need_weights=False`).
    Plain,
    /// The attention probabilities returned as well: Keras `return_attention_scores=True`,
    /// torch `need_weights=True` (head-averaged); the loss still reads the output only.
    Scores,
    /// The layer built with `dropout = 0.1` on the probabilities, active in the training step.
    Dropout,
}

impl CallKind {
    pub const ALL: [CallKind; 3] = [CallKind::Plain, CallKind::Scores, CallKind::Dropout];

    /// The probability of dropping an attention probability in a `dropout` row.
    pub const DROPOUT_RATE: f64 = 0.1;

    pub fn name(self) -> &'static str {
        match self {
            CallKind::Plain => "plain",
            CallKind::Scores => "scores",
            CallKind::Dropout => "dropout",
        }
    }

    fn dropout(self) -> f64 {
        if self == CallKind::Dropout { Self::DROPOUT_RATE } else { 0.0 }
    }
}

impl FromStr for CallKind {
    type Err = anyhow::Error;

    fn from_str(s: &str) -> Result<Self> {
        match Self::ALL.into_iter().find(|c| c.name() == s) {
            Some(call) => Ok(call),
            None => bail!("--call {s:?}: expected plain, scores or dropout"),
        }
    }
}

impl fmt::Display for CallKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The valid length of each sequence of a padded batch: from `T - T/(4B)` for the first down to
/// `3T/4` for the last, so that every batch element is padded differently.
pub fn padding_lengths(shape: Shape) -> Vec<usize> {
    let (b, t) = (shape.batch, shape.seq_len);
    (0..b).map(|i| (t - t * (i + 1) / (4 * b)).max(1)).collect()
}

/// One row of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Case {
    pub shape: Shape,
    pub mask: MaskKind,
    pub model: ModelKind,
    pub call: CallKind,
}

impl Case {
    /// FLOPs of one forward pass: multiply-adds count 2, the softmax 5 per score, and only the
    /// (query, key) pairs the mask allows (what a kernel that skips blocked tiles must compute).
    pub fn forward_flops(&self) -> f64 {
        let s = self.shape;
        let (b, t, d, e) = (s.batch as f64, s.seq_len as f64, s.features as f64, s.width() as f64);
        let pairs = b * t * t * self.mask.density(s);
        let attention = 2.0 * 2.0 * pairs * e + 5.0 * pairs * s.heads as f64; // Q Kᵀ, P V, softmax
        let projections = match self.model {
            // q, k, v: D -> E; output: E -> D.
            ModelKind::Keras => 2.0 * b * t * (3.0 * d * e + e * d),
            // proj: D -> E; q, k, v, out: E -> E; final: E -> D.
            ModelKind::Projected => 2.0 * b * t * (d * e + 4.0 * e * e + e * d),
            ModelKind::Baseline => 0.0,
        };
        attention + projections
    }

    /// FLOPs of a training step as the layers compute it one by one, the backward pass at twice
    /// the forward: the same count for both sides of a row. The projected model's pairs of layers
    /// in a row ([`kernels::linear_after`]) do fewer where the rows outnumber the widths, so its
    /// step can come closer to this floor than the products alone would allow.
    pub fn train_flops(&self) -> f64 {
        3.0 * self.forward_flops()
    }

    /// The model of this row with its library's default initialisation (seeded by `device`).
    pub fn init(&self, device: &Device) -> Result<TaskModel> {
        let s = self.shape;
        Ok(match self.model {
            ModelKind::Keras => TaskModel::Keras(KerasSelfAttention {
                layer: KerasMhaConfig::new(s.heads, s.key_dim, s.features)
                    .with_dropout(self.call.dropout())
                    .init(device)?,
                use_causal_mask: self.mask == MaskKind::Causal,
            }),
            ModelKind::Projected => {
                let config = ProjectedConfig::new(s.features, s.width(), s.heads)
                    .with_output_dim(Some(s.features))
                    .with_dropout(self.call.dropout());
                TaskModel::Projected(config.init(device)?)
            }
            ModelKind::Baseline => bail!("the benchmark measures the attention models, not the baseline"),
        })
    }

    /// The masks of this row on `device`, made once and reused by every call.
    pub fn masks(&self, device: &Device) -> Masks {
        let s = self.shape;
        let (b, t) = (s.batch, s.seq_len);
        match (self.mask, self.model) {
            (MaskKind::Padding, ModelKind::Keras) => {
                let lengths = padding_lengths(s);
                let allowed: Vec<bool> = (0..b * t * t).map(|i| i % t < lengths[i / (t * t)]).collect();
                Masks {
                    attention_mask: Some(Tensor::from_data(TensorData::new(allowed, [b, t, t]), device)),
                    ..Masks::default()
                }
            }
            (MaskKind::Padding, _) => {
                let lengths = padding_lengths(s);
                let ignored: Vec<bool> = (0..b * t).map(|i| i % t >= lengths[i / t]).collect();
                Masks {
                    key_padding_mask: Some(Tensor::from_data(TensorData::new(ignored, [b, t]), device)),
                    ..Masks::default()
                }
            }
            (MaskKind::Causal, ModelKind::Projected) => {
                let blocked: Vec<bool> = (0..t * t).map(|i| i % t > i / t).collect();
                Masks {
                    attn_mask: Some(Tensor::from_data(TensorData::new(blocked, [t, t]), device)),
                    ..Masks::default()
                }
            }
            // Keras' causal rule is the layer's flag (see `init`).
            _ => Masks::default(),
        }
    }
}

/// A row's masks as its model takes them.
#[derive(Debug, Clone, Default)]
pub struct Masks {
    /// Keras `attention_mask [B, T, S]`, true = may attend.
    attention_mask: Option<Tensor<3, Bool>>,
    /// torch `key_padding_mask [B, S]`, true = ignore.
    key_padding_mask: Option<Tensor<2, Bool>>,
    /// torch boolean `attn_mask [T, S]`, true = blocked.
    attn_mask: Option<Tensor<2, Bool>>,
}

/// `model(x)` with the row's masks, as the row's call makes it; the output only.
pub fn call(model: &TaskModel, x: Tensor<3>, masks: &Masks, call: CallKind, training: bool) -> Result<Tensor<3>> {
    let scores = call == CallKind::Scores;
    Ok(match model {
        TaskModel::Keras(m) => {
            let mut input = KerasMhaInput::self_attention(x)
                .use_causal_mask(m.use_causal_mask)
                .training(training)
                .return_attention_scores(scores);
            input.attention_mask = masks.attention_mask.clone();
            m.layer.forward(input)?.output
        }
        TaskModel::Projected(m) => {
            let mut input = ProjectedInput::new(x).training(training).need_weights(scores);
            input.key_padding_mask = masks.key_padding_mask.clone();
            input.attn_mask = masks.attn_mask.clone().map(AttnMask::bool_2d);
            m.forward(input)?.output
        }
        TaskModel::Baseline(_) => bail!("the benchmark measures the attention models"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_parse_and_bad_ones_say_what_is_expected() {
        assert_eq!("32,136,4,6,4".parse::<Shape>().unwrap(), Shape::SEED);
        assert_eq!(Shape::SEED.to_string(), "32,136,4,6x4");
        for bad in ["32,136,4,6", "a,b,c,d,e", "32,0,4,6,4"] {
            let error = bad.parse::<Shape>().unwrap_err().to_string();
            assert!(error.contains(bad) && error.contains("B,T,D,H,K"), "{error}");
        }
        assert!("diagonal".parse::<MaskKind>().unwrap_err().to_string().contains("none, causal or padding"));
        assert_eq!("scores".parse::<CallKind>().unwrap(), CallKind::Scores);
        assert!("weights".parse::<CallKind>().unwrap_err().to_string().contains("plain, scores or dropout"));
    }

    #[test]
    fn padding_lengths_differ_and_stay_within_the_sequence() {
        let shape = Shape { batch: 4, seq_len: 100, features: 1, heads: 1, key_dim: 1 };
        assert_eq!(padding_lengths(shape), vec![94, 88, 82, 75]);
        assert_eq!(padding_lengths(Shape { batch: 1, ..shape }), vec![75]);
        assert!((MaskKind::Padding.density(shape) - 339.0 / 400.0).abs() < 1e-12);
    }
}
