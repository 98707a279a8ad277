//! A Keras tensor of any rank, as the graph passes it from node to node.
//!
//! Burn's tensors carry their rank in the type (`Tensor<D>`), a Keras graph decides ranks at run
//! time. [`DynTensor`] holds a float tensor of rank 1 to 6 and dispatches each operation to the
//! rank it holds. Every Keras dtype is stored as float32: integers (token ids, counts) are exact
//! below 2^24 and booleans are 0 and 1, so one storage type serves the whole graph and autodiff
//! sees every float path. [`Value`] adds the dtype and the Keras mask that travels with a tensor
//! (`_keras_mask`: a boolean tensor, usually the tensor's shape without its last axis).

use burn::tensor::{Device, Shape, Slice, Tensor, TensorData, activation};

use model::error::{ModelError, Result};
use model::nd_mask::broadcast_shape;
use model::weights::HostTensor;

/// The largest rank a Keras tensor may have here: `[B, a_1, ..., a_4, D]`.
pub const MAX_RANK: usize = 6;

/// A float tensor of rank 1 to [`MAX_RANK`].
#[derive(Debug, Clone)]
pub enum DynTensor {
    R1(Tensor<1>),
    R2(Tensor<2>),
    R3(Tensor<3>),
    R4(Tensor<4>),
    R5(Tensor<5>),
    R6(Tensor<6>),
}

/// `$body` on the tensor of whichever rank `$x` holds, wrapped back at the same rank.
macro_rules! map_rank {
    ($x:expr, $t:ident => $body:expr) => {
        match $x {
            $crate::value::DynTensor::R1($t) => $crate::value::DynTensor::R1($body),
            $crate::value::DynTensor::R2($t) => $crate::value::DynTensor::R2($body),
            $crate::value::DynTensor::R3($t) => $crate::value::DynTensor::R3($body),
            $crate::value::DynTensor::R4($t) => $crate::value::DynTensor::R4($body),
            $crate::value::DynTensor::R5($t) => $crate::value::DynTensor::R5($body),
            $crate::value::DynTensor::R6($t) => $crate::value::DynTensor::R6($body),
        }
    };
}

/// `$body` on the tensor of whichever rank `$x` holds; `$body` returns anything.
macro_rules! with_rank {
    ($x:expr, $t:ident => $body:expr) => {
        match $x {
            $crate::value::DynTensor::R1($t) => $body,
            $crate::value::DynTensor::R2($t) => $body,
            $crate::value::DynTensor::R3($t) => $body,
            $crate::value::DynTensor::R4($t) => $body,
            $crate::value::DynTensor::R5($t) => $body,
            $crate::value::DynTensor::R6($t) => $body,
        }
    };
}

/// `$body` on two tensors of the same rank (the caller aligned them), wrapped at that rank.
macro_rules! zip_rank {
    ($a:expr, $b:expr, |$x:ident, $y:ident| $body:expr) => {
        match ($a, $b) {
            ($crate::value::DynTensor::R1($x), $crate::value::DynTensor::R1($y)) => $crate::value::DynTensor::R1($body),
            ($crate::value::DynTensor::R2($x), $crate::value::DynTensor::R2($y)) => $crate::value::DynTensor::R2($body),
            ($crate::value::DynTensor::R3($x), $crate::value::DynTensor::R3($y)) => $crate::value::DynTensor::R3($body),
            ($crate::value::DynTensor::R4($x), $crate::value::DynTensor::R4($y)) => $crate::value::DynTensor::R4($body),
            ($crate::value::DynTensor::R5($x), $crate::value::DynTensor::R5($y)) => $crate::value::DynTensor::R5($body),
            ($crate::value::DynTensor::R6($x), $crate::value::DynTensor::R6($y)) => $crate::value::DynTensor::R6($body),
            _ => unreachable!("operands are aligned to one rank first"),
        }
    };
}

