//! Fused multi-head attention and dense-layer products for Burn's CPU backends (flex, ndarray):
//! one kernel for `softmax(scale · q kᵀ, mask) v`, one for its gradients, neither of which writes
//! the `[B, h, T, S]` score tensor to memory, and the dense layers' `x W + b` on the `gemm` crate.
//!
//! The modules are layered, each importing only those above it in this list:
//!
//! * [`profile`]: where the kernels' time goes, when asked (imports nothing);
//! * [`simd`]: 16 float32 lanes as a vector of the CPU's instruction set, and [`Isa`], the
//!   instruction set in use (the widest the CPU has, or the one `KERNELS_ISA` names);
//! * [`buffer`]: the kernels' working memory, reused from call to call whatever the allocator;
//! * [`dims`]: the sizes of a call and what its fully masked rows get, and [`tuning`]: the
//!   kernel's blocking, derived from the CPU's L1 size and a measurement of its FMA units at
//!   run time;
//! * [`tile`]: the two register-blocked products the kernel is made of;
//! * [`bias`], [`dropout`] and [`mask`]: a float mask added to the logits, dropout on the
//!   probabilities as a counter-based keep-mask, and boolean masks as bits with the tiles they
//!   skip;
//! * [`attention`]: the algorithm on host slices, tiled and parallel over (batch, head, 16 or 32
//!   rows);
//! * [`gemm`]: dense products on host slices;
//! * [`ops`]: both as Burn backend operations with their own backward passes.

pub mod attention;
pub mod bias;
pub mod buffer;
pub mod dims;
pub mod dropout;
pub mod gemm;
pub mod mask;
pub mod ops;
pub mod profile;
pub mod simd;
#[doc(hidden)]
pub mod testing;
mod tile;
pub mod tuning;

pub use bias::FloatBias;
pub use dims::{Dims, FullyMaskedRows};
pub use dropout::KeepMask;
pub use mask::{BoolMask, Marks};
pub use ops::{
    Dense, FusedCall, LinearPair, fused_attention, fused_attention_with_probs, fused_self_attention, linear_after,
    linear_forward, supports,
};
pub use simd::{Isa, IsaError};
pub use tuning::Tuning;

/// Runs `f` on a thread of rayon's pool. Each parallel loop started from a thread outside the
/// pool hands its work to the pool and sleeps until it is done (two context switches, tens of
/// microseconds); started inside, the loops of `f` split their work among the pool's threads
/// directly, and only `f` itself is handed over. Every kernel entry point starts here or, for
/// work that runs on one thread, in [`on_caller`], so the first one also sets the allocator up
/// ([`buffer::keep_freed_memory`]), and each call's time is kept as `phase`'s when [`profile`]
/// is enabled.
pub(crate) fn on_pool<R: Send>(phase: profile::Phase, f: impl FnOnce() -> R + Send) -> R {
    buffer::keep_freed_memory();
    profile::timed(phase, || rayon::scope(|_| f()))
}

/// [`on_pool`] for work that runs on one thread: on the caller's, with no hand-over.
pub(crate) fn on_caller<R>(phase: profile::Phase, f: impl FnOnce() -> R) -> R {
    buffer::keep_freed_memory();
    profile::timed(phase, f)
}
