//! Keras' initializers by name (`kernel_initializer`, `bias_initializer`), drawn on the host.
//!
//! The distributions are Keras 3.15's (`keras/src/initializers`); the random numbers are this
//! crate's ([`Rng`]), since TensorFlow's generator cannot be reproduced. Keras' seeding rule is
//! kept: an initializer with a seed is stateless, so every call on the same shape returns the same
//! numbers (a seeded `MultiHeadAttention` gets identical query and key kernels when their shapes
//! agree, as in Keras); without a seed each call draws afresh.
//!
//! The fans of an `EinsumDense` kernel are its input and output axes (Keras 3.15 passes
//! `input_axes` / `output_axes` to every `VarianceScaling` kernel initializer): `(Dq, h, k)` has
//! `fan_in = Dq`, `fan_out = h k`, and `(h, v, O)` has `fan_in = h v`, `fan_out = O`. A bias
//! initializer gets no axes and uses Keras' `compute_fans` of the bias shape.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::error::{ModelError, Result};
use crate::rng::Rng;

/// Keras' `VarianceScaling` modes: which fan divides the scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FanMode {
    FanIn,
    FanOut,
    FanAvg,
}

/// Keras' `VarianceScaling` distributions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScalingDistribution {
    /// A normal truncated at two standard deviations, its scale corrected for the truncation.
    TruncatedNormal,
    UntruncatedNormal,
    Uniform,
}

/// One of Keras' initializers, with its arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum Distribution {
    VarianceScaling { scale: f64, mode: FanMode, distribution: ScalingDistribution },
    RandomNormal { mean: f64, stddev: f64 },
    RandomUniform { minval: f64, maxval: f64 },
    TruncatedNormal { mean: f64, stddev: f64 },
    Constant { value: f64 },
}

/// A Keras initializer: its distribution and its `seed`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Value", into = "Value")]
pub struct KerasInitializer {
    pub distribution: Distribution,
    /// Keras' `seed`: `Some` makes every draw of a shape the same numbers.
    pub seed: Option<u64>,
}

/// `truncated_normal` stddev correction: the stddev of a unit normal truncated at ±2.
#[allow(clippy::excessive_precision)] // Keras' constant, digit for digit as Keras writes it.
const TRUNCATION_STDDEV: f64 = 0.879_625_661_034_239_78;

impl KerasInitializer {
    pub fn glorot_uniform() -> Self {
        Self::scaling(1.0, FanMode::FanAvg, ScalingDistribution::Uniform)
    }

    pub fn zeros() -> Self {
        Self { distribution: Distribution::Constant { value: 0.0 }, seed: None }
    }

    fn scaling(scale: f64, mode: FanMode, distribution: ScalingDistribution) -> Self {
        Self { distribution: Distribution::VarianceScaling { scale, mode, distribution }, seed: None }
    }

    pub fn with_seed(mut self, seed: Option<u64>) -> Self {
        self.seed = seed;
        self
    }

    /// The initializer Keras' `initializers.get(name)` returns: a snake-case alias
    /// (`"he_normal"`) or a class name (`"HeNormal"`), with Keras' default arguments.
    pub fn from_name(name: &str) -> Result<Self> {
        Self::from_class(name, &Value::Object(Default::default()))
    }

    /// From Keras' serialized form: a name, or `{"class_name": ..., "config": {...}}` as
    /// `config.json` holds it.
    pub fn from_keras(value: &Value) -> Result<Self> {
        match value {
            Value::String(name) => Self::from_name(name),
            Value::Object(map) => {
                let class =
                    map.get("class_name").and_then(Value::as_str).ok_or_else(|| bad(value, "no `class_name`"))?;
                Self::from_class(class, map.get("config").unwrap_or(&Value::Null))
            }
            other => Err(bad(other, "expected a name or {\"class_name\": ..., \"config\": {...}}")),
        }
    }

