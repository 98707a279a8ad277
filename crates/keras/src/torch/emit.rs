//! What a layer class writes into the generated PyTorch module, and the Python spelling of
//! values: [`TorchModule`] for its attribute in `__init__` and its state dict, [`TorchCall`] for
//! the statements of one call in `forward`.
//!
//! Variables: `x<i>` is node `i`'s first output (`x<i>_<k>` its `k`-th), `m<i>` its Keras mask.

use std::fmt::Write as _;

use serde_json::Value as Json;

use crate::activation::Activation;
use crate::graph::{Arg, CallMask, Node, Port};
use crate::value::{DType, constant_tensor};
use model::error::{ModelError, Result};
use model::weights::{HostTensor, WeightMap};

/// A layer's attribute of the generated module: its constructor line and its state-dict entries.
/// Written once per layer, however many times the graph calls it.
pub struct TorchModule<'a> {
    /// The attribute's name, `self.<attr>`.
    pub attr: &'a str,
    /// Whether some call of the layer receives a Keras mask as `mask=` ([`receives_mask`]).
    pub masked_calls: bool,
    pub(super) init: &'a mut String,
    pub(super) state: &'a mut WeightMap,
    /// Whether `check` records the attribute's first output as the node's (see [`Self::untraced`]).
    pub(super) traced: bool,
}

impl TorchModule<'_> {
    /// The attribute's first output is not the Keras node's output (an `nn.LSTM` returns every
    /// step where the layer returns the last), so `check` does not compare it.
    pub fn untraced(&mut self) {
        self.traced = false;
    }

    /// `self.<attr> = <constructor>` in `__init__`.
    pub fn construct(&mut self, constructor: impl std::fmt::Display) {
        let _ = writeln!(self.init, "        self.{} = {constructor}", self.attr);
    }

    /// `self.<attr>`, a parameter of the module itself (not a submodule, so `check` does not
    /// hook it), with its state-dict entry `<attr>`.
    pub fn parameter(&mut self, tensor: HostTensor) {
        let shape: Vec<String> = tensor.shape.iter().map(usize::to_string).collect();
        let _ =
            writeln!(self.init, "        self.{} = torch.nn.Parameter(torch.zeros({}))", self.attr, shape.join(", "));
        self.state.insert(self.attr.to_string(), tensor);
        self.traced = false;
    }

    /// The state-dict entry `<attr>.<name>`, in torch's layout.
    pub fn tensor(&mut self, name: &str, tensor: HostTensor) {
        self.state.insert(format!("{}.{name}", self.attr), tensor);
    }
}

/// One call being written into `forward`: the graph node, its statements, and the names of its
/// operands.
pub struct TorchCall<'a> {
    pub node: &'a Node,
    /// The node's index: its outputs are `x<index>`, its mask `m<index>`.
    pub index: usize,
    /// The layer's attribute, `self.<attr>`.
    pub attr: &'a str,
    /// Every node's first output rank (from a probe run).
    pub ranks: &'a [usize],
    /// For a model input: the name `forward` takes it by.
    pub model_input: Option<&'a str>,
    /// How many of the node's outputs the graph reads (at least 1).
    pub outputs: usize,
    /// Whether some call of the layer (this one or another) receives a Keras mask as `mask=`,
    /// as [`TorchModule::masked_calls`].
    pub masked_calls: bool,
    /// Whether each node's first output carries a Keras mask (from the probe run): only those
    /// get an `m<i>` variable.
    pub(super) masked: &'a [bool],
    /// `layer <label> (<class>)`, for errors.
    pub(super) what: String,
    pub(super) lines: Vec<String>,
    /// Constant tensors of the call, as buffers of the module: `(name, values, dtype)`.
    pub(super) buffers: Vec<(String, HostTensor, DType)>,
}

