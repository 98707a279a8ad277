//! What Keras' recurrent layers share: `keras.layers.RNN`'s arguments and its loop over the
//! steps, as keras 3.15 runs it on TensorFlow (`backend.rnn`, `unroll=False`; cuDNN only on a
//! GPU), for `LSTM`, `GRU` and `SimpleRNN` (`lstm.rs`, `gru.rs`, `simple_rnn.rs`).
//!
//! The loop: at inference the inputs of every step are projected by the cell's kernel at once
//! (one product, `[B, T, in] x [in, gates · units]`; in training each step projects its own, see
//! [`run`]), then the steps run in order (reversed with `go_backwards`), each adding the
//! recurrent product. In training, `dropout` and `recurrent_dropout` draw their masks once per
//! call ([`Dropout`]). With a mask (`[B, T]`, from `Masking` or
//! `Embedding(mask_zero=True)`, any steps, interior ones included), a masked step keeps every
//! state as it was and outputs the previous step's output (zeros before the first), or zeros
//! with `zero_output_for_mask` (which `Bidirectional` sets when it returns sequences). The
//! outputs are in the order the steps ran: reversed with `go_backwards`, as Keras leaves them.
//! `return_sequences` returns them all (`[B, T, units]`), else the last (`[B, units]`);
//! `return_state` adds the final states. The mask goes on with the sequences, unchanged (also
//! with `go_backwards`), and nowhere else (`RNN.compute_mask`).

use burn::module::Param;
use burn::tensor::{Bool, Device, Distribution, Tensor};

use super::{Build, Call, Variable};
use crate::activation::Activation;
use crate::saved::VarReader;
use crate::torch::{PyCall, TorchCall, TorchModule, activation_name, py_bool, var};
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

    /// The blocks of `units` columns in the kernels (LSTM 4, GRU 3, SimpleRNN 1).
    fn gates(&self) -> usize;

    /// The inputs projected for every step at once, `[B, T, in]` -> `[B, T, gates · units]`,
    /// the inputs' dropout masks applied ([`Dropout::inputs`]).
    fn project(&self, x: Tensor<3>, dropout: &[Tensor<2>]) -> Tensor<3>;

    /// One step: this step's projected inputs `[B, gates · units]` and the states before it
    /// (`[B, units]` each) give the states after it; `dropout` masks the previous output where
    /// the recurrent product reads it ([`Dropout::recurrent`]).
    fn step(&self, projected: Tensor<2>, states: &[Tensor<2>], dropout: &[Tensor<2>]) -> Vec<Tensor<2>>;
}

/// The dropout masks of one call in training, drawn once for all its steps as Keras'
/// `DropoutRNNCell` draws them (`0` or `1 / (1 - rate)`, from Burn's generator), each rate only
/// when `0 < rate < 1`: one mask of the inputs `[B, in]` and one of the previous output
/// `[B, units]`, or, where a gated cell has a `recurrent_dropout` (Keras then takes its
/// `implementation=1`), one of each per gate block. Empty at inference.
#[derive(Debug, Clone, Default)]
pub struct Dropout {
    pub inputs: Vec<Tensor<2>>,
    pub recurrent: Vec<Tensor<2>>,
}

impl Dropout {
    /// The masks of a call of `cell` on `x` (`[B, T, in]`); none unless `training`.
    pub fn draw(cell: &(impl Cell + ?Sized), recurrence: &Recurrence, x: &Tensor<3>, training: bool) -> Self {
        let [batch, _, width] = x.dims();
        let per_gate = recurrence.recurrent_dropout > 0.0 && cell.gates() > 1;
        let count = if per_gate { cell.gates() } else { 1 };
        let draw = |rate: f64, width: usize| -> Vec<Tensor<2>> {
            if !training || rate <= 0.0 || rate >= 1.0 {
                return Vec::new();
            }
            let keep = Distribution::Bernoulli(1.0 - rate);
            (0..count)
                .map(|_| Tensor::<2>::random([batch, width], keep, &x.device()).mul_scalar(1.0 / (1.0 - rate)))
                .collect()
        };
        Self { inputs: draw(recurrence.dropout, width), recurrent: draw(recurrence.recurrent_dropout, cell.units()) }
    }
}

