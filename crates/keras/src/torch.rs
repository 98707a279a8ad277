//! A whole Keras model as PyTorch code: one readable `nn.Module` whose `forward` mirrors the
//! graph call by call, and its state dict.
//!
//! Each layer becomes a torch built-in where one is exact (`nn.Linear`, `nn.Embedding`,
//! `nn.Dropout`'s functional form) or a short class of the prelude (`torch_prelude.py`) that
//! writes out what Keras does and torch does not (TensorFlow's SAME padding, channels-last
//! convolution, layer and batch normalization over any axis, Keras' attention and its mask
//! rules). Masks travel explicitly: `m5` is the Keras mask of `x5`, decided by the same rules the
//! Burn executor applies. `forward(..., trace={})` records every node's output under the node's
//! label, so the probe written beside the module lets `python3 OUT.py` name the first node where
//! torch and Burn (or Keras, with `--probe`) differ.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;

use serde_json::Value as Json;

use super::activation::Activation;
use super::graph::{Arg, Node, Port};
use super::layers::core_layers::Elementwise;
use super::layers::merge::Merge;
use super::layers::pooling::Pooling;
use super::layers::reshape::Reshape;
use super::layers::{Layer, Stateless, StatelessKind};
use super::executor::KerasModel;
use super::ops::Operation;
use super::value::{Binary, DType, Reduce, Unary};
use model::error::{ModelError, Result};
use model::weights::{HostTensor, WeightMap};

const PRELUDE: &str = include_str!("torch_prelude.py");

/// The generated module and its weights.
pub struct TorchExport {
    /// The Python source of `OUT.py`.
    pub source: String,
    /// Its `state_dict`, in torch's layouts.
    pub state_dict: WeightMap,
    /// `(node label, torch construct)` for the printout, in running order.
    pub constructs: Vec<(String, String)>,
}

