//! The operations that select, split and repeat values: `x[...]` (`GetItem`), `slice`, `take`,
//! `stack`, `unstack`, `split`, `tile`, `repeat`, `broadcast_to`, with numpy's semantics. `unstack` and `split`
//! have several outputs.

use serde_json::Value as Json;

use crate::config::LayerArgs;
use crate::graph::Arg;
use crate::layers::{Call, Input};
use crate::torch::tuple;
use crate::value::{Binary, DType, DynTensor, Value, constant_tensor, json_array, map_rank};
use model::error::Result;

#[derive(Debug, Clone)]
pub enum Indexing {
    /// `x[key]`: the key is the call's second argument (ints, slices, `None`, `...`).
    GetItem,
    /// `slice(x, start_indices, shape)`: the block of `shape` from constant `start_indices`.
    Slice {
        shape: Vec<usize>,
    },
    /// `take(x, indices, axis)`: integer indices of any shape (constant or a tensor, negative
    /// ones from the end) along `axis`, or into the flattened input where `None`.
    Take {
        axis: Option<i64>,
    },
    Stack {
        axis: i64,
    },
    Unstack {
        axis: i64,
    },
    /// `split(x, indices_or_sections, axis)`: equal sections, or cut before each index.
    Split {
        sections: Sections,
        axis: i64,
    },
    /// numpy's `tile`: `repeats` aligned with the last axes.
    Tile {
        repeats: Vec<usize>,
    },
    /// numpy's `repeat`: each entry along `axis` `repeats` times in place (`[a, b]` to
    /// `[a, a, b, b]`; grouped-query attention's shared key heads); the flattened input where
    /// `axis` is `None`.
    Repeat {
        repeats: usize,
        axis: Option<i64>,
    },
    BroadcastTo {
        shape: Vec<usize>,
    },
}

#[derive(Debug, Clone)]
pub enum Sections {
    Equal(usize),
    Before(Vec<i64>),
}

/// One entry of a `GetItem` key.
enum Index {
    At(i64),
    Range { start: Option<i64>, stop: Option<i64>, step: Option<i64> },
    NewAxis,
    Ellipsis,
}

