//! The layer classes a Keras model may hold. Each class is one file: its arguments (honoured
//! or refused by name), its saved variables, its Burn call with Keras' semantics and mask rule,
//! and what it writes into the generated PyTorch module ([`KerasLayer`]). The `registry!` below
//! names them: one line per type, with the classes it serves.
//!
//! Keras' mask rules, as `Layer.__call__` applies them (keras 3.15): a layer whose `call` takes
//! `mask` receives its single tensor argument's mask; the mask that goes on to the outputs is
//! `compute_mask(inputs, previous_mask)` for a layer that supports masking (by default the first
//! input's mask unchanged) and nothing for one that does not. Operations (`x + y`) drop masks.
//! The executor works out `previous_mask` ([`Call::previous_mask`]); each layer decides the
//! rest.

#[macro_use]
mod registry;
pub mod convolution;
pub mod moments;
pub mod recurrent;
pub mod resize;

// The layer classes: `file::Type => "KerasClass", ...;`, one line per type.
registry! {
    input_layer::InputLayer => "InputLayer";
    dense::Dense => "Dense";
    einsum_dense::EinsumDense => "EinsumDense";
    multi_head_attention::MultiHeadAttention => "MultiHeadAttention";
    attention::Attention => "Attention";
    additive_attention::AdditiveAttention => "AdditiveAttention";
    layer_normalization::LayerNormalization => "LayerNormalization";
    batch_normalization::BatchNormalization => "BatchNormalization";
    group_normalization::GroupNormalization => "GroupNormalization";
    unit_normalization::UnitNormalization => "UnitNormalization";
    dropout::Dropout => "Dropout", "SpatialDropout1D";
    gaussian_noise::GaussianNoise => "GaussianNoise";
    gaussian_dropout::GaussianDropout => "GaussianDropout";
    embedding::Embedding => "Embedding";
    reversible_embedding::ReversibleEmbedding => "ReversibleEmbedding";
    masking::Masking => "Masking";
    lstm::Lstm => "LSTM";
    gru::Gru => "GRU";
    simple_rnn::SimpleRnn => "SimpleRNN";
    bidirectional::Bidirectional => "Bidirectional";
    time_distributed::TimeDistributed => "TimeDistributed";
    conv1d::Conv1D => "Conv1D";
    conv2d::Conv2D => "Conv2D";
    depthwise_conv2d::DepthwiseConv2D => "DepthwiseConv2D", "DepthwiseConv1D";
    separable_conv2d::SeparableConv2D => "SeparableConv2D", "SeparableConv1D";
    conv_transpose::ConvTranspose => "Conv1DTranspose", "Conv2DTranspose";
    pooling1d::Pooling1D => "MaxPooling1D", "AveragePooling1D";
    global_pooling1d::GlobalPooling1D => "GlobalAveragePooling1D", "GlobalMaxPooling1D";
    pooling2d::Pooling2D => "MaxPooling2D", "AveragePooling2D";
    global_pooling2d::GlobalPooling2D => "GlobalAveragePooling2D", "GlobalMaxPooling2D";
    flatten::Flatten => "Flatten";
    reshape::Reshape => "Reshape";
    permute::Permute => "Permute";
    repeat_vector::RepeatVector => "RepeatVector";
    up_sampling1d::UpSampling1D => "UpSampling1D";
    zero_padding1d::ZeroPadding1D => "ZeroPadding1D";
    cropping1d::Cropping1D => "Cropping1D";
    up_sampling2d::UpSampling2D => "UpSampling2D";
    zero_padding2d::ZeroPadding2D => "ZeroPadding2D";
    cropping2d::Cropping2D => "Cropping2D";
    merge::Merge => "Add", "Subtract", "Multiply", "Average", "Maximum", "Minimum";
    concatenate::Concatenate => "Concatenate";
    activation::ActivationLayer => "Activation";
    softmax::Softmax => "Softmax";
    relu::ReLU => "ReLU";
    leaky_relu::LeakyReLU => "LeakyReLU";
    prelu::PReLU => "PReLU";
    elu::ELU => "ELU";
    identity::Identity => "Identity";
    rescaling::Rescaling => "Rescaling";
    normalization::Normalization => "Normalization";
    resizing::Resizing => "Resizing";
    center_crop::CenterCrop => "CenterCrop";
    augmentation::Augmentation => "RandomFlip", "RandomRotation", "RandomZoom", "RandomContrast", "RandomTranslation",
        "RandomBrightness", "RandomCrop";
    weight::Weight => "Weight";
}