pub(crate) use {map_rank, with_rank};

/// An elementwise operation of two tensors, numpy broadcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Binary {
    Add,
    Subtract,
    Multiply,
    Divide,
    Power,
    Maximum,
    Minimum,
    Equal,
    NotEqual,
    Greater,
    GreaterEqual,
    Less,
    LessEqual,
    LogicalAnd,
    LogicalOr,
    LogicalXor,
}

impl Binary {
    /// Whether the result is boolean (0 or 1).
    pub fn is_predicate(self) -> bool {
        !matches!(
            self,
            Binary::Add
                | Binary::Subtract
                | Binary::Multiply
                | Binary::Divide
                | Binary::Power
                | Binary::Maximum
                | Binary::Minimum
        )
    }

    fn apply<const D: usize>(self, a: Tensor<D>, b: Tensor<D>) -> Tensor<D> {
        let truth = |t: Tensor<D>| t.not_equal_elem(0.0);
        match self {
            Binary::Add => a + b,
            Binary::Subtract => a - b,
            Binary::Multiply => a * b,
            Binary::Divide => a / b,
            Binary::Power => a.powf(b),
            Binary::Maximum => a.max_pair(b),
            Binary::Minimum => a.min_pair(b),
            Binary::Equal => a.equal(b).float(),
            Binary::NotEqual => a.not_equal(b).float(),
            Binary::Greater => a.greater(b).float(),
            Binary::GreaterEqual => a.greater_equal(b).float(),
            Binary::Less => a.lower(b).float(),
            Binary::LessEqual => a.lower_equal(b).float(),
            Binary::LogicalAnd => truth(a).bool_and(truth(b)).float(),
            Binary::LogicalOr => truth(a).bool_or(truth(b)).float(),
            Binary::LogicalXor => truth(a).not_equal(truth(b)).float(),
        }
    }
}

/// A reduction over axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reduce {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
    Any,
    All,
}

impl DynTensor {
    /// Wraps a tensor of a rank known at compile time.
    pub fn from<const D: usize>(tensor: Tensor<D>) -> Self {
        let dims = tensor.dims().to_vec();
        Self::reshaped(tensor, &dims)
    }

    /// `tensor` reshaped to `shape`, whose length picks the rank.
    fn reshaped<const D: usize>(tensor: Tensor<D>, shape: &[usize]) -> Self {
        let shape = Shape::from(shape.to_vec());
        match shape.num_dims() {
            1 => Self::R1(tensor.reshape(shape)),
            2 => Self::R2(tensor.reshape(shape)),
            3 => Self::R3(tensor.reshape(shape)),
            4 => Self::R4(tensor.reshape(shape)),
            5 => Self::R5(tensor.reshape(shape)),
            6 => Self::R6(tensor.reshape(shape)),
            rank => unreachable!("rank {rank} is checked by the callers"),
        }
    }

    /// A host tensor on `device`. A scalar becomes shape `[1]`.
    pub fn from_host(host: &HostTensor, device: &Device) -> Result<Self> {
        let shape = if host.shape.is_empty() { vec![1] } else { host.shape.clone() };
        check_rank(&shape)?;
        let flat = Tensor::<1>::from_data(TensorData::new(host.data.clone(), [host.data.len()]), device);
        Ok(Self::reshaped(flat, &shape))
    }

    /// `value` broadcast later: a `[1]` tensor (a scalar operand).
    pub fn scalar(value: f32, device: &Device) -> Self {
        Self::R1(Tensor::from_data(TensorData::new(vec![value], [1]), device))
    }

    /// The values on the host, row-major.
    pub fn to_host(&self) -> HostTensor {
        with_rank!(self.clone(), t => HostTensor::from_tensor(t))
    }

    pub fn shape(&self) -> Vec<usize> {
        with_rank!(self, t => t.dims().to_vec())
    }

    pub fn rank(&self) -> usize {
        with_rank!(self, t => t.dims().len())
    }

