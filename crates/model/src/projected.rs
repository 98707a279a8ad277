//! The popular PyTorch port of Keras' `MultiHeadAttention(num_heads=6, key_dim=4)`:
//!
//! ```text
//! z = x P^T + p                      proj:  Linear(in, E)       x [B, T, in] -> z [B, T, E]
//! a = MultiheadAttention(E, h)(z, z, z)                          -> a [B, T, E]
//! y = a F^T + f                      final: Linear(E, out)       -> y [B, T, out]   (optional)
//! ```
//!
//! Without `final` it returns `E` features (24 for the seed, not Keras' 4) and has
//! `in*E + E + 4*E*E + 4*E` parameters (2,520 for in=4, E=24, against Keras' 460). With `final`
//! it can represent the Keras layer exactly (see [`crate::convert`]).
//!
//! `proj` and the attention's query, key and value projections are dense layers in a row, and so
//! are the attention's `out_proj` and `final`. On the CPU backends each pair computes the same
//! gradients in fewer products when the rows `B·T` outnumber the widths
//! ([`kernels::linear_after`]): at 8,256,512 with heads of 32, a training step's 17 products
//! over the rows (`[B·T, E] x [E, E]` and their transposes) become 11, plus nine of `E x E x E`.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Bool, Device, Tensor};

use crate::dense::{linear, linear_weights};
use crate::error::{ModelError, Result};
use crate::torch_mha::{AttnMask, Neighbours, TorchMha, TorchMhaConfig, TorchMhaInput, TorchMhaOutput};
use crate::weights::WeightMap;
use kernels::linear_forward;

#[derive(Config, Debug, PartialEq)]
pub struct ProjectedConfig {
    /// Input features `in`.
    pub in_features: usize,
    /// Attention width `E`.
    pub embed_dim: usize,
    /// Heads `h` of `E / h` features.
    pub num_heads: usize,
    /// Width of the final Linear head; `None` = no head (the output has `E` features).
    pub output_dim: Option<usize>,
    /// Biases in every Linear (`proj`, the attention, `final`).
    #[config(default = true)]
    pub bias: bool,
    /// Dropout on the attention weights (training only).
    #[config(default = 0.0)]
    pub dropout: f64,
}

impl ProjectedConfig {
    fn mha(&self) -> TorchMhaConfig {
        TorchMhaConfig::new(self.embed_dim, self.num_heads).with_bias(self.bias).with_dropout(self.dropout)
    }

    fn validate(&self) -> Result<()> {
        if self.in_features == 0 {
            return Err(ModelError::config("in_features", 0, "must be at least 1"));
        }
        if self.output_dim == Some(0) {
            return Err(ModelError::config("output_dim", 0, "must be at least 1 (or unset for no head)"));
        }
        Ok(())
    }

    /// A model with torch's default initialisation of each layer.
    pub fn init(&self, device: &Device) -> Result<ProjectedModel> {
        self.validate()?;
        // Burn's default Linear init is torch's: U(+-1/sqrt(fan_in)) for weight and bias.
        let torch_linear = |i, o| LinearConfig::new(i, o).with_bias(self.bias).init(device);
        Ok(ProjectedModel {
            proj: torch_linear(self.in_features, self.embed_dim),
            mha: self.mha().init(device)?,
            head: self.output_dim.map(|o| torch_linear(self.embed_dim, o)),
        })
    }

    /// A model holding the weights of a state_dict: `proj.weight (E, in)`, `proj.bias (E)`, the
    /// attention's names without prefix (`in_proj_weight`, ...), and `final.weight (out, E)`,
    /// `final.bias (out)` when the config has a head.
    pub fn init_with_state_dict(&self, weights: &WeightMap, device: &Device) -> Result<ProjectedModel> {
        self.validate()?;
        let mut attention = weights.clone();
        let proj = torch_linear_from(&mut attention, "proj", self.in_features, self.embed_dim, self.bias, device)?;
        let head = match self.output_dim {
            Some(o) => Some(torch_linear_from(&mut attention, "final", self.embed_dim, o, self.bias, device)?),
            None if weights.contains("final.weight") => {
                return Err(ModelError::UnexpectedTensors { names: vec!["final.weight".into()] });
            }
            None => None,
        };
        Ok(ProjectedModel { proj, mha: self.mha().init_with_state_dict(&attention, device)?, head })
    }
}

