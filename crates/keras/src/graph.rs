//! A Keras 3 model's `config.json` as one flat graph of calls.
//!
//! A functional config lists its layers; each layer's `inbound_nodes` are its calls, whose
//! `args`/`kwargs` hold `__keras_tensor__` references `keras_history: [layer, node, tensor]`
//! (the `node`-th call of `layer`, its `tensor`-th output). Tensor operators and `keras.ops`
//! calls on symbolic tensors are recorded the same way, as entries whose `module` is
//! `keras.src.ops.*`: `x + y` is class `Add` from `keras.src.ops.numpy`, the `Add` *layer* is class
//! `Add` from `keras.layers` with its operands as one list. `input_layers`/`output_layers` give
//! the model's inputs and outputs in order.
//!
//! Nested models (a `Functional` or `Sequential` entry with its own `layers`) are expanded in
//! place: each call of a sub-model adds its inner calls, wired to the call's arguments; the inner
//! layers are created once and shared between the calls, as their weights are. A `Sequential`
//! is a chain of one call per layer. Only the calls the outputs need are kept, in an order where
//! every call follows the calls it reads (a cycle or a reference to nothing is an error that
//! names the layer).
//!
//! Weights: Keras saves a layer's variables under a path built from *class names*
//! (`layers/<snake_case(class)>[_N]`, see [`model::keras_file`]); operation nodes are not layers
//! and take no path, and a `Sequential`'s input layer is not among its layers.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value as Json;

use model::error::{ModelError, Result};
use model::keras_file::{snake_case, unique_name};

/// One output of one call: `graph.nodes[node]`'s `index`-th output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Port {
    pub node: usize,
    pub index: usize,
}

/// An argument of a call as recorded: a tensor, a list or dict of arguments, or a constant.
#[derive(Debug, Clone)]
pub enum Arg {
    Tensor(Port),
    List(Vec<Arg>),
    Const(Json),
}

impl Arg {
    /// Every tensor this argument refers to, in order.
    /// The argument as the JSON constant it was saved as (a list of constants is one), or `None`
    /// when it reads a tensor.
    pub fn constant(&self) -> Option<Json> {
        match self {
            Arg::Const(c) => Some(c.clone()),
            Arg::List(items) => items.iter().map(Arg::constant).collect::<Option<Vec<_>>>().map(Json::Array),
            Arg::Tensor(_) => None,
        }
    }

    pub fn ports(&self) -> Vec<Port> {
        match self {
            Arg::Tensor(port) => vec![*port],
            Arg::List(items) => items.iter().flat_map(Arg::ports).collect(),
            Arg::Const(_) => vec![],
        }
    }
}

/// A layer or operation of the model (a nested model's inner layers included).
#[derive(Debug, Clone)]
pub struct LayerSpec {
    /// Its name, qualified by the sub-models that hold it (`encoder/dense`).
    pub name: String,
    pub class_name: String,
    /// `keras.layers`, `keras.src.ops.numpy`, ... (tells an operation from a layer).
    pub module: String,
    /// Its constructor arguments.
    pub config: Json,
    /// `package>Class` for a class registered by user code (`register_keras_serializable`).
    pub registered_name: Option<String>,
    /// Where its variables are in `model.weights.h5`; `None` for operations.
    pub h5_path: Option<String>,
}

impl LayerSpec {
    /// An operation node (`x + y`, `keras.ops.mean(x)`), not a layer.
    pub fn is_operation(&self) -> bool {
        self.module.starts_with("keras.src.ops") || self.module.starts_with("keras.ops")
    }

    /// A class of Keras itself (`keras.layers`, `keras.src...`) or of this project's flattener
    /// (`keras2torch.weight`), not one of the user's, which may share a built-in class's name.
    pub fn is_known_class(&self) -> bool {
        let within = |package: &str| {
            self.module == package || self.module.strip_prefix(package).is_some_and(|rest| rest.starts_with('.'))
        };
        // `keras.applications` defines classes of its own networks (ConvNeXt's `LayerScale`):
        // custom layers to this converter, which the flattener traces.
        (within("keras") && !within("keras.src.applications")) || within("keras2torch")
    }
}