pub use registry::supported_classes;

use std::path::Path;

use burn::tensor::Device;
use serde_json::Value as Json;

use crate::activation::Activation;
use crate::config::LayerArgs;
use crate::graph::{Arg, LayerSpec, Node, Port};
use crate::saved::{SavedWeights, VarReader};
use crate::torch::{TorchCall, TorchModule};
use crate::value::{DynTensor, Value};
use model::error::{ModelError, Result};
use model::weights::HostTensor;

/// One Keras layer class: everything about it, in its own file.
pub trait KerasLayer {
    /// Reads the layer's arguments (each one taken, or refused by name) and its saved variables.
    fn build(layer: &mut Build) -> Result<Self>
    where
        Self: Sized;

    /// Runs one call; the outputs carry their Keras masks.
    fn call(&self, call: &Call) -> Result<Vec<Value>>;

    /// The variables in Keras' order and layout (what `layer.weights` lists).
    fn variables(&self) -> Vec<Variable> {
        Vec::new()
    }

    /// Whether the layer takes the masks off its input tensors once called, so that later
    /// readers see none (Keras' `MultiHeadAttention` does).
    fn clears_input_masks(&self) -> bool {
        false
    }

    /// The layer's attribute of the generated module and its state dict; nothing for a layer
    /// without variables.
    fn torch_module(&self, _module: &mut TorchModule) -> Result<()> {
        Ok(())
    }

    /// The statements of one call in `forward`; returns the torch construct for the printout.
    fn torch_call(&self, call: &mut TorchCall) -> Result<String>;
}

/// What a layer is built from: its place, its config's arguments and its saved variables.
pub struct Build<'a> {
    pub file: &'a Path,
    pub spec: &'a LayerSpec,
    pub args: LayerArgs<'a>,
    pub saved: &'a SavedWeights,
    pub device: &'a Device,
}

impl Build<'_> {
    /// The Keras class name (`Dense`): a type serving several classes tells them apart by it.
    pub fn class(&self) -> &str {
        &self.spec.class_name
    }

    /// The layer's saved variables, taken in order with their shapes checked.
    pub fn vars(&self) -> Result<VarReader> {
        Ok(VarReader::new(&self.args.what, self.saved.vars(self.spec)?))
    }

    /// The saved variables of a group below the layer's own (a recurrent layer's `cell`).
    pub fn vars_in(&self, group: &str) -> Result<VarReader> {
        let vars = match &self.spec.h5_path {
            Some(path) => self.saved.vars_at(&format!("{path}/{group}/vars"), &self.spec.name)?,
            None => Vec::new(),
        };
        Ok(VarReader::new(&self.args.what, vars))
    }

    /// The `activation` argument.
    pub fn activation(&mut self) -> Result<Activation> {
        self.activation_or("activation", "linear")
    }

    /// The layer a wrapper holds (`{"class_name": ..., "config": {...}}`, Keras' serialization),
    /// its variables in the group `group` below the wrapper's (`layer`, `forward_layer`).
    pub fn wrapped(&self, config: &Json, group: &str) -> Result<Layer> {
        let text = |key: &str| config.get(key).and_then(Json::as_str);
        let inner = config.get("config").cloned().unwrap_or(Json::Null);
        let spec = LayerSpec {
            name: format!("{}/{}", self.spec.name, inner.get("name").and_then(Json::as_str).unwrap_or(group)),
            class_name: text("class_name").unwrap_or_default().to_string(),
            module: text("module").unwrap_or("keras.layers").to_string(),
            config: inner,
            registered_name: text("registered_name").map(str::to_string),
            h5_path: self.spec.h5_path.as_ref().map(|path| format!("{path}/{group}")),
        };
        let place = format!("wrapped in {} {}", self.class(), self.spec.name);
        Layer::build(self.file, &spec, self.saved, self.device, &place)
    }

    /// An activation argument, the Keras name `default` where the config does not hold it (an
    /// explicit `null` is linear, as Keras' `activations.get(None)`).
    pub fn activation_or(&mut self, argument: &str, default: &str) -> Result<Activation> {
        let value = self.args.take_opt(argument).unwrap_or_else(|| Json::from(default));
        Activation::from_keras(&value).map_err(|e| self.args.error(format!("{argument}: {e}")))
    }
}

