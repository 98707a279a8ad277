//! The written module's classes: each kept block ([`Plan`]) becomes an `nn.Module` class whose
//! `forward` is the block's statements, called from the module holding it as one line
//! (`x31 = self.transformer_layer_0(x12, m3)`), so that a KerasHub backbone reads as a hand port
//! of it: `class TransformerEncoder(nn.Module)` once, and a call per layer.
//!
//! Inside a class, values are renamed locally (`x1, x2, ...` in the order the block computes
//! them, `m<k>` beside the `x<k>` it masks) and the block's inputs take the names its `call`
//! gives them (`padding_mask`), so that blocks which compute the same thing write the same text
//! and share one class (a `TransformerEncoder2` where a block differs, Gemma 2's alternating
//! sliding windows). A custom layer called twice (ALBERT's shared encoder) is one attribute
//! called twice; where its calls would need different classes, it is left to the module holding
//! it ([`assemble`] returns its instance, which the caller drops from the plan).

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

use super::origin::Plan;
use super::torch_dtype;
use crate::value::DType;
use model::weights::HostTensor;

/// What one node writes into `forward`: its statements and its constant tensors.
pub struct NodeCode {
    pub lines: Vec<String>,
    /// `(buffer name, values, dtype)`, read as `self.<name>` in the lines.
    pub buffers: Vec<(String, HostTensor, DType)>,
}

/// The written module: the classes of its blocks, and its own `__init__` and `forward`.
pub struct Assembled {
    /// The blocks' class definitions, each before the classes that hold it.
    pub classes: String,
    /// The model module's `__init__` statements (its buffers not included).
    pub init: Vec<String>,
    /// Its `forward` statements.
    pub body: Vec<String>,
    /// Its own buffers, named as the nodes' code names them.
    pub buffers: Vec<(String, HostTensor, DType)>,
    /// The blocks' buffers, by their state-dict keys.
    pub block_state: Vec<(String, HostTensor)>,
}

/// Everything [`assemble`] reads.
pub struct Parts<'a> {
    pub plan: &'a Plan<'a>,
    /// Each node's code; `None` for a node that writes none (a repeated value).
    pub code: &'a [Option<NodeCode>],
    /// Each node's layer.
    pub layer_of: &'a [usize],
    /// Each layer's `__init__` statement(s) (empty for a layer without an attribute).
    pub layer_init: &'a [String],
    /// Each instance's attribute in the module holding it.
    pub instance_attr: &'a [String],
    /// Each instance's attribute path from the model's module, with a dot after it
    /// (`encoder.transformer_layer_0.`): the prefix of its state-dict keys.
    pub instance_path: &'a [String],
    /// The values the model returns.
    pub returned: &'a [String],
    /// Names a class or a parameter must not take (the prelude's).
    pub reserved: &'a HashSet<&'static str>,
}

/// The module's code, or the instance whose calls would need different classes.
pub fn assemble(parts: &Parts) -> Result<Assembled, usize> {
    let mut writer = Writer::new(parts);
    let top = writer.scope(None)?;
    Ok(Assembled {
        classes: writer.classes,
        init: top.init,
        body: top.lines,
        buffers: top.buffers,
        block_state: writer.block_state,
    })
}

/// One scope's statements before they become a class.
struct ScopeCode {
    init: Vec<String>,
    lines: Vec<String>,
    buffers: Vec<(String, HostTensor, DType)>,
}

/// A block written as a class body: the text with its name left open, and how it is called.
struct BlockClass {
    text: String,
    /// The calling scope's values passed in, in the parameters' order.
    arguments: Vec<String>,
    /// The calling scope's names of the values returned.
    results: Vec<String>,
    buffers: Vec<(String, HostTensor)>,
}

const NAME_SLOT: &str = "\u{0}class\u{0}";

struct Writer<'p> {
    parts: &'p Parts<'p>,
    /// The nodes whose statements name each value (`x5`, `m5`, `x5_1`).
    readers: HashMap<String, Vec<usize>>,
    /// Each block's last written node (`None`: it writes nothing).
    last: Vec<Option<usize>>,
    classes: String,
    /// Class text (name left open) -> its name.
    named: HashMap<String, String>,
    used_names: HashSet<String>,
    /// Each instance's first call: its class text and buffers, which later calls must repeat.
    first_call: HashMap<usize, (String, Vec<(String, HostTensor)>)>,
    block_state: Vec<(String, HostTensor)>,
}