impl TorchCall<'_> {
    /// A statement of `forward`.
    pub fn line(&mut self, line: impl Into<String>) {
        self.lines.push(line.into());
    }

    /// `x<i> = <value>`, with `m<i> = <mask>` beside it where the node's output carries a mask.
    pub fn assign(&mut self, value: &str, mask: &str) {
        let i = self.index;
        if self.masked() {
            self.line(format!("x{i}, m{i} = {value}, {mask}"));
        } else {
            self.line(format!("x{i} = {value}"));
        }
    }

    /// `x<i>, x<i>_1, ... = <value>` for a value of `count` outputs (one: `x<i> = <value>`), then
    /// `m<i> = <mask>` where the node's first output carries a mask.
    pub fn assign_outputs(&mut self, count: usize, value: &str, mask: &str) {
        let i = self.index;
        let names: Vec<String> = (0..count.max(1)).map(|index| var(Port { node: i, index })).collect();
        self.line(format!("{} = {value}", names.join(", ")));
        if self.masked() {
            self.line(format!("m{i} = {mask}"));
        }
    }

    /// Whether this node's output carries a Keras mask (`m<i>` exists).
    pub fn masked(&self) -> bool {
        self.is_masked(self.index)
    }

    /// Whether node `node`'s first output carries a Keras mask.
    pub fn is_masked(&self, node: usize) -> bool {
        self.masked.get(node).copied().unwrap_or(false)
    }

    /// The mask variable of a port: `m5` for a masked node's first output, else `None`.
    pub fn mask_of(&self, port: Port) -> String {
        if port.index == 0 && self.is_masked(port.node) { format!("m{}", port.node) } else { "None".into() }
    }

    /// The error for a call this writer cannot express in torch.
    pub fn refuse(&self, why: impl std::fmt::Display) -> ModelError {
        ModelError::Conversion { direction: "Keras -> torch", reason: format!("{}: {why}", self.what) }
    }

    /// An argument as a Python expression; a constant tensor saved in the graph becomes a buffer
    /// of the module (`self.constant_<i>_<k>`), so that `forward` does not spell its values out.
    pub fn render(&mut self, arg: &Arg) -> String {
        match arg {
            Arg::Tensor(p) => var(*p),
            Arg::List(items) => format!("[{}]", items.iter().map(|a| self.render(a)).collect::<Vec<_>>().join(", ")),
            Arg::Const(c) => match constant_tensor(c) {
                Some((host, dtype)) => {
                    let name = format!("constant_{}_{}", self.index, self.buffers.len());
                    self.buffers.push((name.clone(), host, dtype));
                    format!("self.{name}")
                }
                None => literal(c),
            },
        }
    }

    /// The first tensor argument (or the one passed as `inputs=`: PaliGemma's ViT calls
    /// `query_proj(inputs=x)`), as a Python expression.
    pub fn input(&self) -> Result<String> {
        match self.node.args.first().or_else(|| self.kwarg("inputs")) {
            Some(Arg::Tensor(p)) => Ok(var(*p)),
            Some(Arg::List(items)) if items.len() == 1 => Ok(render(&items[0])),
            _ => Err(self.refuse("no tensor input")),
        }
    }

    /// The mask Keras hands the call (`previous_mask`): a recorded `mask=` tensor, else its first
    /// tensor argument's.
    pub fn previous_mask(&self) -> String {
        if let Some((_, Arg::Tensor(p))) = self.node.kwargs.iter().find(|(k, _)| k == "mask") {
            return var(*p);
        }
        match self.node.args.first() {
            Some(Arg::Tensor(p)) => self.mask_of(*p),
            _ => "None".into(),
        }
    }

    /// The mask `call` receives as `mask=` ([`Node::call_mask`]): `None` where it receives none.
    pub fn call_mask(&self) -> String {
        match self.node.call_mask() {
            CallMask::Explicit(port) => var(port),
            CallMask::OfArgument(port) => self.mask_of(port),
            CallMask::None => "None".into(),
        }
    }

    /// Writes the call of a layer wrapped in this one (`TimeDistributed`'s) on the variable
    /// `x<i>` of this call, as a node of one tensor argument without masks and of one rank less
    /// (the steps folded into the batch): its statements and buffers join this call's.
    pub fn wrapped(&mut self, run: impl FnOnce(&mut TorchCall) -> Result<String>) -> Result<String> {
        let node = Node {
            layer: self.node.layer,
            label: self.node.label.clone(),
            call: self.node.call,
            args: vec![Arg::Tensor(Port { node: self.index, index: 0 })],
            kwargs: Vec::new(),
        };
        let unmasked = vec![false; self.masked.len()];
        let mut ranks = self.ranks.to_vec();
        if let Some(rank) = ranks.get_mut(self.index) {
            *rank = rank.saturating_sub(1);
        }
        let mut inner = TorchCall {
            node: &node,
            index: self.index,
            attr: self.attr,
            ranks: &ranks,
            model_input: None,
            outputs: 1,
            masked_calls: false,
            masked: &unmasked,
            what: self.what.clone(),
            lines: Vec::new(),
            buffers: Vec::new(),
        };
        let construct = run(&mut inner)?;
        let (lines, buffers) = (inner.lines, inner.buffers);
        self.lines.extend(lines);
        self.buffers.extend(buffers);
        Ok(construct)
    }

    /// The tensor at `position`, or keyword `name`.
    pub fn port(&self, position: usize, name: &str) -> Option<Port> {
        match self.node.args.get(position).or_else(|| self.kwarg(name)) {
            Some(Arg::Tensor(p)) => Some(*p),
            _ => None,
        }
    }

    /// A keyword argument as recorded.
    pub fn kwarg(&self, name: &str) -> Option<&Arg> {
        self.node.kwargs.iter().find(|(k, _)| k == name).map(|(_, a)| a)
    }

    /// A recorded `name=True`.
    pub fn flag(&self, name: &str) -> bool {
        matches!(self.kwarg(name), Some(Arg::Const(Json::Bool(true))))
    }
}

