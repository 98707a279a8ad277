//! The layers a Keras model may hold, each built from its config and saved variables and run
//! with Keras' own semantics, masks included.
//!
//! Keras' mask rules, as `Layer.__call__` applies them (keras 3.15): a layer whose `call` takes
//! `mask` receives its single tensor argument's mask; the mask that goes on to the outputs is
//! `compute_mask(inputs, previous_mask)` for a layer that supports masking (by default the first
//! input's mask unchanged) and nothing for one that does not. Operations (`x + y`) drop masks.
//! The executor works out `previous_mask` ([`Call::previous_mask`]); each layer decides the
//! rest.

pub mod attention;
pub mod conv;
pub mod core_layers;
pub mod merge;
pub mod norm;
pub mod pooling;
pub mod reshape;

use std::path::Path;

use burn::module::Module;
use burn::tensor::Device;
use serde_json::Value as Json;

use super::config::LayerArgs;
use super::graph::LayerSpec;
use super::ops::Operation;
use super::saved::SavedWeights;
use super::value::{DynTensor, Value};
use model::error::{ModelError, Result};
use model::weights::HostTensor;

/// A call's argument with the tensors in place.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // short-lived, one per argument of the call being run
pub enum Input {
    Tensor(Value),
    List(Vec<Input>),
    Const(Json),
}

impl Input {
    pub fn tensors(&self) -> Vec<&Value> {
        match self {
            Input::Tensor(v) => vec![v],
            Input::List(items) => items.iter().flat_map(Input::tensors).collect(),
            Input::Const(_) => vec![],
        }
    }
}

/// One call of a layer: its arguments, the training flag and the mask Keras hands on.
pub struct Call<'a> {
    /// `layer <label> (<class>)`, for errors.
    pub what: &'a str,
    pub args: Vec<Input>,
    pub kwargs: Vec<(String, Input)>,
    pub training: bool,
    /// The first argument's mask, or an explicit `mask=` (Keras' `previous_mask`).
    pub previous_mask: Option<DynTensor>,
}

impl Call<'_> {
    pub fn error(&self, message: impl std::fmt::Display) -> ModelError {
        ModelError::InvalidConfig { field: "call", value: self.what.to_string(), reason: message.to_string() }
    }

    /// Axis `a` (negative: from the end) of a rank-`rank` input.
    pub fn axis(&self, a: i64, rank: usize) -> Result<usize> {
        crate::config::axis(a, rank).ok_or_else(|| self.error(format!("axis {a} of a rank-{rank} input")))
    }

    /// Every axis of `axes`, as [`Call::axis`].
    pub fn axes(&self, axes: &[i64], rank: usize) -> Result<Vec<usize>> {
        axes.iter().map(|&a| self.axis(a, rank)).collect()
    }

    /// A keyword argument.
    pub fn kwarg(&self, name: &str) -> Option<&Input> {
        self.kwargs.iter().find(|(k, _)| k == name).map(|(_, v)| v)
    }

    /// The `index`-th positional argument, or the keyword `name`.
    pub fn arg(&self, index: usize, name: &str) -> Option<&Input> {
        self.args.get(index).or_else(|| self.kwarg(name))
    }

    /// The tensor at position `index` (or keyword `name`).
    pub fn tensor(&self, index: usize, name: &str) -> Result<Value> {
        match self.arg(index, name) {
            Some(Input::Tensor(v)) => Ok(v.clone()),
            Some(Input::List(items)) if items.len() == 1 => match &items[0] {
                Input::Tensor(v) => Ok(v.clone()),
                _ => Err(self.error(format!("argument {name} is not a tensor"))),
            },
            _ => Err(self.error(format!("argument {name} is missing or not a tensor"))),
        }
    }

    /// An optional tensor argument.
    pub fn opt_tensor(&self, index: usize, name: &str) -> Option<Value> {
        match self.arg(index, name) {
            Some(Input::Tensor(v)) => Some(v.clone()),
            _ => None,
        }
    }

    /// The first argument as a list of tensors (merge layers).
    pub fn tensor_list(&self) -> Result<Vec<Value>> {
        let Some(first) = self.args.first() else { return Err(self.error("no inputs")) };
        Ok(first.tensors().into_iter().cloned().collect())
    }

    /// A boolean keyword (`use_causal_mask=True`), `default` when absent or `None`.
    pub fn flag(&self, name: &str, default: bool) -> bool {
        match self.kwarg(name) {
            Some(Input::Const(Json::Bool(b))) => *b,
            _ => default,
        }
    }

    /// Keras' `training`: the call's own `training=` when recorded, else the model's.
    pub fn training(&self) -> bool {
        match self.kwarg("training") {
            Some(Input::Const(Json::Bool(b))) => *b,
            _ => self.training,
        }
    }
}