impl Indexing {
    /// The operation of class `class`, or `None` for another class.
    pub fn from_config(class: &str, args: &mut LayerArgs) -> Result<Option<Self>> {
        let axis = |args: &mut LayerArgs, default: i64| -> Result<i64> {
            Ok(args.take_ints("axis")?.and_then(|a| a.first().copied()).unwrap_or(default))
        };
        Ok(Some(match class {
            "GetItem" => Self::GetItem,
            "Slice" => Self::Slice { shape: sizes(args, "shape")? },
            "Take" => Self::Take { axis: args.take_ints("axis")?.and_then(|a| a.first().copied()) },
            "Stack" => Self::Stack { axis: axis(args, 0)? },
            "Unstack" => {
                args.take("num"); // follows from the input's shape
                Self::Unstack { axis: axis(args, 0)? }
            }
            "Split" => {
                let sections = match args.take("indices_or_sections") {
                    Json::Number(n) => {
                        Sections::Equal(n.as_u64().ok_or_else(|| args.error("indices_or_sections: a count"))? as usize)
                    }
                    Json::Array(items) => Sections::Before(
                        items
                            .iter()
                            .map(Json::as_i64)
                            .collect::<Option<_>>()
                            .ok_or_else(|| args.error("indices_or_sections: integers"))?,
                    ),
                    other => {
                        return Err(args.error(format!("indices_or_sections = {other}: a count or a list of indices")));
                    }
                };
                Self::Split { sections, axis: axis(args, 0)? }
            }
            "Tile" => Self::Tile { repeats: sizes(args, "repeats")? },
            "Repeat" => {
                let repeats = match args.take("repeats") {
                    Json::Number(n) => n.as_u64().ok_or_else(|| args.error("repeats: a count"))? as usize,
                    other => {
                        return Err(
                            args.error(format!("repeats = {other}: one count (a count per entry is not supported)"))
                        );
                    }
                };
                Self::Repeat { repeats, axis: args.take_ints("axis")?.and_then(|a| a.first().copied()) }
            }
            "BroadcastTo" => Self::BroadcastTo { shape: sizes(args, "shape")? },
            _ => return Ok(None),
        }))
    }

    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let first = call.args.first();
        let tensor = || match first {
            Some(Input::Tensor(v)) => Ok(v.clone()),
            _ => Err(call.error("the first operand is not a tensor")),
        };
        let same = |x: &Value, y: DynTensor| Value::new(y, x.dtype);
        Ok(match self {
            Self::GetItem => {
                let x = tensor()?;
                let Some(key) = call.args.get(1).and_then(Input::constant) else {
                    return Err(call.error("the index is not a constant (indexing by a tensor is not supported)"));
                };
                vec![same(&x, get_item(x.tensor.clone(), &key, call)?)]
            }
            Self::Slice { shape } => {
                let x = tensor()?;
                let start = slice_start(call.args.get(1).and_then(Input::constant).as_ref(), shape, &x.tensor.shape())
                    .map_err(|why| call.error(why))?;
                let mut y = x.tensor.clone();
                for (axis, (&from, &size)) in start.iter().zip(shape).enumerate() {
                    y = y.slice_axis(axis, from, from + size, 1);
                }
                vec![same(&x, y)]
            }
            Self::Take { axis } => {
                let x = tensor()?;
                let (flat, axis) = match axis {
                    Some(a) => (x.tensor.clone(), call.axis(*a, x.tensor.rank())?),
                    None => (x.tensor.clone().reshape(&[x.tensor.shape().iter().product()])?, 0),
                };
                let length = flat.shape()[axis];
                let indices = call.args.get(1);
                let (indices, index_shape) = match (indices.and_then(Input::constant), indices) {
                    // Constant indices: checked here, as TensorFlow's gather checks them.
                    (Some(c), _) => {
                        let Some(host) = json_array(&c, false).filter(|h| h.data.iter().all(|i| i.fract() == 0.0))
                        else {
                            return Err(call.error(format!("take's indices {c}: integers")));
                        };
                        if let Some(bad) = host.data.iter().find(|&&i| i < -(length as f32) || i >= length as f32) {
                            return Err(call.error(format!("take's index {bad} outside an axis of {length}")));
                        }
                        let shape = host.shape.clone();
                        (DynTensor::from_host(&host, &flat.device())?, shape)
                    }
                    (None, Some(Input::Tensor(v))) => (v.tensor.clone(), v.shape()),
                    _ => return Err(call.error("take's indices are neither integers nor a tensor")),
                };
                vec![same(&x, take(flat, axis, indices, &index_shape)?)]
            }
            Self::Stack { axis } => {
                let parts: Vec<&Value> = first.map(Input::tensors).unwrap_or_default();
                let Some(head) = parts.first() else { return Err(call.error("stack of nothing")) };
                let axis = call.axis(*axis, head.tensor.rank() + 1)?;
                let expanded = parts.iter().map(|v| v.tensor.clone().expand_dims(axis)).collect::<Result<Vec<_>>>()?;
                vec![Value::new(DynTensor::concat(expanded, axis)?, head.dtype)]
            }
            Self::Unstack { axis } => {
                let x = tensor()?;
                let axis = call.axis(*axis, x.tensor.rank())?;
                let mut shape = x.tensor.shape();
                let count = shape.remove(axis);
                (0..count)
                    .map(|i| Ok(same(&x, x.tensor.clone().slice_axis(axis, i, i + 1, 1).reshape(&shape)?)))
                    .collect::<Result<_>>()?
            }
            Self::Split { sections, axis } => {
                let x = tensor()?;
                let axis = call.axis(*axis, x.tensor.rank())?;
                let length = x.tensor.shape()[axis];
                let cuts = cuts(sections, length).map_err(|e| call.error(e))?;
                cuts.windows(2).map(|w| same(&x, x.tensor.clone().slice_axis(axis, w[0], w[1], 1))).collect()
            }
            Self::Tile { repeats } => {
                let x = tensor()?;
                let mut y = x.tensor.clone();
                while y.rank() < repeats.len() {
                    y = y.expand_dims(0)?;
                }
                let offset = y.rank() - repeats.len();
                for (k, &times) in repeats.iter().enumerate() {
                    let axis = offset + k;
                    if times != 1 {
                        y = DynTensor::concat(vec![y; times], axis)?;
                    }
                }
                vec![same(&x, y)]
            }
            Self::Repeat { repeats, axis } => {
                let x = tensor()?;
                let (flat, axis) = match axis {
                    Some(a) => (x.tensor.clone(), call.axis(*a, x.tensor.rank())?),
                    None => (x.tensor.clone().reshape(&[x.tensor.shape().iter().product()])?, 0),
                };
                vec![same(&x, flat.repeat_axis(axis, *repeats)?)]
            }
            Self::BroadcastTo { shape } => {
                let x = tensor()?;
                let mut y = x.tensor.clone();
                while y.rank() < shape.len() {
                    y = y.expand_dims(0)?;
                }
                vec![same(&x, y.broadcast_to(shape)?)]
            }
        })
    }

    /// Whether the operation has several outputs (a sequence in torch).
    pub fn gives_a_sequence(&self) -> bool {
        matches!(self, Self::Unstack { .. } | Self::Split { .. })
    }

    /// The torch expression of the operation on `x` (the first operand as written) and the
    /// node's recorded `args`; `unstack` and `split` give a sequence.
    pub fn torch(&self, x: &str, args: &[Arg], rendered: &[String]) -> std::result::Result<String, String> {
        use crate::torch::render;
        Ok(match self {
            Self::GetItem => {
                let key = args.get(1).and_then(Arg::constant).ok_or("an index that is not a constant")?;
                let items: Vec<String> = key_items(&key)?
                    .into_iter()
                    .map(|item| match item {
                        Index::At(i) => i.to_string(),
                        Index::NewAxis => "None".into(),
                        Index::Ellipsis => "...".into(),
                        Index::Range { start, stop, step } => {
                            let part = |v: Option<i64>| v.map_or(String::new(), |v| v.to_string());
                            match step {
                                Some(step) => format!("{}:{}:{step}", part(start), part(stop)),
                                None => format!("{}:{}", part(start), part(stop)),
                            }
                        }
                    })
                    .collect();
                format!("{x}[{}]", items.join(", "))
            }
            Self::Slice { shape } => {
                let start = args.get(1).and_then(Arg::constant).ok_or("slice's start indices are not constant")?;
                let start: Vec<i64> = match start {
                    Json::Array(items) => items.iter().map(Json::as_i64).collect::<Option<_>>(),
                    _ => None,
                }
                .ok_or("slice's start indices are not integers")?;
                let ranges: Vec<String> =
                    start.iter().zip(shape).map(|(from, size)| format!("{from}:{}", from + *size as i64)).collect();
                format!("{x}[{}]", ranges.join(", "))
            }
            Self::Take { axis } => {
                let indices = match (args.get(1).and_then(Arg::constant), axis) {
                    // One index drops the axis, as torch's `select` does.
                    (Some(Json::Number(i)), Some(axis)) => return Ok(format!("{x}.select({axis}, {i})")),
                    (Some(list @ (Json::Array(_) | Json::Number(_))), _) => {
                        format!("torch.tensor({})", render(&Arg::Const(list)))
                    }
                    // A tensor (a constant one is a buffer, int64 if integers): negative indices from the end.
                    (indices, _) => {
                        let rendered = rendered.get(1).ok_or("take's indices are missing")?;
                        let integers = indices.as_ref().and_then(constant_tensor).is_some_and(|(_, d)| d == DType::Int);
                        if integers { rendered.clone() } else { format!("{rendered}.long()") }
                    }
                };
                match axis {
                    // numpy's take along an axis is indexing by one integer tensor at that axis.
                    Some(axis) if *axis >= 0 => format!("{x}[{}{indices}]", ":, ".repeat(*axis as usize)),
                    Some(axis) => format!("{x}[..., {indices}{}]", ", :".repeat((-1 - *axis) as usize)),
                    None => format!("torch.take({x}, {indices})"),
                }
            }
            Self::Stack { axis } => {
                format!("torch.stack({}, dim={axis})", rendered.first().ok_or("no operands")?)
            }
            Self::Unstack { axis } => format!("torch.unbind({x}, dim={axis})"),
            Self::Split { sections: Sections::Equal(n), axis } => format!("torch.tensor_split({x}, {n}, dim={axis})"),
            Self::Split { sections: Sections::Before(at), axis } => {
                format!("torch.tensor_split({x}, {at:?}, dim={axis})")
            }
            Self::Tile { repeats } => format!("torch.tile({x}, {})", tuple(repeats)),
            Self::Repeat { repeats, axis: Some(axis) } => {
                format!("torch.repeat_interleave({x}, {repeats}, dim={axis})")
            }
            Self::Repeat { repeats, axis: None } => format!("torch.repeat_interleave({x}.flatten(), {repeats})"),
            Self::BroadcastTo { shape } => format!("torch.broadcast_to({x}, {})", tuple(shape)),
        })
    }
}