/// The outputs of a run: every step's output in the order the steps ran, and the final states.
pub struct Run {
    pub outputs: Vec<Tensor<2>>,
    pub states: Vec<Tensor<2>>,
}

/// Runs `cell` over the steps of `x` (`[B, T, in]`) from `initial` states, with `keep`
/// (`[B, T]`, true = the step counts) where there is a mask; `each_step` projects each step's
/// inputs in the loop (for training) instead of all of them before it.
pub fn run(
    cell: &(impl Cell + ?Sized),
    recurrence: &Recurrence,
    x: Tensor<3>,
    keep: Option<Tensor<2, Bool>>,
    initial: Vec<Tensor<2>>,
    dropout: &Dropout,
    each_step: bool,
) -> Run {
    let [batch, steps, features] = x.dims();
    let units = cell.units();
    let width = cell.gates() * units;
    let device = x.device();
    // At inference the inputs of all steps are projected by one product before the loop. Where
    // gradients are taken, each step projects its own: the backward pass of a step's slice fills
    // a zero tensor of the whole sliced tensor, and of `[B, T, G·u]` that was 4.4 MB a step, most
    // of an LSTM(64)'s training step at `[32, 136, 4]`; of the inputs `[B, T, in]` it is small.
    let projected = if each_step { None } else { Some(cell.project(x.clone(), &dropout.inputs)) }; // [B, T, G·u]
    let order: Vec<usize> = if recurrence.go_backwards { (0..steps).rev().collect() } else { (0..steps).collect() };
    let zeros = Tensor::<2>::zeros([batch, units], &device); // [B, u]
    let (mut states, mut output) = (initial, zeros.clone());
    let mut outputs = Vec::with_capacity(steps);
    for t in order {
        let inputs = match &projected {
            Some(projected) => projected.clone().slice([0..batch, t..t + 1]), // [B, 1, G·u]
            None => cell.project(x.clone().slice([0..batch, t..t + 1, 0..features]), &dropout.inputs), // [B, 1, G·u]
        }
        .reshape([batch, width]); // [B, G·u]
        let new_states = cell.step(inputs, &states, &dropout.recurrent);
        let new_output = new_states[0].clone(); // [B, u]
        match &keep {
            None => (states, output) = (new_states, new_output),
            Some(keep) => {
                let kept = keep.clone().slice([0..batch, t..t + 1]).expand([batch, units]); // [B, u]
                let held = if recurrence.zero_output_for_mask { zeros.clone() } else { output };
                output = held.mask_where(kept.clone(), new_output);
                states =
                    states.into_iter().zip(new_states).map(|(old, new)| old.mask_where(kept.clone(), new)).collect();
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
    let x = call.tensor(0, "sequences")?.tensor.rank_n::<3>("recurrent layer sequences [B, T, features]")?;
    let initial = initial_states(call, cell.state_count(), |_| cell.units(), &x)?;
    let keep = call_keep(call)?;
    let dropout = Dropout::draw(cell, recurrence, &x, call.training);
    let run = run(cell, recurrence, x, keep, initial, &dropout, call.training);
    let output = output(&run, recurrence.return_sequences).ok_or_else(|| call.error("a sequence of no steps"))?;
    let [batch, _, units] = output.dims();
    let output = match recurrence.return_sequences {
        true => Value::float(DynTensor::from(output)).with_mask(call.previous_mask.clone()), // [B, T, u]
        false => Value::float(DynTensor::from(output.reshape([batch, units]))),              // [B, u]
    };
    let mut values = vec![output];
    if recurrence.return_state {
        values.extend(run.states.into_iter().map(|state| Value::float(DynTensor::from(state))));
    }
    Ok(values)
}

/// The call's mask as the steps to keep, `[B, T]`.
pub fn call_keep(call: &Call) -> Result<Option<Tensor<2, Bool>>> {
    match &call.mask {
        Some(mask) => Ok(Some(mask.clone().rank_n::<2>("recurrent layer mask [B, T]")?.bool())),
        None => Ok(None),
    }
}

/// The states a call starts from: its `initial_state` (`count` tensors `[B, units_of(k)]`), else
/// zeros.
pub fn initial_states(
    call: &Call,
    count: usize,
    units_of: impl Fn(usize) -> usize,
    x: &Tensor<3>,
) -> Result<Vec<Tensor<2>>> {
    let [batch, _, _] = x.dims();
    let Some(given) = call.arg(1, "initial_state") else {
        return Ok((0..count).map(|k| Tensor::<2>::zeros([batch, units_of(k)], &x.device())).collect());
    };
    let states = given.tensors();
    if states.len() != count {
        return Err(call.error(format!("initial_state has {} tensors, the layer {count} states", states.len())));
    }
    let mut out = Vec::with_capacity(count);
    for (k, state) in states.into_iter().enumerate() {
        let state = state.tensor.clone().rank_n::<2>("initial_state [B, units]")?;
        if state.dims() != [batch, units_of(k)] {
            return Err(call.error(format!(
                "initial_state {k} is {:?}, the layer's state [{batch}, {}]",
                state.dims(),
                units_of(k)
            )));
        }
        out.push(state);
    }
    Ok(out)
}

/// A run's output: every step's (`[B, T, u]`) with `sequences`, else the last step's (`[B, 1, u]`);
/// `None` for no steps.
pub fn output(run: &Run, sequences: bool) -> Option<Tensor<3>> {
    match sequences {
        true if !run.outputs.is_empty() => {
            Some(Tensor::cat(run.outputs.iter().map(|o| o.clone().unsqueeze_dim::<3>(1)).collect(), 1)) // [B, T, u]
        }
        true => None,
        false => run.outputs.last().map(|last| last.clone().unsqueeze_dim::<3>(1)), // [B, 1, u]
    }
}

/// A cell's two kernels as Keras saves them in the layer's `cell` group: `kernel [in, G·u]`
/// and `recurrent_kernel [u, G·u]`.
pub fn read_kernels(
    vars: &mut VarReader,
    gates: usize,
    units: usize,
    device: &Device,
) -> Result<(Param<Tensor<2>>, Param<Tensor<2>>)> {
    let kernel = vars.next("kernel", &[None, Some(gates * units)])?.to_tensor("kernel", device)?;
    let recurrent =
        vars.next("recurrent_kernel", &[Some(units), Some(gates * units)])?.to_tensor("recurrent_kernel", device)?;
    Ok((Param::from_tensor(kernel), Param::from_tensor(recurrent)))
}

/// A cell's bias `[width]`, where it has one.
pub fn read_bias(
    vars: &mut VarReader,
    use_bias: bool,
    width: usize,
    device: &Device,
) -> Result<Option<Param<Tensor<1>>>> {
    match use_bias {
        true => Ok(Some(Param::from_tensor(vars.next("bias", &[Some(width)])?.to_tensor("bias", device)?))),
        false => Ok(None),
    }
}

/// A cell's variables as Keras lists them (`<cell>/kernel`, `<cell>/recurrent_kernel`,
/// `<cell>/bias`) and saves them, in the layer's `cell` group.
pub fn cell_variables(
    cell: &str,
    kernel: &Param<Tensor<2>>,
    recurrent_kernel: &Param<Tensor<2>>,
    bias: Option<HostTensor>,
) -> Vec<Variable> {
    let (kernel, recurrent_kernel) =
        (HostTensor::from_tensor(kernel.val()), HostTensor::from_tensor(recurrent_kernel.val()));
    let named = [("kernel", Some(kernel)), ("recurrent_kernel", Some(recurrent_kernel)), ("bias", bias)];
    named
        .into_iter()
        .filter_map(|(name, tensor)| {
            tensor.map(|tensor| Variable { path: format!("{cell}/{name}"), group: "/cell".into(), tensor })
        })
        .collect()
}

/// `x W + b` for every step of `x` (`[B, T, in]`, `W: [in, G·u]`, `b: [G·u]`): `[B, T, G·u]`,
/// with the inputs' dropout masks: none, one for every gate, or one per gate block of `units`.
pub fn project_dropped(
    x: Tensor<3>,
    kernel: Tensor<2>,
    bias: Option<Tensor<1>>,
    masks: &[Tensor<2>],
    units: usize,
) -> Tensor<3> {
    let dropped = |m: &Tensor<2>| x.clone() * m.clone().unsqueeze_dim::<3>(1); // [B, T, in]
    match masks {
        [] => project(x, kernel, bias),
        [mask] => project(dropped(mask), kernel, bias),
        per_gate => {
            let [input, _] = kernel.dims();
            let blocks = per_gate.iter().enumerate().map(|(k, mask)| {
                let columns = k * units..(k + 1) * units;
                let bias = bias.clone().map(|b| b.slice([columns.clone()]));
                project(dropped(mask), kernel.clone().slice([0..input, columns]), bias) // [B, T, u]
            });
            Tensor::cat(blocks.collect(), 2) // [B, T, G·u]
        }
    }
}

/// `h R` (`R: [u, G·u]`) with the recurrent dropout masks of `h`: none, one, or one per gate block.
pub fn recurrent_product(h: Tensor<2>, kernel: Tensor<2>, masks: &[Tensor<2>], units: usize) -> Tensor<2> {
    match masks {
        [] => h.matmul(kernel),
        [mask] => (h * mask.clone()).matmul(kernel),
        per_gate => {
            let [rows, _] = kernel.dims();
            let blocks = per_gate.iter().enumerate().map(|(k, mask)| {
                (h.clone() * mask.clone()).matmul(kernel.clone().slice([0..rows, k * units..(k + 1) * units])) // [B, u]
            });
            Tensor::cat(blocks.collect(), 1) // [B, G·u]
        }
    }
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

/// `activation(x)` of a cell's gates. `tanh` and `sigmoid` are written through `exp`:
/// `1 - 2 / (exp(2x) + 1)` and `1 / (1 + exp(-x))`, within 2e-7 of the library functions, because
/// flex takes 10.7 and 4.3 ns an element for its `tanh` and `sigmoid` and 2.0 for `exp` (on
/// `[32, 64]`, Intel Xeon): a cell's activations were half of an LSTM's forward pass.
pub fn activate(activation: Activation, x: Tensor<2>) -> Tensor<2> {
    match activation {
        Activation::Tanh => x.mul_scalar(2.0).exp().add_scalar(1.0).recip().mul_scalar(-2.0).add_scalar(1.0),
        Activation::Sigmoid => x.neg().exp().add_scalar(1.0).recip(),
        other => match other.apply(DynTensor::from(x)) {
            DynTensor::R2(y) => y,
            _ => unreachable!("an activation keeps the rank"),
        },
    }
}

/// The `gate`-th of `gates` equal column blocks of `z` (`[B, gates · units]` -> `[B, units]`).
pub fn gate(z: &Tensor<2>, gate: usize, units: usize) -> Tensor<2> {
    let [batch, _] = z.dims();
    z.clone().slice([0..batch, gate * units..(gate + 1) * units])
}

/// How a recurrent layer is written into the torch module: torch's own `nn.LSTM` / `nn.GRU` /
/// `nn.RNN` where it computes the same function (no call with a mask, the activations it has,
/// the GRU's `reset_after` form), else the prelude's `Recurrent`, Keras' loop written out.
pub struct TorchRecurrent<'a> {
    /// `lstm`, `gru` or `simple_rnn`: the prelude's name of the cell.
    pub cell: &'static str,
    pub activation: Activation,
    /// `None` for a cell without gates (`SimpleRNN`).
    pub recurrent_activation: Option<Activation>,
    pub reset_after: bool,
    pub recurrence: &'a Recurrence,
    /// Keras' layout: `[in, G·u]`, `[u, G·u]`, `[G·u]` (GRU with `reset_after`: `[2, 3u]`).
    pub kernel: HostTensor,
    pub recurrent_kernel: HostTensor,
    pub bias: Option<HostTensor>,
}

impl TorchRecurrent<'_> {
    pub fn units(&self) -> usize {
        self.recurrent_kernel.shape[0]
    }

    /// torch's module of the same function, where there is one.
    pub fn native(&self, masked_calls: bool) -> Option<&'static str> {
        let gated = self.activation == Activation::Tanh && self.recurrent_activation == Some(Activation::Sigmoid);
        let dropout = self.recurrence.dropout > 0.0 || self.recurrence.recurrent_dropout > 0.0;
        match self.cell {
            _ if masked_calls || dropout => None, // torch's own modules mask nothing, drop nothing Keras drops
            "lstm" if gated => Some("LSTM"),
            "gru" if gated && self.reset_after => Some("GRU"),
            "simple_rnn" if matches!(self.activation, Activation::Tanh | Activation::Relu) => Some("RNN"),
            _ => None,
        }
    }

    /// torch's gate blocks from Keras' (`GRU`: Keras `z, r, h`, torch `r, z, n`), of a tensor
    /// `[rows, G·u]`, transposed to `[G·u, rows]` as torch stores its weights.
    fn torch_blocks(&self, keras: &HostTensor) -> HostTensor {
        let (rows, width, units) = (keras.shape[0], keras.shape[1], self.units());
        let order: &[usize] = if self.cell == "gru" { &[1, 0, 2] } else { &[0, 1, 2, 3][..width / units] };
        let mut data = Vec::with_capacity(rows * width);
        for row in keras.data.chunks_exact(width) {
            for &block in order {
                data.extend_from_slice(&row[block * units..(block + 1) * units]);
            }
        }
        HostTensor::new(vec![rows, width], data).transposed()
    }

    /// The prelude's `Recurrent(...)` for this layer, only what differs from the defaults
    /// spelled out, as a user would write it.
    pub fn prelude_constructor(&self) -> String {
        let r = self.recurrence;
        let mut arguments = vec![
            format!("cell={:?}", self.cell),
            format!("input_size={}", self.kernel.shape[0]),
            format!("units={}", self.units()),
        ];
        if self.activation != Activation::Tanh {
            arguments.push(format!("activation={:?}", activation_name(self.activation)));
        }
        if let Some(recurrent) = self.recurrent_activation.filter(|&a| a != Activation::Sigmoid) {
            arguments.push(format!("recurrent_activation={:?}", activation_name(recurrent)));
        }
        for (name, value, default) in [
            ("use_bias", self.bias.is_some(), true),
            ("reset_after", self.reset_after, true),
            ("return_sequences", r.return_sequences, false),
            ("return_state", r.return_state, false),
            ("go_backwards", r.go_backwards, false),
            ("zero_output_for_mask", r.zero_output_for_mask, false),
        ] {
            if value != default && (name != "reset_after" || self.cell == "gru") {
                arguments.push(format!("{name}={}", py_bool(value)));
            }
        }
        for (name, rate) in [("dropout", r.dropout), ("recurrent_dropout", r.recurrent_dropout)] {
            if rate != 0.0 {
                arguments.push(format!("{name}={}", crate::torch::py_float(rate)));
            }
        }
        format!("Recurrent({})", arguments.join(", "))
    }

    /// The prelude module's state dict: Keras' variables in Keras' layout.
    pub fn prelude_state(&self) -> Vec<(&'static str, HostTensor)> {
        let mut state = vec![("kernel", self.kernel.clone()), ("recurrent_kernel", self.recurrent_kernel.clone())];
        if let Some(bias) = &self.bias {
            state.push(("bias", bias.clone()));
        }
        state
    }

    /// The layer's attribute and its state dict.
    pub fn module(&self, module: &mut TorchModule) -> Result<()> {
        let Some(class) = self.native(module.masked_calls) else {
            module.construct(self.prelude_constructor());
            for (name, tensor) in self.prelude_state() {
                module.tensor(name, tensor);
            }
            return Ok(());
        };
        module.construct(self.native_constructor(class, false));
        if !self.recurrence.return_sequences {
            module.untraced(); // its first output is every step's, the layer's the last
        }
        for (name, tensor) in self.native_state("") {
            module.tensor(&name, tensor);
        }
        Ok(())
    }

    /// `torch.nn.<class>(...)` for this layer, both directions in one with `bidirectional`.
    pub fn native_constructor(&self, class: &str, bidirectional: bool) -> String {
        let (input, units) = (self.kernel.shape[0], self.units());
        let nonlinearity = match (class, self.activation) {
            ("RNN", Activation::Relu) => ", nonlinearity=\"relu\"",
            _ => "",
        };
        let both = if bidirectional { ", bidirectional=True" } else { "" };
        let bias = py_bool(self.bias.is_some());
        format!("torch.nn.{class}({input}, {units}, batch_first=True, bias={bias}{nonlinearity}{both})")
    }

    /// torch's state dict of the layer as one direction of a torch module (`suffix` `""` or
    /// `"_reverse"`): the kernels transposed in torch's gate order, Keras' one bias as torch's
    /// input bias and the recurrent one zero (a GRU's: Keras' second row).
    pub fn native_state(&self, suffix: &str) -> Vec<(String, HostTensor)> {
        let mut state = vec![
            (format!("weight_ih_l0{suffix}"), self.torch_blocks(&self.kernel)),
            (format!("weight_hh_l0{suffix}"), self.torch_blocks(&self.recurrent_kernel)),
        ];
        if let Some(b) = &self.bias {
            let width = b.shape[b.shape.len() - 1];
            let rows = if b.shape.len() == 2 {
                b.clone()
            } else {
                HostTensor::new(vec![2, width], [b.data.clone(), vec![0.0; width]].concat())
            };
            let blocks = self.torch_blocks(&rows).transposed(); // [2, G·u] in torch's order
            state.push((format!("bias_ih_l0{suffix}"), HostTensor::new(vec![width], blocks.data[..width].to_vec())));
            state.push((format!("bias_hh_l0{suffix}"), HostTensor::new(vec![width], blocks.data[width..].to_vec())));
        }
        state
    }

    /// The statements of one call.
    pub fn call(&self, call: &mut TorchCall) -> Result<String> {
        let x = call.input()?;
        let i = call.index;
        let r = self.recurrence;
        let states = if self.cell == "lstm" { 2 } else { 1 };
        let initial = initial_state_vars(call, states)?;
        let mask = call.previous_mask();
        if let Some(class) = self.native(call.masked_calls) {
            let input = if r.go_backwards { format!("{x}.flip(1)") } else { x };
            let initial = match initial {
                Some(h) if states == 2 => format!(", ({}.unsqueeze(0), {}.unsqueeze(0))", h[0], h[1]),
                Some(h) => format!(", {}.unsqueeze(0)", h[0]),
                None => String::new(),
            };
            call.line(format!("y{i}, s{i} = self.{}({input}{initial})", call.attr));
            let output = if r.return_sequences { format!("y{i}") } else { format!("y{i}[:, -1]") };
            call.assign(&output, &mask);
            if r.return_state {
                let state_names: Vec<String> = (1..=states).map(|k| format!("x{i}_{k}")).collect();
                let finals = if states == 2 { format!("s{i}[0][0], s{i}[1][0]") } else { format!("s{i}[0]") };
                call.line(format!("{} = {finals}", state_names.join(", ")));
            }
            return Ok(format!("nn.{class}"));
        }
        let invocation = prelude_invocation(call, x, initial);
        match r.return_state {
            true => call.assign_outputs(1 + states, &invocation, &mask),
            false => call.assign(&invocation, &mask),
        }
        Ok(format!("Recurrent({:?})", self.cell))
    }
}

/// The variables of a call's `initial_state` (`count` tensors), where it has one.
pub fn initial_state_vars(call: &TorchCall, count: usize) -> Result<Option<Vec<String>>> {
    let Some(arg) = call.kwarg("initial_state").or_else(|| call.node.args.get(1)) else {
        return Ok(None);
    };
    let ports = arg.ports();
    if ports.len() != count {
        return Err(call.refuse(format!("initial_state has {} tensors, the layer {count} states", ports.len())));
    }
    Ok(Some(ports.into_iter().map(var).collect()))
}

/// `self.<attr>(x[, mask=m][, initial_state=[states]])`: a call of the prelude's `Recurrent` or
/// `Bidirectional`, with the mask Keras passes as `mask=` and the initial states where given.
pub fn prelude_invocation(call: &TorchCall, x: String, initial: Option<Vec<String>>) -> String {
    let call_mask = call.call_mask();
    PyCall::new(format!("self.{}", call.attr))
        .arg(x)
        .kw_if(call_mask != "None", "mask", &call_mask)
        .kw_if(initial.is_some(), "initial_state", format!("[{}]", initial.unwrap_or_default().join(", ")))
        .to_string()
}
