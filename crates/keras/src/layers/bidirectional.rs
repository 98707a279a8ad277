//! `keras.layers.Bidirectional(layer, merge_mode="concat", backward_layer=None)`: a recurrent
//! layer run forward and a second one backward over the same sequences (by default a copy of
//! the first with `go_backwards=True`, weights of its own), as keras 3.15 runs it:
//!
//! - both get the call's mask, and both output zeros at masked steps when they return sequences
//!   (Keras forces `zero_output_for_mask = return_sequences` on them);
//! - the backward outputs, which come in the order it ran, are flipped back to time order when it
//!   returns sequences;
//! - `merge_mode`: `concat` (on the features), `sum`, `mul`, `ave`, or `None` (two outputs);
//! - `initial_state`: the forward layer's states, then the backward one's; `return_state` returns
//!   its final states in that order after the output(s);
//! - the mask goes on with the sequences (to both outputs without a merge), as
//!   `Bidirectional.compute_mask` says.
//!
//! The two layers' variables are saved under `forward_layer/cell` and `backward_layer/cell`.
//! torch: `nn.LSTM` / `nn.GRU` / `nn.RNN` with `bidirectional=True` where each direction is
//! torch's own module (no mask, no dropout, the default activations), else the prelude's
//! `Bidirectional` around two `Recurrent`s (Keras' loop written out).

use burn::module::Module;
use burn::tensor::Tensor;
use serde_json::Value as Json;

use super::gru::Gru;
use super::lstm::Lstm;
use super::recurrent::{self, Cell, Dropout, Recurrence, TorchRecurrent};
use super::simple_rnn::SimpleRnn;
use super::{Build, Call, KerasLayer, Layer, Variable};
use crate::torch::{TorchCall, TorchModule};
use crate::value::{DynTensor, Value};
use model::error::Result;

/// How the two directions' outputs are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeMode {
    Concat,
    Sum,
    Mul,
    Ave,
    /// Two outputs, forward then backward.
    Separate,
}

impl MergeMode {
    fn keras_name(self) -> &'static str {
        match self {
            MergeMode::Concat => "concat",
            MergeMode::Sum => "sum",
            MergeMode::Mul => "mul",
            MergeMode::Ave => "ave",
            MergeMode::Separate => "None",
        }
    }
}

/// One direction: a recurrent layer of any of the three classes.
#[derive(Module, Debug)]
#[allow(clippy::large_enum_variant)] // two per layer, built once
pub enum Direction {
    Lstm(Lstm),
    Gru(Gru),
    SimpleRnn(SimpleRnn),
}

impl Direction {
    /// The layer that `config` (Keras' serialization) describes, its variables in the group
    /// `group` below the wrapper's: a recurrent layer, else an error naming the class.
    fn build(wrapper: &Build, config: &Json, group: &str) -> Result<Self> {
        match wrapper.wrapped(config, group)? {
            Layer::Lstm(layer) => Ok(Direction::Lstm(layer)),
            Layer::Gru(layer) => Ok(Direction::Gru(layer)),
            Layer::SimpleRnn(layer) => Ok(Direction::SimpleRnn(layer)),
            _ => {
                let class = config.get("class_name").and_then(Json::as_str).unwrap_or_default();
                Err(wrapper.args.error(format!("wraps a {class:?}: Bidirectional is read around LSTM, GRU and SimpleRNN")))
            }
        }
    }

    fn cell(&self) -> &dyn Cell {
        match self {
            Direction::Lstm(layer) => layer,
            Direction::Gru(layer) => layer,
            Direction::SimpleRnn(layer) => layer,
        }
    }

    fn recurrence(&self) -> &Recurrence {
        match self {
            Direction::Lstm(layer) => &layer.recurrence,
            Direction::Gru(layer) => &layer.recurrence,
            Direction::SimpleRnn(layer) => &layer.recurrence,
        }
    }

    fn recurrence_mut(&mut self) -> &mut Recurrence {
        match self {
            Direction::Lstm(layer) => &mut layer.recurrence,
            Direction::Gru(layer) => &mut layer.recurrence,
            Direction::SimpleRnn(layer) => &mut layer.recurrence,
        }
    }

    fn variables(&self) -> Vec<Variable> {
        match self {
            Direction::Lstm(layer) => layer.variables(),
            Direction::Gru(layer) => layer.variables(),
            Direction::SimpleRnn(layer) => layer.variables(),
        }
    }

    fn torch(&self) -> TorchRecurrent<'_> {
        match self {
            Direction::Lstm(layer) => layer.torch(),
            Direction::Gru(layer) => layer.torch(),
            Direction::SimpleRnn(layer) => layer.torch(),
        }
    }
}

#[derive(Module, Debug)]
pub struct Bidirectional {
    pub forward: Direction,
    pub backward: Direction,
    #[module(skip)]
    pub merge_mode: MergeMode,
}

