//! Fused attention for the CPU backends: one kernel for `softmax(scale · q kᵀ) v` and one for its
//! gradients, which never write the `[B, h, T, S]` score tensor to memory.
//!
//! * [`kernel`]: the algorithm on host slices, vectorised and parallel over (batch, head) pairs;
//! * [`op`]: the kernel as a Burn backend operation with its own backward pass;
//! * [`exp`]: the vectorisable `exp` the kernel uses.

pub mod exp;
pub mod kernel;
pub mod op;

pub use op::{fused_attention, supports};
