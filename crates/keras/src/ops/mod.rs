//! Operation nodes: tensor operators and `keras.ops` calls recorded in a functional graph
//! (`x + y`, `keras.ops.mean(x, axis=1)`), with their numpy semantics. Their arguments are
//! in the call (`args`), their options in the node's config (`axis`, `keepdims`, `newshape`...).
//! Operations drop Keras masks, as TensorFlow's eager ops do.

use burn::module::Module;
use serde_json::Value as Json;

use crate::config::LayerArgs;
use crate::graph::Arg;
mod attention;
mod einsum;
mod indexing;

use einsum::Einsum;
use indexing::Indexing;

use crate::layers::convolution::two_sizes;
use crate::layers::{Build, Call, Input, KerasLayer, same_padding};
use crate::torch::{PyCall, TorchCall, py_bool, py_float, py_str, torch_dtype, tuple};
use crate::value::{Binary, DType, DynTensor, Reduce, Unary, Value, constant_tensor, map_rank, resolve_shape};
use model::error::Result;

/// An operation node of the graph: an [`Operation`] as a layer of the model.
#[derive(Module, Debug)]
pub struct OperationNode {
    #[module(skip)]
    pub op: Operation,
}

impl KerasLayer for OperationNode {
    fn build(layer: &mut Build) -> Result<Self> {
        let class = layer.spec.class_name.clone();
        Ok(Self { op: Operation::from_config(&class, &mut layer.args)? })
    }

    fn call(&self, call: &Call) -> Result<Vec<Value>> {
        self.op.call(call)
    }

    fn torch_call(&self, call: &mut TorchCall) -> Result<String> {
        let node = call.node;
        let rendered: Vec<String> = node.args.iter().map(|a| call.render(a)).collect();
        // Only the keywords the operation reads: rendering a constant tensor makes it a buffer.
        let keywords: Vec<(&str, String)> = self
            .op
            .keywords()
            .iter()
            .map(|&name| (name, call.kwarg(name).cloned().map_or_else(|| "None".to_string(), |a| call.render(&a))))
            .collect();
        let y = self.op.torch(&node.args, &rendered, &keywords).map_err(|why| call.refuse(why))?;
        if self.op.gives_a_sequence() {
            // `unstack` / `split`: x<i>, x<i>_1, ... are the parts the graph reads.
            let i = call.index;
            call.line(format!("x{i}_parts = {y}"));
            for k in 0..call.outputs {
                let name = if k == 0 { format!("x{i}") } else { format!("x{i}_{k}") };
                call.line(format!("{name} = x{i}_parts[{k}]"));
            }
        } else {
            call.assign(&y, "None");
        }
        Ok("torch operation".into())
    }
}

/// `keras.ops.sum(x, axis=1)` and the other reductions as torch writes them (`torch.sum(x,
/// dim=1)`), or the prelude's `reduce` where torch has no one call for it (every axis kept,
/// a product over several axes).
fn reduction(kind: Reduce, x: &str, axes: Option<&[i64]>, keepdims: bool) -> String {
    let (function, name) = match kind {
        Reduce::Sum => ("torch.sum", "sum"),
        Reduce::Mean => ("torch.mean", "mean"),
        Reduce::Max => ("torch.amax", "max"),
        Reduce::Min => ("torch.amin", "min"),
        Reduce::Prod => ("torch.prod", "prod"),
        Reduce::Any => ("torch.any", "any"),
        Reduce::All => ("torch.all", "all"),
    };
    let torch_call = match axes {
        None if !keepdims && !matches!(kind, Reduce::Max | Reduce::Min) => Some(PyCall::new(function).arg(x)),
        Some([axis]) => Some(PyCall::new(function).arg(x).kw("dim", axis)),
        Some(axes) if !axes.is_empty() && kind != Reduce::Prod => {
            Some(PyCall::new(function).arg(x).kw("dim", tuple(axes)))
        }
        _ => None,
    };
    match torch_call {
        Some(call) => call.kw_if(keepdims, "keepdim", "True").to_string(),
        None => PyCall::new("reduce")
            .arg(x)
            .kw("kind", py_str(name))
            .kw_if(axes.is_some(), "axis", format!("{:?}", axes.unwrap_or_default()))
            .kw("keepdims", py_bool(keepdims))
            .to_string(),
    }
}

/// An optional `dtype` argument (`None`: the input's).
fn take_dtype(args: &mut LayerArgs) -> Result<Option<DType>> {
    match args.take("dtype") {
        Json::Null => Ok(None),
        Json::String(name) => {
            DType::parse(&name).map(Some).ok_or_else(|| args.error(format!("dtype {name:?} is not supported")))
        }
        other => Err(args.error(format!("dtype = {other}: a dtype name"))),
    }
}

/// `x` of dtype `from` as `to`, as Keras casts: to bool by `!= 0`, float to int toward zero.
fn cast(x: DynTensor, from: DType, to: DType) -> DynTensor {
    match (from, to) {
        (_, DType::Bool) => x.map(Unary::ToBool),
        (DType::Float, DType::Int) => x.map(Unary::Truncate),
        _ => x,
    }
}