    pub fn device(&self) -> Device {
        with_rank!(self, t => t.device())
    }

    /// The tensor at rank `D`, or an error naming the rank found.
    pub fn rank_n<const D: usize>(self, what: &str) -> Result<Tensor<D>> {
        let shape = self.shape();
        if shape.len() != D {
            return Err(ModelError::InputShape {
                input: "keras tensor",
                expected: format!("rank {D} for {what}"),
                found: shape,
            });
        }
        Ok(with_rank!(self, t => t.reshape(Shape::from(shape.clone()))))
    }

    /// The same values in `shape` (same element count).
    pub fn reshape(self, shape: &[usize]) -> Result<Self> {
        check_rank(shape)?;
        let from = self.shape();
        if from.iter().product::<usize>() != shape.iter().product::<usize>() {
            return Err(ModelError::InputShape {
                input: "reshape",
                expected: format!("{} elements for shape {shape:?}", shape.iter().product::<usize>()),
                found: from,
            });
        }
        Ok(with_rank!(self, t => Self::reshaped(t, shape)))
    }

    /// `1`s prepended up to `rank` (numpy's alignment from the right).
    pub fn lift_to(self, rank: usize) -> Result<Self> {
        let shape = self.shape();
        if shape.len() >= rank {
            return Ok(self);
        }
        let lifted: Vec<usize> = std::iter::repeat_n(1, rank - shape.len()).chain(shape).collect();
        self.reshape(&lifted)
    }

    /// A size-1 axis inserted at `axis` (already in `0..=rank`).
    pub fn expand_dims(self, axis: usize) -> Result<Self> {
        let mut shape = self.shape();
        shape.insert(axis, 1);
        self.reshape(&shape)
    }

    /// `a op b` with numpy broadcasting.
    pub fn binary(op: Binary, a: Self, b: Self) -> Result<Self> {
        let (sa, sb) = (a.shape(), b.shape());
        if broadcast_shape(&sa, &sb).is_none() {
            return Err(ModelError::InputShape {
                input: "elementwise operation",
                expected: format!("shapes that broadcast against {sb:?}"),
                found: sa,
            });
        }
        let rank = sa.len().max(sb.len());
        let (a, b) = (a.lift_to(rank)?, b.lift_to(rank)?);
        Ok(zip_rank!(a, b, |x, y| op.apply(x, y)))
    }

    /// Where `condition` is non-zero `self`, else `other`; all three broadcast.
    pub fn select(condition: Self, on_true: Self, on_false: Self) -> Result<Self> {
        // c*t + (1-c)*f would turn an infinite branch into NaN; choose per element instead.
        let keep = Self::binary(Binary::NotEqual, condition, Self::scalar(0.0, &on_true.device()))?;
        let shape = broadcast_shape(&keep.shape(), &on_true.shape())
            .and_then(|s| broadcast_shape(&s, &on_false.shape()))
            .ok_or_else(|| ModelError::InputShape {
                input: "where",
                expected: format!("branches that broadcast against {:?} and each other", keep.shape()),
                found: on_true.shape(),
            })?;
        let [keep, on_true, on_false] = [keep, on_true, on_false].map(|t| t.broadcast_to(&shape));
        let (keep, on_true, on_false) = (keep?, on_true?, on_false?);
        Ok(match (keep, on_true, on_false) {
            (Self::R1(c), Self::R1(t), Self::R1(f)) => Self::R1(f.mask_where(c.bool(), t)),
            (Self::R2(c), Self::R2(t), Self::R2(f)) => Self::R2(f.mask_where(c.bool(), t)),
            (Self::R3(c), Self::R3(t), Self::R3(f)) => Self::R3(f.mask_where(c.bool(), t)),
            (Self::R4(c), Self::R4(t), Self::R4(f)) => Self::R4(f.mask_where(c.bool(), t)),
            (Self::R5(c), Self::R5(t), Self::R5(f)) => Self::R5(f.mask_where(c.bool(), t)),
            (Self::R6(c), Self::R6(t), Self::R6(f)) => Self::R6(f.mask_where(c.bool(), t)),
            _ => unreachable!("broadcast to one shape"),
        })
    }

