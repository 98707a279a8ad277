//! Fused attention for the CPU backends: one kernel for `softmax(scale · q kᵀ, mask) v` and one
//! for its gradients, which never write the `[B, h, T, S]` score tensor to memory.
//!
//! * [`kernel`]: the algorithm on host slices, tiled and parallel over (batch, head, 16 rows);
//! * [`tile`]: the two register-blocked products the kernel is made of;
//! * [`mask`]: causal, key-padding and general boolean masks as bits, with the tiles they skip;
//! * [`bias`]: a float mask added to the logits (torch's float `attn_mask`), in both orientations;
//! * [`dropout`]: dropout on the probabilities as a counter-based keep-mask both passes regenerate;
//! * [`op`]: the kernel as a Burn backend operation with its own backward pass;
//! * [`exp`]: the vectorisable `exp` the kernel uses;
//! * [`gemm`] and [`linear`]: the dense layers' product on the same tiles, as a backend operation.
//! * [`host`]: the CPU backends' tensors as float32 slices, read in place on flex.

pub mod bias;
pub mod dropout;
pub mod exp;
pub mod gemm;
pub mod host;
pub mod kernel;
pub mod linear;
pub mod mask;
pub mod op;
pub mod tile;

pub use bias::FloatBias;
pub use linear::linear_forward;
pub use mask::BoolMask;
pub use op::{FusedCall, fused_attention, fused_attention_with_probs, supports};