/// Every operation class this converter runs, for the error on any other.
const SUPPORTED: &str = "Add, Subtract, Multiply, Divide, TrueDivide, Power, Maximum, Minimum, Equal, NotEqual, Greater, GreaterEqual, Less, LessEqual, LogicalAnd, LogicalOr, LogicalXor, LogicalNot, Negative, Absolute, Abs, Square, Sqrt, Rsqrt, Reciprocal, Exp, Log, Tanh, Sigmoid, Relu, Gelu, Silu, Softmax, LogSoftmax, Sign, Floor, Round, Cast, ConvertToTensor, ZerosLike, OnesLike, FullLike, Where, Clip, Matmul, Einsum, Concatenate, Reshape, Transpose, Moveaxis, ExpandDims, Squeeze, Pad, Cumsum, DotProductAttention, ExtractPatches, GetItem, Slice, Take, Stack, Unstack, Split, Tile, Repeat, BroadcastTo, Mean, Sum, Max, Min, Prod, Any, All";

#[derive(Debug, Clone)]
pub enum Operation {
    Binary(Binary),
    Unary(Unary),
    Gelu {
        approximate: bool,
    },
    Silu,
    Softmax {
        axis: i64,
        log: bool,
    },
    Cast(DType),
    /// `convert_to_tensor(x, dtype)`: the value, cast where a dtype is given.
    ConvertToTensor(Option<DType>),
    /// `zeros_like`, `ones_like`, `full_like`: `value` in the input's shape.
    FullLike {
        value: f64,
        dtype: Option<DType>,
    },
    Where,
    Clip {
        min: f64,
        max: f64,
    },
    Matmul,
    Concatenate {
        axis: i64,
    },
    Reshape {
        shape: Vec<i64>,
    },
    Transpose {
        axes: Option<Vec<i64>>,
    },
    /// numpy's `moveaxis`: each `source` axis to its `destination`, the others in order.
    Moveaxis {
        source: Vec<i64>,
        destination: Vec<i64>,
    },
    /// `einsum(subscripts, a, b)` of two operands ([`einsum`]).
    Einsum(Einsum),
    ExpandDims {
        axes: Vec<i64>,
    },
    Squeeze {
        axes: Option<Vec<i64>>,
    },
    /// numpy's `pad` in mode `"constant"`: `(before, after)` entries per axis (one pair: the
    /// same for every axis), of the call's `constant_values` (0 where none).
    Pad {
        widths: Vec<(usize, usize)>,
    },
    /// numpy's `cumsum` along `axis` (the flattened input where `None`), of the input cast to
    /// `dtype` first; booleans sum as integers.
    Cumsum {
        axis: Option<i64>,
        dtype: Option<DType>,
    },
    /// `keras.ops.dot_product_attention(query, key, value, bias, mask, scale)` on `[B, T, N, H]`
    /// ([`attention`]).
    DotProductAttention {
        is_causal: bool,
    },
    Reduce {
        kind: Reduce,
        axes: Option<Vec<i64>>,
        keepdims: bool,
    },
    /// `keras.ops.image.extract_patches` on a batch of images: each `size` window (every
    /// `strides`, `dilation` apart, TensorFlow's padding) as one vector in `(row, column,
    /// channel)` order, what Keras' identity-kernel convolution computes.
    ExtractPatches {
        size: [usize; 2],
        strides: [usize; 2],
        dilation: usize,
        same: bool,
        channels_last: bool,
    },
    /// Selecting, splitting and repeating: `x[...]`, `take`, `stack`, `unstack`, `split`, `tile`,
    /// `broadcast_to` ([`indexing`]).
    Indexing(Indexing),
}