/// A layer of the model: a Burn module (its variables are parameters) or a stateless step.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)] // one per layer of a model, built once
pub enum Layer {
    Dense(core_layers::Dense),
    EinsumDense(core_layers::EinsumDense),
    Embedding(core_layers::Embedding),
    PRelu(core_layers::PRelu),
    Conv1d(conv::Conv1d),
    LayerNorm(norm::LayerNorm),
    BatchNorm(norm::BatchNorm),
    Attention(attention::Attention),
    Stateless(Stateless),
}

/// A layer or operation without variables.
#[derive(Module, Debug)]
pub struct Stateless {
    #[module(skip)]
    pub kind: StatelessKind,
}

/// What a stateless node does.
#[derive(Debug, Clone)]
pub enum StatelessKind {
    Input,
    Core(core_layers::Elementwise),
    Pool(pooling::Pooling),
    Reshape(reshape::Reshape),
    Merge(merge::Merge),
    Operation(Operation),
}

/// The classes this converter builds, for the error on any other.
pub const SUPPORTED: &str = "InputLayer, Dense, EinsumDense, MultiHeadAttention, LayerNormalization, BatchNormalization, Dropout, SpatialDropout1D, GaussianNoise, GaussianDropout, Embedding, Masking, Conv1D, MaxPooling1D, AveragePooling1D, GlobalAveragePooling1D, GlobalMaxPooling1D, Flatten, Reshape, Permute, RepeatVector, Add, Subtract, Multiply, Average, Maximum, Minimum, Concatenate, Activation, Softmax, ReLU, LeakyReLU, PReLU, ELU, Identity, and keras.ops operations";

impl Layer {
    /// The layer described by `spec`, its variables read from `saved`.
    pub fn build(file: &Path, spec: &LayerSpec, saved: &SavedWeights, device: &Device, place: &str) -> Result<Self> {
        let mut args = LayerArgs::new(file, &spec.name, &spec.class_name, &spec.config);
        if spec.is_operation() {
            let op = Operation::from_config(&spec.class_name, &mut args)?;
            args.finish()?;
            return Ok(Self::stateless(StatelessKind::Operation(op)));
        }
        let vars = || saved.vars(spec);
        let layer = match spec.class_name.as_str() {
            "InputLayer" => {
                for inert in
                    ["batch_shape", "batch_input_shape", "sparse", "ragged", "optional", "input_shape", "batch_size"]
                {
                    args.take(inert);
                }
                Self::stateless(StatelessKind::Input)
            }
            "Dense" => Self::Dense(core_layers::Dense::build(&mut args, vars()?, device)?),
            "EinsumDense" => Self::EinsumDense(core_layers::EinsumDense::build(&mut args, vars()?, device)?),
            "Embedding" => Self::Embedding(core_layers::Embedding::build(&mut args, vars()?, device)?),
            "PReLU" => Self::PRelu(core_layers::PRelu::build(&mut args, vars()?, device)?),
            "Conv1D" => Self::Conv1d(conv::Conv1d::build(&mut args, vars()?, device)?),
            "LayerNormalization" => Self::LayerNorm(norm::LayerNorm::build(&mut args, vars()?, device)?),
            "BatchNormalization" => Self::BatchNorm(norm::BatchNorm::build(&mut args, vars()?, device)?),
            "MultiHeadAttention" => Self::Attention(attention::Attention::build(file, spec, saved, &mut args, device)?),
            class => {
                if let Some(kind) = core_layers::Elementwise::build(class, &mut args)? {
                    Self::stateless(StatelessKind::Core(kind))
                } else if let Some(kind) = pooling::Pooling::build(class, &mut args)? {
                    Self::stateless(StatelessKind::Pool(kind))
                } else if let Some(kind) = reshape::Reshape::build(class, &mut args)? {
                    Self::stateless(StatelessKind::Reshape(kind))
                } else if let Some(kind) = merge::Merge::build(class, &mut args)? {
                    Self::stateless(StatelessKind::Merge(kind))
                } else {
                    return Err(unsupported(file, spec, place));
                }
            }
        };
        args.finish()?;
        Ok(layer)
    }