/// A Python call written with keyword arguments, as a user would write it:
/// `PyCall::new("Conv1D").kw("filters", 4).kw_if(false, "channels_last", "False")` is
/// `Conv1D(filters=4)`. Values are Python already ([`py_bool`], [`py_str`], [`py_float`], `{:?}`
/// of integers and of lists of them). A keyword whose value is written as the prelude's
/// signature writes its default is left out (`Conv1D(..., strides=1)` is `Conv1D(...)`).
pub struct PyCall {
    text: String,
    empty: bool,
    defaults: Vec<(&'static str, &'static str)>,
}

impl PyCall {
    pub fn new(function: impl std::fmt::Display) -> Self {
        let function = function.to_string();
        Self { defaults: super::prelude::parameter_defaults(&function), text: format!("{function}("), empty: true }
    }

    /// A positional argument (the tensors a call is obviously about).
    pub fn arg(mut self, value: impl std::fmt::Display) -> Self {
        self.separate();
        let _ = write!(self.text, "{value}");
        self
    }

    /// `name=value`, unless that is the prelude's default.
    pub fn kw(mut self, name: &str, value: impl std::fmt::Display) -> Self {
        let value = value.to_string();
        if self.defaults.contains(&(name, value.as_str())) {
            return self;
        }
        self.separate();
        let _ = write!(self.text, "{name}={value}");
        self
    }

    /// `name=value` where `written` (an argument left at its default otherwise).
    pub fn kw_if(self, written: bool, name: &str, value: impl std::fmt::Display) -> Self {
        if written { self.kw(name, value) } else { self }
    }

    fn separate(&mut self) {
        if !self.empty {
            self.text.push_str(", ");
        }
        self.empty = false;
    }
}

impl std::fmt::Display for PyCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{})", self.text)
    }
}

/// Whether a node's `call` receives a Keras mask as `mask=` ([`Node::call_mask`]; the mask of
/// an argument when that node's output carries one, `masked`, from the probe).
pub fn receives_mask(node: &Node, masked: &[bool]) -> bool {
    match node.call_mask() {
        CallMask::Explicit(_) => true,
        CallMask::OfArgument(port) => port.index == 0 && masked.get(port.node).copied().unwrap_or(false),
        CallMask::None => false,
    }
}

/// The variable of a port: `x5` for a node's first output, `x5_1` for its second.
pub fn var(port: Port) -> String {
    if port.index == 0 { format!("x{}", port.node) } else { format!("x{}_{}", port.node, port.index) }
}

/// torch's name of a dtype as this writer stores it (integers as int64).
pub fn torch_dtype(dtype: DType) -> &'static str {
    match dtype {
        DType::Float => "torch.float32",
        DType::Int => "torch.int64",
        DType::Bool => "torch.bool",
    }
}

/// An argument as a Python expression.
pub fn render(arg: &Arg) -> String {
    match arg {
        Arg::Tensor(p) => var(*p),
        Arg::List(items) => format!("[{}]", items.iter().map(render).collect::<Vec<_>>().join(", ")),
        Arg::Const(c) => literal(c),
    }
}

/// A JSON constant as a Python literal.
pub fn literal(value: &Json) -> String {
    match value {
        Json::Null => "None".into(),
        Json::Bool(b) => py_bool(*b).into(),
        Json::Number(n) => n.to_string(),
        Json::String(s) => format!("{s:?}"),
        Json::Array(items) => format!("[{}]", items.iter().map(literal).collect::<Vec<_>>().join(", ")),
        Json::Object(_) => match constant_tensor(value) {
            Some((host, dtype)) => {
                format!("torch.tensor({:?}, dtype={}).reshape({:?})", host.data, torch_dtype(dtype), host.shape)
            }
            None => "None".into(),
        },
    }
}

/// A string as a Python literal.
pub fn py_str(s: &str) -> String {
    format!("{s:?}")
}

pub fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// A float, infinities as `math.inf`.
pub fn py_float(v: f64) -> String {
    if v.is_infinite() { if v > 0.0 { "math.inf".into() } else { "-math.inf".into() } } else { format!("{v:?}") }
}

/// Integers as a Python tuple: `(1,)` for one, `(1, 2)` for two.
pub fn tuple<T: std::fmt::Display>(items: &[T]) -> String {
    match items {
        [one] => format!("({one},)"),
        _ => format!("({})", items.iter().map(T::to_string).collect::<Vec<_>>().join(", ")),
    }
}

