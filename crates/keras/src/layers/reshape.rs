//! Layers that move values without computing: `Flatten`, `Reshape`, `Permute`, `RepeatVector`.
//! None of them supports masking: a mask stops here, as in Keras.

use super::Call;
use model::error::Result;
use crate::config::LayerArgs;
use crate::value::{Value, resolve_shape};

#[derive(Debug, Clone)]
pub enum Reshape {
    /// `Flatten(data_format)`: channels-first inputs are moved to channels-last first.
    Flatten {
        channels_last: bool,
    },
    /// `Reshape(target_shape)`, one entry may be -1; the batch axis is kept.
    Reshape {
        target: Vec<i64>,
    },
    /// `Permute(dims)`: 1-based, the batch axis stays first.
    Permute {
        dims: Vec<usize>,
    },
    RepeatVector {
        n: usize,
    },
}

impl Reshape {
    pub fn build(class: &str, args: &mut LayerArgs) -> Result<Option<Self>> {
        Ok(Some(match class {
            "Flatten" => Self::Flatten { channels_last: args.take_channels_last()? },
            "Reshape" => Self::Reshape {
                target: args.take_ints("target_shape")?.ok_or_else(|| args.error("target_shape is missing"))?,
            },
            "Permute" => {
                let dims = args.take_ints("dims")?.ok_or_else(|| args.error("dims is missing"))?;
                let n = dims.len() as i64;
                let mut seen = vec![false; dims.len()];
                if dims.iter().any(|&d| d < 1 || d > n || std::mem::replace(&mut seen[d as usize - 1], true)) {
                    return Err(args.error(format!("dims = {dims:?} is not a permutation of 1..={n}")));
                }
                Self::Permute { dims: dims.into_iter().map(|d| d as usize).collect() }
            }
            "RepeatVector" => Self::RepeatVector { n: args.take_usize("n", None)? },
            _ => return Ok(None),
        }))
    }

    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "inputs")?;
        let shape = x.shape();
        let batch = shape[0];
        let tensor = match self {
            Self::Flatten { channels_last } => {
                let mut t = x.tensor;
                if !channels_last && shape.len() > 2 {
                    let order: Vec<usize> =
                        std::iter::once(0).chain(2..shape.len()).chain(std::iter::once(1)).collect();
                    t = t.permute(&order)?;
                }
                t.reshape(&[batch, shape[1..].iter().product()])?
            }
            Self::Reshape { target } => {
                let Some(per_sample) = resolve_shape(target, shape[1..].iter().product()) else {
                    return Err(call.error(format!("cannot reshape {:?} to target_shape {target:?}", &shape[1..])));
                };
                x.tensor.reshape(&[vec![batch], per_sample].concat())?
            }
            Self::Permute { dims } => {
                if dims.len() + 1 != shape.len() {
                    return Err(call.error(format!("dims {dims:?} for an input of shape {shape:?}")));
                }
                let order: Vec<usize> = std::iter::once(0).chain(dims.iter().copied()).collect();
                x.tensor.permute(&order)?
            }
            Self::RepeatVector { n } => {
                if shape.len() != 2 {
                    return Err(call.error(format!("an input of shape {shape:?}; RepeatVector takes [B, D]")));
                }
                x.tensor.expand_dims(1)?.broadcast_to(&[batch, *n, shape[1]])?
            }
        };
        Ok(vec![Value::float(tensor)])
    }
}