/// One call of a layer.
#[derive(Debug, Clone)]
pub struct Node {
    /// Index into [`Graph::layers`].
    pub layer: usize,
    /// The layer's name, and `@k` for its `k`-th call (k > 0): the name a user reads.
    pub label: String,
    /// Which call of its layer this is (its index in config.json's `inbound_nodes`).
    pub call: usize,
    pub args: Vec<Arg>,
    pub kwargs: Vec<(String, Arg)>,
}

/// What a call receives as `mask=`, by Keras' rule (`Layer.__call__`, step 6): an explicit
/// `mask=` tensor, else the mask its only tensor argument carries (a list is one argument), and
/// nothing for a call of several tensor arguments. (`compute_mask` reads the first argument's
/// mask even then: Keras' `previous_mask`.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallMask {
    /// The recorded `mask=` tensor itself.
    Explicit(Port),
    /// Whatever mask the call's only tensor argument carries.
    OfArgument(Port),
    None,
}

impl Node {
    /// Where this call's `mask=` comes from.
    pub fn call_mask(&self) -> CallMask {
        if let Some((_, Arg::Tensor(port))) = self.kwargs.iter().find(|(k, _)| k == "mask") {
            return CallMask::Explicit(*port);
        }
        let arguments = self.args.iter().chain(self.kwargs.iter().filter(|(k, _)| k != "mask").map(|(_, a)| a));
        match (arguments.filter(|a| !a.ports().is_empty()).count(), self.args.first()) {
            (1, Some(Arg::Tensor(port))) => CallMask::OfArgument(*port),
            _ => CallMask::None,
        }
    }
}

/// Built-in layer classes whose `call(inputs, mask=None, ...)` takes `mask` second.
const MASK_SECOND: [&str; 4] = ["Softmax", "GlobalAveragePooling1D", "Attention", "AdditiveAttention"];

/// A model input.
#[derive(Debug, Clone)]
pub struct InputSpec {
    pub name: String,
    /// `batch_shape` with `None` as 0.
    pub shape: Vec<usize>,
    pub dtype: String,
    /// The input layer's node.
    pub node: usize,
}

/// The whole model as calls in an order that can run.
#[derive(Debug, Clone)]
pub struct Graph {
    pub name: String,
    pub layers: Vec<LayerSpec>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<InputSpec>,
    /// `(output layer name, its port)` in the model's order.
    pub outputs: Vec<(String, Port)>,
}

/// The deepest nesting of sub-models followed: far beyond any real model, a bound on a damaged one.
const MAX_NESTING: usize = 32;

impl Graph {
    /// The graph of a model's `config.json` (already parsed); `file` names it in errors.
    pub fn from_config(file: &Path, config: &Json) -> Result<Self> {
        let mut builder =
            Builder { file, layers: Vec::new(), nodes: Vec::new(), inputs: Vec::new(), by_name: HashMap::new() };
        let name = config.pointer("/config/name").and_then(Json::as_str).unwrap_or("model").to_string();
        let outputs = builder.expand(config, "", "", None, 0)?;
        Ok(Graph { name, layers: builder.layers, nodes: builder.nodes, inputs: builder.inputs, outputs })
    }

    /// The node's layer.
    pub fn layer_of(&self, node: &Node) -> &LayerSpec {
        &self.layers[node.layer]
    }
}

struct Builder<'a> {
    file: &'a Path,
    layers: Vec<LayerSpec>,
    nodes: Vec<Node>,
    inputs: Vec<InputSpec>,
    /// Qualified layer name -> index in `layers`.
    by_name: HashMap<String, usize>,
}

/// One model's layer list while it is expanded: entries by name, calls resolved so far.
struct Scope<'c> {
    prefix: String,
    entries: HashMap<String, &'c Json>,
    /// Qualified names of the entries, by their name in this model.
    qualified: HashMap<String, usize>,
    /// `(layer, call)` -> what the call produced; `None` while it is being resolved.
    done: HashMap<(String, usize), Option<Produced>>,
    /// For a nested model: its input layers' names and the ports they stand for.
    bound_inputs: HashMap<String, Port>,
    /// How many models hold this one (0 for the file's own model).
    depth: usize,
}

