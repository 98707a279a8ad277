//! Operation nodes: tensor operators and `keras.ops` calls recorded in a functional graph
//! (`x + y`, `keras.ops.mean(x, axis=1)`), with their numpy semantics. Their arguments are
//! in the call (`args`), their options in the node's config (`axis`, `keepdims`, `newshape`...).
//! Operations drop Keras masks, as TensorFlow's eager ops do.

use serde_json::Value as Json;

use super::config::LayerArgs;
use super::layers::{Call, Input};
use super::value::{Binary, DType, DynTensor, Reduce, Unary, Value, resolve_shape};
use model::error::Result;

/// Every operation class this converter runs, for the error on any other.
const SUPPORTED: &str = "Add, Subtract, Multiply, Divide, TrueDivide, Power, Maximum, Minimum, Equal, NotEqual, Greater, GreaterEqual, Less, LessEqual, LogicalAnd, LogicalOr, LogicalXor, LogicalNot, Negative, Absolute, Abs, Square, Sqrt, Exp, Log, Tanh, Sigmoid, Relu, Gelu, Silu, Softmax, LogSoftmax, Sign, Floor, Round, Cast, Where, Clip, Matmul, Concatenate, Reshape, Transpose, ExpandDims, Squeeze, Mean, Sum, Max, Min, Prod, Any, All";

#[derive(Debug, Clone)]
pub enum Operation {
    Binary(Binary),
    Unary(Unary),
    Gelu { approximate: bool },
    Silu,
    Softmax { axis: i64, log: bool },
    Cast(DType),
    Where,
    Clip { min: f64, max: f64 },
    Matmul,
    Concatenate { axis: i64 },
    Reshape { shape: Vec<i64> },
    Transpose { axes: Option<Vec<i64>> },
    ExpandDims { axes: Vec<i64> },
    Squeeze { axes: Option<Vec<i64>> },
    Reduce { kind: Reduce, axes: Option<Vec<i64>>, keepdims: bool },
}

impl Operation {
    pub fn from_config(class: &str, args: &mut LayerArgs) -> Result<Self> {
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
            "Where" => Ok(Self::Where),
            "Clip" => Ok(Self::Clip { min: args.take_f64("x_min", f64::NEG_INFINITY)?, max: args.take_f64("x_max", f64::INFINITY)? }),
            "Matmul" => Ok(Self::Matmul),
            "Concatenate" => Ok(Self::Concatenate { axis: args.take_ints("axis")?.and_then(|a| a.first().copied()).unwrap_or(0) }),
            "Reshape" => Ok(Self::Reshape { shape: args.take_ints("newshape")?.ok_or_else(|| args.error("newshape is missing"))? }),
            "Transpose" => Ok(Self::Transpose { axes: args.take_ints("axes")? }),
            "ExpandDims" => Ok(Self::ExpandDims { axes: args.take_ints("axis")?.ok_or_else(|| args.error("axis is missing"))? }),
            "Squeeze" => Ok(Self::Squeeze { axes: args.take_ints("axis")? }),
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
                let y = match (from, to) {
                    (_, DType::Bool) => x.map(Unary::ToBool),
                    (DType::Float, DType::Int) => x.map(Unary::Truncate),
                    _ => x,
                };
                (y, *to)
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
}