impl Operation {
    pub fn from_config(class: &str, args: &mut LayerArgs) -> Result<Self> {
        if let Some(op) = Indexing::from_config(class, args)? {
            return Ok(Self::Indexing(op));
        }
        let binary = |op| Ok(Self::Binary(op));
        let reduce = |kind, args: &mut LayerArgs| -> Result<Self> {
            let axes = args.take_ints("axis")?;
            let keepdims = args.take_bool("keepdims", false)?;
            if !args.take("initial").is_null() {
                return Err(args.error("initial: not supported"));
            }
            Ok(Self::Reduce { kind, axes, keepdims })
        };
        match class {
            "Add" => binary(Binary::Add),
            "Subtract" => binary(Binary::Subtract),
            "Multiply" => binary(Binary::Multiply),
            "Divide" | "TrueDivide" => binary(Binary::Divide),
            "Power" => binary(Binary::Power),
            "Maximum" => binary(Binary::Maximum),
            "Minimum" => binary(Binary::Minimum),
            "Equal" => binary(Binary::Equal),
            "NotEqual" => binary(Binary::NotEqual),
            "Greater" => binary(Binary::Greater),
            "GreaterEqual" => binary(Binary::GreaterEqual),
            "Less" => binary(Binary::Less),
            "LessEqual" => binary(Binary::LessEqual),
            "LogicalAnd" => binary(Binary::LogicalAnd),
            "LogicalOr" => binary(Binary::LogicalOr),
            "LogicalXor" => binary(Binary::LogicalXor),
            "LogicalNot" => Ok(Self::Unary(Unary::LogicalNot)),
            "Negative" => Ok(Self::Unary(Unary::Negative)),
            "Absolute" | "Abs" => Ok(Self::Unary(Unary::Abs)),
            "Square" => Ok(Self::Unary(Unary::Square)),
            "Sqrt" => Ok(Self::Unary(Unary::Sqrt)),
            "Rsqrt" => Ok(Self::Unary(Unary::Rsqrt)),
            "Reciprocal" => Ok(Self::Unary(Unary::Reciprocal)),
            "Exp" => Ok(Self::Unary(Unary::Exp)),
            "Log" => Ok(Self::Unary(Unary::Log)),
            "Tanh" => Ok(Self::Unary(Unary::Tanh)),
            "Sigmoid" => Ok(Self::Unary(Unary::Sigmoid)),
            "Relu" => Ok(Self::Unary(Unary::Relu)),
            "Sign" => Ok(Self::Unary(Unary::Sign)),
            "Floor" => Ok(Self::Unary(Unary::Floor)),
            "Round" => {
                if args.take_usize("decimals", Some(0))? != 0 {
                    return Err(args.error("decimals: only 0 is supported"));
                }
                Ok(Self::Unary(Unary::Round))
            }
            "Gelu" => Ok(Self::Gelu { approximate: args.take_bool("approximate", true)? }),
            "Silu" | "Swish" => Ok(Self::Silu),
            "Softmax" | "LogSoftmax" => {
                Ok(Self::Softmax { axis: args.take_ints("axis")?.and_then(|a| a.first().copied()).unwrap_or(-1), log: class == "LogSoftmax" })
            }
            "Cast" => {
                let name = args.take_str("dtype", "float32")?;
                DType::parse(&name).map(Self::Cast).ok_or_else(|| args.error(format!("dtype {name:?} is not supported")))
            }
            "ConvertToTensor" => {
                for unsupported in ["sparse", "ragged"] {
                    if args.take_bool(unsupported, false)? {
                        return Err(args.error(format!("{unsupported}=True: not supported")));
                    }
                }
                Ok(Self::ConvertToTensor(take_dtype(args)?))
            }
            "ZerosLike" | "OnesLike" | "FullLike" => {
                let value = match class {
                    "ZerosLike" => 0.0,
                    "OnesLike" => 1.0,
                    _ => args.take_f64("fill_value", f64::NAN)?,
                };
                if value.is_nan() {
                    return Err(args.error("fill_value: a number (a tensor fill value is not supported)"));
                }
                Ok(Self::FullLike { value, dtype: take_dtype(args)? })
            }
            "Where" => Ok(Self::Where),
            "Clip" => Ok(Self::Clip { min: args.take_f64("x_min", f64::NEG_INFINITY)?, max: args.take_f64("x_max", f64::INFINITY)? }),
            "Matmul" => Ok(Self::Matmul),
            "Concatenate" => Ok(Self::Concatenate { axis: args.take_ints("axis")?.and_then(|a| a.first().copied()).unwrap_or(0) }),
            "Reshape" => Ok(Self::Reshape { shape: args.take_ints("newshape")?.ok_or_else(|| args.error("newshape is missing"))? }),
            "Transpose" => Ok(Self::Transpose { axes: args.take_ints("axes")? }),
            "Moveaxis" => {
                let source = args.take_ints("source")?.ok_or_else(|| args.error("source is missing"))?;
                let destination = args.take_ints("destination")?.ok_or_else(|| args.error("destination is missing"))?;
                if source.len() != destination.len() {
                    return Err(args.error(format!("source {source:?} and destination {destination:?} differ in length")));
                }
                Ok(Self::Moveaxis { source, destination })
            }
            "Einsum" => {
                let subscripts = args.take_str("subscripts", "")?;
                Einsum::parse(&subscripts).map(Self::Einsum).map_err(|why| args.error(format!("subscripts {subscripts:?}: {why}")))
            }
            "ExpandDims" => Ok(Self::ExpandDims { axes: args.take_ints("axis")?.ok_or_else(|| args.error("axis is missing"))? }),
            "Squeeze" => Ok(Self::Squeeze { axes: args.take_ints("axis")? }),
            "Pad" => {
                let mode = args.take_str("mode", "constant")?;
                if mode != "constant" {
                    return Err(args.error(format!("mode = {mode:?}: only \"constant\" is supported")));
                }
                let pad_width = args.take("pad_width");
                Ok(Self::Pad {
                    widths: pad_widths(&pad_width)
                        .ok_or_else(|| args.error(format!("pad_width = {pad_width}: not (before, after) amounts")))?,
                })
            }
            "Cumsum" => Ok(Self::Cumsum {
                axis: args.take_ints("axis")?.and_then(|a| a.first().copied()),
                dtype: take_dtype(args)?,
            }),
            "DotProductAttention" => Ok(Self::DotProductAttention { is_causal: attention::from_config(args)? }),
            "ExtractPatches" => {
                let size = two_sizes(args.take_ints("size")?, None)
                    .ok_or_else(|| args.error("size: one or two sizes (3-D patches are not supported)"))?;
                let strides = two_sizes(args.take_ints("strides")?, Some(size)).ok_or_else(|| args.error("strides: one or two sizes"))?;
                let dilation = match args.take_ints("dilation_rate")?.as_deref() {
                    None => 1,
                    Some([d]) if *d > 0 => *d as usize,
                    Some([a, b]) if a == b && *a > 0 => *a as usize,
                    Some(other) => return Err(args.error(format!("dilation_rate = {other:?}: one positive rate"))),
                };
                let same = args.take_choice("padding", "valid", &["valid", "same"])? == "same";
                if dilation > 1 && strides.iter().any(|&s| s > 1) {
                    return Err(args.error("strides > 1 with dilation_rate > 1: Keras refuses this too"));
                }
                Ok(Self::ExtractPatches { size, strides, dilation, same, channels_last: args.take_channels_last()? })
            }
            "Mean" => reduce(Reduce::Mean, args),
            "Sum" => reduce(Reduce::Sum, args),
            "Max" | "Amax" => reduce(Reduce::Max, args),
            "Min" | "Amin" => reduce(Reduce::Min, args),
            "Prod" => reduce(Reduce::Prod, args),
            "Any" => reduce(Reduce::Any, args),
            "All" => reduce(Reduce::All, args),
            other => Err(args.error(format!(
                "the operation {other} is not supported (supported: {SUPPORTED}). `cargo xtask convert FILE --layer NAME` still converts the file's attention layers one by one"
            ))),
        }
    }