impl KerasLayer for Bidirectional {
    fn build(layer: &mut Build) -> Result<Self> {
        let merge_mode = match layer.args.take("merge_mode") {
            Json::Null => MergeMode::Separate,
            Json::String(mode) => match mode.as_str() {
                "concat" => MergeMode::Concat,
                "sum" => MergeMode::Sum,
                "mul" => MergeMode::Mul,
                "ave" => MergeMode::Ave,
                other => return Err(layer.args.error(format!("merge_mode {other:?} is none of concat, sum, mul, ave"))),
            },
            other => return Err(layer.args.error(format!("merge_mode {other} is not a string or null"))),
        };
        let forward_config = layer.args.take("layer");
        let mut backward_config = layer.args.take("backward_layer");
        if backward_config.is_null() {
            // Keras' default: the layer's config with go_backwards, weights of its own.
            backward_config = forward_config.clone();
            if let Some(config) = backward_config.get_mut("config").and_then(Json::as_object_mut) {
                config.insert("go_backwards".into(), Json::Bool(true));
            }
        }
        let mut forward = Direction::build(layer, &forward_config, "forward_layer")?;
        let mut backward = Direction::build(layer, &backward_config, "backward_layer")?;
        let (f, b) = (*forward.recurrence(), *backward.recurrence());
        if f.go_backwards == b.go_backwards || f.return_sequences != b.return_sequences || f.return_state != b.return_state {
            return Err(layer.args.error(
                "the forward and backward layers must differ in go_backwards and agree in return_sequences and return_state",
            ));
        }
        for direction in [&mut forward, &mut backward] {
            let recurrence = direction.recurrence_mut();
            recurrence.zero_output_for_mask = recurrence.return_sequences;
        }
        Ok(Self { forward, backward, merge_mode })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let x = call.tensor(0, "sequences")?.tensor.rank_n::<3>("Bidirectional sequences [B, T, features]")?;
        let keep = recurrent::call_keep(call)?;
        let (forward_cell, backward_cell) = (self.forward.cell(), self.backward.cell());
        let forward_states = forward_cell.state_count();
        let units_of = |k: usize| if k < forward_states { forward_cell.units() } else { backward_cell.units() };
        let initial = recurrent::initial_states(call, forward_states + backward_cell.state_count(), units_of, &x)?;
        let (forward_initial, backward_initial) = initial.split_at(forward_states);
        let recurrence = *self.forward.recurrence();
        let backward_recurrence = self.backward.recurrence();
        let forward_dropout = Dropout::draw(forward_cell, &recurrence, &x, call.training);
        let backward_dropout = Dropout::draw(backward_cell, backward_recurrence, &x, call.training);
        let forward =
            recurrent::run(forward_cell, &recurrence, x.clone(), keep.clone(), forward_initial.to_vec(), &forward_dropout, call.training);
        let backward =
            recurrent::run(backward_cell, backward_recurrence, x, keep, backward_initial.to_vec(), &backward_dropout, call.training);
        let sequences = recurrence.return_sequences;
        let no_steps = || call.error("a sequence of no steps");
        let forward_output = recurrent::output(&forward, sequences).ok_or_else(no_steps)?; // [B, T|1, u]
        let mut backward_output = recurrent::output(&backward, sequences).ok_or_else(no_steps)?; // [B, T|1, u]
        if sequences {
            backward_output = backward_output.flip([1]); // back to time order
        }
        let merged = match self.merge_mode {
            MergeMode::Separate => vec![forward_output, backward_output],
            MergeMode::Concat => vec![Tensor::cat(vec![forward_output, backward_output], 2)], // [B, T|1, 2u]
            MergeMode::Sum => vec![forward_output + backward_output],
            MergeMode::Mul => vec![forward_output * backward_output],
            MergeMode::Ave => vec![(forward_output + backward_output).div_scalar(2.0)],
        };
        let mut values: Vec<Value> = merged
            .into_iter()
            .map(|t| {
                let [batch, _, width] = t.dims();
                match sequences {
                    true => Value::float(DynTensor::from(t)).with_mask(call.previous_mask.clone()), // [B, T, w]
                    false => Value::float(DynTensor::from(t.reshape([batch, width]))), // [B, w]
                }
            })
            .collect();
        if recurrence.return_state {
            let states = forward.states.into_iter().chain(backward.states);
            values.extend(states.map(|state| Value::float(DynTensor::from(state))));
        }
        Ok(values)
    }

    fn variables(&self) -> Vec<Variable> {
        let moved = |group: &str, vars: Vec<Variable>| -> Vec<Variable> {
            vars.into_iter()
                .map(|v| Variable { path: v.path, group: format!("/{group}{}", v.group), tensor: v.tensor })
                .collect()
        };
        let mut vars = moved("forward_layer", self.forward.variables());
        vars.extend(moved("backward_layer", self.backward.variables()));
        vars
    }