/// numpy's `take` of `indices` (integers stored as floats, negative ones counted from the end,
/// as TensorFlow's backend wraps them) of shape `index_shape` along `axis` of `x`: the axis
/// replaced by the indices' axes (`[1]` for a scalar in place of no axis).
fn take(x: DynTensor, axis: usize, indices: DynTensor, index_shape: &[usize]) -> Result<DynTensor> {
    let mut shape = x.shape();
    let device = x.device();
    let count = index_shape.iter().product::<usize>();
    let flat = indices.reshape(&[count])?; // [count]
    let negative = DynTensor::binary(Binary::Less, flat.clone(), DynTensor::scalar(0.0, &device))?;
    let wrapped = DynTensor::binary(
        Binary::Add,
        flat,
        DynTensor::binary(Binary::Multiply, negative, DynTensor::scalar(shape[axis] as f32, &device))?,
    )?;
    let wrapped = wrapped.rank_n::<1>("take's indices")?.int(); // [count]
    let taken = map_rank!(x, t => t.select(axis, wrapped.clone())); // [..., count, ...]
    shape.splice(axis..=axis, index_shape.iter().copied());
    taken.reshape(if shape.is_empty() { &[1] } else { &shape })
}

/// A list of non-negative sizes.
fn sizes(args: &mut LayerArgs, argument: &str) -> Result<Vec<usize>> {
    let values = args.take_ints(argument)?.ok_or_else(|| args.error(format!("{argument} is missing")))?;
    values
        .into_iter()
        .map(|v| usize::try_from(v).map_err(|_| args.error(format!("{argument}: {v} is not a size"))))
        .collect()
}

