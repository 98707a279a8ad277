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
//!
//! The modules, each importing only those above it: [`stats`] (plain numbers, nothing of the
//! study), [`design`] (what to run), [`runner`] (running it, the results), [`analysis`] (what the
//! report and figures read from the results), [`plot`] (the figures) and [`report`] (`report.md`,
//! and [`write_report`], which writes it beside the figures).

pub mod analysis;
pub mod design;
pub mod plot;
pub mod report;
pub mod runner;
pub mod stats;

pub use analysis::cross_backend_max_diff;
pub use design::{Condition, PlannedRun, Rung, StudyConfig, Variant, ladder};
pub use report::write_report;
pub use runner::{BLOW_UP, RunResult, RungFloors, StudyResults, run_study};
pub use stats::{Difference, mean_std, smooth, t_critical_95};
