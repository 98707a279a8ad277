//! What Keras' recurrent layers share: `keras.layers.RNN`'s arguments and its loop over the
//! steps, as keras 3.15 runs it on TensorFlow (`backend.rnn`, `unroll=False`; cuDNN only on a
//! GPU), for `LSTM`, `GRU` and `SimpleRNN` (`lstm.rs`, `gru.rs`, `simple_rnn.rs`).
//!
//! The loop: the inputs of every step are projected by the cell's kernel at once (one product,
//! `[B, T, in] x [in, gates · units]`), then the steps run in order (reversed with
//! `go_backwards`), each adding the recurrent product. With a mask (`[B, T]`, from `Masking` or
//! `Embedding(mask_zero=True)`, any steps, interior ones included), a masked step keeps every
//! state as it was and outputs the previous step's output (zeros before the first), or zeros
//! with `zero_output_for_mask` (which `Bidirectional` sets when it returns sequences). The
//! outputs are in the order the steps ran: reversed with `go_backwards`, as Keras leaves them.
//! `return_sequences` returns them all (`[B, T, units]`), else the last (`[B, units]`);
//! `return_state` adds the final states. The mask goes on with the sequences, unchanged (also
//! with `go_backwards`), and nowhere else (`RNN.compute_mask`).

use burn::tensor::{Bool, Tensor};

use super::{Build, Call, Variable};
use crate::activation::Activation;
use crate::value::{DynTensor, Value};
use model::error::Result;
use model::weights::HostTensor;

/// `keras.layers.RNN`'s arguments, as every recurrent layer takes them.
#[derive(Debug, Clone, Copy)]
pub struct Recurrence {
    pub return_sequences: bool,
    pub return_state: bool,
    pub go_backwards: bool,
    /// A masked step outputs zeros instead of the previous output.
    pub zero_output_for_mask: bool,
    /// Dropout rates on the inputs and on the recurrent state: nothing at inference.
    pub dropout: f64,
    pub recurrent_dropout: f64,
}

impl Recurrence {
    /// Takes the arguments of `RNN` (and the dropout rates of the cell): `stateful` is refused,
    /// `unroll` changes nothing in the values.
    pub fn take(layer: &mut Build) -> Result<Self> {
        if layer.args.take_bool("stateful", false)? {
            return Err(layer.args.error(
                "stateful=True (states carried from one batch to the next) is not supported; \
                 save the model with stateful=False and pass the states as initial_state",
            ));
        }
        layer.args.take_bool("unroll", false)?;
        Ok(Self {
            return_sequences: layer.args.take_bool("return_sequences", false)?,
            return_state: layer.args.take_bool("return_state", false)?,
            go_backwards: layer.args.take_bool("go_backwards", false)?,
            zero_output_for_mask: layer.args.take_bool("zero_output_for_mask", false)?,
            dropout: layer.args.take_f64("dropout", 0.0)?,
            recurrent_dropout: layer.args.take_f64("recurrent_dropout", 0.0)?,
        })
    }
}

/// One cell of a recurrent layer: its inputs' projection for all steps, and one step.
pub trait Cell {
    /// The width of the output and of every state.
    fn units(&self) -> usize;

    /// How many states the cell carries (LSTM: `h` and `c`); the output is the first.
    fn state_count(&self) -> usize {
        1
    }

    /// The inputs projected for every step at once, `[B, T, in]` -> `[B, T, gates · units]`.
    fn project(&self, x: Tensor<3>) -> Tensor<3>;

    /// One step: this step's projected inputs `[B, gates · units]` and the states before it
    /// (`[B, units]` each) give the states after it.
    fn step(&self, projected: Tensor<2>, states: &[Tensor<2>]) -> Vec<Tensor<2>>;
}

/// The outputs of a run: every step's output in the order the steps ran, and the final states.
pub struct Run {
    pub outputs: Vec<Tensor<2>>,
    pub states: Vec<Tensor<2>>,
}

/// Runs `cell` over the steps of `x` (`[B, T, in]`) from `initial` states, with `keep`
/// (`[B, T]`, true = the step counts) where there is a mask.
pub fn run(cell: &impl Cell, recurrence: &Recurrence, x: Tensor<3>, keep: Option<Tensor<2, Bool>>, initial: Vec<Tensor<2>>) -> Run {
    let [batch, steps, _] = x.dims();
    let units = cell.units();
    let device = x.device();
    let projected = cell.project(x); // [B, T, G·u]
    let width = projected.dims()[2];
    let order: Vec<usize> = if recurrence.go_backwards { (0..steps).rev().collect() } else { (0..steps).collect() };
    let zeros = Tensor::<2>::zeros([batch, units], &device); // [B, u]
    let (mut states, mut output) = (initial, zeros.clone());
    let mut outputs = Vec::with_capacity(steps);
    for t in order {
        let inputs = projected.clone().slice([0..batch, t..t + 1]).reshape([batch, width]); // [B, G·u]
        let new_states = cell.step(inputs, &states);
        let new_output = new_states[0].clone(); // [B, u]
        match &keep {
            None => (states, output) = (new_states, new_output),
            Some(keep) => {
                let kept = keep.clone().slice([0..batch, t..t + 1]).expand([batch, units]); // [B, u]
                let held = if recurrence.zero_output_for_mask { zeros.clone() } else { output };
                output = held.mask_where(kept.clone(), new_output);
                states = states.into_iter().zip(new_states).map(|(old, new)| old.mask_where(kept.clone(), new)).collect();
            }
        }
        outputs.push(output.clone());
    }
    Run { outputs, states }
}

