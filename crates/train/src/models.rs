//! The three sequence models the project trains, behind one module type.
//!
//! * `keras`: the Keras-exact layer, self-attention on `x`, output width from `output_shape`.
//! * `projected`: `Linear(in, E) + MHA(E, h) + Linear(E, out)`, PyTorch's conventions.
//! * `baseline`: a per-position MLP, `Linear(in, H) -> ReLU -> Linear(H, out)`, which sees one
//!   position at a time and so shows what a model without attention can reach.

use burn::module::{Module, ModuleMapper, Param, ParamId};
use burn::nn::{Linear, LinearConfig};
use burn::optim::GradientsParams;
use burn::tensor::activation::relu;
use burn::tensor::{Bool, Device, Tensor};
use model::dense::{linear, linear_weights};
use model::projected::ProjectedInput;
use model::torch_mha::AttnMask;
use model::{KerasMha, KerasMhaConfig, KerasMhaInput, ProjectedConfig, ProjectedModel, Result, WeightMap};
use serde::{Deserialize, Serialize};

/// The Keras-exact layer used as `layer(x, x, attention_mask, use_causal_mask)`.
#[derive(Module, Debug)]
pub struct KerasSelfAttention {
    pub layer: KerasMha,
    pub use_causal_mask: bool,
}

/// `Linear(in, H) -> ReLU -> Linear(H, out)` applied to every position independently.
#[derive(Module, Debug)]
pub struct PerPositionMlp {
    pub hidden: Linear,
    pub output: Linear,
}

/// One of the three models.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)] // one model per run: the variants' size difference costs nothing
pub enum TaskModel {
    Keras(KerasSelfAttention),
    Projected(ProjectedModel),
    Baseline(PerPositionMlp),
}

/// Which model, by config name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelKind {
    Keras,
    Projected,
    Baseline,
}

impl ModelKind {
    pub const ALL: [ModelKind; 3] = [ModelKind::Keras, ModelKind::Projected, ModelKind::Baseline];

    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Keras => "keras",
            ModelKind::Projected => "projected",
            ModelKind::Baseline => "baseline",
        }
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The shape of a model, every size resolved.
#[derive(Debug, Clone, PartialEq)]
pub enum ModelSpec {
    Keras { layer: KerasMhaConfig, use_causal_mask: bool },
    Projected(ProjectedConfig),
    Baseline { in_features: usize, hidden: usize, output_dim: usize },
}

impl ModelSpec {
    pub fn kind(&self) -> ModelKind {
        match self {
            ModelSpec::Keras { .. } => ModelKind::Keras,
            ModelSpec::Projected(_) => ModelKind::Projected,
            ModelSpec::Baseline { .. } => ModelKind::Baseline,
        }
    }

    /// A freshly initialised model (each library's default initialisation).
    pub fn init(&self, device: &Device) -> Result<TaskModel> {
        Ok(match self {
            ModelSpec::Keras { layer, use_causal_mask } => {
                TaskModel::Keras(KerasSelfAttention { layer: layer.init(device)?, use_causal_mask: *use_causal_mask })
            }
            ModelSpec::Projected(config) => TaskModel::Projected(config.init(device)?),
            ModelSpec::Baseline { in_features, hidden, output_dim } => TaskModel::Baseline(PerPositionMlp {
                hidden: LinearConfig::new(*in_features, *hidden).init(device),
                output: LinearConfig::new(*hidden, *output_dim).init(device),
            }),
        })
    }

    /// A model holding `weights`, named as [`TaskModel::library_weights`] names them.
    pub fn init_with_weights(&self, weights: &WeightMap, device: &Device) -> Result<TaskModel> {
        Ok(match self {
            ModelSpec::Keras { layer, use_causal_mask } => TaskModel::Keras(KerasSelfAttention {
                layer: layer.init_with_weights(weights, device)?,
                use_causal_mask: *use_causal_mask,
            }),
            ModelSpec::Projected(config) => TaskModel::Projected(config.init_with_state_dict(weights, device)?),
            ModelSpec::Baseline { in_features, hidden, output_dim } => {
                weights.reject_unknown(&["hidden.weight", "hidden.bias", "output.weight", "output.bias"])?;
                let layer = |name: &str, d_in: usize, d_out: usize| -> Result<Linear> {
                    let weight = weights.expect(&format!("{name}.weight"), &[d_in, d_out])?;
                    let bias = weights.expect(&format!("{name}.bias"), &[d_out])?;
                    Ok(linear(weight.to_tensor(name, device)?, Some(bias.to_tensor(name, device)?)))
                };
                TaskModel::Baseline(PerPositionMlp {
                    hidden: layer("hidden", *in_features, *hidden)?,
                    output: layer("output", *hidden, *output_dim)?,
                })
            }
        })
    }
}

