//! A whole Keras model as PyTorch code: one readable `nn.Module` whose `forward` mirrors the
//! graph call by call, and its state dict.
//!
//! Each layer becomes a torch built-in where one is exact (`nn.Linear`, `nn.Embedding`,
//! `nn.Dropout`'s functional form) or a short class of the prelude (`prelude.py`) that
//! writes out what Keras does and torch does not (TensorFlow's SAME padding, channels-last
//! convolution, layer and batch normalization over any axis, Keras' attention and its mask
//! rules). Masks travel explicitly: `m5` is the Keras mask of `x5`, decided by the same rules the
//! Burn executor applies, and only where the probe run saw one. `check` records every layer's
//! output with forward hooks (`NODES`), so the probe written beside the module lets
//! `python3 OUT.py` name the first layer where torch and Burn (or Keras, with `--probe`) differ,
//! and `forward` reads as the graph, line by line.

mod classes;
mod emit;
mod origin;
mod prelude;
mod shared;

pub use emit::{
    PyCall, TorchCall, TorchModule, activate, activation_name, fold, literal, py_bool, py_float, py_str, receives_mask,
    render, torch_dtype, tuple, var,
};

use std::collections::{BTreeMap, HashSet};

use classes::{NodeCode, Parts, assemble};
use origin::{Origin, Plan};
use prelude::{prelude_for, prelude_names};
use shared::{reading_shared, repeated_values, shared_port};
use std::fmt::Write as _;

use crate::executor::KerasModel;
use crate::graph::{Arg, Node, Port};
use crate::value::DType;
use model::error::Result;
use model::weights::WeightMap;

/// Where the generated source holds the prelude until the rest of it is written.
const PRELUDE_SLOT: &str = "\u{0}prelude\u{0}";

/// The generated module and its weights.
pub struct TorchExport {
    /// The Python source of `OUT.py`.
    pub source: String,
    /// Its `state_dict`, in torch's layouts.
    pub state_dict: WeightMap,
    /// `(node label, torch construct)` for the printout, in running order.
    pub constructs: Vec<(String, String)>,
}