impl<'p> Writer<'p> {
    fn new(parts: &'p Parts<'p>) -> Self {
        let plan = parts.plan;
        let mut readers: HashMap<String, Vec<usize>> = HashMap::new();
        for (node, code) in parts.code.iter().enumerate() {
            let Some(code) = code else { continue };
            for line in &code.lines {
                for value in values_in(line) {
                    if value_node(&value) != Some(node) {
                        readers.entry(value).or_default().push(node);
                    }
                }
            }
        }
        let written: Vec<bool> = parts.code.iter().map(Option::is_some).collect();
        Writer {
            parts,
            readers,
            last: plan.last_nodes(&written),
            classes: String::new(),
            named: HashMap::new(),
            used_names: HashSet::new(),
            first_call: HashMap::new(),
            block_state: Vec::new(),
        }
    }

    /// The statements of `scope` (a kept block, or the model's module), its blocks' classes
    /// written first.
    fn scope(&mut self, scope: Option<usize>) -> Result<ScopeCode, usize> {
        let plan = self.parts.plan;
        // Its nodes at their places, its blocks at their last nodes' (where each can run: what it
        // reads is computed before, what it computes is read after).
        let mut items: Vec<(usize, Option<usize>)> = (0..self.parts.code.len())
            .filter(|&n| self.parts.code[n].is_some() && plan.scope(n) == scope)
            .map(|n| (n, None))
            .collect();
        for block in 0..plan.origin().blocks.len() {
            if let Some(last) = self.last[block].filter(|_| plan.is_kept(block) && plan.parent(block) == scope) {
                items.push((last, Some(block)));
            }
        }
        items.sort_by_key(|&(position, block)| (position, block.is_none()));
        let mut code = ScopeCode { init: Vec::new(), lines: Vec::new(), buffers: Vec::new() };
        let mut built_layers = HashSet::new();
        let mut built_instances = HashSet::new();
        for (node, block) in items {
            match block {
                None => {
                    let layer = self.parts.layer_of[node];
                    let init = &self.parts.layer_init[layer];
                    if !init.is_empty() && built_layers.insert(layer) {
                        code.init.push(init.clone());
                    }
                    let node_code = self.parts.code[node].as_ref().expect("items are written nodes");
                    code.lines.extend(node_code.lines.iter().cloned());
                    code.buffers.extend(node_code.buffers.iter().cloned());
                }
                Some(block) => {
                    let inner = self.scope(Some(block))?;
                    let class = self.block_class(block, inner);
                    let instance = plan.instance(block);
                    match self.first_call.get(&instance) {
                        Some((text, buffers)) if *text != class.text || !same_values(buffers, &class.buffers) => {
                            return Err(instance);
                        }
                        Some(_) => {}
                        None => {
                            let path = &self.parts.instance_path[instance];
                            for (name, tensor) in &class.buffers {
                                self.block_state.push((format!("{path}{name}"), tensor.clone()));
                            }
                            self.first_call.insert(instance, (class.text.clone(), class.buffers.clone()));
                        }
                    }
                    let name = self.class_name(&plan.origin().blocks[block].class, &class.text);
                    let attr = &self.parts.instance_attr[instance];
                    if built_instances.insert(instance) {
                        code.init.push(format!("        self.{attr} = {name}()\n"));
                    }
                    let call = format!("self.{attr}({})", class.arguments.join(", "));
                    code.lines.push(if class.results.is_empty() {
                        call
                    } else {
                        format!("{} = {call}", class.results.join(", "))
                    });
                }
            }
        }
        Ok(code)
    }

