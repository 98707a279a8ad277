//! Where each node of a flattened model came from: the flattener's record of the custom layers
//! it traced (config.json's `keras2torch` entry, written by `flatten.py::_block_record`). Each
//! traced call of a custom layer is a [`Block`]; the writer makes a block a module class of its
//! own (`classes.rs`), so the written code keeps the model's structure (`TransformerEncoder`,
//! `CachedMultiHeadAttention`) instead of one line per operation. The record only shapes the
//! code: where it is missing or does not fit the graph, the module is written flat.

use std::collections::HashMap;

use serde_json::Value as Json;

use crate::graph::{Graph, Port};

/// One traced call of a custom layer.
#[derive(Debug, Clone)]
pub struct Block {
    /// The custom layer's name (`transformer_layer_0`): its attribute in the module holding it.
    /// Two calls of one layer (ALBERT's shared encoder) are two blocks of the same name.
    pub name: String,
    /// Its Python class (`TransformerEncoder`), which the written class is named after.
    pub class: String,
    /// The block whose call made this one's.
    pub parent: Option<usize>,
    /// The call's tensor arguments by the names its `call` gives them (`padding_mask`).
    pub inputs: Vec<(String, Port)>,
}

/// The flattener's record, mapped onto the graph.
#[derive(Debug, Default)]
pub struct Origin {
    pub blocks: Vec<Block>,
    /// Each node's innermost block.
    pub node_block: Vec<Option<usize>>,
    /// Each layer's own name where the flattener renamed it (`transformer_layer_0_dropout`
    /// was `dropout`), which is its attribute's name inside its block.
    pub own_names: Vec<Option<String>>,
}

impl Origin {
    /// The record of `config` (a whole `config.json`) for `graph`; empty where there is none.
    pub fn read(graph: &Graph, config: &Json) -> Self {
        let mut origin = Origin::default_for(graph);
        let Some(record) = config.get("keras2torch") else { return origin };
        let layer_index: HashMap<&str, usize> =
            graph.layers.iter().enumerate().map(|(i, l)| (l.name.as_str(), i)).collect();
        let node_of: HashMap<(usize, usize), usize> =
            graph.nodes.iter().enumerate().map(|(i, n)| ((n.layer, n.call), i)).collect();
        let port = |layer: &Json, call: &Json, tensor: &Json| -> Option<Port> {
            let layer = *layer_index.get(layer.as_str()?)?;
            let node = *node_of.get(&(layer, call.as_u64()? as usize))?;
            Some(Port { node, index: tensor.as_u64()? as usize })
        };
        let entries = record.get("blocks").and_then(Json::as_array).map(Vec::as_slice).unwrap_or_default();
        for (index, entry) in entries.iter().enumerate() {
            let text = |key: &str| entry.get(key).and_then(Json::as_str).map(str::to_string);
            let (Some(name), Some(class)) = (text("name"), text("class")) else { return Origin::default_for(graph) };
            let parent = entry.get("parent").and_then(Json::as_u64).map(|p| p as usize).filter(|&p| p < index);
            let inputs = entry
                .get("inputs")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
                .filter_map(|input| match input.as_array()?.as_slice() {
                    [parameter, layer, call, tensor] => {
                        Some((parameter.as_str()?.to_string(), port(layer, call, tensor)?))
                    }
                    _ => None,
                })
                .collect();
            origin.blocks.push(Block { name, class, parent, inputs });
        }
        for (layer, blocks) in record.get("calls").and_then(Json::as_object).into_iter().flatten() {
            let Some(&layer) = layer_index.get(layer.as_str()) else { continue };
            for (call, block) in blocks.as_array().into_iter().flatten().enumerate() {
                let block = block.as_u64().map(|b| b as usize).filter(|&b| b < origin.blocks.len());
                if let Some(&node) = node_of.get(&(layer, call)) {
                    origin.node_block[node] = block;
                }
            }
        }
        for (layer, own) in record.get("names").and_then(Json::as_object).into_iter().flatten() {
            if let (Some(&layer), Some(own)) = (layer_index.get(layer.as_str()), own.as_str()) {
                origin.own_names[layer] = Some(own.to_string());
            }
        }
        origin
    }

    fn default_for(graph: &Graph) -> Self {
        Origin {
            blocks: Vec::new(),
            node_block: vec![None; graph.nodes.len()],
            own_names: vec![None; graph.layers.len()],
        }
    }
}

/// Which blocks the written module keeps as classes of their own. A custom layer is one
/// *instance* (one attribute, one set of weights) however many blocks (calls) it has; a dropped
/// instance's nodes are written in the module holding it, as though it had not been traced.
/// An instance is dropped where a class could not express it: one of its calls uses a layer
/// that something outside it uses too (the attribute must live above both), or a value it
/// computes is read outside it before its last node (its call could not be one statement).
pub struct Plan<'o> {
    origin: &'o Origin,
    /// Each block's instance.
    instance_of: Vec<usize>,
    /// Each instance's parent instance.
    instance_parent: Vec<Option<usize>>,
    kept: Vec<bool>,
}