/// The Python module for `model`. `ranks` gives each node's first output rank (from a probe
/// run); `weights_file` and `probe_file` are the names beside the module.
pub fn torch_export(model: &KerasModel, ranks: &[usize], weights_file: &str, probe_file: &str) -> Result<TorchExport> {
    let graph = &model.graph;
    let mut names = AttrNames::default();
    let attrs: Vec<String> = graph.layers.iter().map(|l| names.unique(&l.name)).collect();
    let mut init = String::new();
    let mut state = WeightMap::new();
    let mut built = HashSet::new();
    let mut body = String::new();
    let mut constructs = Vec::new();
    let inputs: Vec<String> = graph.inputs.iter().map(|i| names.unique(&i.name)).collect();
    for (index, node) in graph.nodes.iter().enumerate() {
        let spec = graph.layer_of(node);
        let attr = &attrs[node.layer];
        let what = format!("layer {} ({})", node.label, spec.class_name);
        let refuse =
            |why: &str| ModelError::Conversion { direction: "Keras -> torch", reason: format!("{what}: {why}") };
        let x = |port: &Port| var(*port);
        let first_mask = mask_of(node);
        let mut e = Emit { lines: Vec::new(), index };
        let construct: String = match &model.layers[node.layer] {
            Layer::Stateless(Stateless { kind: StatelessKind::Input }) => {
                let position = graph
                    .inputs
                    .iter()
                    .position(|i| i.node == index)
                    .ok_or_else(|| refuse("an input layer that is not a model input"))?;
                e.line(format!("x{index}, m{index} = {}, None", inputs[position]));
                "input".into()
            }
            Layer::Dense(d) => {
                let [input, units] = d.kernel.dims();
                if built.insert(node.layer) {
                    let _ = writeln!(
                        init,
                        "        self.{attr} = torch.nn.Linear({input}, {units}, bias={})",
                        py_bool(d.bias.is_some())
                    );
                    state.insert(format!("{attr}.weight"), HostTensor::from_tensor(d.kernel.val()).transposed());
                    if let Some(b) = &d.bias {
                        state.insert(format!("{attr}.bias"), HostTensor::from_tensor(b.val()));
                    }
                }
                e.line(format!("x{index} = {}", activate(d.activation, &format!("self.{attr}({})", arg0(node)?))));
                e.line(format!("m{index} = {first_mask}"));
                format!("nn.Linear({input}, {units})")
            }
            Layer::EinsumDense(d) => {
                if built.insert(node.layer) {
                    let bias = if d.bias.is_some() { format!("{:?}", d.bias_shape) } else { "None".into() };
                    let _ = writeln!(
                        init,
                        "        self.{attr} = EinsumDense({:?}, {:?}, {bias}, {:?})",
                        d.equation,
                        d.kernel_shape,
                        activation_name(d.activation)
                    );
                    state.insert(
                        format!("{attr}.kernel"),
                        HostTensor::from_tensor(d.kernel.val()).reshaped(d.kernel_shape.clone()),
                    );
                    if let Some(b) = &d.bias {
                        state.insert(
                            format!("{attr}.bias"),
                            HostTensor::from_tensor(b.val()).reshaped(d.bias_shape.clone()),
                        );
                    }
                }
                e.line(format!("x{index}, m{index} = self.{attr}({}), None", arg0(node)?));
                format!("EinsumDense({:?})", d.equation)
            }
            Layer::Embedding(d) => {
                let [vocabulary, width] = d.embeddings.dims();
                if built.insert(node.layer) {
                    let _ = writeln!(init, "        self.{attr} = torch.nn.Embedding({vocabulary}, {width})");
                    state.insert(format!("{attr}.weight"), HostTensor::from_tensor(d.embeddings.val()));
                }
                let ids = arg0(node)?;
                e.line(format!("x{index} = self.{attr}({ids}.long())"));
                e.line(format!("m{index} = {}", if d.mask_zero { format!("{ids} != 0") } else { "None".into() }));
                format!("nn.Embedding({vocabulary}, {width}){}", if d.mask_zero { ", mask = ids != 0" } else { "" })
            }
            Layer::PRelu(d) => {
                if built.insert(node.layer) {
                    let _ = writeln!(init, "        self.{attr} = PReLU({:?})", d.alpha_shape);
                    state.insert(
                        format!("{attr}.alpha"),
                        HostTensor::from_tensor(d.alpha.val()).reshaped(d.alpha_shape.clone()),
                    );
                }
                e.line(format!("x{index}, m{index} = self.{attr}({}), {first_mask}", arg0(node)?));
                "PReLU".into()
            }
            Layer::Conv1d(c) => {
                let [filters, per_group, kernel] = c.weight.dims();
                if built.insert(node.layer) {
                    let _ = writeln!(
                        init,
                        "        self.{attr} = Conv1D({}, {filters}, {kernel}, {}, {}, {}, {}, {:?}, {}, {:?})",
                        per_group * c.groups,
                        c.stride,
                        c.dilation,
                        c.groups,
                        py_bool(c.bias.is_some()),
                        c.padding,
                        py_bool(c.channels_last),
                        activation_name(c.activation)
                    );
                    state.insert(format!("{attr}.conv.weight"), HostTensor::from_tensor(c.weight.val()));
                    if let Some(b) = &c.bias {
                        state.insert(format!("{attr}.conv.bias"), HostTensor::from_tensor(b.val()));
                    }
                }
                e.line(format!("x{index}, m{index} = self.{attr}({}), None", arg0(node)?));
                format!("nn.Conv1d({}, {filters}, {kernel}) with padding {:?}", per_group * c.groups, c.padding)
            }
            Layer::LayerNorm(n) => {
                let width = n.gamma.as_ref().or(n.beta.as_ref()).map_or(1, |p| p.dims()[0]);
                if built.insert(node.layer) {
                    let _ = writeln!(
                        init,
                        "        self.{attr} = LayerNormalization([{width}], {:?}, {:e}, {}, {}, {})",
                        n.axes,
                        n.epsilon,
                        py_bool(n.beta.is_some() || n.rms_scaling),
                        py_bool(n.gamma.is_some()),
                        py_bool(n.rms_scaling)
                    );
                    for (name, p) in [("gamma", &n.gamma), ("beta", &n.beta)] {
                        if let Some(p) = p {
                            state.insert(format!("{attr}.{name}"), HostTensor::from_tensor(p.val()));
                        }
                    }
                }
                e.line(format!("x{index}, m{index} = self.{attr}({}), {first_mask}", arg0(node)?));
                format!("LayerNormalization(axes {:?}, eps {:e})", n.axes, n.epsilon)
            }
            Layer::BatchNorm(n) => {
                let channels = n.moving_mean.value_sync().dims()[0];
                if built.insert(node.layer) {
                    let _ = writeln!(
                        init,
                        "        self.{attr} = BatchNormalization({channels}, {}, {:e}, {:?}, {}, {})",
                        n.axis,
                        n.epsilon,
                        n.momentum,
                        py_bool(n.beta.is_some()),
                        py_bool(n.gamma.is_some())
                    );
                    for (name, p) in [("gamma", &n.gamma), ("beta", &n.beta)] {
                        if let Some(p) = p {
                            state.insert(format!("{attr}.{name}"), HostTensor::from_tensor(p.val()));
                        }
                    }
                    state.insert(format!("{attr}.moving_mean"), HostTensor::from_tensor(n.moving_mean.value_sync()));
                    state.insert(
                        format!("{attr}.moving_variance"),
                        HostTensor::from_tensor(n.moving_variance.value_sync()),
                    );
                }
                e.line(format!("x{index}, m{index} = self.{attr}({}, {first_mask}), {first_mask}", arg0(node)?));
                format!("BatchNormalization(axis {}, eps {:e})", n.axis, n.epsilon)
            }
            Layer::Attention(a) => {
                let layer = &a.layer;
                let query_port = port_arg(node, 0, "query").ok_or_else(|| refuse("no query tensor"))?;
                let rank = ranks.get(query_port.node).copied().unwrap_or(3);
                let axes = model::keras_mha::resolve_attention_axes(layer.attention_axes.as_deref(), rank)
                    .map_err(|e| refuse(&e.to_string()))?;
                if layer.gate.is_some() || layer.sliding_window.is_some() {
                    return Err(refuse("use_gate and sliding_window are not written for torch yet"));
                }
                let d = layer.dims();
                if built.insert(node.layer) {
                    let _ = writeln!(
                        init,
                        "        self.{attr} = MultiHeadAttention({}, {}, {}, {}, {}, {}, {}, bias={}, dropout={:?})",
                        d.query_dim,
                        d.key_input_dim,
                        d.value_input_dim,
                        d.num_heads,
                        d.key_dim,
                        d.value_dim,
                        d.output_dim,
                        py_bool(layer.query.bias.is_some()),
                        layer.dropout
                    );
                    for (name, linear) in [
                        ("query", &layer.query),
                        ("key", &layer.key),
                        ("value", &layer.value),
                        ("output", &layer.output),
                    ] {
                        state.insert(
                            format!("{attr}.{name}.weight"),
                            HostTensor::from_tensor(linear.weight.val()).transposed(),
                        );
                        if let Some(b) = &linear.bias {
                            state.insert(format!("{attr}.{name}.bias"), HostTensor::from_tensor(b.val()));
                        }
                    }
                }
                let value_port = port_arg(node, 1, "value").ok_or_else(|| refuse("no value tensor"))?;
                let key_port = port_arg(node, 2, "key");
                let mask_var = |p: Port| if p.index == 0 { format!("m{}", p.node) } else { "None".into() };
                let attention_mask = node
                    .kwargs
                    .iter()
                    .find(|(k, _)| k == "attention_mask")
                    .map(|(_, a)| render(a))
                    .unwrap_or("None".into());
                let causal = node_flag(node, "use_causal_mask");
                let scores = node_flag(node, "return_attention_scores");
                let outputs = if scores { format!("x{index}, x{index}_1") } else { format!("x{index}") };
                e.line(format!(
                    "{outputs} = self.{attr}({}, {}, key={}, query_mask={}, value_mask={}, key_mask={}, attention_mask={attention_mask}, use_causal_mask={}, return_attention_scores={}, attention_axes={axes:?})",
                    x(&query_port),
                    x(&value_port),
                    key_port.map_or("None".into(), |p| x(&p)),
                    mask_var(query_port),
                    mask_var(value_port),
                    key_port.map_or("None".into(), mask_var),
                    py_bool(causal),
                    py_bool(scores)
                ));
                e.line(format!("m{index} = {}", mask_var(query_port)));
                // Keras' MultiHeadAttention takes the masks off its input tensors.
                let mut erased = Vec::new();
                for port in node.args.iter().chain(node.kwargs.iter().map(|(_, a)| a)).flat_map(Arg::ports) {
                    if port.index == 0 && !erased.contains(&port.node) {
                        erased.push(port.node);
                        e.line(format!("m{} = None  # Keras' attention clears its inputs' masks", port.node));
                    }
                }
                "MultiHeadAttention (Keras' rules, written in torch)".into()
            }
            Layer::Stateless(Stateless { kind }) => {
                stateless(&mut e, kind, node, &first_mask).map_err(|why| refuse(&why))?
            }
        };
        e.line(format!("if trace is not None: trace[{:?}] = x{index}", node.label));
        constructs.push((format!("{} ({})", node.label, spec.class_name), construct));
        for line in e.lines {
            let _ = writeln!(body, "        {line}");
        }
    }
    let returns: Vec<String> = graph.outputs.iter().map(|(_, p)| var(*p)).collect();
    let returned = if returns.len() == 1 { returns[0].clone() } else { format!("({})", returns.join(", ")) };
    let input_names: Vec<String> = graph.inputs.iter().map(|i| format!("{:?}", i.name)).collect();
    let input_dtypes: Vec<String> = graph
        .inputs
        .iter()
        .map(|i| {
            format!(
                "{:?}: {}",
                i.name,
                if DType::parse(&i.dtype) == Some(DType::Float) { "torch.float32" } else { "torch.int64" }
            )
        })
        .collect();
    let output_names: Vec<String> = graph.outputs.iter().map(|(n, _)| format!("{n:?}")).collect();
    let source = format!(
        r#""""{name}: a Keras 3 model as one torch nn.Module.

Generated by `cargo xtask convert`. `load()` returns the module in eval mode with the weights of
`{weights_file}` (loaded with `load_state_dict(strict=True)`). `python3 <this file>` runs it on
the probe `{probe_file}` (the inputs, and Burn's output of every node) and names the first node
where torch and Burn differ; `--probe FILE` checks against another probe in the same format,
such as one made by Keras.
"""

{PRELUDE}

INPUTS = [{inputs}]
INPUT_DTYPES = {{{dtypes}}}
OUTPUTS = [{outputs}]
WEIGHTS = os.path.join(HERE, "{weights_file}")
PROBE = os.path.join(HERE, "{probe_file}")


class Model(torch.nn.Module):
    """{name}, call by call as Keras runs it; `m<i>` is the Keras mask of `x<i>`."""

    def __init__(self):
        super().__init__()
{init}
    def forward(self, {args}, trace=None):
{body}        return {returned}


def load(path=WEIGHTS):
    model = Model()
    model.load_state_dict(load_file(path), strict=True)
    return model.eval()


def check(probe_path, tolerance=1e-5):
    """Runs the probe's inputs; prints each output's largest difference and the first node that differs."""
    probe = load_file(probe_path)
    model = load()
    inputs = [probe["inputs." + name].to(INPUT_DTYPES[name]) for name in INPUTS]
    trace = {{}}
    with torch.no_grad():
        outputs = model(*inputs, trace=trace)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    for label, ours in trace.items():
        theirs = probe.get("nodes." + label)
        if theirs is None or not torch.is_tensor(ours):
            continue
        if tuple(theirs.shape) != tuple(ours.shape):
            print(f"first node that differs: {{label}}: shape {{tuple(ours.shape)}}, the probe's {{tuple(theirs.shape)}}")
            break
        difference = (ours.double() - theirs.double()).abs().max().item() if ours.numel() else 0.0
        if not difference <= tolerance:
            print(f"first node that differs: {{label}}: {{difference:.3e}}")
            break
    worst = 0.0
    for name, ours in zip(OUTPUTS, outputs):
        theirs = probe["expected." + name]
        difference = (ours.double() - theirs.double()).abs().max().item()
        worst = max(worst, difference)
        print(f"{{name}}: max |torch - probe| = {{difference:.3e}}")
    return worst <= tolerance


if __name__ == "__main__":
    path = sys.argv[sys.argv.index("--probe") + 1] if "--probe" in sys.argv else PROBE
    sys.exit(0 if check(path) else 1)
"#,
        name = graph.name,
        inputs = input_names.join(", "),
        dtypes = input_dtypes.join(", "),
        outputs = output_names.join(", "),
        args = inputs.join(", "),
    );
    Ok(TorchExport { source, state_dict: state, constructs })
}

/// The lines of one node.
struct Emit {
    lines: Vec<String>,
    index: usize,
}

impl Emit {
    fn line(&mut self, line: String) {
        self.lines.push(line);
    }
}

/// The variable of a port: `x5` for a node's first output, `x5_1` for its second.
fn var(port: Port) -> String {
    if port.index == 0 { format!("x{}", port.node) } else { format!("x{}_{}", port.node, port.index) }
}

/// An argument as a Python expression.
fn render(arg: &Arg) -> String {
    match arg {
        Arg::Tensor(p) => var(*p),
        Arg::List(items) => format!("[{}]", items.iter().map(render).collect::<Vec<_>>().join(", ")),
        Arg::Const(c) => literal(c),
    }
}

fn literal(value: &Json) -> String {
    match value {
        Json::Null => "None".into(),
        Json::Bool(b) => py_bool(*b).into(),
        Json::Number(n) => n.to_string(),
        Json::String(s) => format!("{s:?}"),
        Json::Array(items) => format!("[{}]", items.iter().map(literal).collect::<Vec<_>>().join(", ")),
        Json::Object(_) => "None".into(),
    }
}

fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

/// The mask Keras hands the node (`previous_mask`): a recorded `mask=` tensor, else its first
/// tensor argument's.
fn mask_of(node: &Node) -> String {
    if let Some((_, Arg::Tensor(p))) = node.kwargs.iter().find(|(k, _)| k == "mask") {
        return var(*p);
    }
    match node.args.first() {
        Some(Arg::Tensor(p)) if p.index == 0 => format!("m{}", p.node),
        _ => "None".into(),
    }
}

fn arg0(node: &Node) -> Result<String> {
    match node.args.first() {
        Some(Arg::Tensor(p)) => Ok(var(*p)),
        Some(Arg::List(items)) if items.len() == 1 => Ok(render(&items[0])),
        _ => Err(ModelError::Conversion {
            direction: "Keras -> torch",
            reason: format!("{}: no tensor input", node.label),
        }),
    }
}

/// The tensor at `position` or keyword `name`.
fn port_arg(node: &Node, position: usize, name: &str) -> Option<Port> {
    match node.args.get(position).or_else(|| node.kwargs.iter().find(|(k, _)| k == name).map(|(_, a)| a)) {
        Some(Arg::Tensor(p)) => Some(*p),
        _ => None,
    }
}

fn node_flag(node: &Node, name: &str) -> bool {
    matches!(node.kwargs.iter().find(|(k, _)| k == name), Some((_, Arg::Const(Json::Bool(true)))))
}

/// The recorded `training=` of a call (Dropout records `False` when Keras forced it), else the module's.
fn training_of(node: &Node) -> &'static str {
    match node.kwargs.iter().find(|(k, _)| k == "training") {
        Some((_, Arg::Const(Json::Bool(true)))) => "True",
        Some((_, Arg::Const(Json::Bool(false)))) => "False",
        _ => "self.training",
    }
}

fn activation_name(a: Activation) -> &'static str {
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

fn activate(a: Activation, x: &str) -> String {
    match a {
        Activation::Linear => x.to_string(),
        _ => format!("ACTIVATIONS[{:?}]({x})", activation_name(a)),
    }
}

/// A layer or operation without weights; `Err` is why it cannot be written.
fn stateless(e: &mut Emit, kind: &StatelessKind, node: &Node, first_mask: &str) -> std::result::Result<String, String> {
    let i = e.index;
    let x0 = || arg0(node).map_err(|err| err.to_string());
    match kind {
        StatelessKind::Input => Err("an input layer called on a tensor".into()),
        StatelessKind::Core(core) => {
            let x = x0()?;
            let (expr, construct) = match core {
                Elementwise::Activation(a) => (activate(*a, &x), format!("activation {}", activation_name(*a))),
                Elementwise::Relu { max_value, negative_slope, threshold } => (
                    format!(
                        "keras_relu({x}, {}, {negative_slope:?}, {threshold:?})",
                        max_value.map_or("None".into(), |v| format!("{v:?}"))
                    ),
                    "ReLU".into(),
                ),
                Elementwise::LeakyRelu { negative_slope } => {
                    (format!("F.leaky_relu({x}, {negative_slope:?})"), "F.leaky_relu".into())
                }
                Elementwise::Elu { alpha } => (format!("keras_elu({x}, {alpha:?})"), "ELU".into()),
                Elementwise::Softmax { axes } => {
                    (format!("keras_softmax({x}, {axes:?}, {first_mask})"), "softmax with the mask".into())
                }
                Elementwise::Identity => (x.clone(), "identity".into()),
                Elementwise::Dropout { rate, spatial } => (
                    format!("dropout({x}, {rate:?}, {}, {})", py_bool(*spatial), training_of(node)),
                    "dropout (identity in eval)".into(),
                ),
                Elementwise::GaussianNoise { stddev } => (
                    format!("gaussian_noise({x}, {stddev:?}, {})", training_of(node)),
                    "Gaussian noise (identity in eval)".into(),
                ),
                Elementwise::GaussianDropout { rate } => (
                    format!("gaussian_dropout({x}, {rate:?}, {})", training_of(node)),
                    "Gaussian dropout (identity in eval)".into(),
                ),
                Elementwise::Masking { mask_value } => {
                    e.line(format!("x{i}, m{i} = masking({x}, {mask_value:?})"));
                    return Ok("masking".into());
                }
            };
            e.line(format!("x{i}, m{i} = {expr}, {first_mask}"));
            Ok(construct)
        }
        StatelessKind::Pool(pool) => {
            let x = x0()?;
            let (expr, construct) = match *pool {
                Pooling::Window { max, pool, stride, same, channels_last } => (
                    format!(
                        "pool1d({x}, {}, {pool}, {stride}, {}, {})",
                        py_bool(max),
                        py_bool(same),
                        py_bool(channels_last)
                    ),
                    format!("{} pooling, TensorFlow's padding", if max { "max" } else { "average" }),
                ),
                Pooling::Global { max: false, channels_last, keepdims } => (
                    format!(
                        "global_average_pool1d({x}, {first_mask}, {}, {})",
                        py_bool(channels_last),
                        py_bool(keepdims)
                    ),
                    "masked mean over the steps".into(),
                ),
                Pooling::Global { max: true, channels_last, keepdims } => (
                    format!(
                        "torch.amax({x}, dim={}, keepdim={})",
                        if channels_last { 1 } else { 2 },
                        py_bool(keepdims)
                    ),
                    "torch.amax over the steps".into(),
                ),
            };
            e.line(format!("x{i}, m{i} = {expr}, None"));
            Ok(construct)
        }
        StatelessKind::Reshape(reshape) => {
            let x = x0()?;
            let expr = match reshape {
                Reshape::Flatten { channels_last: true } => format!("torch.flatten({x}, 1)"),
                Reshape::Flatten { channels_last: false } => {
                    format!(
                        "torch.flatten({x}.permute(0, *range(2, {x}.dim()), 1), 1) if {x}.dim() > 2 else torch.flatten({x}, 1)"
                    )
                }
                Reshape::Reshape { target } => format!("{x}.reshape({x}.shape[0], *{target:?})"),
                Reshape::Permute { dims } => format!("{x}.permute(0, *{dims:?})"),
                Reshape::RepeatVector { n } => format!("{x}.unsqueeze(1).expand(-1, {n}, -1)"),
            };
            e.line(format!("x{i}, m{i} = {expr}, None"));
            Ok("tensor reshaping".into())
        }
        StatelessKind::Merge(merge) => {
            let ports: Vec<Port> = node.args.first().map(Arg::ports).unwrap_or_default();
            let xs: Vec<String> = ports.iter().map(|p| var(*p)).collect();
            let ms: Vec<String> =
                ports.iter().map(|p| if p.index == 0 { format!("m{}", p.node) } else { "None".into() }).collect();
            let (expr, mask) = match merge {
                Merge::Elementwise(op) => {
                    let expr = match op {
                        Binary::Add => xs.join(" + "),
                        Binary::Subtract => xs.join(" - "),
                        Binary::Multiply => xs.join(" * "),
                        Binary::Maximum => fold("torch.maximum", &xs),
                        Binary::Minimum => fold("torch.minimum", &xs),
                        other => return Err(format!("merge {other:?}")),
                    };
                    (expr, format!("merge_masks([{}])", ms.join(", ")))
                }
                Merge::Average => {
                    (format!("({}) / {}", xs.join(" + "), xs.len()), format!("merge_masks([{}])", ms.join(", ")))
                }
                Merge::Concatenate { axis } => (
                    format!("torch.cat([{}], dim={axis})", xs.join(", ")),
                    format!("concatenate_masks([{}], [{}], {axis})", xs.join(", "), ms.join(", ")),
                ),
            };
            e.line(format!("x{i}, m{i} = {expr}, {mask}"));
            Ok("elementwise merge".into())
        }
        StatelessKind::Operation(op) => {
            let operand = |k: usize| node.args.get(k).map(render).ok_or_else(|| format!("operand {k} is missing"));
            let tensor = |k: usize| -> std::result::Result<String, String> {
                let r = operand(k)?;
                Ok(if matches!(node.args.get(k), Some(Arg::Const(_))) { format!("torch.tensor({r})") } else { r })
            };
            let expr = match op {
                Operation::Binary(b) => {
                    let (a, c) = (operand(0)?, operand(1)?);
                    match b {
                        Binary::Add => format!("{a} + {c}"),
                        Binary::Subtract => format!("{a} - {c}"),
                        Binary::Multiply => format!("{a} * {c}"),
                        Binary::Divide => format!("torch.true_divide({}, {c})", tensor(0)?),
                        Binary::Power => format!("torch.pow({a}, {c})"),
                        Binary::Maximum => format!("torch.maximum({}, {})", tensor(0)?, tensor(1)?),
                        Binary::Minimum => format!("torch.minimum({}, {})", tensor(0)?, tensor(1)?),
                        Binary::Equal => format!("torch.eq({}, {c})", tensor(0)?),
                        Binary::NotEqual => format!("torch.ne({}, {c})", tensor(0)?),
                        Binary::Greater => format!("torch.gt({}, {c})", tensor(0)?),
                        Binary::GreaterEqual => format!("torch.ge({}, {c})", tensor(0)?),
                        Binary::Less => format!("torch.lt({}, {c})", tensor(0)?),
                        Binary::LessEqual => format!("torch.le({}, {c})", tensor(0)?),
                        Binary::LogicalAnd => format!("torch.logical_and({}, {})", tensor(0)?, tensor(1)?),
                        Binary::LogicalOr => format!("torch.logical_or({}, {})", tensor(0)?, tensor(1)?),
                        Binary::LogicalXor => format!("torch.logical_xor({}, {})", tensor(0)?, tensor(1)?),
                    }
                }
                Operation::Unary(u) => {
                    let a = tensor(0)?;
                    match u {
                        Unary::Negative => format!("-{a}"),
                        Unary::Abs => format!("torch.abs({a})"),
                        Unary::Square => format!("torch.square({a})"),
                        Unary::Sqrt => format!("torch.sqrt({a})"),
                        Unary::Exp => format!("torch.exp({a})"),
                        Unary::Log => format!("torch.log({a})"),
                        Unary::Tanh => format!("torch.tanh({a})"),
                        Unary::Sigmoid => format!("torch.sigmoid({a})"),
                        Unary::Relu => format!("F.relu({a})"),
                        Unary::Sign => format!("torch.sign({a})"),
                        Unary::Floor => format!("torch.floor({a})"),
                        Unary::Round => format!("torch.round({a})"),
                        Unary::LogicalNot => format!("torch.logical_not({a})"),
                        other => return Err(format!("operation {other:?}")),
                    }
                }
                Operation::Gelu { approximate } => {
                    format!("F.gelu({}, approximate={:?})", tensor(0)?, if *approximate { "tanh" } else { "none" })
                }
                Operation::Silu => format!("F.silu({})", tensor(0)?),
                Operation::Softmax { axis, log } => {
                    format!("torch.{}({}, dim={axis})", if *log { "log_softmax" } else { "softmax" }, tensor(0)?)
                }
                Operation::Cast(to) => format!(
                    "{}.to({})",
                    tensor(0)?,
                    match to {
                        DType::Float => "torch.float32",
                        DType::Int => "torch.int64",
                        DType::Bool => "torch.bool",
                    }
                ),
                Operation::Where => format!("torch.where({}.bool(), {}, {})", tensor(0)?, tensor(1)?, tensor(2)?),
                Operation::Clip { min, max } => {
                    format!("torch.clamp({}, {}, {})", tensor(0)?, py_float(*min), py_float(*max))
                }
                Operation::Matmul => format!("torch.matmul({}, {})", tensor(0)?, tensor(1)?),
                Operation::Concatenate { axis } => format!("torch.cat({}, dim={axis})", operand(0)?),
                Operation::Reshape { shape } => format!("{}.reshape({shape:?})", tensor(0)?),
                Operation::Transpose { axes: None } => format!("{0}.permute(*reversed(range({0}.dim())))", tensor(0)?),
                Operation::Transpose { axes: Some(axes) } => format!("{}.permute({axes:?})", tensor(0)?),
                Operation::ExpandDims { axes } => format!("expand_dims({}, {axes:?})", tensor(0)?),
                Operation::Squeeze { axes: None } => format!("{}.squeeze()", tensor(0)?),
                Operation::Squeeze { axes: Some(axes) } => format!("{}.squeeze({})", tensor(0)?, tuple(axes)),
                Operation::Reduce { kind, axes, keepdims } => format!(
                    "reduce({}, {:?}, {}, {})",
                    tensor(0)?,
                    match kind {
                        Reduce::Sum => "sum",
                        Reduce::Mean => "mean",
                        Reduce::Max => "max",
                        Reduce::Min => "min",
                        Reduce::Prod => "prod",
                        Reduce::Any => "any",
                        Reduce::All => "all",
                    },
                    axes.as_ref().map_or("None".into(), |a| format!("{a:?}")),
                    py_bool(*keepdims)
                ),
            };
            e.line(format!("x{i}, m{i} = {expr}, None"));
            Ok("torch operation".into())
        }
    }
}

fn fold(function: &str, xs: &[String]) -> String {
    xs.iter().skip(1).fold(xs[0].clone(), |acc, x| format!("{function}({acc}, {x})"))
}

fn tuple(axes: &[i64]) -> String {
    format!("({},)", axes.iter().map(i64::to_string).collect::<Vec<_>>().join(", "))
}

fn py_float(v: f64) -> String {
    if v.is_infinite() { if v > 0.0 { "math.inf".into() } else { "-math.inf".into() } } else { format!("{v:?}") }
}

/// Python attribute names from layer names: identifiers, unique, clear of `nn.Module`'s own.
#[derive(Default)]
struct AttrNames {
    used: BTreeMap<String, usize>,
}

impl AttrNames {
    fn unique(&mut self, name: &str) -> String {
        let mut base: String =
            name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '_' }).collect();
        if base.is_empty() || base.starts_with(|c: char| c.is_ascii_digit()) {
            base.insert_str(0, "layer_");
        }
        const RESERVED: [&str; 14] = [
            "training",
            "forward",
            "eval",
            "train",
            "parameters",
            "modules",
            "state_dict",
            "to",
            "cuda",
            "cpu",
            "trace",
            "self",
            "type",
            "float",
        ];
        if RESERVED.contains(&base.as_str()) || is_python_keyword(&base) {
            base.push_str("_layer");
        }
        let count = self.used.entry(base.clone()).or_insert(0);
        *count += 1;
        if *count == 1 { base } else { format!("{base}_{}", *count - 1) }
    }
}

fn is_python_keyword(name: &str) -> bool {
    matches!(
        name,
        "and"
            | "as"
            | "assert"
            | "break"
            | "class"
            | "continue"
            | "def"
            | "del"
            | "elif"
            | "else"
            | "except"
            | "finally"
            | "for"
            | "from"
            | "global"
            | "if"
            | "import"
            | "in"
            | "is"
            | "lambda"
            | "nonlocal"
            | "not"
            | "or"
            | "pass"
            | "raise"
            | "return"
            | "try"
            | "while"
            | "with"
            | "yield"
            | "none"
            | "true"
            | "false"
            | "math"
            | "os"
            | "sys"
            | "torch"
            | "f"
    )
}