    /// The class of `block`: its statements with values renamed locally.
    fn block_class(&self, block: usize, code: ScopeCode) -> BlockClass {
        let plan = self.parts.plan;
        let inside = |value: &str| value_node(value).is_some_and(|node| plan.within(node, block));
        // Parameters: the values read from outside, in the order the statements read them,
        // named as the block's `call` names them where it does.
        let named_inputs: HashMap<String, &str> =
            plan.origin().blocks[block].inputs.iter().map(|(name, port)| (super::var(*port), name.as_str())).collect();
        let mut local: HashMap<String, String> = HashMap::new();
        let mut local_nodes: HashMap<usize, usize> = HashMap::new();
        let mut arguments = Vec::new();
        let mut taken: HashSet<String> = HashSet::new();
        for line in &code.lines {
            for value in values_in(line) {
                if local.contains_key(&value) {
                    continue;
                }
                let node = value_node(&value).expect("values name a node");
                let renamed = if inside(&value) {
                    let count = local_nodes.len() + 1;
                    let k = *local_nodes.entry(node).or_insert(count);
                    local_value(&value, k)
                } else {
                    let base = match named_inputs.get(&value) {
                        Some(name) => sanitize(name, self.parts.reserved),
                        None if value.starts_with('m') => match local.get(&format!("x{node}")) {
                            Some(x) if !x.starts_with('x') => format!("{x}_mask"),
                            _ => "mask".to_string(),
                        },
                        None => "value".to_string(),
                    };
                    let mut name = base.clone();
                    let mut n = 1;
                    while taken.contains(&name) || name == "self" {
                        name = format!("{base}_{n}");
                        n += 1;
                    }
                    arguments.push(value.clone());
                    name
                };
                taken.insert(renamed.clone());
                local.insert(value, renamed);
            }
        }
        // Results: the values read outside the block, or returned by the model.
        let mut results: Vec<String> = local
            .keys()
            .filter(|value| inside(value))
            .filter(|value| {
                self.parts.returned.contains(value)
                    || self.readers.get(*value).is_some_and(|r| r.iter().any(|&n| !plan.within(n, block)))
            })
            .cloned()
            .collect();
        results.sort_by_key(|value| {
            (local_nodes[&value_node(value).expect("a value")], value.starts_with('m'), value.clone())
        });
        // Buffers: `constant_<k>` in the order the block reads them.
        let mut buffer_names: HashMap<String, String> = HashMap::new();
        for (k, (name, _, _)) in code.buffers.iter().enumerate() {
            buffer_names.insert(name.clone(), format!("constant_{k}"));
        }
        let rename = |line: &str| rename_identifiers(line, &local, &buffer_names);
        // The call's own arguments first, in its signature's order; then the others as read.
        let signature: Vec<String> = source_inputs(plan, block);
        arguments.sort_by_key(|v| signature.iter().position(|s| s == v).unwrap_or(signature.len()));
        let parameters: Vec<&str> = arguments.iter().map(|v| local[v].as_str()).collect();
        let returned: Vec<&str> = results.iter().map(|v| local[v].as_str()).collect();
        let source = &plan.origin().blocks[block];
        let mut text = format!(
            "class {NAME_SLOT}(torch.nn.Module):\n    \"\"\"{}, as traced: its `call`, statement by statement.\"\"\"\n\n    def __init__(self):\n        super().__init__()\n",
            source.class
        );
        for init in &code.init {
            text.push_str(init);
        }
        for (name, host, dtype) in &code.buffers {
            let _ = writeln!(
                text,
                "        self.register_buffer({:?}, torch.zeros({:?}, dtype={}))",
                buffer_names[name],
                host.shape,
                torch_dtype(*dtype)
            );
        }
        let _ = writeln!(text, "\n    def forward(self, {}):", parameters.join(", "));
        for line in &code.lines {
            let _ = writeln!(text, "        {}", rename(line));
        }
        let _ =
            writeln!(text, "        return {}", if returned.is_empty() { "None".into() } else { returned.join(", ") });
        let buffers = code.buffers.into_iter().map(|(name, host, _)| (buffer_names[&name].clone(), host)).collect();
        BlockClass { text, arguments, results, buffers }
    }

    /// The name of the class whose text is `text`, defining it on first use: the Keras class's
    /// name, numbered where another text took it.
    fn class_name(&mut self, class: &str, text: &str) -> String {
        if let Some(name) = self.named.get(text) {
            return name.clone();
        }
        let mut base: String = class.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if base.is_empty() || base.starts_with(|c: char| c.is_ascii_digit()) {
            base.insert_str(0, "Block");
        }
        if self.parts.reserved.contains(base.as_str()) || base == "Model" {
            base.push_str("Block");
        }
        let mut name = base.clone();
        let mut n = 2;
        while self.used_names.contains(&name) {
            name = format!("{base}{n}");
            n += 1;
        }
        self.used_names.insert(name.clone());
        self.named.insert(text.to_string(), name.clone());
        self.classes.push_str(&text.replacen(NAME_SLOT, &name, 1));
        self.classes.push_str("\n\n");
        name
    }
}

/// The values a block's call was given, in its signature's order.
fn source_inputs(plan: &Plan, block: usize) -> Vec<String> {
    plan.origin().blocks[block].inputs.iter().map(|(_, port)| super::var(*port)).collect()
}

fn same_values(a: &[(String, HostTensor)], b: &[(String, HostTensor)]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|((na, ta), (nb, tb))| na == nb && ta.shape == tb.shape && ta.data == tb.data)
}