/// The Python module for `model`. `ranks` gives each node's first output rank and `masked`
/// whether it carries a Keras mask (from a probe run); `weights_file` and `probe_file` are the
/// names beside the module. Each layer class writes its own attribute and statements
/// ([`crate::layers::KerasLayer`]).
pub fn torch_export(
    model: &KerasModel,
    ranks: &[usize],
    masked: &[bool],
    weights_file: &str,
    probe_file: &str,
) -> Result<TorchExport> {
    let graph = &model.graph;
    let origin = Origin::read(graph, &model.config);
    // Each value computed once: the nodes read a repeated operation's value where it is first
    // computed (shared.rs), and the repeating nodes write nothing.
    let same = repeated_values(model, masked, &origin.node_block);
    let nodes: Vec<_> = graph.nodes.iter().map(|node| reading_shared(node, &same)).collect();
    let model_outputs: Vec<_> = graph.outputs.iter().map(|(name, port)| (name, shared_port(*port, &same))).collect();
    let written: Vec<bool> = same.iter().map(Option::is_none).collect();
    let read_ports: Vec<Vec<Port>> = nodes
        .iter()
        .map(|n| n.args.iter().chain(n.kwargs.iter().map(|(_, a)| a)).flat_map(Arg::ports).collect())
        .collect();
    let reads: Vec<Vec<usize>> = read_ports.iter().map(|ports| ports.iter().map(|p| p.node).collect()).collect();
    // How many outputs of each node are read: by later nodes, or as the model's outputs.
    let mut outputs_read = vec![1usize; nodes.len()];
    for port in read_ports.iter().flatten().chain(model_outputs.iter().map(|(_, p)| p)) {
        outputs_read[port.node] = outputs_read[port.node].max(port.index + 1);
    }
    let mut layer_nodes = vec![Vec::new(); graph.layers.len()];
    for (index, node) in nodes.iter().enumerate().filter(|(i, _)| written[*i]) {
        layer_nodes[node.layer].push(index);
    }
    let mut plan = Plan::new(&origin);
    plan.settle(&reads, &written, &layer_nodes);
    let module = loop {
        let attempt = Module {
            model,
            ranks,
            masked,
            nodes: &nodes,
            written: &written,
            layer_nodes: &layer_nodes,
            outputs_read: &outputs_read,
        };
        match attempt.write(&plan, &model_outputs)? {
            Ok(module) => break module,
            Err(instance) => {
                plan.drop_instance(instance);
                plan.settle(&reads, &written, &layer_nodes);
            }
        }
    };
    let WrittenModule { inputs, classes, init, body, state, constructs, hooked } = module;
    let returns: Vec<String> = model_outputs.iter().map(|(_, p)| var(*p)).collect();
    let returned = if returns.len() == 1 { returns[0].clone() } else { format!("({})", returns.join(", ")) };
    let input_names: Vec<String> = graph.inputs.iter().map(|i| format!("{:?}", i.name)).collect();
    let input_dtypes: Vec<String> = graph
        .inputs
        .iter()
        .map(|i| {
            format!(
                "{:?}: {}",
                i.name,
                torch_dtype(if DType::parse(&i.dtype) == Some(DType::Float) { DType::Float } else { DType::Int })
            )
        })
        .collect();
    let output_names: Vec<String> = graph.outputs.iter().map(|(n, _)| format!("{n:?}")).collect();
    let nodes: Vec<String> = hooked
        .iter()
        .map(|(attr, labels)| {
            let labels: Vec<String> = labels.iter().map(|l| format!("{l:?}")).collect();
            format!("    {attr:?}: [{}],", labels.join(", "))
        })
        .collect();
    let source = format!(
        r#""""{name}: a Keras 3 model as one torch nn.Module.

Generated by `cargo xtask convert`. `load()` returns the module in eval mode with the weights of
`{weights_file}` (loaded with `load_state_dict(strict=True)`). `python3 <this file>` runs it on
the probe `{probe_file}` (the inputs, and Burn's output of every node) and names the first layer
where torch and Burn differ (recorded by forward hooks, `NODES`); `--probe FILE` checks against
another probe in the same format, such as one made by Keras.
"""

{prelude}

INPUTS = [{inputs}]
INPUT_DTYPES = {{{dtypes}}}
OUTPUTS = [{outputs}]
# Each layer attribute and the graph nodes it computes, in running order (for `check`).
NODES = {{
{nodes}
}}
WEIGHTS = os.path.join(HERE, "{weights_file}")
PROBE = os.path.join(HERE, "{probe_file}")


{classes}class Model(torch.nn.Module):
    """{name}, call by call as Keras runs it; `m<i>` is the Keras mask of `x<i>` where it has one."""

    def __init__(self):
        super().__init__()
{init}
    def forward(self, {args}):
{body}        return {returned}


def load(path=WEIGHTS, keep_memory=True):
    """The module in eval mode with the weights of `path`; `keep_memory` calls keep_freed_memory()."""
    if keep_memory:
        keep_freed_memory()
    model = Model()
    model.load_state_dict(load_file(path), strict=True)
    return model.eval()


def largest_difference(ours, theirs):
    """max |ours - theirs|, relative where |theirs| exceeds 1: float32's ulp at 160 is 1.5e-5, and
    libraries round an ulp apart on some processors."""
    ours, theirs = ours.double(), theirs.double()
    return ((ours - theirs).abs() / theirs.abs().clamp(min=1.0)).max().item() if ours.numel() else 0.0


def check(probe_path, tolerance=1e-5):
    """Runs the probe's inputs; prints each output's largest difference and the first node that differs."""
    probe = load_file(probe_path)
    model = load()
    inputs = [probe["inputs." + name].to(INPUT_DTYPES[name]) for name in INPUTS]
    recorded = {{attr: [] for attr in NODES}}

    def record(attr):
        return lambda module, args, output: recorded[attr].append(output[0] if isinstance(output, tuple) else output)

    hooks = [model.get_submodule(attr).register_forward_hook(record(attr)) for attr in NODES]
    with torch.no_grad():
        outputs = model(*inputs)
    for hook in hooks:
        hook.remove()
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    trace = {{label: out for attr, labels in NODES.items() for label, out in zip(labels, recorded[attr])}}
    order = {{label: k for k, label in enumerate(l for labels in NODES.values() for l in labels)}}
    for label, ours in sorted(trace.items(), key=lambda item: order[item[0]]):
        theirs = probe.get("nodes." + label)
        if theirs is None or not torch.is_tensor(ours):
            continue
        if tuple(theirs.shape) != tuple(ours.shape):
            print(f"first node that differs: {{label}}: shape {{tuple(ours.shape)}}, the probe's {{tuple(theirs.shape)}}")
            break
        difference = largest_difference(ours, theirs)
        if not difference <= tolerance:
            print(f"first node that differs: {{label}}: {{difference:.3e}}")
            break
    worst = 0.0
    for name, ours in zip(OUTPUTS, outputs):
        difference = largest_difference(ours, probe["expected." + name])
        worst = max(worst, difference)
        print(f"{{name}}: max |torch - probe| / max(1, |probe|) = {{difference:.3e}}")
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
        nodes = nodes.join("\n"),
        prelude = PRELUDE_SLOT,
    );
    // The prelude's definitions that the module's own code names, and theirs.
    let source = source.replacen(PRELUDE_SLOT, &prelude_for(&source), 1);
    Ok(TorchExport { source, state_dict: state, constructs })
}

/// The parts of the module a plan gives.
struct Module<'a> {
    model: &'a KerasModel,
    ranks: &'a [usize],
    masked: &'a [bool],
    /// The graph's nodes, reading repeated values where they are first computed.
    nodes: &'a [Node],
    /// Whether each node writes code (not a repeated value).
    written: &'a [bool],
    /// Each layer's written nodes.
    layer_nodes: &'a [Vec<usize>],
    /// How many outputs of each node are read (at least 1).
    outputs_read: &'a [usize],
}

/// The module's code for one plan.
struct WrittenModule {
    /// `forward`'s parameters.
    inputs: Vec<String>,
    classes: String,
    init: String,
    body: String,
    state: WeightMap,
    constructs: Vec<(String, String)>,
    /// Each hooked attribute's path and the nodes it computes.
    hooked: Vec<(String, Vec<String>)>,
}

impl Module<'_> {
    /// The module's code, or the instance of `plan` whose calls would need different classes.
    fn write(
        &self,
        plan: &Plan,
        model_outputs: &[(&String, Port)],
    ) -> Result<std::result::Result<WrittenModule, usize>> {
        let (model, graph) = (self.model, &self.model.graph);
        let origin = plan.origin();
        let mut names = AttrNames::default();
        // The inputs keep their Keras names as forward's arguments (`_input` after one that would
        // hide a name of the prelude there); layers are named after them.
        let prelude = prelude_names();
        let inputs: Vec<String> = graph
            .inputs
            .iter()
            .map(|i| {
                let name = names.unique(&i.name);
                if prelude.contains(name.as_str()) { names.unique(&format!("{name}_input")) } else { name }
            })
            .collect();
        // Attributes: a layer's in the module of the instance owning it (inside a block, by the
        // name its layer had there: `query_dense`, `dense` for Keras' `dense_7`), then each
        // instance's in the module holding it.
        let mut instance_names: Vec<AttrNames> = (0..plan.instances()).map(|_| AttrNames::default()).collect();
        // Each instance's custom layer's name (its blocks share it).
        let mut instance_name = vec![""; plan.instances()];
        for (block, source) in origin.blocks.iter().enumerate() {
            instance_name[plan.instance(block)] = &source.name;
        }
        let owners: Vec<Option<usize>> =
            self.layer_nodes.iter().map(|nodes| plan.owner(nodes.iter().copied())).collect();
        let attrs: Vec<String> = graph
            .layers
            .iter()
            .enumerate()
            .map(|(layer, spec)| match owners[layer] {
                // A layer whose calls all repeat values (the flattener's `Identity` keeping an
                // output's name) has no attribute, and takes no name.
                _ if self.layer_nodes[layer].is_empty() => String::new(),
                None => names.unique(&spec.name),
                Some(instance) => {
                    let holder = &instance_name[instance];
                    let own = origin.own_names[layer].as_deref().unwrap_or(&spec.name);
                    instance_names[instance].unique(&local_name(own, &spec.class_name, holder))
                }
            })
            .collect();
        let mut instance_attr = vec![String::new(); plan.instances()];
        for (block, source) in origin.blocks.iter().enumerate() {
            let instance = plan.instance(block);
            if instance_attr[instance].is_empty() {
                instance_attr[instance] = match plan.parent_instance(instance) {
                    Some(parent) => instance_names[parent].unique(&local_name(&source.name, &source.class, "")),
                    None => names.unique(&source.name),
                };
            }
        }
        let instance_path: Vec<String> = (0..plan.instances())
            .map(|instance| {
                let mut chain: Vec<&str> = std::iter::successors(Some(instance), |&i| plan.parent_instance(i))
                    .map(|i| instance_attr[i].as_str())
                    .collect();
                chain.reverse();
                chain.iter().map(|a| format!("{a}.")).collect()
            })
            .collect();
        let path = |instance: Option<usize>| instance.map_or("", |i| instance_path[i].as_str());
        let mut state = WeightMap::new();
        let mut layer_init = vec![String::new(); graph.layers.len()];
        let mut built = HashSet::new();
        let mut code: Vec<Option<NodeCode>> = Vec::with_capacity(self.nodes.len());
        let mut constructs = Vec::new();
        let mut hooked: Vec<(String, Vec<String>)> = Vec::new();
        for (index, node) in self.nodes.iter().enumerate() {
            if !self.written[index] {
                code.push(None);
                continue;
            }
            let spec = graph.layer_of(node);
            let layer = &model.layers[node.layer];
            let attr = &attrs[node.layer];
            let owner_path = path(owners[node.layer]);
            let masked_calls = self.nodes.iter().any(|n| n.layer == node.layer && receives_mask(n, self.masked));
            if built.insert(node.layer) {
                let mut layer_state = WeightMap::new();
                let mut module = TorchModule {
                    attr,
                    masked_calls,
                    init: &mut layer_init[node.layer],
                    state: &mut layer_state,
                    traced: true,
                };
                layer.torch_module(&mut module)?;
                if module.traced && !layer_init[node.layer].is_empty() {
                    hooked.push((format!("{owner_path}{attr}"), Vec::new()));
                }
                for (key, tensor) in layer_state.iter() {
                    state.insert(format!("{owner_path}{key}"), tensor.clone());
                }
            }
            // The nodes of layers with a module attribute: `check` records them with forward hooks.
            let hook = format!("{owner_path}{attr}");
            if let Some((_, labels)) = hooked.iter_mut().find(|(a, _)| *a == hook) {
                labels.push(node.label.clone());
            }
            let model_input = graph.inputs.iter().position(|i| i.node == index).map(|k| inputs[k].as_str());
            let mut call = TorchCall {
                node,
                index,
                attr,
                ranks: self.ranks,
                model_input,
                outputs: self.outputs_read[index],
                masked_calls,
                masked: self.masked,
                what: format!("layer {} ({})", node.label, spec.class_name),
                lines: Vec::new(),
                buffers: Vec::new(),
            };
            let construct = layer.torch_call(&mut call)?;
            constructs.push((format!("{} ({})", node.label, spec.class_name), construct));
            code.push(Some(NodeCode { lines: call.lines, buffers: call.buffers }));
        }
        let layer_of: Vec<usize> = self.nodes.iter().map(|n| n.layer).collect();
        let returned: Vec<String> = model_outputs.iter().map(|(_, p)| var(*p)).collect();
        let parts = Parts {
            plan,
            code: &code,
            layer_of: &layer_of,
            layer_init: &layer_init,
            instance_attr: &instance_attr,
            instance_path: &instance_path,
            returned: &returned,
            reserved: &prelude,
        };
        let assembled = match assemble(&parts) {
            Ok(assembled) => assembled,
            Err(instance) => return Ok(Err(instance)),
        };
        let mut init: String = assembled.init.concat();
        for (name, host, dtype) in assembled.buffers {
            let dtype = torch_dtype(dtype);
            let _ =
                writeln!(init, "        self.register_buffer({name:?}, torch.zeros({:?}, dtype={dtype}))", host.shape);
            state.insert(name, host);
        }
        for (key, tensor) in assembled.block_state {
            state.insert(key, tensor);
        }
        let body: String = assembled.body.iter().map(|line| format!("        {line}\n")).collect();
        Ok(Ok(WrittenModule { inputs, classes: assembled.classes, init, body, state, constructs, hooked }))
    }
}

/// The attribute name, inside the block of the custom layer `holder`, of a layer or a custom
/// layer of class `class`: the name it had there (`own`, before the flattener made names
/// unique), the holder's name taken off a name the flattener gave (`layer_scale_gamma` of
/// `layer_scale`'s weight `gamma`), and Keras' numbering taken off a name Keras gave (`dense_7`
/// is `dense`, numbered again in the block), so that the blocks of one class name theirs alike.
fn local_name(own: &str, class: &str, holder: &str) -> String {
    let own = own.strip_prefix(holder).and_then(|rest| rest.strip_prefix('_')).filter(|r| !r.is_empty()).unwrap_or(own);
    let automatic = model::keras_file::snake_case(class);
    match own.strip_prefix(automatic.as_str()).and_then(|rest| rest.strip_prefix('_')) {
        Some(number) if !number.is_empty() && number.bytes().all(|b| b.is_ascii_digit()) => automatic,
        _ => own.to_string(),
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::activation::Activation;

    #[test]
    fn an_activation_forward_writes_by_name_is_a_prelude_function() {
        let names = prelude_names();
        for activation in [Activation::Softplus, Activation::HardSigmoid, Activation::HardSilu, Activation::Mish] {
            let written = activate(activation, "x");
            let function = written.split('(').next().unwrap();
            assert!(names.contains(function), "{written}");
            assert!(prelude::whole().contains(&format!("{:?}: {function},", activation_name(activation))), "{written}");
        }
    }
}