/// What a call produced: one node's outputs, or a nested model's output ports.
#[derive(Clone)]
enum Produced {
    Node(usize),
    Ports(Vec<Port>),
}

impl Produced {
    fn port(&self, index: usize) -> Option<Port> {
        match self {
            Produced::Node(node) => Some(Port { node: *node, index }),
            Produced::Ports(ports) => ports.get(index).copied(),
        }
    }
}

/// `[layer, node, tensor]` of a reference (`keras_history`, `input_layers`, `output_layers`).
fn history(value: &Json) -> Option<(String, usize, usize)> {
    let items = value.as_array()?;
    match items.as_slice() {
        [layer, node, tensor] => {
            Some((layer.as_str()?.to_string(), node.as_u64()? as usize, tensor.as_u64()? as usize))
        }
        _ => None,
    }
}

/// `input_layers`/`output_layers`: one reference, a list of them, or a dict of them (a model
/// built on `inputs={"age": ..., ...}`), whose order is Keras' `tree.flatten`: the keys sorted.
fn references(value: Option<&Json>) -> Vec<(String, usize, usize)> {
    let Some(value) = value else { return vec![] };
    if let Some(one) = history(value) {
        return vec![one];
    }
    if let Some(by_key) = value.as_object() {
        let mut keys: Vec<&String> = by_key.keys().collect();
        keys.sort();
        return keys.into_iter().filter_map(|key| history(&by_key[key])).collect();
    }
    value.as_array().map(|items| items.iter().filter_map(history).collect()).unwrap_or_default()
}

impl<'a> Builder<'a> {
    fn error(&self, message: impl std::fmt::Display) -> ModelError {
        ModelError::file(self.file, message)
    }