/// `slice`'s start indices (a constant list, one per axis of `shape`), checked against the
/// input's `dims`: the block must lie inside it.
fn slice_start(start: Option<&Json>, shape: &[usize], dims: &[usize]) -> std::result::Result<Vec<usize>, String> {
    let start: Vec<i64> = match start {
        Some(Json::Array(items)) => items.iter().map(Json::as_i64).collect::<Option<_>>(),
        _ => None,
    }
    .ok_or("slice's start indices are not constant integers (tensor start indices are not supported)")?;
    if start.len() != shape.len() || shape.len() != dims.len() {
        return Err(format!("slice of {dims:?} from {start:?} of shape {shape:?}: one start and size per axis"));
    }
    start
        .iter()
        .zip(shape)
        .zip(dims)
        .map(|((&from, &size), &length)| match usize::try_from(from) {
            Ok(from) if from + size <= length => Ok(from),
            _ => Err(format!("slice of {dims:?} from {start:?} of shape {shape:?} leaves the input")),
        })
        .collect()
}

/// The boundaries of `split`'s pieces along an axis of `length`.
fn cuts(sections: &Sections, length: usize) -> std::result::Result<Vec<usize>, String> {
    Ok(match sections {
        Sections::Equal(n) => {
            if *n == 0 || !length.is_multiple_of(*n) {
                return Err(format!("{length} entries do not split into {n} equal sections"));
            }
            (0..=*n).map(|k| k * length / n).collect()
        }
        Sections::Before(at) => {
            let clamp = |i: i64| if i < 0 { (length as i64 + i).max(0) as usize } else { (i as usize).min(length) };
            let mut cuts = vec![0];
            cuts.extend(at.iter().map(|&i| clamp(i)));
            cuts.push(length);
            for k in 1..cuts.len() {
                cuts[k] = cuts[k].max(cuts[k - 1]);
            }
            cuts
        }
    })
}

