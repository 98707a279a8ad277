//! Values a flattened graph computes more than once. Tracing a custom layer records Keras'
//! implicit steps as operation nodes, once per place Keras takes them: keras.io's
//! English-to-Spanish encoder compares its token ids with 0 twice and casts the boolean result to
//! bool three times on its way to the attention mask. The torch module computes each value once:
//! an operation node that repeats an earlier one (the same operation on the same operands) and a
//! cast to the dtype its operand already has are read as that earlier value and write no
//! statement; so is an `Identity` layer's output (the flattener's, which keeps a custom layer's
//! name on the model's output), its input. Operations are deterministic (`ops` has no random
//! one) and drop Keras masks; a value is shared only where its reader sees the same mask (none,
//! for operations), so every reader sees what it saw.

use std::collections::HashMap;

use crate::executor::KerasModel;
use crate::graph::{Arg, Node, Port};
use crate::layers::Layer;
use crate::ops::Operation;
use crate::value::DType;

/// For each node, the earlier value its output repeats (`None`: a value of its own). `blocks`
/// gives each node's block (`origin.rs`): an operation repeats one of its own block only, so
/// that each block's class computes what it reads.
pub fn repeated_values(model: &KerasModel, masked: &[bool], blocks: &[Option<usize>]) -> Vec<Option<Port>> {
    let graph = &model.graph;
    let masked_at = |node: usize| masked.get(node).copied().unwrap_or(false);
    let mut same: Vec<Option<Port>> = vec![None; graph.nodes.len()];
    // The dtype of each operation's output where the writer knows it (what torch computes it
    // as). A model input's is the caller's, which a cast may change: unknown.
    let mut dtypes: Vec<Option<DType>> = vec![None; graph.nodes.len()];
    let mut first_of: HashMap<String, usize> = HashMap::new();
    for (index, node) in graph.nodes.iter().enumerate() {
        // An Identity layer (the flattener's, keeping a custom layer's name on its output) is its
        // input where both carry a mask or neither does.
        if let (Layer::Identity(_), [Arg::Tensor(port)]) = (&model.layers[node.layer], node.args.as_slice()) {
            let port = shared_port(*port, &same);
            let carries_a_mask = port.index == 0 && masked_at(port.node);
            if node.kwargs.is_empty() && masked_at(index) == carries_a_mask {
                same[index] = Some(port);
            }
            continue;
        }
        let Layer::Operation(operation) = &model.layers[node.layer] else { continue };
        let op = &operation.op;
        if op.gives_a_sequence() || masked_at(index) {
            continue;
        }
        let node = reading_shared(node, &same);
        let operand = match node.args.first() {
            Some(Arg::Tensor(port)) if port.index == 0 => Some(*port),
            _ => None,
        };
        let operand_dtype = operand.and_then(|port| dtypes[port.node]);
        dtypes[index] = match op {
            Operation::Binary(binary) if binary.is_predicate() => Some(DType::Bool),
            Operation::Cast(to) | Operation::ConvertToTensor(Some(to)) => Some(*to),
            Operation::ConvertToTensor(None)
            | Operation::ExpandDims { .. }
            | Operation::Squeeze { .. }
            | Operation::Reshape { .. }
            | Operation::Transpose { .. }
            | Operation::Indexing(_) => operand_dtype,
            _ => None,
        };
        // A cast to the dtype its operand has is the operand.
        if let Some(operand) = operand.filter(|port| !masked_at(port.node)) {
            let identity = match op {
                Operation::Cast(to) | Operation::ConvertToTensor(Some(to)) => operand_dtype == Some(*to),
                Operation::ConvertToTensor(None) => true,
                _ => false,
            };
            if identity && node.args.len() == 1 && node.kwargs.is_empty() {
                same[index] = Some(operand);
                continue;
            }
        }
        let key = format!("{:?} {op:?} {:?} {:?}", blocks.get(index), node.args, node.kwargs);
        match first_of.get(&key) {
            Some(&earlier) => same[index] = Some(Port { node: earlier, index: 0 }),
            None => {
                first_of.insert(key, index);
            }
        }
    }
    same
}

/// `node` reading each repeated value from where it is first computed.
pub fn reading_shared(node: &Node, same: &[Option<Port>]) -> Node {
    Node {
        layer: node.layer,
        label: node.label.clone(),
        call: node.call,
        args: node.args.iter().map(|arg| shared_arg(arg, same)).collect(),
        kwargs: node.kwargs.iter().map(|(name, arg)| (name.clone(), shared_arg(arg, same))).collect(),
    }
}

/// A port's value where it is first computed.
pub fn shared_port(port: Port, same: &[Option<Port>]) -> Port {
    if port.index == 0 { same.get(port.node).copied().flatten().unwrap_or(port) } else { port }
}

fn shared_arg(arg: &Arg, same: &[Option<Port>]) -> Arg {
    match arg {
        Arg::Tensor(port) => Arg::Tensor(shared_port(*port, same)),
        Arg::List(items) => Arg::List(items.iter().map(|item| shared_arg(item, same)).collect()),
        Arg::Const(value) => Arg::Const(value.clone()),
    }
}