    /// Adds the calls of the model `config` (a `Functional` or `Sequential` entry) whose outputs
    /// the caller needs, returning its outputs by name. `inputs` binds a nested model's inputs.
    fn expand(
        &mut self,
        config: &Json,
        prefix: &str,
        h5_prefix: &str,
        inputs: Option<Vec<Port>>,
        depth: usize,
    ) -> Result<Vec<(String, Port)>> {
        if depth > MAX_NESTING {
            return Err(self.error(format!("{prefix}: sub-models nested deeper than {MAX_NESTING}")));
        }
        let class = config.get("class_name").and_then(Json::as_str).unwrap_or_default();
        let module = config.get("module").and_then(Json::as_str).unwrap_or("keras");
        if !module.starts_with("keras") && config.pointer("/config/layers").is_none() {
            return Err(self.error(format!(
                "{}: a subclassed model ({class}, from {module}), whose Python code a file does not carry. \
                 `cargo xtask flatten FILE --import YOUR_MODEL.py --out FLAT.keras` re-traces it into built-in layers, \
                 with your Python and Keras",
                display(prefix)
            )));
        }
        let entries = config
            .pointer("/config/layers")
            .and_then(Json::as_array)
            .ok_or_else(|| self.error(format!("{}: a {class} config without a `layers` list", display(prefix))))?;
        let sequential = class == "Sequential";
        let mut scope = Scope {
            prefix: prefix.to_string(),
            entries: HashMap::new(),
            qualified: HashMap::new(),
            done: HashMap::new(),
            bound_inputs: HashMap::new(),
            depth,
        };
        // Every layer of the list gets its h5 path, called or not, as Keras numbers them.
        let mut used = HashMap::new();
        let mut chain = Vec::new();
        for (position, entry) in entries.iter().enumerate() {
            let class_name = entry.get("class_name").and_then(Json::as_str).unwrap_or_default().to_string();
            let module = entry.get("module").and_then(Json::as_str).unwrap_or_default().to_string();
            let layer_config = entry.get("config").cloned().unwrap_or(Json::Null);
            let name = entry
                .get("name")
                .or_else(|| layer_config.get("name"))
                .and_then(Json::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| format!("{class_name}_{position}"));
            let qualified = qualify(prefix, &name);
            if scope.entries.insert(name.clone(), entry).is_some() {
                return Err(self.error(format!("two layers named {qualified:?}")));
            }
            let registered_name = entry.get("registered_name").and_then(Json::as_str).map(str::to_string);
            let is_op = module.starts_with("keras.src.ops") || module.starts_with("keras.ops");
            let saved = !(is_op || sequential && class_name == "InputLayer");
            let h5_path =
                saved.then(|| join(h5_prefix, &format!("layers/{}", unique_name(snake_case(&class_name), &mut used))));
            let index = match self.by_name.get(&qualified) {
                Some(&index) => index,
                None => {
                    self.layers.push(LayerSpec {
                        name: qualified.clone(),
                        class_name: class_name.clone(),
                        module,
                        registered_name,
                        config: layer_config,
                        h5_path,
                    });
                    self.by_name.insert(qualified.clone(), self.layers.len() - 1);
                    self.layers.len() - 1
                }
            };
            scope.qualified.insert(name.clone(), index);
            chain.push((name, class_name));
        }

        if sequential {
            return self.expand_sequential(config, &mut scope, &chain, inputs);
        }

        // A nested functional model starts with a node of its own, which `input_layers` and
        // `output_layers` count (Keras' `get_tensor` subtracts it) and inbound references do not.
        let builtin_node = |(name, node, tensor): (String, usize, usize)| {
            let functional = scope.entries.get(name.as_str()).and_then(|e| e.get("class_name")).and_then(Json::as_str)
                == Some("Functional");
            let node = if functional { node.saturating_sub(1) } else { node };
            (name, node, tensor)
        };
        let input_refs: Vec<_> =
            references(config.pointer("/config/input_layers")).into_iter().map(builtin_node).collect();
        let output_refs: Vec<_> =
            references(config.pointer("/config/output_layers")).into_iter().map(builtin_node).collect();
        if output_refs.is_empty() {
            return Err(self.error(format!("{}: the config names no output layers", display(prefix))));
        }
        match inputs {
            Some(ports) => {
                if ports.len() != input_refs.len() {
                    return Err(self.error(format!(
                        "sub-model {prefix} takes {} inputs, called with {}",
                        input_refs.len(),
                        ports.len()
                    )));
                }
                for ((name, _, _), port) in input_refs.iter().zip(ports) {
                    scope.bound_inputs.insert(name.clone(), port);
                }
            }
            None => {
                for (name, node, tensor) in &input_refs {
                    let port = self.resolve(&mut scope, name, *node, *tensor)?;
                    let entry = scope.entries[name.as_str()];
                    let input = self.input_spec(entry, name, port.node)?;
                    self.inputs.push(input);
                }
            }
        }
        let mut outputs = Vec::new();
        for (name, node, tensor) in &output_refs {
            let port = self.resolve(&mut scope, name, *node, *tensor)?;
            // A layer named by several outputs: `name@node`, and `.tensor` for one node's outputs.
            let same_name = output_refs.iter().filter(|(n, _, _)| n == name).count();
            let same_node = output_refs.iter().filter(|(n, k, _)| n == name && k == node).count();
            let mut key = if same_name > 1 { format!("{name}@{node}") } else { name.clone() };
            if same_node > 1 {
                key = format!("{key}.{tensor}");
            }
            outputs.push((key, port));
        }
        Ok(outputs)
    }