/// A parameter name from a `call`'s: an identifier clear of Python's words and the prelude's.
fn sanitize(name: &str, reserved: &HashSet<&'static str>) -> String {
    let mut name: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).collect();
    if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
        name.insert(0, 'v');
    }
    if reserved.contains(name.as_str()) || super::is_python_keyword(&name) || value_node(&name).is_some() {
        name.push_str("_input");
    }
    name
}

/// The node a value's name refers to: `x5`, `x5_1`, `m5` and a node's temporary (`x5_parts`)
/// to node 5.
fn value_node(name: &str) -> Option<usize> {
    let rest = name.strip_prefix('x').or_else(|| name.strip_prefix('m'))?;
    let (node, suffix) = rest.split_once('_').map_or((rest, None), |(node, suffix)| (node, Some(suffix)));
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(node) && suffix.is_none_or(|s| !s.is_empty())).then(|| node.parse().ok()).flatten()
}

/// The local name of a value (or temporary) of the block's `k`-th node: `x5_1` is `x<k>_1`.
fn local_value(value: &str, k: usize) -> String {
    let (kind, rest) = value.split_at(1);
    match rest.split_once('_') {
        Some((_, suffix)) => format!("{kind}{k}_{suffix}"),
        None => format!("{kind}{k}"),
    }
}

/// The values (`x5`, `m5`, `x5_1`) a statement names, in order: identifiers outside string
/// literals and not after a dot (an attribute is not a value).
fn values_in(line: &str) -> Vec<String> {
    let mut found = Vec::new();
    walk_identifiers(line, |word, after_dot| {
        if !after_dot && value_node(word).is_some() {
            found.push(word.to_string());
        }
        None
    });
    found
}

/// `line` with values renamed by `values` and buffers (`self.<name>`) by `buffers`.
fn rename_identifiers(line: &str, values: &HashMap<String, String>, buffers: &HashMap<String, String>) -> String {
    walk_identifiers(line, |word, after_dot| if after_dot { buffers.get(word) } else { values.get(word) }.cloned())
}

/// Calls `f(identifier, follows a dot)` for each identifier of a Python statement outside string
/// literals; returns the statement with each identifier for which `f` gives a name replaced.
fn walk_identifiers(line: &str, mut f: impl FnMut(&str, bool) -> Option<String>) -> String {
    let bytes = line.as_bytes();
    let mut out = String::with_capacity(line.len());
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'"' || c == b'\'' {
            // A string literal, escapes included, copied as it is.
            let start = i;
            i += 1;
            while i < bytes.len() && bytes[i] != c {
                i += if bytes[i] == b'\\' { 2 } else { 1 };
            }
            i = (i + 1).min(bytes.len());
            out.push_str(&line[start..i]);
        } else if c.is_ascii_alphabetic() || c == b'_' {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                i += 1;
            }
            let word = &line[start..i];
            let after_dot = line[..start].trim_end().ends_with('.');
            match f(word, after_dot) {
                Some(name) => out.push_str(&name),
                None => out.push_str(word),
            }
        } else if c.is_ascii_digit() {
            // A number (`1e-5`, `0x10`): its letters are not identifiers.
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_' || bytes[i] == b'.') {
                i += 1;
            }
            out.push_str(&line[start..i]);
        } else {
            let width = line[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&line[i..i + width]);
            i += width;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_the_statement_s_own_names_not_attributes_strings_or_numbers() {
        let line = r#"x12, m12 = self.x3(x4_1, m4, "x5", 1e5, torch.einsum("x7->x7", x8))"#;
        assert_eq!(values_in(line), ["x12", "m12", "x4_1", "m4", "x8"]);
        let values: HashMap<String, String> =
            [("x12", "x1"), ("m12", "m1"), ("x4_1", "query")].into_iter().map(|(a, b)| (a.into(), b.into())).collect();
        let buffers: HashMap<String, String> = [("constant_9_0".to_string(), "constant_0".to_string())].into();
        assert_eq!(
            rename_identifiers("x12, m12 = f(x4_1, self.constant_9_0, constant_9_0)", &values, &buffers),
            "x1, m1 = f(query, self.constant_0, constant_9_0)"
        );
        assert_eq!(value_node("xs"), None);
        assert_eq!(value_node("x4_"), None);
        assert_eq!(value_node("x40_2"), Some(40));
        assert_eq!(value_node("x40_parts"), Some(40));
        assert_eq!(local_value("x40_parts", 3), "x3_parts");
        assert_eq!(local_value("m40", 3), "m3");
    }
}
