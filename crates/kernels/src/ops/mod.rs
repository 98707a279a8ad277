//! The kernels as Burn backend operations: implemented for flex and ndarray, whose tensors live in
//! host memory, and for `Autodiff<B, C>` with the kernels' own backward passes.
//!
//! * [`host`]: the CPU backends' tensors as float32 slices, read in place on flex;
//! * [`attention`]: fused attention, forward and backward;
//! * [`linear`]: the dense layers' `x W + b`, forward and backward, and two of them in a row
//!   with the cheaper backward pass of a pair.

pub mod attention;
pub mod host;
pub mod linear;

pub use attention::{FusedCall, fused_attention, fused_attention_with_probs, fused_self_attention, supports};
pub use linear::{Dense, LinearPair, linear_after, linear_forward};