    fn stateless(kind: StatelessKind) -> Self {
        Self::Stateless(Stateless { kind })
    }

    /// Runs one call; the outputs carry their Keras masks.
    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        match self {
            Self::Dense(l) => l.call(call),
            Self::EinsumDense(l) => l.call(call),
            Self::Embedding(l) => l.call(call),
            Self::PRelu(l) => l.call(call),
            Self::Conv1d(l) => l.call(call),
            Self::LayerNorm(l) => l.call(call),
            Self::BatchNorm(l) => l.call(call),
            Self::Attention(l) => l.call(call),
            Self::Stateless(Stateless { kind }) => match kind {
                StatelessKind::Input => Ok(vec![call.tensor(0, "inputs")?]),
                StatelessKind::Core(k) => k.call(call),
                StatelessKind::Pool(k) => k.call(call),
                StatelessKind::Reshape(k) => k.call(call),
                StatelessKind::Merge(k) => k.call(call),
                StatelessKind::Operation(op) => op.call(call),
            },
        }
    }
}

/// The error for a class outside the supported set: its name, class and place in the graph.
fn unsupported(file: &Path, spec: &LayerSpec, place: &str) -> ModelError {
    let kind = match spec.class_name.as_str() {
        "Lambda" => "a Lambda layer (Python code, which a file cannot carry)".to_string(),
        _ if !spec.module.starts_with("keras") => format!(
            "a custom layer (registered as {:?}), whose Python code a file does not carry",
            spec.registered_name.as_deref().unwrap_or(&spec.class_name)
        ),
        class => format!("a layer class this converter does not support ({class})"),
    };
    ModelError::file(
        file,
        format!(
            "layer {} ({}, {place}) is {kind}. Supported: {SUPPORTED}. `cargo xtask convert FILE --layer NAME` still converts the file's attention layers one by one",
            spec.name, spec.class_name
        ),
    )
}

/// TensorFlow's SAME padding over `length` steps for a window reaching `reach` steps, `stride`
/// apart: `ceil(length / stride)` outputs, and the padding before and after (the smaller half
/// first, as TensorFlow puts it).
pub fn same_padding(length: usize, reach: usize, stride: usize) -> (usize, usize, usize) {
    let out = length.div_ceil(stride);
    let total = ((out.max(1) - 1) * stride + reach).saturating_sub(length);
    (out, total / 2, total - total / 2)
}

/// A saved variable of any shape as a rank-1 tensor (the layer keeps its shape beside it).
pub fn flat_tensor(host: &HostTensor, device: &Device) -> Result<burn::tensor::Tensor<1>> {
    host.reshaped(vec![host.data.len()]).to_tensor("variable", device)
}

/// The mask a layer that supports masking and keeps its input's shape hands on.
pub fn keep_mask(mut value: Value, call: &Call) -> Value {
    value.mask = call.previous_mask.clone();
    value
}