/// `f(f(a, b), c)` over the operands.
pub fn fold(function: &str, xs: &[String]) -> String {
    xs.iter().skip(1).fold(xs[0].clone(), |acc, x| format!("{function}({acc}, {x})"))
}

/// The prelude's name of a Keras activation (`ACTIVATIONS[name]`, `activation="name"`).
pub fn activation_name(a: Activation) -> &'static str {
    match a {
        Activation::Linear => "linear",
        Activation::Relu => "relu",
        Activation::Gelu { approximate: false } => "gelu",
        Activation::Gelu { approximate: true } => "gelu_tanh",
        Activation::Silu => "silu",
        Activation::Tanh => "tanh",
        Activation::Sigmoid => "sigmoid",
        Activation::Softmax => "softmax",
        Activation::LogSoftmax => "log_softmax",
        Activation::Elu => "elu",
        Activation::Selu => "selu",
        Activation::Softplus => "softplus",
        Activation::Softsign => "softsign",
        Activation::HardSigmoid => "hard_sigmoid",
        Activation::HardSilu => "hard_silu",
        Activation::LeakyRelu => "leaky_relu",
        Activation::Relu6 => "relu6",
        Activation::Mish => "mish",
        Activation::Exponential => "exponential",
    }
}

/// `x` through the activation (unchanged for `linear`), as `ACTIVATIONS[name]` in the prelude
/// computes it: the torch function where it is the one Keras computes (`F.gelu` with the
/// `approximate` Keras' activation takes, softmax over the last axis), else the prelude's function
/// of Keras' name (`softplus`, `hard_sigmoid`, `hard_silu`, `mish`: Keras' order of operations).
pub fn activate(a: Activation, x: &str) -> String {
    match a {
        Activation::Linear => x.to_string(),
        Activation::Relu => format!("F.relu({x})"),
        Activation::Gelu { approximate: false } => format!("F.gelu({x}, approximate=\"none\")"),
        Activation::Gelu { approximate: true } => format!("F.gelu({x}, approximate=\"tanh\")"),
        Activation::Silu => format!("F.silu({x})"),
        Activation::Tanh => format!("torch.tanh({x})"),
        Activation::Sigmoid => format!("torch.sigmoid({x})"),
        Activation::Softmax => format!("F.softmax({x}, dim=-1)"),
        Activation::LogSoftmax => format!("F.log_softmax({x}, dim=-1)"),
        Activation::Elu => format!("F.elu({x})"),
        Activation::Selu => format!("F.selu({x})"),
        Activation::Softplus => format!("softplus({x})"),
        Activation::Softsign => format!("F.softsign({x})"),
        Activation::HardSigmoid => format!("hard_sigmoid({x})"),
        Activation::HardSilu => format!("hard_silu({x})"),
        Activation::LeakyRelu => format!("F.leaky_relu({x}, negative_slope=0.2)"),
        Activation::Relu6 => format!("F.relu6({x})"),
        Activation::Mish => format!("mish({x})"),
        Activation::Exponential => format!("torch.exp({x})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_spells_its_keywords_and_leaves_defaults_out() {
        let call = PyCall::new("Conv1D").kw("filters", 4).kw("padding", py_str("valid")).kw_if(
            false,
            "channels_last",
            "False",
        );
        assert_eq!(call.to_string(), r#"Conv1D(filters=4)"#); // "valid" is the prelude's default
        let call = PyCall::new("Conv1D").kw("strides", 2).kw("padding", py_str("causal")).kw("use_bias", py_bool(true));
        assert_eq!(call.to_string(), r#"Conv1D(strides=2, padding="causal")"#);
        let call = PyCall::new("self.lstm").arg("x1").kw_if(true, "mask", "m1");
        assert_eq!(call.to_string(), "self.lstm(x1, mask=m1)");
        assert_eq!(PyCall::new("f").to_string(), "f()");
    }

    #[test]
    fn tuples_take_a_trailing_comma_only_for_one_item() {
        assert_eq!(tuple::<i64>(&[]), "()");
        assert_eq!(tuple(&[1i64]), "(1,)");
        assert_eq!(tuple(&[2usize, 3]), "(2, 3)");
    }

    #[test]
    fn activations_are_torch_functions_where_exact_else_the_prelude_s() {
        assert_eq!(activate(Activation::Linear, "x"), "x");
        assert_eq!(activate(Activation::Relu, "x"), "F.relu(x)");
        // keras.activations.gelu's approximate is False (keras.ops.gelu's True).
        assert_eq!(activate(Activation::Gelu { approximate: false }, "x"), r#"F.gelu(x, approximate="none")"#);
        assert_eq!(activate(Activation::Softmax, "x"), "F.softmax(x, dim=-1)");
        assert_eq!(activate(Activation::Softplus, "x"), "softplus(x)");
        assert_eq!(activate(Activation::HardSilu, "x"), "hard_silu(x)");
    }
}