    /// The tensor repeated along its size-1 axes up to `shape` (same rank after lifting).
    pub fn broadcast_to(self, shape: &[usize]) -> Result<Self> {
        let lifted = self.lift_to(shape.len())?;
        let from = lifted.shape();
        if from.len() != shape.len() || from.iter().zip(shape).any(|(f, s)| f != s && *f != 1) {
            return Err(ModelError::InputShape {
                input: "broadcast",
                expected: format!("a shape that broadcasts to {shape:?}"),
                found: from,
            });
        }
        Ok(map_rank!(lifted, t => t.expand(Shape::from(shape.to_vec()))))
    }

    /// `f(x)` elementwise.
    pub fn map(self, f: Unary) -> Self {
        map_rank!(self, t => f.apply(t))
    }

    /// A reduction over `axes` (each in `0..rank`, distinct), the axes kept as size 1 or dropped.
    pub fn reduce(self, kind: Reduce, axes: &[usize], keepdims: bool) -> Result<Self> {
        let mut shape = self.shape();
        let reduced = map_rank!(self, t => {
            let mut t = t;
            for &axis in axes {
                t = match kind {
                    Reduce::Sum => t.sum_dim(axis),
                    Reduce::Mean => t.mean_dim(axis),
                    Reduce::Max => t.max_dim(axis),
                    Reduce::Min => t.min_dim(axis),
                    Reduce::Prod => t.prod_dim(axis),
                    Reduce::Any => t.not_equal_elem(0.0).any_dim(axis).float(),
                    Reduce::All => t.not_equal_elem(0.0).all_dim(axis).float(),
                };
            }
            t
        });
        for &axis in axes {
            shape[axis] = 1;
        }
        if keepdims {
            return Ok(reduced);
        }
        let kept: Vec<usize> = shape.iter().enumerate().filter(|(i, _)| !axes.contains(i)).map(|(_, d)| *d).collect();
        if kept.is_empty() { reduced.reshape(&[1]) } else { reduced.reshape(&kept) }
    }

    /// The axes reordered: output axis `i` is input axis `order[i]`.
    pub fn permute(self, order: &[usize]) -> Result<Self> {
        let rank = self.rank();
        let mut seen = vec![false; rank];
        if order.len() != rank || order.iter().any(|&a| a >= rank || std::mem::replace(&mut seen[a], true)) {
            return Err(ModelError::InputShape {
                input: "transpose",
                expected: format!("a permutation of 0..{rank}, got {order:?}"),
                found: self.shape(),
            });
        }
        Ok(match self {
            Self::R1(t) => Self::R1(t),
            Self::R2(t) => Self::R2(t.permute([order[0], order[1]])),
            Self::R3(t) => Self::R3(t.permute([order[0], order[1], order[2]])),
            Self::R4(t) => Self::R4(t.permute([order[0], order[1], order[2], order[3]])),
            Self::R5(t) => Self::R5(t.permute([order[0], order[1], order[2], order[3], order[4]])),
            Self::R6(t) => Self::R6(t.permute([order[0], order[1], order[2], order[3], order[4], order[5]])),
        })
    }