    /// Runs the operation; outputs carry no mask.
    pub fn call(&self, call: &Call) -> Result<Vec<Value>> {
        let device = call.args.iter().flat_map(Input::tensors).next().map(|v| v.tensor.device());
        let operand = |index: usize| -> Result<(DynTensor, DType)> {
            match call.args.get(index) {
                Some(Input::Tensor(v)) => Ok((v.tensor.clone(), v.dtype)),
                Some(Input::Const(c)) => {
                    let device = device.clone().ok_or_else(|| call.error("an operation on constants only"))?;
                    let (value, dtype) = match c {
                        Json::Bool(b) => (*b as u8 as f32, DType::Bool),
                        Json::Number(n) if n.is_i64() || n.is_u64() => {
                            (n.as_f64().unwrap_or_default() as f32, DType::Int)
                        }
                        Json::Number(n) => (n.as_f64().unwrap_or_default() as f32, DType::Float),
                        other => return Err(call.error(format!("operand {other} is not a number"))),
                    };
                    Ok((DynTensor::scalar(value, &device), dtype))
                }
                _ => Err(call.error(format!("operand {index} is missing"))),
            }
        };
        let (y, dtype) = match self {
            Self::Binary(op) => {
                let ((a, da), (b, db)) = (operand(0)?, operand(1)?);
                let dtype = if op.is_predicate() {
                    DType::Bool
                } else if *op == Binary::Divide || da == DType::Float || db == DType::Float {
                    DType::Float
                } else {
                    da
                };
                (DynTensor::binary(*op, a, b)?, dtype)
            }
            Self::Unary(op) => {
                let (x, dtype) = operand(0)?;
                let dtype = if *op == Unary::LogicalNot { DType::Bool } else { dtype };
                (x.map(*op), dtype)
            }
            Self::Gelu { approximate } => {
                let activation = crate::activation::Activation::Gelu { approximate: *approximate };
                (activation.apply(operand(0)?.0), DType::Float)
            }
            Self::Silu => (crate::activation::Activation::Silu.apply(operand(0)?.0), DType::Float),
            Self::Softmax { axis: a, log } => {
                let x = operand(0)?.0;
                let rank = x.rank();
                let a = call.axis(*a, rank)?;
                (if *log { x.log_softmax(a) } else { x.softmax(a) }, DType::Float)
            }
            Self::Cast(to) => {
                let (x, from) = operand(0)?;
                (cast(x, from, *to), *to)
            }
            Self::ConvertToTensor(to) => {
                let (x, from) = operand(0)?;
                match to {
                    Some(to) => (cast(x, from, *to), *to),
                    None => (x, from),
                }
            }
            Self::FullLike { value, dtype } => {
                let (x, from) = operand(0)?;
                let y = DynTensor::full(&x.shape(), *value as f32, &x.device());
                (y, dtype.unwrap_or(from))
            }
            Self::Where => {
                let (c, _) = operand(0)?;
                let ((a, da), (b, _)) = (operand(1)?, operand(2)?);
                (DynTensor::select(c, a, b)?, da)
            }
            Self::Clip { min, max } => {
                let (x, dtype) = operand(0)?;
                (x.map(Unary::Clip(*min as f32, *max as f32)), dtype)
            }
            Self::Matmul => (DynTensor::matmul(operand(0)?.0, operand(1)?.0)?, DType::Float),
            Self::Concatenate { axis: a } => {
                let parts: Vec<&Value> = call.args.first().map(Input::tensors).unwrap_or_default();
                let dtype = parts.first().map_or(DType::Float, |v| v.dtype);
                let rank = parts.first().map_or(1, |v| v.shape().len());
                let a = call.axis(*a, rank)?;
                (DynTensor::concat(parts.into_iter().map(|v| v.tensor.clone()).collect(), a)?, dtype)
            }
            Self::ExtractPatches { size, strides, dilation, same, channels_last } => {
                let (x, dtype) = operand(0)?;
                (extract_patches(x, *size, *strides, *dilation, *same, *channels_last, call)?, dtype)
            }
            Self::Reshape { shape } => {
                let (x, dtype) = operand(0)?;
                let Some(dims) = resolve_shape(shape, x.shape().iter().product()) else {
                    return Err(call.error(format!("cannot reshape {:?} to {shape:?}", x.shape())));
                };
                (x.reshape(&dims)?, dtype)
            }
            Self::Transpose { axes } => {
                let (x, dtype) = operand(0)?;
                let rank = x.rank();
                let order: Vec<usize> = match axes {
                    None => (0..rank).rev().collect(),
                    Some(axes) => call.axes(axes, rank)?,
                };
                (x.permute(&order)?, dtype)
            }
            Self::Moveaxis { source, destination } => {
                let (x, dtype) = operand(0)?;
                let rank = x.rank();
                let order = moved_axes(&call.axes(source, rank)?, &call.axes(destination, rank)?, rank)
                    .ok_or_else(|| call.error(format!("moveaxis {source:?} -> {destination:?}: repeated axes")))?;
                (x.permute(&order)?, dtype)
            }
            Self::Einsum(einsum) => {
                let ((a, da), (b, db)) = (operand(0)?, operand(1)?);
                let dtype = if da == DType::Float || db == DType::Float { DType::Float } else { da };
                (einsum.run(a, b)?, dtype)
            }
            Self::ExpandDims { axes } => {
                let (mut x, dtype) = operand(0)?;
                let rank = x.rank() + axes.len();
                let mut resolved: Vec<usize> = call.axes(axes, rank)?;
                resolved.sort();
                for a in resolved {
                    x = x.expand_dims(a)?;
                }
                (x, dtype)
            }
            Self::Squeeze { axes } => {
                let (x, dtype) = operand(0)?;
                let shape = x.shape();
                let rank = shape.len();
                let drop: Vec<usize> = match axes {
                    None => (0..rank).filter(|&i| shape[i] == 1).collect(),
                    Some(axes) => call.axes(axes, rank)?,
                };
                if let Some(&bad) = drop.iter().find(|&&a| shape[a] != 1) {
                    return Err(call.error(format!("cannot squeeze axis {bad} of shape {shape:?}")));
                }
                let kept: Vec<usize> = (0..rank).filter(|i| !drop.contains(i)).map(|i| shape[i]).collect();
                (x.reshape(if kept.is_empty() { &[1] } else { &kept })?, dtype)
            }
            Self::Indexing(op) => return op.call(call),
            Self::DotProductAttention { is_causal } => return Ok(vec![attention::call(*is_causal, call)?]),
            Self::Pad { widths } => {
                let (x, dtype) = operand(0)?;
                let value = match call.arg(1, "constant_values") {
                    None | Some(Input::Const(Json::Null)) => 0.0,
                    Some(Input::Const(Json::Number(n))) => n.as_f64().unwrap_or_default() as f32,
                    Some(_) => return Err(call.error("constant_values: a number (a tensor is not supported)")),
                };
                let rank = x.rank();
                let widths = match widths.as_slice() {
                    [one] => vec![*one; rank],
                    all if all.len() == rank => all.to_vec(),
                    all => {
                        return Err(call.error(format!("pad_width {all:?} for a rank-{rank} input: one pair per axis")));
                    }
                };
                let mut y = x;
                for (axis, (before, after)) in widths.into_iter().enumerate() {
                    y = y.pad_axis(axis, before, after, value)?;
                }
                (y, dtype)
            }
            Self::Cumsum { axis, dtype } => {
                let (x, from) = operand(0)?;
                let to = dtype.unwrap_or(from);
                let x = if to == from { x } else { cast(x, from, to) };
                let (x, axis) = match axis {
                    Some(a) => {
                        let rank = x.rank();
                        (x, call.axis(*a, rank)?)
                    }
                    None => {
                        let count = x.shape().iter().product();
                        (x.reshape(&[count])?, 0)
                    }
                };
                (map_rank!(x, t => t.cumsum(axis)), if to == DType::Bool { DType::Int } else { to })
            }
            Self::Reduce { kind, axes, keepdims } => {
                let (x, dtype) = operand(0)?;
                let rank = x.rank();
                let axes: Vec<usize> = match axes {
                    None => (0..rank).collect(),
                    Some(axes) => call.axes(axes, rank)?,
                };
                let dtype = match kind {
                    Reduce::Any | Reduce::All => DType::Bool,
                    Reduce::Mean => DType::Float,
                    _ => dtype,
                };
                (x.reduce(*kind, &axes, *keepdims)?, dtype)
            }
        };
        Ok(vec![Value::new(y, dtype)])
    }

