//! The study behind the project's claim: do the Keras-exact and the projected model train equally
//! well, where training is hard, where the learning rate is not tuned for both, where data is
//! scarce, and could the study have seen a difference at all?
//!
//! A ladder of tasks ([`Rung`]: the lookup task, then sharper, interfering, noisier and two-hop
//! ones), and per rung a learning-rate sweep (at the base training-set size) and a data-size sweep
//! (at the base learning rate), every condition with several seeds, on every CPU backend. A
//! positive control, the Keras layer with one head ([`Variant::OneHead`]), runs at each rung's base
//! condition: a model the study must tell apart. A subset (chosen rungs, the base condition, one
//! seed) also runs on the GPU-style backend, for the per-step agreement between backends.
//!
//! Each variant and seed draws its initial weights once (on flex); every condition and backend
//! starts from them, with the same host-generated batches, so the loss curves of one variant on
//! different backends are comparable step by step. Finished runs are reused and interrupted ones
//! resumed, unless the study is fresh: reuse matches configs, not the code that ran them.

mod design;
pub mod plot;
pub mod report;

pub use design::*;