    /// Tensors of one rank joined along `axis`.
    pub fn concat(parts: Vec<Self>, axis: usize) -> Result<Self> {
        let Some(first) = parts.first() else {
            return Err(ModelError::InputShape {
                input: "concatenate",
                expected: "one tensor or more".into(),
                found: vec![],
            });
        };
        let (rank, shape) = (first.rank(), first.shape());
        for part in &parts {
            let other = part.shape();
            let agrees = other.len() == rank && (0..rank).all(|i| i == axis || other[i] == shape[i]);
            if !agrees {
                return Err(ModelError::InputShape {
                    input: "concatenate",
                    expected: format!("the shape {shape:?} except along axis {axis}"),
                    found: other,
                });
            }
        }
        macro_rules! cat {
            ($variant:ident) => {
                Self::$variant(Tensor::cat(
                    parts
                        .into_iter()
                        .map(|p| match p {
                            Self::$variant(t) => t,
                            _ => unreachable!("ranks checked above"),
                        })
                        .collect(),
                    axis,
                ))
            };
        }
        Ok(match rank {
            1 => cat!(R1),
            2 => cat!(R2),
            3 => cat!(R3),
            4 => cat!(R4),
            5 => cat!(R5),
            _ => cat!(R6),
        })
    }

    /// numpy's `matmul`: the last two axes multiply, the others broadcast; a rank-1 operand is a
    /// row (left) or a column (right) that the result drops.
    pub fn matmul(a: Self, b: Self) -> Result<Self> {
        let (a_vector, b_vector) = (a.rank() == 1, b.rank() == 1);
        let a = if a_vector { a.expand_dims(0)? } else { a };
        let b = if b_vector { b.expand_dims(1)? } else { b };
        let rank = a.rank().max(b.rank());
        let (a, b) = (a.lift_to(rank)?, b.lift_to(rank)?);
        let (sa, sb) = (a.shape(), b.shape());
        let batch_ok = sa[..rank - 2].iter().zip(&sb[..rank - 2]).all(|(x, y)| x == y || *x == 1 || *y == 1);
        if sa[rank - 1] != sb[rank - 2] || !batch_ok {
            return Err(ModelError::InputShape {
                input: "matmul",
                expected: format!("an operand that multiplies {sb:?}"),
                found: sa,
            });
        }
        let product = zip_rank!(a, b, |x, y| x.matmul(y));
        let mut shape = product.shape();
        if b_vector {
            shape.pop();
        }
        if a_vector {
            shape.remove(shape.len() - if b_vector { 1 } else { 2 });
        }
        if shape.is_empty() {
            shape.push(1);
        }
        product.reshape(&shape)
    }

    /// `start..end` with `step` along `axis`.
    pub fn slice_axis(self, axis: usize, start: usize, end: usize, step: usize) -> Self {
        let rank = self.rank();
        let slices: Vec<Slice> =
            (0..rank)
                .map(|i| {
                    if i == axis {
                        Slice::new(start as isize, Some(end as isize), step as isize)
                    } else {
                        Slice::full()
                    }
                })
                .collect();
        map_rank!(self, t => t.slice(&slices))
    }

    /// Every entry along `axis` repeated `times` times in place (`numpy.repeat`): `[a, b]` to
    /// `[a, a, b, b]`.
    pub fn repeat_axis(self, axis: usize, times: usize) -> Result<Self> {
        let mut shape = self.shape();
        let mut spread = shape.clone();
        spread.insert(axis + 1, times);
        shape[axis] *= times;
        self.expand_dims(axis + 1)?.broadcast_to(&spread)?.reshape(&shape)
    }

    /// The entries `indices` along `axis`, in that order (`numpy.take`).
    pub fn take_axis(self, axis: usize, indices: &[usize]) -> Result<Self> {
        let device = self.device();
        let data: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        let indices = Tensor::<1, burn::tensor::Int>::from_data(TensorData::new(data, [indices.len()]), &device);
        Ok(map_rank!(self, t => t.select(axis, indices.clone())))
    }