    /// The keyword arguments of a call the torch expression reads (rendered for [`Self::torch`]).
    fn keywords(&self) -> &'static [&'static str] {
        match self {
            Self::Pad { .. } => &["constant_values"],
            Self::DotProductAttention { .. } => attention::KEYWORDS,
            _ => &[],
        }
    }

    /// Whether the torch expression is a sequence of outputs (`unstack`, `split`).
    pub fn gives_a_sequence(&self) -> bool {
        matches!(self, Self::Indexing(op) if op.gives_a_sequence())
    }

    /// The torch expression of the operation on `args` (the node's recorded operands, as
    /// `rendered`) and the `keywords` it reads (`None` where absent); `Err` says why it cannot
    /// be written.
    fn torch(
        &self,
        args: &[Arg],
        rendered: &[String],
        keywords: &[(&str, String)],
    ) -> std::result::Result<String, String> {
        let operand = |k: usize| rendered.get(k).cloned().ok_or_else(|| format!("operand {k} is missing"));
        // A positional argument, else the keyword (Keras records these ops' options as keywords).
        let keyword = |k: usize, name: &str| -> String {
            rendered
                .get(k)
                .cloned()
                .or_else(|| keywords.iter().find(|(n, _)| *n == name).map(|(_, r)| r.clone()))
                .unwrap_or_else(|| "None".into())
        };
        // A number where torch wants a tensor (a constant tensor is a buffer already).
        let tensor = |k: usize| -> std::result::Result<String, String> {
            let r = operand(k)?;
            let number = matches!(args.get(k), Some(Arg::Const(c)) if constant_tensor(c).is_none());
            Ok(if number { format!("torch.tensor({r})") } else { r })
        };
        Ok(match self {
            Self::Binary(b) => {
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
            Self::Unary(u) => {
                let a = tensor(0)?;
                match u {
                    Unary::Negative => format!("-{a}"),
                    Unary::Abs => format!("torch.abs({a})"),
                    Unary::Square => format!("torch.square({a})"),
                    Unary::Sqrt => format!("torch.sqrt({a})"),
                    Unary::Rsqrt => format!("torch.rsqrt({a})"),
                    Unary::Reciprocal => format!("torch.reciprocal({a})"),
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
            Self::Gelu { approximate } => {
                format!("F.gelu({}, approximate={:?})", tensor(0)?, if *approximate { "tanh" } else { "none" })
            }
            Self::Silu => format!("F.silu({})", tensor(0)?),
            Self::Softmax { axis, log } => {
                format!("torch.{}({}, dim={axis})", if *log { "log_softmax" } else { "softmax" }, tensor(0)?)
            }
            Self::Cast(to) | Self::ConvertToTensor(Some(to)) => format!("{}.to({})", tensor(0)?, torch_dtype(*to)),
            Self::ConvertToTensor(None) => tensor(0)?,
            Self::FullLike { value, dtype } => {
                let like = if *value == 0.0 {
                    format!("torch.zeros_like({}", tensor(0)?)
                } else if *value == 1.0 {
                    format!("torch.ones_like({}", tensor(0)?)
                } else {
                    format!("torch.full_like({}, {}", tensor(0)?, py_float(*value))
                };
                match dtype {
                    Some(to) => format!("{like}, dtype={})", torch_dtype(*to)),
                    None => format!("{like})"),
                }
            }
            Self::Where => format!("torch.where({}.bool(), {}, {})", tensor(0)?, tensor(1)?, tensor(2)?),
            Self::Clip { min, max } => {
                format!("torch.clamp({}, min={}, max={})", tensor(0)?, py_float(*min), py_float(*max))
            }
            Self::Matmul => format!("torch.matmul({}, {})", tensor(0)?, tensor(1)?),
            Self::Concatenate { axis } => format!("torch.cat({}, dim={axis})", operand(0)?),
            Self::Reshape { shape } => format!("{}.reshape({shape:?})", tensor(0)?),
            Self::Indexing(op) => op.torch(&operand(0)?, args, rendered)?,
            Self::ExtractPatches { size, strides, dilation, same, channels_last } => PyCall::new("extract_patches")
                .arg(tensor(0)?)
                .kw("size", format!("{size:?}"))
                .kw("strides", format!("{strides:?}"))
                .kw("dilation_rate", dilation)
                .kw("padding", py_str(if *same { "same" } else { "valid" }))
                .kw_if(!*channels_last, "channels_last", "False")
                .to_string(),
            Self::Transpose { axes: None } => format!("{0}.permute(*reversed(range({0}.dim())))", tensor(0)?),
            Self::Transpose { axes: Some(axes) } => format!("{}.permute({axes:?})", tensor(0)?),
            Self::Moveaxis { source, destination } => {
                format!("torch.movedim({}, {}, {})", tensor(0)?, tuple(source), tuple(destination))
            }
            Self::Einsum(einsum) => {
                format!("torch.einsum({}, {}, {})", py_str(einsum.subscripts()), tensor(0)?, tensor(1)?)
            }
            // One new axis: the prelude's expand_dims is this unsqueeze.
            Self::ExpandDims { axes } => match axes.as_slice() {
                [axis] => format!("{}.unsqueeze({axis})", tensor(0)?),
                _ => format!("expand_dims({}, axis={axes:?})", tensor(0)?),
            },
            Self::Pad { widths } => {
                let x = tensor(0)?;
                let value = keyword(1, "constant_values");
                let value = if value == "None" { String::new() } else { format!(", value={value}") };
                match widths.as_slice() {
                    // One pair for every axis, whatever the rank.
                    [(before, after)] => format!("F.pad({x}, ({before}, {after}) * {x}.dim(){value})"),
                    all => {
                        // F.pad names the last axis first; leading axes left alone need no pair.
                        let first = all.iter().position(|&(b, a)| b > 0 || a > 0).unwrap_or(all.len());
                        let pairs: Vec<String> =
                            all[first..].iter().rev().flat_map(|(b, a)| [b.to_string(), a.to_string()]).collect();
                        if pairs.is_empty() { x } else { format!("F.pad({x}, ({}){value})", pairs.join(", ")) }
                    }
                }
            }
            Self::Cumsum { axis, dtype } => {
                let x = tensor(0)?;
                let (x, dim) = match axis {
                    Some(axis) => (x, *axis),
                    None => (format!("{x}.flatten()"), 0),
                };
                match dtype {
                    // torch sums booleans as int64, as Keras sums them as integers.
                    Some(DType::Bool) => format!("torch.cumsum({x}.bool(), dim={dim})"),
                    Some(to) => format!("torch.cumsum({x}, dim={dim}, dtype={})", torch_dtype(*to)),
                    None => format!("torch.cumsum({x}, dim={dim})"),
                }
            }
            Self::DotProductAttention { is_causal } => {
                let [query, key, value] = [0, 1, 2].map(operand);
                attention::torch(
                    *is_causal,
                    [query?, key?, value?],
                    [3, 4, 5].map(|k| keyword(k, attention::KEYWORDS[k - 3])),
                )
            }
            Self::Squeeze { axes: None } => format!("{}.squeeze()", tensor(0)?),
            Self::Squeeze { axes: Some(axes) } => format!("{}.squeeze({})", tensor(0)?, tuple(axes)),
            Self::Reduce { kind, axes, keepdims } => reduction(*kind, &tensor(0)?, axes.as_deref(), *keepdims),
        })
    }
}

/// `pad`'s `pad_width` as Keras saves it (`[[before, after], ...]`, a pair of one amount, or
/// one amount): the `(before, after)` pairs; `None` for anything else.
fn pad_widths(value: &Json) -> Option<Vec<(usize, usize)>> {
    let amount = |v: &Json| v.as_u64().map(|n| n as usize);
    let pair = |v: &Json| match v {
        Json::Array(items) if items.len() == 2 => Some((amount(&items[0])?, amount(&items[1])?)),
        Json::Array(items) if items.len() == 1 => amount(&items[0]).map(|n| (n, n)),
        v => amount(v).map(|n| (n, n)),
    };
    match value {
        Json::Array(items) if items.iter().all(Json::is_number) => pair(value).map(|p| vec![p]),
        Json::Array(items) if !items.is_empty() => items.iter().map(pair).collect(),
        v => pair(v).map(|p| vec![p]),
    }
}

/// The order of axes `numpy.moveaxis` gives: `source[k]` at `destination[k]`, the other axes in
/// their order; `None` where an axis repeats.
fn moved_axes(source: &[usize], destination: &[usize], rank: usize) -> Option<Vec<usize>> {
    let mut order: Vec<Option<usize>> = vec![None; rank];
    for (&from, &to) in source.iter().zip(destination) {
        if order[to].replace(from).is_some() {
            return None;
        }
    }
    let mut rest = (0..rank).filter(|a| !source.contains(a));
    let order: Vec<usize> = order.into_iter().map(|slot| slot.or_else(|| rest.next())).collect::<Option<_>>()?;
    let mut seen = order.clone();
    seen.sort_unstable();
    seen.dedup();
    (seen.len() == rank).then_some(order)
}

/// The patches of `x: [B, H, W, C]` (or `[B, C, H, W]`): for each window position, the window's
/// values in `(row, column, channel)` order, `[B, H', W', ph pw C]`.
fn extract_patches(
    x: DynTensor,
    size: [usize; 2],
    strides: [usize; 2],
    dilation: usize,
    same: bool,
    channels_last: bool,
    call: &Call,
) -> Result<DynTensor> {
    if x.rank() != 4 {
        return Err(call.error(format!("extract_patches of shape {:?}: a batch of images", x.shape())));
    }
    let mut x = if channels_last { x } else { x.permute(&[0, 2, 3, 1])? };
    let mut counts = [0; 2];
    for axis in 0..2 {
        let length = x.shape()[1 + axis];
        let reach = (size[axis] - 1) * dilation + 1;
        if same {
            let (out, before, after) = same_padding(length, reach, strides[axis]);
            x = x.pad_axis(1 + axis, before, after, 0.0)?;
            counts[axis] = out;
        } else if length >= reach {
            counts[axis] = (length - reach) / strides[axis] + 1;
        } else {
            return Err(
                call.error(format!("{length} pixels along axis {} are fewer than a patch reaches ({reach})", 1 + axis))
            );
        }
    }
    let mut parts = Vec::with_capacity(size[0] * size[1]);
    for i in 0..size[0] {
        for j in 0..size[1] {
            let (top, left) = (i * dilation, j * dilation);
            let rows = x.clone().slice_axis(1, top, top + (counts[0] - 1) * strides[0] + 1, strides[0]);
            parts.push(rows.slice_axis(2, left, left + (counts[1] - 1) * strides[1] + 1, strides[1])); // [B, H', W', C]
        }
    }
    let patches = DynTensor::concat(parts, 3)?; // [B, H', W', ph pw C]
    if channels_last { Ok(patches) } else { patches.permute(&[0, 3, 1, 2]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moveaxis_orders_axes_as_numpy_does() {
        // numpy.moveaxis(x, [3, 1], [-1, 1]) on rank 4 (KerasHub's rotary embedding): unchanged.
        assert_eq!(moved_axes(&[3, 1], &[3, 1], 4), Some(vec![0, 1, 2, 3]));
        // numpy.moveaxis(np.zeros((2, 3, 4, 5)), 0, -1).shape == (3, 4, 5, 2)
        assert_eq!(moved_axes(&[0], &[3], 4), Some(vec![1, 2, 3, 0]));
        // numpy.moveaxis(np.zeros((2, 3, 4, 5)), [0, 1], [-1, -2]).shape == (4, 5, 3, 2)
        assert_eq!(moved_axes(&[0, 1], &[3, 2], 4), Some(vec![2, 3, 1, 0]));
        assert_eq!(moved_axes(&[0, 1], &[2, 2], 4), None);
    }

    #[test]
    fn pad_widths_read_every_form_keras_saves() {
        let read = |text: &str| pad_widths(&serde_json::from_str(text).unwrap());
        assert_eq!(read("[[0, 0], [1, 2]]"), Some(vec![(0, 0), (1, 2)]));
        assert_eq!(read("[[3]]"), Some(vec![(3, 3)])); // pad_width=(3,): one amount for every axis
        assert_eq!(read("[1, 2]"), Some(vec![(1, 2)]));
        assert_eq!(read("2"), Some(vec![(2, 2)]));
        assert_eq!(read("[[1, -1]]"), None);
        assert_eq!(read("[]"), None);
    }

    #[test]
    fn pad_take_and_cumsum_are_torch_s_own_calls() {
        let x = crate::graph::Port { node: 0, index: 0 };
        let ids = crate::graph::Port { node: 1, index: 0 };
        let on = |op: Operation, args: &[Arg], keywords: &[(&str, String)]| {
            let rendered: Vec<String> = args.iter().map(crate::torch::render).collect();
            op.torch(args, &rendered, keywords).unwrap()
        };
        let none = [("constant_values", "None".to_string())];
        let pad = |widths: Vec<(usize, usize)>| Operation::Pad { widths };
        // Whisper's Padder: the leading axes left alone need no pair.
        assert_eq!(on(pad(vec![(0, 0), (1, 1), (0, 0)]), &[Arg::Tensor(x)], &none), "F.pad(x0, (0, 0, 1, 1))");
        assert_eq!(
            on(pad(vec![(2, 3)]), &[Arg::Tensor(x)], &[("constant_values", "1.5".into())]),
            "F.pad(x0, (2, 3) * x0.dim(), value=1.5)"
        );
        assert_eq!(on(pad(vec![(0, 0), (0, 0)]), &[Arg::Tensor(x)], &none), "x0");
        let cumsum = |axis, dtype| Operation::Cumsum { axis, dtype };
        assert_eq!(on(cumsum(Some(-1), None), &[Arg::Tensor(x)], &[]), "torch.cumsum(x0, dim=-1)");
        assert_eq!(on(cumsum(None, None), &[Arg::Tensor(x)], &[]), "torch.cumsum(x0.flatten(), dim=0)");
        assert_eq!(
            on(cumsum(Some(1), Some(DType::Int)), &[Arg::Tensor(x)], &[]),
            "torch.cumsum(x0, dim=1, dtype=torch.int64)"
        );
        let take = |axis| Operation::Indexing(Indexing::Take { axis });
        // T5's buckets by a tensor: numpy's take is indexing at the axis by that tensor.
        assert_eq!(on(take(Some(0)), &[Arg::Tensor(x), Arg::Tensor(ids)], &[]), "x0[x1.long()]");
        assert_eq!(on(take(Some(2)), &[Arg::Tensor(x), Arg::Tensor(ids)], &[]), "x0[:, :, x1.long()]");
        assert_eq!(on(take(Some(-2)), &[Arg::Tensor(x), Arg::Tensor(ids)], &[]), "x0[..., x1.long(), :]");
        assert_eq!(on(take(None), &[Arg::Tensor(x), Arg::Tensor(ids)], &[]), "torch.take(x0, x1.long())");
        let scalar = Arg::Const(serde_json::json!(3));
        assert_eq!(on(take(Some(1)), &[Arg::Tensor(x), scalar], &[]), "x0.select(1, 3)");
        let list = Arg::List(vec![Arg::Const(serde_json::json!(0)), Arg::Const(serde_json::json!(-1))]);
        assert_eq!(on(take(Some(1)), &[Arg::Tensor(x), list], &[]), "x0[:, torch.tensor([0, -1])]");
    }

    #[test]
    fn reductions_are_torch_s_own_where_one_call_computes_them() {
        assert_eq!(reduction(Reduce::Sum, "x", Some(&[1]), false), "torch.sum(x, dim=1)");
        assert_eq!(reduction(Reduce::Mean, "x", Some(&[1, 2]), true), "torch.mean(x, dim=(1, 2), keepdim=True)");
        assert_eq!(reduction(Reduce::Max, "x", Some(&[-1]), false), "torch.amax(x, dim=-1)");
        assert_eq!(reduction(Reduce::All, "x", None, false), "torch.all(x)");
        // Where torch has no single call: a product over two axes, every axis kept.
        assert_eq!(reduction(Reduce::Prod, "x", Some(&[0, 1]), false), r#"reduce(x, kind="prod", axis=[0, 1])"#);
        assert_eq!(reduction(Reduce::Sum, "x", None, true), r#"reduce(x, kind="sum", keepdims=True)"#);
        assert_eq!(reduction(Reduce::Min, "x", None, false), r#"reduce(x, kind="min")"#);
    }
}