    /// A `Sequential`: its input (its `InputLayer`, or `build_input_shape`) through each layer.
    fn expand_sequential(
        &mut self,
        config: &Json,
        scope: &mut Scope,
        chain: &[(String, String)],
        inputs: Option<Vec<Port>>,
    ) -> Result<Vec<(String, Port)>> {
        let mut steps = chain.iter().peekable();
        let mut current = match inputs {
            Some(ports) => {
                let [port] = ports.as_slice() else {
                    return Err(self.error(format!(
                        "Sequential {} takes one input, called with {}",
                        scope.prefix,
                        ports.len()
                    )));
                };
                if steps.peek().is_some_and(|(_, class)| class == "InputLayer") {
                    steps.next();
                }
                *port
            }
            None => {
                let (name, layer_config) = match steps.peek() {
                    Some((name, class)) if class == "InputLayer" => {
                        let name = name.clone();
                        steps.next();
                        (name.clone(), scope.entries[name.as_str()].get("config").cloned().unwrap_or(Json::Null))
                    }
                    _ => {
                        let shape = config.pointer("/config/build_input_shape").cloned().unwrap_or(Json::Null);
                        if shape.is_null() {
                            return Err(self.error("a Sequential model without an input layer or build_input_shape"));
                        }
                        ("input".to_string(), serde_json::json!({ "batch_shape": shape, "dtype": "float32" }))
                    }
                };
                let qualified = qualify(&scope.prefix, &name);
                let layer = match scope.qualified.get(&name) {
                    Some(&index) => index,
                    None => {
                        self.layers.push(LayerSpec {
                            name: qualified.clone(),
                            class_name: "InputLayer".into(),
                            module: "keras.layers".into(),
                            registered_name: None,
                            config: layer_config.clone(),
                            h5_path: None,
                        });
                        self.layers.len() - 1
                    }
                };
                let node = self.push_node(layer, &qualified, 0, vec![], vec![]);
                let entry = serde_json::json!({ "config": layer_config });
                let input = self.input_spec(&entry, &name, node)?;
                self.inputs.push(input);
                Port { node, index: 0 }
            }
        };
        let mut last = None;
        for (name, _) in steps {
            let entry = scope.entries[name.as_str()];
            let produced = self.call(scope, name, entry, 0, vec![Arg::Tensor(current)], vec![])?;
            current = produced.port(0).ok_or_else(|| self.error(format!("{name}: a sub-model without outputs")))?;
            last = Some(name.clone());
        }
        Ok(vec![(last.unwrap_or_else(|| "input".into()), current)])
    }

    fn input_spec(&self, entry: &Json, name: &str, node: usize) -> Result<InputSpec> {
        let config = entry.get("config").unwrap_or(&Json::Null);
        let shape = config
            .get("batch_shape")
            .or_else(|| config.get("batch_input_shape"))
            .and_then(Json::as_array)
            .ok_or_else(|| self.error(format!("input layer {name}: no batch_shape")))?
            .iter()
            .map(|d| d.as_u64().unwrap_or(0) as usize)
            .collect();
        let dtype = config.get("dtype").and_then(Json::as_str).unwrap_or("float32").to_string();
        Ok(InputSpec { name: name.to_string(), shape, dtype, node })
    }

    /// The port of `[name, node, tensor]` in `scope`, adding the calls it needs first.
    fn resolve(&mut self, scope: &mut Scope, name: &str, call: usize, tensor: usize) -> Result<Port> {
        if let Some(port) = scope.bound_inputs.get(name) {
            return Ok(*port);
        }
        let where_ = qualify(&scope.prefix, name);
        let Some(&entry) = scope.entries.get(name) else {
            return Err(self.error(format!("a reference to layer {where_:?}, which the config does not have")));
        };
        let produced = match scope.done.get(&(name.to_string(), call)) {
            Some(Some(produced)) => produced.clone(),
            Some(None) => {
                return Err(
                    self.error(format!("layer {where_}: its inputs depend on its own output (a cycle in the graph)"))
                );
            }
            None => {
                scope.done.insert((name.to_string(), call), None);
                let produced = self.resolve_call(scope, name, entry, call)?;
                scope.done.insert((name.to_string(), call), Some(produced.clone()));
                produced
            }
        };
        produced.port(tensor).ok_or_else(|| self.error(format!("layer {where_}: call {call} has no output {tensor}")))
    }

