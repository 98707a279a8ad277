//! Keras' built-in activations by name, with the formulas of keras 3.15's TensorFlow backend.

use burn::tensor::{Tensor, activation as act};
use serde_json::Value as Json;

use super::value::{DynTensor, map_rank};

/// A Keras activation (`Dense(activation=...)`, `Activation(...)`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    Linear,
    Relu,
    /// `gelu(x, approximate)`: erf form, or the tanh approximation.
    Gelu {
        approximate: bool,
    },
    Silu,
    Tanh,
    Sigmoid,
    Softmax,
    LogSoftmax,
    Elu,
    Selu,
    Softplus,
    Softsign,
    HardSigmoid,
    HardSilu,
    LeakyRelu,
    Relu6,
    Mish,
    Exponential,
}

impl Activation {
    /// Every name this converter accepts, for error messages.
    pub const NAMES: &'static str = "linear, relu, gelu, silu, swish, tanh, sigmoid, softmax, log_softmax, elu, selu, softplus, softsign, hard_sigmoid, hard_silu, hard_swish, leaky_relu, relu6, mish, exponential";

    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "linear" | "identity" => Self::Linear,
            "relu" => Self::Relu,
            // keras.activations.gelu defaults to approximate=False.
            "gelu" => Self::Gelu { approximate: false },
            // KerasHub's registered `gelu(x, approximate=True)` (BERT, GPT-2, ALBERT, ...).
            "keras_hub>gelu_approximate" => Self::Gelu { approximate: true },
            "silu" | "swish" => Self::Silu,
            "tanh" => Self::Tanh,
            "sigmoid" => Self::Sigmoid,
            "softmax" => Self::Softmax,
            "log_softmax" => Self::LogSoftmax,
            "elu" => Self::Elu,
            "selu" => Self::Selu,
            "softplus" => Self::Softplus,
            "softsign" => Self::Softsign,
            "hard_sigmoid" => Self::HardSigmoid,
            "hard_silu" | "hard_swish" => Self::HardSilu,
            "leaky_relu" => Self::LeakyRelu,
            "relu6" => Self::Relu6,
            "mish" => Self::Mish,
            "exponential" => Self::Exponential,
            _ => return None,
        })
    }

    /// A serialized activation: a name (`"relu"`), `null`, or a dict naming a function
    /// (`{"class_name": "function", "config": "gelu"}`) or a `functools.partial` of `gelu` with
    /// `approximate`. `Err` carries the value as text.
    pub fn from_keras(value: &Json) -> Result<Self, String> {
        match value {
            Json::Null => Ok(Self::Linear),
            Json::String(name) => {
                Self::from_name(name).ok_or_else(|| format!("{name:?} is not a built-in activation ({})", Self::NAMES))
            }
            Json::Object(map) => {
                let config = map.get("config");
                let name = config
                    .and_then(|c| {
                        c.as_str()
                            .or_else(|| c.get("name").and_then(Json::as_str))
                            .or_else(|| c.get("fn").and_then(Json::as_str))
                    })
                    .or_else(|| map.get("class_name").and_then(Json::as_str))
                    .unwrap_or_default();
                let mut activation = Self::from_name(name)
                    .ok_or_else(|| format!("{value} is not a built-in activation ({})", Self::NAMES))?;
                let approximate =
                    config.and_then(|c| c.pointer("/keywords/approximate").or_else(|| c.get("approximate")));
                if let (Self::Gelu { .. }, Some(flag)) = (activation, approximate) {
                    activation = Self::Gelu { approximate: flag.as_bool().unwrap_or(false) };
                }
                Ok(activation)
            }
            other => Err(format!("{other} is not an activation")),
        }
    }

    /// The activation on a tensor of any rank (softmaxes over the last axis).
    pub fn apply(self, x: DynTensor) -> DynTensor {
        let last = x.rank() - 1;
        match self {
            Self::Linear => x,
            Self::Softmax => x.softmax(last),
            Self::LogSoftmax => x.log_softmax(last),
            _ => map_rank!(x, t => self.elementwise(t)),
        }
    }

    fn elementwise<const D: usize>(self, x: Tensor<D>) -> Tensor<D> {
        match self {
            Self::Linear | Self::Softmax | Self::LogSoftmax => x,
            Self::Relu => act::relu(x),
            Self::Gelu { approximate: false } => {
                // 0.5 x (1 + erf(x / sqrt 2))
                x.clone() * (x.div_scalar(std::f32::consts::SQRT_2).erf().add_scalar(1.0)).mul_scalar(0.5)
            }
            Self::Gelu { approximate: true } => {
                // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))
                let inner = (x.clone() + x.clone().powi_scalar(3).mul_scalar(0.044715))
                    .mul_scalar((2.0 / std::f64::consts::PI).sqrt());
                x * inner.tanh().add_scalar(1.0).mul_scalar(0.5)
            }
            Self::Silu => x.clone() * act::sigmoid(x),
            Self::Tanh => x.tanh(),
            Self::Sigmoid => act::sigmoid(x),
            Self::Elu => elu(x, 1.0),
            Self::Selu => elu(x, 1.673_263_242_354_377_3).mul_scalar(1.050_700_987_355_480_5),
            Self::Softplus => softplus(x),
            Self::Softsign => x.clone() / x.abs().add_scalar(1.0),
            Self::HardSigmoid => hard_sigmoid(x),
            Self::HardSilu => x.clone() * hard_sigmoid(x),
            Self::LeakyRelu => act::leaky_relu(x, 0.2),
            Self::Relu6 => x.clamp(0.0, 6.0),
            Self::Mish => x.clone() * softplus(x).tanh(),
            Self::Exponential => x.exp(),
        }
    }
}

/// `x` where `x > 0`, else `alpha (exp(x) - 1)`.
pub fn elu<const D: usize>(x: Tensor<D>, alpha: f64) -> Tensor<D> {
    let negative = x.clone().exp().sub_scalar(1.0).mul_scalar(alpha);
    negative.mask_where(x.clone().greater_elem(0.0), x)
}

/// `log(1 + exp(x))`, computed as `max(x, 0) + log1p(exp(-|x|))` so large inputs do not overflow.
pub fn softplus<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    act::relu(x.clone()) + x.abs().neg().exp().log1p()
}

/// Keras 3: `relu6(x + 3) / 6`.
fn hard_sigmoid<const D: usize>(x: Tensor<D>) -> Tensor<D> {
    x.add_scalar(3.0).clamp(0.0, 6.0).div_scalar(6.0)
}