    fn from_class(class: &str, config: &Value) -> Result<Self> {
        use ScalingDistribution::*;
        let number = |key: &str, default: f64| -> Result<f64> {
            match config.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(v) => v.as_f64().ok_or_else(|| bad(config, &format!("`{key}` = {v} is not a number"))),
            }
        };
        let key: String = class.chars().filter(|c| *c != '_').flat_map(char::to_lowercase).collect();
        let initializer = match key.as_str() {
            "glorotuniform" => Self::glorot_uniform(),
            "glorotnormal" => Self::scaling(1.0, FanMode::FanAvg, TruncatedNormal),
            "heuniform" => Self::scaling(2.0, FanMode::FanIn, Uniform),
            "henormal" => Self::scaling(2.0, FanMode::FanIn, TruncatedNormal),
            "lecununiform" => Self::scaling(1.0, FanMode::FanIn, Uniform),
            "lecunnormal" => Self::scaling(1.0, FanMode::FanIn, TruncatedNormal),
            "variancescaling" => {
                let text =
                    |key: &str, default: &str| config.get(key).and_then(Value::as_str).unwrap_or(default).to_string();
                let mode = serde_json::from_value(json!(text("mode", "fan_in")))
                    .map_err(|_| bad(config, "`mode` must be fan_in, fan_out or fan_avg"))?;
                let distribution = match text("distribution", "truncated_normal").as_str() {
                    "normal" => TruncatedNormal, // Keras' alias
                    other => serde_json::from_value(json!(other)).map_err(|_| {
                        bad(config, "`distribution` must be truncated_normal, untruncated_normal or uniform")
                    })?,
                };
                let scale = number("scale", 1.0)?;
                if scale <= 0.0 {
                    return Err(bad(config, "`scale` must be positive"));
                }
                Self::scaling(scale, mode, distribution)
            }
            "randomnormal" | "normal" => Self {
                distribution: Distribution::RandomNormal {
                    mean: number("mean", 0.0)?,
                    stddev: number("stddev", 0.05)?,
                },
                seed: None,
            },
            "randomuniform" | "uniform" => Self {
                distribution: Distribution::RandomUniform {
                    minval: number("minval", -0.05)?,
                    maxval: number("maxval", 0.05)?,
                },
                seed: None,
            },
            "truncatednormal" => Self {
                distribution: Distribution::TruncatedNormal {
                    mean: number("mean", 0.0)?,
                    stddev: number("stddev", 0.05)?,
                },
                seed: None,
            },
            "zeros" | "zero" => Self::zeros(),
            "ones" | "one" => Self { distribution: Distribution::Constant { value: 1.0 }, seed: None },
            "constant" => Self { distribution: Distribution::Constant { value: number("value", 0.0)? }, seed: None },
            _ => {
                return Err(ModelError::config(
                    "initializer",
                    class,
                    "not supported: one of the Glorot, He and LeCun families (uniform, normal), variance_scaling, random_normal, random_uniform, truncated_normal, zeros, ones, constant",
                ));
            }
        };
        let seed = match config.get("seed") {
            None | Some(Value::Null) => None,
            Some(v) => {
                Some(v.as_u64().ok_or_else(|| bad(config, &format!("`seed` = {v} is not a non-negative integer")))?)
            }
        };
        Ok(initializer.with_seed(seed))
    }

    /// Keras' class name for this initializer and its config, as `config.json` holds them.
    pub fn to_keras(&self) -> Value {
        let (class, mut config) = match &self.distribution {
            Distribution::VarianceScaling { scale, mode, distribution } => {
                let named = [
                    ("GlorotUniform", 1.0, FanMode::FanAvg, ScalingDistribution::Uniform),
                    ("GlorotNormal", 1.0, FanMode::FanAvg, ScalingDistribution::TruncatedNormal),
                    ("HeUniform", 2.0, FanMode::FanIn, ScalingDistribution::Uniform),
                    ("HeNormal", 2.0, FanMode::FanIn, ScalingDistribution::TruncatedNormal),
                    ("LecunUniform", 1.0, FanMode::FanIn, ScalingDistribution::Uniform),
                    ("LecunNormal", 1.0, FanMode::FanIn, ScalingDistribution::TruncatedNormal),
                ];
                match named.iter().find(|(_, s, m, d)| s == scale && m == mode && d == distribution) {
                    Some((class, ..)) => (*class, json!({ "input_axes": null, "output_axes": null })),
                    None => (
                        "VarianceScaling",
                        json!({ "scale": scale, "mode": mode, "distribution": distribution, "input_axes": null, "output_axes": null }),
                    ),
                }
            }
            Distribution::RandomNormal { mean, stddev } => ("RandomNormal", json!({ "mean": mean, "stddev": stddev })),
            Distribution::RandomUniform { minval, maxval } => {
                ("RandomUniform", json!({ "minval": minval, "maxval": maxval }))
            }
            Distribution::TruncatedNormal { mean, stddev } => {
                ("TruncatedNormal", json!({ "mean": mean, "stddev": stddev }))
            }
            Distribution::Constant { value } if *value == 0.0 => ("Zeros", json!({})),
            Distribution::Constant { value } if *value == 1.0 => ("Ones", json!({})),
            Distribution::Constant { value } => ("Constant", json!({ "value": value })),
        };
        if !matches!(self.distribution, Distribution::Constant { .. }) {
            config["seed"] = json!(self.seed);
        }
        json!({ "module": "keras.initializers", "class_name": class, "config": config, "registered_name": null })
    }

    /// Draws a tensor of `shape` (row-major) whose fans are `fans` (see the module docs).
    /// `fresh_seed` is used when the initializer has no seed.
    pub fn sample(&self, shape: &[usize], (fan_in, fan_out): (usize, usize), fresh_seed: u64) -> Vec<f32> {
        let n: usize = shape.iter().product();
        // A seeded initializer's draw depends on the seed and the shape only.
        let mut parts = vec![self.seed.unwrap_or(fresh_seed), self.seed.is_some() as u64];
        parts.extend(shape.iter().map(|&d| d as u64));
        let mut rng = Rng::from_parts(&parts);
        let mut truncated = |mean: f64, stddev: f64| loop {
            let z = rng.normal();
            if z.abs() <= 2.0 {
                break (mean + stddev * z) as f32;
            }
        };
        match self.distribution {
            Distribution::Constant { value } => vec![value as f32; n],
            Distribution::TruncatedNormal { mean, stddev } => (0..n).map(|_| truncated(mean, stddev)).collect(),
            Distribution::RandomNormal { mean, stddev } => {
                (0..n).map(|_| (mean + stddev * rng.normal()) as f32).collect()
            }
            Distribution::RandomUniform { minval, maxval } => {
                (0..n).map(|_| (minval + (maxval - minval) * rng.uniform()) as f32).collect()
            }
            Distribution::VarianceScaling { scale, mode, distribution } => {
                let fan = match mode {
                    FanMode::FanIn => fan_in as f64,
                    FanMode::FanOut => fan_out as f64,
                    FanMode::FanAvg => (fan_in + fan_out) as f64 / 2.0,
                };
                let scale = scale / fan.max(1.0);
                match distribution {
                    ScalingDistribution::TruncatedNormal => {
                        (0..n).map(|_| truncated(0.0, scale.sqrt() / TRUNCATION_STDDEV)).collect()
                    }
                    ScalingDistribution::UntruncatedNormal => {
                        (0..n).map(|_| (scale.sqrt() * rng.normal()) as f32).collect()
                    }
                    ScalingDistribution::Uniform => {
                        let limit = (3.0 * scale).sqrt();
                        (0..n).map(|_| (limit * (2.0 * rng.uniform() - 1.0)) as f32).collect()
                    }
                }
            }
        }
    }
}