    fn torch_module(&self, module: &mut TorchModule) -> Result<()> {
        if let Some(class) = self.native(module.masked_calls) {
            let forward = self.forward.torch();
            module.construct(forward.native_constructor(class, true));
            let recurrence = self.forward.recurrence();
            if !(recurrence.return_sequences && self.merge_mode == MergeMode::Concat) {
                module.untraced(); // its first output is both directions' every step
            }
            for (suffix, direction) in [("", &self.forward), ("_reverse", &self.backward)] {
                for (name, tensor) in direction.torch().native_state(suffix) {
                    module.tensor(&name, tensor);
                }
            }
            return Ok(());
        }
        let mut arguments = vec![
            format!("forward_layer={}", self.forward.torch().prelude_constructor()),
            format!("backward_layer={}", self.backward.torch().prelude_constructor()),
        ];
        if self.merge_mode != MergeMode::Concat {
            arguments.push(format!("merge_mode={:?}", self.merge_mode.keras_name()).replace("\"None\"", "None"));
        }
        module.construct(format!("Bidirectional({})", arguments.join(", ")));
        for (group, direction) in [("forward_layer", &self.forward), ("backward_layer", &self.backward)] {
            for (name, tensor) in direction.torch().prelude_state() {
                module.tensor(&format!("{group}.{name}"), tensor);
            }
        }
        Ok(())
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        if let Some(class) = self.native(call.masked_calls) {
            return self.native_call(class, call);
        }
        let x = call.input()?;
        let recurrence = self.forward.recurrence();
        let state_count = self.forward.cell().state_count() + self.backward.cell().state_count();
        let invocation = recurrent::prelude_invocation(call, x, recurrent::initial_state_vars(call, state_count)?);
        let states = if recurrence.return_state { state_count } else { 0 };
        let outputs = if self.merge_mode == MergeMode::Separate { 2 } else { 1 };
        let mask = call.previous_mask();
        match outputs + states {
            1 => call.assign(&invocation, &mask),
            count => call.assign_outputs(count, &invocation, &mask),
        }
        Ok(format!("Bidirectional({})", self.merge_mode.keras_name()))
    }
}

impl Bidirectional {
    /// torch's own bidirectional module where it computes the same: each direction torch's own
    /// module (no mask, no dropout, the default activations), the backward layer the forward
    /// one's kind and width going backwards (torch puts its outputs back in time order, as Keras
    /// flips them).
    fn native(&self, masked_calls: bool) -> Option<&'static str> {
        let (forward, backward) = (self.forward.torch(), self.backward.torch());
        let class = forward.native(masked_calls)?;
        let same = backward.native(masked_calls) == Some(class)
            && forward.cell == backward.cell
            && forward.units() == backward.units()
            && forward.activation == backward.activation
            && forward.bias.is_some() == backward.bias.is_some();
        let directions = !self.forward.recurrence().go_backwards && self.backward.recurrence().go_backwards;
        (same && directions).then_some(class)
    }

    /// The statements of a call of torch's bidirectional module: the outputs of both directions
    /// (every step's, `y[..., :u]` and `y[..., u:]`, or the final states `h[0]` and `h[1]`),
    /// merged as Keras merges them, then the states forward then backward.
    fn native_call(&self, class: &str, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let i = call.index;
        let recurrence = self.forward.recurrence();
        let units = self.forward.cell().units();
        let lstm = class == "LSTM";
        let initial = match recurrent::initial_state_vars(call, if lstm { 4 } else { 2 })?.as_deref() {
            None => String::new(),
            Some([h_f, c_f, h_b, c_b]) => format!(", (torch.stack([{h_f}, {h_b}]), torch.stack([{c_f}, {c_b}]))"),
            Some([h_f, h_b]) => format!(", torch.stack([{h_f}, {h_b}])"),
            Some(_) => unreachable!("initial_state_vars checked the count"),
        };
        call.line(format!("y{i}, s{i} = self.{}({x}{initial})", call.attr));
        let h = if lstm { format!("s{i}[0]") } else { format!("s{i}") };
        let (forward, backward) = match recurrence.return_sequences {
            true => (format!("y{i}[..., :{units}]"), format!("y{i}[..., {units}:]")),
            false => (format!("{h}[0]"), format!("{h}[1]")),
        };
        let merged = match (self.merge_mode, recurrence.return_sequences) {
            (MergeMode::Concat, true) => vec![format!("y{i}")],
            (MergeMode::Concat, false) => vec![format!("torch.cat([{forward}, {backward}], dim=-1)")],
            (MergeMode::Sum, _) => vec![format!("{forward} + {backward}")],
            (MergeMode::Mul, _) => vec![format!("{forward} * {backward}")],
            (MergeMode::Ave, _) => vec![format!("({forward} + {backward}) / 2")],
            (MergeMode::Separate, _) => vec![forward, backward],
        };
        let mask = call.previous_mask();
        let mut values = merged;
        if recurrence.return_state {
            let states: &[String] = if lstm {
                &[format!("s{i}[0][0]"), format!("s{i}[1][0]"), format!("s{i}[0][1]"), format!("s{i}[1][1]")]
            } else {
                &[format!("s{i}[0]"), format!("s{i}[1]")]
            };
            values.extend(states.iter().cloned());
        }
        match values.len() {
            1 => call.assign(&values[0], &mask),
            count => call.assign_outputs(count, &values.join(", "), &mask),
        }
        Ok(format!("nn.{class}(bidirectional=True)"))
    }
}