/// Takes `{prefix}.weight (out, in)` and `{prefix}.bias (out)` out of `weights` as a Linear.
fn torch_linear_from(
    weights: &mut WeightMap,
    prefix: &str,
    d_in: usize,
    d_out: usize,
    bias: bool,
    device: &Device,
) -> Result<Linear> {
    let weight_name = format!("{prefix}.weight");
    let bias_name = format!("{prefix}.bias");
    let weight = weights.expect(&weight_name, &[d_out, d_in])?.transposed().to_tensor(&weight_name, device)?;
    let bias = match bias {
        true => Some(weights.expect(&bias_name, &[d_out])?.to_tensor(&bias_name, device)?),
        false => None,
    };
    weights.take(&weight_name);
    weights.take(&bias_name);
    Ok(linear(weight, bias))
}

/// `Linear(in, E)` -> `MultiheadAttention(E, h)` self-attention -> optional `Linear(E, out)`.
#[derive(Module, Debug)]
pub struct ProjectedModel {
    /// `Linear(in, E)`, weight `[in, E]`.
    pub proj: Linear,
    pub mha: TorchMha,
    /// The optional final `Linear(E, out)` (torch name `final`), weight `[E, out]`.
    pub head: Option<Linear>,
}

/// The arguments of one call.
#[derive(Debug, Clone)]
pub struct ProjectedInput {
    /// `[B, T, in]`
    pub x: Tensor<3>,
    /// `[B, T]`, true = ignore that key.
    pub key_padding_mask: Option<Tensor<2, Bool>>,
    pub attn_mask: Option<AttnMask>,
    pub need_weights: bool,
    pub training: bool,
}

impl ProjectedInput {
    pub fn new(x: Tensor<3>) -> Self {
        Self { x, key_padding_mask: None, attn_mask: None, need_weights: false, training: false }
    }

    pub fn need_weights(mut self, need: bool) -> Self {
        self.need_weights = need;
        self
    }

    pub fn training(mut self, training: bool) -> Self {
        self.training = training;
        self
    }
}

/// The result of a call: the output `[B, T, out | E]`, the projection `z [B, T, E]` and the
/// head-averaged attention weights when asked for.
#[derive(Debug, Clone)]
pub struct ProjectedOutput {
    pub output: Tensor<3>,
    pub proj_output: Tensor<3>,
    pub attention: TorchMhaOutput,
}

impl ProjectedModel {
    pub fn forward(&self, input: ProjectedInput) -> Result<ProjectedOutput> {
        let [_, _, width] = input.x.dims();
        let in_features = self.proj.weight.dims()[0];
        if width != in_features {
            return Err(ModelError::InputShape {
                input: "x",
                expected: format!("[B, T, {in_features}]"),
                found: input.x.dims().to_vec(),
            });
        }
        let z = linear_forward(&self.proj, input.x.clone()); // [B, T, E]
        let mut call =
            TorchMhaInput::self_attention(z.clone()).need_weights(input.need_weights).training(input.training);
        call.key_padding_mask = input.key_padding_mask;
        call.attn_mask = input.attn_mask;
        // proj -> query, key, value and out_proj -> final are pairs of layers in a row.
        let neighbours = Neighbours { before: Some((&self.proj, input.x)), after: self.head.as_ref() };
        let (attention, head_output) = self.mha.forward_between(call, neighbours)?; // [B, T, E], [B, T, out]
        let output = head_output.unwrap_or_else(|| attention.output.clone()); // [B, T, out | E]
        Ok(ProjectedOutput { output, proj_output: z, attention })
    }

    /// The config that rebuilds this model's shape.
    pub fn config(&self) -> ProjectedConfig {
        let [in_features, embed_dim] = self.proj.weight.dims();
        ProjectedConfig::new(in_features, embed_dim, self.mha.num_heads)
            .with_output_dim(self.head.as_ref().map(|h| h.weight.dims()[1]))
            .with_bias(self.proj.bias.is_some())
            .with_dropout(self.mha.dropout)
    }

    /// The weights under the state_dict names read by [`ProjectedConfig::init_with_state_dict`].
    pub fn state_dict(&self) -> WeightMap {
        let mut map = self.mha.state_dict();
        for (prefix, layer) in [("proj", Some(&self.proj)), ("final", self.head.as_ref())] {
            let Some(layer) = layer else { continue };
            let (weight, bias) = linear_weights(layer);
            map.insert(format!("{prefix}.weight"), weight.transposed());
            if let Some(bias) = bias {
                map.insert(format!("{prefix}.bias"), bias);
            }
        }
        map
    }
}