impl TryFrom<Value> for KerasInitializer {
    type Error = ModelError;

    fn try_from(value: Value) -> Result<Self> {
        Self::from_keras(&value)
    }
}

impl From<KerasInitializer> for Value {
    fn from(initializer: KerasInitializer) -> Self {
        let mut keras = initializer.to_keras();
        // Only class_name and config: nulls do not survive TOML.
        let mut config = keras["config"].take();
        if let Some(map) = config.as_object_mut() {
            map.retain(|_, v| !v.is_null());
        }
        json!({ "class_name": keras["class_name"], "config": config })
    }
}

/// Keras' `compute_fans` without axes (a bias initializer's fans).
pub fn keras_fans(shape: &[usize]) -> (usize, usize) {
    match shape {
        [] => (1, 1),
        [n] => (*n, *n),
        [i, o] => (*i, *o),
        [lead @ .., i, o] => {
            let receptive: usize = lead.iter().product();
            (i * receptive, o * receptive)
        }
    }
}

fn bad(value: &Value, why: &str) -> ModelError {
    ModelError::config("initializer", value, why.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_class_names_resolve_as_keras_resolves_them() {
        assert_eq!(KerasInitializer::from_name("glorot_uniform").unwrap(), KerasInitializer::glorot_uniform());
        assert_eq!(KerasInitializer::from_name("GlorotUniform").unwrap(), KerasInitializer::glorot_uniform());
        assert_eq!(KerasInitializer::from_name("zeros").unwrap(), KerasInitializer::zeros());
        let he = KerasInitializer::from_keras(&json!({"class_name": "HeNormal", "config": {"seed": 3}})).unwrap();
        assert_eq!(he.seed, Some(3));
        assert!(KerasInitializer::from_name("orthogonal").unwrap_err().to_string().contains("orthogonal"));
        for name in [
            "glorot_normal",
            "he_uniform",
            "lecun_normal",
            "lecun_uniform",
            "random_normal",
            "random_uniform",
            "truncated_normal",
            "ones",
            "constant",
        ] {
            let initializer = KerasInitializer::from_name(name).unwrap();
            // The serialized form reads back to the same initializer.
            assert_eq!(KerasInitializer::from_keras(&initializer.to_keras()).unwrap(), initializer, "{name}");
            assert_eq!(KerasInitializer::try_from(Value::from(initializer.clone())).unwrap(), initializer, "{name}");
        }
    }

    #[test]
    fn a_seeded_initializer_repeats_itself_per_shape() {
        let seeded = KerasInitializer::glorot_uniform().with_seed(Some(7));
        assert_eq!(seeded.sample(&[4, 6, 4], (4, 24), 1), seeded.sample(&[4, 6, 4], (4, 24), 2));
        assert_ne!(seeded.sample(&[4, 6, 4], (4, 24), 1), seeded.sample(&[6, 4, 4], (24, 4), 1));
        let fresh = KerasInitializer::glorot_uniform();
        assert_ne!(fresh.sample(&[4, 6, 4], (4, 24), 1), fresh.sample(&[4, 6, 4], (4, 24), 2));
    }
}