/// One variable of a layer, as Keras names and saves it.
pub struct Variable {
    /// The path below the layer (`kernel`, `query/kernel`): Keras' `variable.path` without the
    /// layer's name.
    pub path: String,
    /// The group below the layer's own in `model.weights.h5` (`""`, or `/query_dense`); the
    /// variables of one group are saved as `vars/0`, `vars/1`, ... in this order.
    pub group: String,
    /// Keras' layout.
    pub tensor: HostTensor,
}

impl Variable {
    /// A variable of the layer's own group.
    pub fn new(path: &str, tensor: HostTensor) -> Self {
        Self { path: path.to_string(), group: String::new(), tensor }
    }

    /// `kernels` (name and Keras-layout tensor, in order), then the `bias` when the layer has one:
    /// the variables of every dense and convolution layer.
    pub fn kernels_and_bias(
        kernels: Vec<(&str, HostTensor)>,
        bias: &Option<burn::module::Param<burn::tensor::Tensor<1>>>,
    ) -> Vec<Self> {
        let mut vars: Vec<Self> = kernels.into_iter().map(|(name, tensor)| Self::new(name, tensor)).collect();
        if let Some(b) = bias {
            vars.push(Self::new("bias", HostTensor::from_tensor(b.val())));
        }
        vars
    }
}

/// A call's argument with the tensors in place.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)] // short-lived, one per argument of the call being run
pub enum Input {
    Tensor(Value),
    List(Vec<Input>),
    Const(Json),
}

impl Input {
    /// The argument as the JSON constant it was saved as (a list of constants is one), or `None`
    /// when it holds a tensor.
    pub fn constant(&self) -> Option<Json> {
        match self {
            Input::Const(c) => Some(c.clone()),
            Input::List(items) => items.iter().map(Input::constant).collect::<Option<Vec<_>>>().map(Json::Array),
            Input::Tensor(_) => None,
        }
    }

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
    /// The mask `call` receives as `mask=`: an explicit one, else the mask of the call's only
    /// tensor argument; none when the call has several (Keras' `Layer.__call__`, step 6).
    pub mask: Option<DynTensor>,
    /// The first argument's mask, or an explicit `mask=` (Keras' `previous_mask`, what
    /// `compute_mask` reads).
    pub previous_mask: Option<DynTensor>,
    /// The graph node this call runs (none for a wrapper's inner call): which output each
    /// argument reads ([`Call::port`]).
    pub node: Option<&'a Node>,
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

    /// The graph output that the tensor argument at position `index` (or keyword `name`) reads,
    /// where the call runs a graph node: two arguments of one port are one tensor (`layer(x, x)`).
    pub fn port(&self, index: usize, name: &str) -> Option<Port> {
        let node = self.node?;
        let arg = node.args.get(index).or_else(|| node.kwargs.iter().find(|(k, _)| k == name).map(|(_, a)| a))?;
        match arg {
            Arg::Tensor(port) => Some(*port),
            Arg::List(items) => match items.as_slice() {
                [Arg::Tensor(port)] => Some(*port),
                _ => None,
            },
            Arg::Const(_) => None,
        }
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

    /// Keras' `training` for this call: the model's. A functional model called with `training`
    /// set hands it to every layer that takes it, over what the node recorded (Dropout records
    /// `False`, the augmentation layers `True`: keras 3.15's `functional.operation_fn`).
    pub fn training(&self) -> bool {
        self.training
    }
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

/// A tensor of `shape` drawn from `distribution` (the dropout and noise layers in training).
pub fn random(shape: &[usize], distribution: burn::tensor::Distribution, device: &Device) -> Result<DynTensor> {
    let values = burn::tensor::Tensor::<1>::random([shape.iter().product::<usize>()], distribution, device);
    DynTensor::from(values).reshape(shape)
}