    /// Zeros (or `value`) added before and after `axis`.
    pub fn pad_axis(self, axis: usize, before: usize, after: usize, value: f32) -> Result<Self> {
        if before == 0 && after == 0 {
            return Ok(self);
        }
        let device = self.device();
        let mut shape = self.shape();
        let mut parts = Vec::new();
        for count in [before, after] {
            shape[axis] = count;
            parts.push((count > 0).then(|| Self::full(&shape, value, &device)));
        }
        let [head, tail] = [parts.remove(0), parts.remove(0)];
        let all: Vec<Self> = head.into_iter().chain(std::iter::once(self)).chain(tail).collect();
        Self::concat(all, axis)
    }

    /// A tensor of `shape` filled with `value`.
    pub fn full(shape: &[usize], value: f32, device: &Device) -> Self {
        let flat = Tensor::<1>::full([shape.iter().product::<usize>()], value, device);
        Self::reshaped(flat, shape)
    }

    /// Softmax over `axis`.
    pub fn softmax(self, axis: usize) -> Self {
        map_rank!(self, t => activation::softmax(t, axis))
    }

    /// Log-softmax over `axis`.
    pub fn log_softmax(self, axis: usize) -> Self {
        map_rank!(self, t => activation::log_softmax(t, axis))
    }

    /// Rows of `table` (`[V, D]`) picked by integer `ids` of any rank: `[..., D]`.
    pub fn gather_rows(table: Tensor<2>, ids: Self) -> Result<Self> {
        let shape = ids.shape();
        let count = shape.iter().product::<usize>();
        let flat = ids.reshape(&[count])?.rank_n::<1>("ids")?.int();
        let width = table.dims()[1];
        let rows = table.select(0, flat);
        Self::from(rows).reshape(&[shape, vec![width]].concat())
    }
}

/// A target shape with at most one `-1` (the size the other entries leave) for `total` elements,
/// or `None` when it cannot hold them.
pub fn resolve_shape(target: &[i64], total: usize) -> Option<Vec<usize>> {
    let known: usize = target.iter().filter(|&&d| d >= 0).map(|&d| d as usize).product();
    let free = target.iter().filter(|&&d| d < 0).count();
    if free > 1 || known == 0 || (free == 0 && known != total) || !total.is_multiple_of(known) {
        return None;
    }
    Some(target.iter().map(|&d| if d < 0 { total / known } else { d as usize }).collect())
}

fn check_rank(shape: &[usize]) -> Result<()> {
    if shape.is_empty() || shape.len() > MAX_RANK {
        return Err(ModelError::InputShape {
            input: "keras tensor",
            expected: format!("rank 1 to {MAX_RANK}"),
            found: shape.to_vec(),
        });
    }
    Ok(())
}

/// An elementwise function of one tensor.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Unary {
    Negative,
    Abs,
    Square,
    Sqrt,
    /// `1 / sqrt(x)`
    Rsqrt,
    /// `1 / x`
    Reciprocal,
    Exp,
    Log,
    Tanh,
    Sigmoid,
    Relu,
    Sign,
    Floor,
    Round,
    LogicalNot,
    /// `x * a`
    Scale(f32),
    /// `x + a`
    Shift(f32),
    /// `x ** a`
    PowScalar(f32),
    /// `min(max(x, lo), hi)`
    Clip(f32, f32),
    /// Casting to bool: non-zero is 1.
    ToBool,
    /// Casting a float to an integer type: truncation toward zero.
    Truncate,
}

impl Unary {
    fn apply<const D: usize>(self, t: Tensor<D>) -> Tensor<D> {
        match self {
            Unary::Negative => t.neg(),
            Unary::Abs => t.abs(),
            Unary::Square => t.clone() * t,
            Unary::Sqrt => t.sqrt(),
            Unary::Rsqrt => t.sqrt().recip(),
            Unary::Reciprocal => t.recip(),
            Unary::Exp => t.exp(),
            Unary::Log => t.log(),
            Unary::Tanh => t.tanh(),
            Unary::Sigmoid => activation::sigmoid(t),
            Unary::Relu => activation::relu(t),
            Unary::Sign => t.sign(),
            Unary::Floor => t.floor(),
            Unary::Round => t.round(),
            Unary::LogicalNot => t.equal_elem(0.0).float(),
            Unary::Scale(a) => t.mul_scalar(a),
            Unary::Shift(a) => t.add_scalar(a),
            Unary::PowScalar(a) => t.powf_scalar(a),
            Unary::Clip(lo, hi) => t.clamp(lo, hi),
            Unary::ToBool => t.not_equal_elem(0.0).float(),
            Unary::Truncate => t.clone().sign() * t.abs().floor(),
        }
    }
}