/// One call of a recurrent layer: the sequences (`[B, T, in]`), the mask `call` receives
/// (none with an `initial_state`: Keras fills `mask=` only for one tensor argument) and optional
/// `initial_state`; returns the output (with the sequences' mask where it returns sequences)
/// and, with `return_state`, the final states.
pub fn call(cell: &impl Cell, recurrence: &Recurrence, call: &Call) -> Result<Vec<Value>> {
    if call.training && (recurrence.dropout > 0.0 || recurrence.recurrent_dropout > 0.0) {
        return Err(call.error(format!(
            "dropout={} and recurrent_dropout={} in training are not implemented (inference is exact)",
            recurrence.dropout, recurrence.recurrent_dropout
        )));
    }
    let x = call.tensor(0, "sequences")?.tensor.rank_n::<3>("recurrent layer sequences [B, T, features]")?;
    let [batch, _, _] = x.dims();
    let initial = match call.arg(1, "initial_state") {
        None => (0..cell.state_count()).map(|_| Tensor::<2>::zeros([batch, cell.units()], &x.device())).collect(),
        Some(given) => {
            let states = given.tensors();
            if states.len() != cell.state_count() {
                return Err(call.error(format!("initial_state has {} tensors, the cell {}", states.len(), cell.state_count())));
            }
            let mut out = Vec::new();
            for state in states {
                out.push(state.tensor.clone().rank_n::<2>("initial_state [B, units]")?);
            }
            out
        }
    };
    let keep = match &call.mask {
        Some(mask) => Some(mask.clone().rank_n::<2>("recurrent layer mask [B, T]")?.bool()),
        None => None,
    };
    let run = run(cell, recurrence, x, keep, initial);
    let output = match (recurrence.return_sequences, run.outputs.last()) {
        (true, _) if !run.outputs.is_empty() => {
            let steps: Vec<Tensor<3>> = run.outputs.iter().map(|o| o.clone().unsqueeze_dim::<3>(1)).collect(); // [B, 1, u] each
            Value::float(DynTensor::from(Tensor::cat(steps, 1))).with_mask(call.previous_mask.clone()) // [B, T, u]
        }
        (_, Some(last)) => Value::float(DynTensor::from(last.clone())), // [B, u]
        (_, None) => return Err(call.error("a sequence of no steps")),
    };
    let mut values = vec![output];
    if recurrence.return_state {
        values.extend(run.states.into_iter().map(|state| Value::float(DynTensor::from(state))));
    }
    Ok(values)
}

/// The `recurrent_activation` argument (sigmoid by default).
pub fn take_recurrent_activation(layer: &mut Build) -> Result<Activation> {
    let value = layer.args.take("recurrent_activation");
    let value = if value.is_null() { serde_json::Value::from("sigmoid") } else { value };
    Activation::from_keras(&value).map_err(|e| layer.args.error(format!("recurrent_activation: {e}")))
}

/// A cell's variables as Keras lists them (`<cell>/kernel`, `<cell>/recurrent_kernel`,
/// `<cell>/bias`) and saves them, in the layer's `cell` group.
pub fn cell_variables(cell: &str, kernel: HostTensor, recurrent_kernel: HostTensor, bias: Option<HostTensor>) -> Vec<Variable> {
    let named = [("kernel", Some(kernel)), ("recurrent_kernel", Some(recurrent_kernel)), ("bias", bias)];
    named
        .into_iter()
        .filter_map(|(name, tensor)| tensor.map(|tensor| Variable { path: format!("{cell}/{name}"), group: "/cell".into(), tensor }))
        .collect()
}

/// `x W + b` for every step of `x` (`[B, T, in]`, `W: [in, G·u]`, `b: [G·u]`): `[B, T, G·u]`.
pub fn project(x: Tensor<3>, kernel: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<3> {
    let [batch, steps, input] = x.dims();
    let width = kernel.dims()[1];
    let mut z = x.reshape([batch * steps, input]).matmul(kernel); // [B·T, G·u]
    if let Some(bias) = bias {
        z = z + bias.unsqueeze_dim(0);
    }
    z.reshape([batch, steps, width])
}

/// `activation(x)` of a cell's gates.
pub fn activate(activation: Activation, x: Tensor<2>) -> Tensor<2> {
    match activation.apply(DynTensor::from(x)) {
        DynTensor::R2(y) => y,
        _ => unreachable!("an activation keeps the rank"),
    }
}

/// The `gate`-th of `gates` equal column blocks of `z` (`[B, gates · units]` -> `[B, units]`).
pub fn gate(z: &Tensor<2>, gate: usize, units: usize) -> Tensor<2> {
    let [batch, _] = z.dims();
    z.clone().slice([0..batch, gate * units..(gate + 1) * units])
}