impl<'o> Plan<'o> {
    /// Every instance kept.
    pub fn new(origin: &'o Origin) -> Self {
        let mut instances: HashMap<(String, Option<usize>), usize> = HashMap::new();
        let mut instance_of = Vec::new();
        let mut instance_parent = Vec::new();
        for block in &origin.blocks {
            let parent = block.parent.map(|p| instance_of[p]);
            let next = instances.len();
            let instance = *instances.entry((block.name.clone(), parent)).or_insert(next);
            if instance == next {
                instance_parent.push(parent);
            }
            instance_of.push(instance);
        }
        let kept = vec![true; instance_parent.len()];
        Plan { origin, instance_of, instance_parent, kept }
    }

    pub fn origin(&self) -> &'o Origin {
        self.origin
    }

    pub fn instance(&self, block: usize) -> usize {
        self.instance_of[block]
    }

    pub fn instances(&self) -> usize {
        self.kept.len()
    }

    /// The innermost kept block at or above `block`.
    fn kept_block(&self, block: Option<usize>) -> Option<usize> {
        std::iter::successors(block, |&b| self.origin.blocks[b].parent).find(|&b| self.kept[self.instance_of[b]])
    }

    /// The kept block whose class writes `node` (`None`: the model's own module).
    pub fn scope(&self, node: usize) -> Option<usize> {
        self.kept_block(self.origin.node_block[node])
    }

    /// The kept block whose class calls `block`'s.
    pub fn parent(&self, block: usize) -> Option<usize> {
        self.kept_block(self.origin.blocks[block].parent)
    }

    /// The kept instance holding `instance` as an attribute.
    pub fn parent_instance(&self, instance: usize) -> Option<usize> {
        std::iter::successors(self.instance_parent[instance], |&i| self.instance_parent[i]).find(|&i| self.kept[i])
    }

    /// Whether `block` is kept.
    pub fn is_kept(&self, block: usize) -> bool {
        self.kept[self.instance_of[block]]
    }

    /// Whether `node`'s scope is `block` or inside it.
    pub fn within(&self, node: usize, block: usize) -> bool {
        std::iter::successors(self.scope(node), |&b| self.parent(b)).any(|b| b == block)
    }

    pub fn drop_instance(&mut self, instance: usize) {
        self.kept[instance] = false;
    }

    /// The kept instances from `instance` up to the model, innermost first.
    fn instance_chain(&self, instance: Option<usize>) -> Vec<Option<usize>> {
        let mut chain: Vec<Option<usize>> =
            std::iter::successors(instance.filter(|&i| self.kept[i]), |&i| self.parent_instance(i)).map(Some).collect();
        chain.push(None);
        chain
    }

    /// The instance owning `layer`'s attribute: the innermost kept instance holding every call
    /// of it (`nodes`, those written).
    pub fn owner(&self, nodes: impl Iterator<Item = usize>) -> Option<usize> {
        let mut owner: Option<Vec<Option<usize>>> = None;
        for node in nodes {
            let chain = self.instance_chain(self.scope(node).map(|b| self.instance_of[b]));
            owner = Some(match owner {
                None => chain,
                Some(current) => current.into_iter().filter(|i| chain.contains(i)).collect(),
            });
        }
        owner.and_then(|chain| chain.first().copied().flatten())
    }

    /// Each kept block's last written node (`written[n]`: node `n` writes code), where its call
    /// is written; `None` for a block that writes nothing.
    pub fn last_nodes(&self, written: &[bool]) -> Vec<Option<usize>> {
        let mut last = vec![None; self.origin.blocks.len()];
        for node in (0..written.len()).filter(|&n| written[n]) {
            for block in std::iter::successors(self.scope(node), |&b| self.parent(b)) {
                last[block] = Some(node); // nodes in running order: the latest is the last
            }
        }
        last
    }

    /// Drops instances until every kept one can be a class: each layer's calls inside its owner,
    /// each kept block's values read outside it only after its last node. `reads[n]` are the
    /// nodes `n` reads; `written[n]` whether node `n` writes code; `layer_nodes` each layer's
    /// written nodes.
    pub fn settle(&mut self, reads: &[Vec<usize>], written: &[bool], layer_nodes: &[Vec<usize>]) {
        loop {
            let mut dropped = None;
            'layers: for nodes in layer_nodes {
                let owner = self.owner(nodes.iter().copied());
                for &node in nodes {
                    let instance = self.scope(node).map(|b| self.instance_of[b]);
                    if instance != owner {
                        dropped = instance;
                        break 'layers;
                    }
                }
            }
            if dropped.is_none() {
                let last = self.last_nodes(written);
                'reads: for (reader, read) in reads.iter().enumerate().filter(|(n, _)| written[*n]) {
                    for &producer in read {
                        for block in std::iter::successors(self.scope(producer), |&b| self.parent(b)) {
                            if !self.within(reader, block) && last[block].is_some_and(|last| reader < last) {
                                dropped = Some(self.instance_of[block]);
                                break 'reads;
                            }
                        }
                    }
                }
            }
            match dropped {
                Some(instance) => self.drop_instance(instance),
                None => return,
            }
        }
    }
}