/// A Keras dtype, as far as the graph needs to know it (storage is float32 for all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DType {
    Float,
    Int,
    Bool,
}

impl DType {
    /// Keras' dtype names: `float32`, `int64`, `bool`, ...
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "float16" | "bfloat16" | "float32" | "float64" => Some(DType::Float),
            "bool" => Some(DType::Bool),
            n if n.starts_with("int") || n.starts_with("uint") => Some(DType::Int),
            _ => None,
        }
    }
}

/// A constant tensor saved in a node's arguments: Keras writes a value computed while the graph
/// was built (`{"class_name": "__tensor__", "config": {"value": [[...]], "dtype": "float32"}}`,
/// or `__numpy__` for a numpy array) as nested lists. `None` for anything else.
pub fn constant_tensor(value: &serde_json::Value) -> Option<(HostTensor, DType)> {
    use serde_json::Value as Json;
    let object = value.as_object()?;
    if !matches!(object.get("class_name")?.as_str()?, "__tensor__" | "__numpy__") {
        return None;
    }
    let config = object.get("config")?;
    let dtype = config.get("dtype").and_then(Json::as_str).and_then(DType::parse).unwrap_or(DType::Float);
    let values = json_array(config.get("value")?, true)?;
    let shape = if values.shape.is_empty() { vec![1] } else { values.shape.clone() };
    Some((values.reshaped(shape), dtype))
}

/// A number or a rectangular nested list of numbers (and, with `bools`, booleans as 0 and 1) as
/// a tensor: shape `[]` for a number. `None` for anything else, a ragged list included.
pub fn json_array(value: &serde_json::Value, bools: bool) -> Option<HostTensor> {
    use serde_json::Value as Json;
    fn walk(v: &Json, depth: usize, bools: bool, shape: &mut Vec<usize>, data: &mut Vec<f32>) -> bool {
        match v {
            Json::Number(n) => n.as_f64().map(|x| data.push(x as f32)).is_some(),
            Json::Bool(b) if bools => {
                data.push(*b as u8 as f32);
                true
            }
            Json::Array(items) => {
                if shape.len() == depth {
                    shape.push(items.len());
                } else if shape[depth] != items.len() {
                    return false;
                }
                items.iter().all(|item| walk(item, depth + 1, bools, shape, data))
            }
            _ => false,
        }
    }
    let (mut shape, mut data) = (Vec::new(), Vec::new());
    (walk(value, 0, bools, &mut shape, &mut data) && data.len() == shape.iter().product::<usize>())
        .then(|| HostTensor::new(shape, data))
}

/// A tensor flowing through a Keras graph: its values, dtype and Keras mask.
#[derive(Debug, Clone)]
pub struct Value {
    pub tensor: DynTensor,
    pub dtype: DType,
    /// `_keras_mask`: non-zero = keep.
    pub mask: Option<DynTensor>,
}

impl Value {
    pub fn new(tensor: DynTensor, dtype: DType) -> Self {
        Self { tensor, dtype, mask: None }
    }

    pub fn float(tensor: DynTensor) -> Self {
        Self::new(tensor, DType::Float)
    }

    pub fn with_mask(mut self, mask: Option<DynTensor>) -> Self {
        self.mask = mask;
        self
    }

    pub fn shape(&self) -> Vec<usize> {
        self.tensor.shape()
    }
}