    /// Adds the `call`-th call of the layer `name` (its recorded inbound node).
    fn resolve_call(&mut self, scope: &mut Scope, name: &str, entry: &Json, call: usize) -> Result<Produced> {
        let where_ = qualify(&scope.prefix, name);
        let class = entry.get("class_name").and_then(Json::as_str).unwrap_or_default();
        if class == "InputLayer" {
            if call != 0 {
                return Err(self.error(format!("input layer {where_}: no call {call}")));
            }
            let node = self.push_node(scope.qualified[name], &where_, 0, vec![], vec![]);
            return Ok(Produced::Node(node));
        }
        let nodes = entry.get("inbound_nodes").and_then(Json::as_array).cloned().unwrap_or_default();
        let Some(recorded) = nodes.get(call) else {
            return Err(self.error(format!(
                "layer {where_} ({class}): a reference to its call {call}, but it records {}",
                nodes.len()
            )));
        };
        let args = match recorded.get("args") {
            Some(Json::Array(items)) => items.iter().map(|a| self.arg(scope, a)).collect::<Result<Vec<_>>>()?,
            Some(other) => return Err(self.error(format!("layer {where_}: call args {other} is not a list"))),
            None => vec![],
        };
        let mut kwargs = Vec::new();
        if let Some(Json::Object(map)) = recorded.get("kwargs") {
            for (key, value) in map {
                kwargs.push((key.clone(), self.arg(scope, value)?));
            }
        }
        self.call(scope, name, entry, call, args, kwargs)
    }

    /// One call of a layer with resolved arguments: a node, or a nested model expanded in place.
    fn call(
        &mut self,
        scope: &mut Scope,
        name: &str,
        entry: &Json,
        call: usize,
        args: Vec<Arg>,
        kwargs: Vec<(String, Arg)>,
    ) -> Result<Produced> {
        let where_ = qualify(&scope.prefix, name);
        let layer = scope.qualified[name];
        if entry.pointer("/config/layers").is_some() {
            // A nested model: its inputs are this call's tensors, in its input order.
            let ports: Vec<Port> = args.iter().flat_map(Arg::ports).collect();
            let inner_h5 = self.layers[layer].h5_path.clone().unwrap_or_default();
            let outputs = self.expand(entry, &where_, &inner_h5, Some(ports), scope.depth + 1)?;
            return Ok(Produced::Ports(outputs.into_iter().map(|(_, port)| port).collect()));
        }
        Ok(Produced::Node(self.push_node(layer, &where_, call, args, kwargs)))
    }

    fn push_node(
        &mut self,
        layer: usize,
        name: &str,
        call: usize,
        mut args: Vec<Arg>,
        mut kwargs: Vec<(String, Arg)>,
    ) -> usize {
        // `softmax(scores, mask)` (KerasHub's attention calls its `Softmax` so): the mask given by
        // position is the call's explicit `mask=`, as Keras' `Layer.__call__` binds it.
        let spec = &self.layers[layer];
        if spec.is_known_class()
            && !spec.is_operation()
            && MASK_SECOND.contains(&spec.class_name.as_str())
            && args.len() == 2
            && !kwargs.iter().any(|(k, _)| k == "mask")
        {
            let mask = args.pop().expect("two arguments");
            kwargs.push(("mask".to_string(), mask));
        }
        let label = if call == 0 { name.to_string() } else { format!("{name}@{call}") };
        self.nodes.push(Node { layer, label, call, args, kwargs });
        self.nodes.len() - 1
    }

    /// A recorded argument: a `__keras_tensor__` becomes a port (its producer added first).
    fn arg(&mut self, scope: &mut Scope, value: &Json) -> Result<Arg> {
        if value.get("class_name").and_then(Json::as_str) == Some("__keras_tensor__") {
            let reference = value.pointer("/config/keras_history").and_then(history).ok_or_else(|| {
                self.error(format!(
                    "{}: a __keras_tensor__ without a readable keras_history: {value}",
                    display(&scope.prefix)
                ))
            })?;
            let (name, call, tensor) = reference;
            return Ok(Arg::Tensor(self.resolve(scope, &name, call, tensor)?));
        }
        match value {
            Json::Array(items) => Ok(Arg::List(items.iter().map(|v| self.arg(scope, v)).collect::<Result<_>>()?)),
            other => Ok(Arg::Const(other.clone())),
        }
    }
}

fn qualify(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_string() } else { format!("{prefix}/{name}") }
}

fn join(prefix: &str, child: &str) -> String {
    if prefix.is_empty() { child.to_string() } else { format!("{prefix}/{child}") }
}

fn display(prefix: &str) -> &str {
    if prefix.is_empty() { "the model" } else { prefix }
}