impl TaskModel {
    /// `x [B, T, in] -> [B, T, out]`. `attention_mask [B, T, T]` uses Keras' polarity
    /// (true = query t may attend key s); the baseline has no attention and ignores it.
    pub fn forward(&self, x: Tensor<3>, attention_mask: Option<Tensor<3, Bool>>, training: bool) -> Result<Tensor<3>> {
        match self {
            TaskModel::Keras(m) => {
                let mut input = KerasMhaInput::self_attention(x).use_causal_mask(m.use_causal_mask).training(training);
                input.attention_mask = attention_mask;
                Ok(m.layer.forward(input)?.output)
            }
            TaskModel::Projected(m) => {
                let mut input = ProjectedInput::new(x).training(training);
                if let Some(mask) = attention_mask {
                    // torch's boolean attn_mask is per (batch x head): [B*h, T, S], true = blocked.
                    let [batch, t, s] = mask.dims();
                    let heads = m.mha.num_heads;
                    let blocked = mask.bool_not().unsqueeze_dim::<4>(1).expand([batch, heads, t, s]).reshape([
                        batch * heads,
                        t,
                        s,
                    ]);
                    input.attn_mask = Some(AttnMask::Bool(blocked));
                }
                Ok(m.forward(input)?.output)
            }
            TaskModel::Baseline(m) => Ok(m.output.forward(relu(m.hidden.forward(x)))),
        }
    }

    pub fn kind(&self) -> ModelKind {
        match self {
            TaskModel::Keras(_) => ModelKind::Keras,
            TaskModel::Projected(_) => ModelKind::Projected,
            TaskModel::Baseline(_) => ModelKind::Baseline,
        }
    }

    /// The weights in the vocabulary of the library the model mirrors: Keras names and shapes,
    /// torch state_dict names, or `hidden.*` / `output.*` (Burn layout) for the baseline.
    pub fn library_weights(&self) -> WeightMap {
        match self {
            TaskModel::Keras(m) => m.layer.keras_weights(),
            TaskModel::Projected(m) => m.state_dict(),
            TaskModel::Baseline(m) => {
                let mut map = WeightMap::new();
                for (name, layer) in [("hidden", &m.hidden), ("output", &m.output)] {
                    let (weight, bias) = linear_weights(layer);
                    map.insert(format!("{name}.weight"), weight);
                    if let Some(bias) = bias {
                        map.insert(format!("{name}.bias"), bias);
                    }
                }
                map
            }
        }
    }

    /// The same model with parameter ids `0, 1, 2, ...` in visiting order, so that optimizer state
    /// saved in a checkpoint (keyed by parameter id) finds its parameters after a reload.
    pub fn with_stable_param_ids(self) -> Self {
        self.map(&mut StableIds { next: 0 })
    }

    /// The gradients, named and shaped as [`TaskModel::library_weights`] names the weights.
    pub fn library_gradients(&self, grads: &GradientsParams) -> WeightMap {
        gradients_as_module(self.clone(), grads).library_weights()
    }
}

/// `module` with every parameter replaced by its gradient (zeros where it has none), so that the
/// module's own weight readers name and shape the gradients as they do the weights.
pub fn gradients_as_module<M: burn::module::Module>(module: M, grads: &GradientsParams) -> M {
    module.map(&mut ParamsToGradients { grads })
}

/// Replaces every parameter with its gradient (zeros where it has none).
struct ParamsToGradients<'a> {
    grads: &'a GradientsParams,
}

impl ModuleMapper for ParamsToGradients<'_> {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let id = param.id;
        let value = param.val();
        let grad = self.grads.get::<D>(id).unwrap_or_else(|| value.inner().zeros_like());
        Param::initialized(id, grad)
    }
}

struct StableIds {
    next: u64,
}

impl ModuleMapper for StableIds {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let id = ParamId::from(self.next);
        self.next += 1;
        let value = param.val();
        let require_grad = value.is_require_grad();
        Param::initialized(id, value.set_require_grad(require_grad))
    }
}