/// A `GetItem` key as Keras saves it: one item or a list of items (`__slice__`, `__ellipsis__`,
/// integers, `null` for a new axis).
fn key_items(key: &Json) -> std::result::Result<Vec<Index>, String> {
    let one = |item: &Json| -> std::result::Result<Index, String> {
        match item {
            Json::Null => Ok(Index::NewAxis),
            Json::Number(n) => n.as_i64().map(Index::At).ok_or_else(|| format!("index {n}")),
            Json::Object(o) => match o.get("class_name").and_then(Json::as_str) {
                Some("__ellipsis__") => Ok(Index::Ellipsis),
                Some("__slice__") => {
                    let field = |name: &str| o.get("config").and_then(|c| c.get(name)).and_then(Json::as_i64);
                    Ok(Index::Range { start: field("start"), stop: field("stop"), step: field("step") })
                }
                other => Err(format!("an index of class {other:?}")),
            },
            other => Err(format!("index {other}")),
        }
    };
    match key {
        Json::Array(items) => items.iter().map(one).collect(),
        item => Ok(vec![one(item)?]),
    }
}

/// numpy's basic indexing of `x` by `key`: integers drop their axis, slices keep it, `None`
/// adds one, `...` stands for the axes the key does not name.
fn get_item(x: DynTensor, key: &Json, call: &Call) -> Result<DynTensor> {
    let items = key_items(key).map_err(|e| call.error(e))?;
    let named = items.iter().filter(|i| matches!(i, Index::At(_) | Index::Range { .. })).count();
    let rank = x.rank();
    if named > rank || items.iter().filter(|i| matches!(i, Index::Ellipsis)).count() > 1 {
        return Err(call.error(format!("index of {named} axes into a rank-{rank} tensor")));
    }
    let mut expanded = Vec::new();
    for item in items {
        if matches!(item, Index::Ellipsis) {
            expanded.extend((0..rank - named).map(|_| Index::Range { start: None, stop: None, step: None }));
        } else {
            expanded.push(item);
        }
    }
    // The axes the key leaves out are taken whole.
    let mut y = x;
    let mut axis = 0; // the axis of `y` the next item reads
    let mut out_shape = Vec::new();
    for item in &expanded {
        match *item {
            Index::NewAxis => out_shape.push(1),
            Index::At(i) => {
                let length = y.shape()[axis] as i64;
                if i < -length || i >= length {
                    return Err(call.error(format!("index {i} of an axis of {length}")));
                }
                let at = i.rem_euclid(length) as usize;
                y = y.slice_axis(axis, at, at + 1, 1);
                axis += 1;
            }
            Index::Range { start, stop, step } => {
                let length = y.shape()[axis] as i64;
                let step = step.unwrap_or(1);
                if step <= 0 {
                    return Err(call.error(format!("a slice step of {step} (only positive steps are supported)")));
                }
                let bound = |v: Option<i64>, default: i64| match v {
                    None => default,
                    Some(v) if v < 0 => (length + v).max(0),
                    Some(v) => v.min(length),
                };
                let (from, to) = (bound(start, 0), bound(stop, length));
                let to = to.max(from);
                let kept = ((to - from) + step - 1) / step;
                y = if kept == 0 {
                    return Err(call.error("an empty slice"));
                } else {
                    y.slice_axis(axis, from as usize, to as usize, step as usize)
                };
                out_shape.push(kept as usize);
                axis += 1;
            }
            Index::Ellipsis => return Err(call.error("more than one `...` in an index")),
        }
    }
    out_shape.extend(y.shape()[axis..].iter().copied());
    y.reshape(if out_shape.is_empty() { &[1] } else { &out_shape })
}
