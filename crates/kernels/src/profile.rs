//! Where the kernels' time goes, when asked: the wall time and the number of calls of each
//! [`Phase`], summed over calls until [`take`] reads them. Off by default; while off, a kernel
//! call pays one relaxed atomic load for it.
//!
//! The phases are the kernels' entry points (each runs through `on_pool`, which times it), which
//! Burn's ops call one at a time from the caller's thread, so their times add up: a training step's time minus the phases is what
//! Burn itself spends (element-wise ops, autodiff bookkeeping, the optimizer) plus the ops'
//! copies between tensors and host slices. `cargo xtask bench --profile` prints it per row.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A kernel entry point whose time is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// [`crate::gemm`]: the dense layers' products, forward and backward.
    Gemm,
    /// [`crate::attention::forward`] and [`crate::attention::forward_with_probs`].
    AttentionForward,
    /// [`crate::attention::backward`].
    AttentionBackward,
}

impl Phase {
    pub const ALL: [Phase; 3] = [Phase::Gemm, Phase::AttentionForward, Phase::AttentionBackward];

    pub fn name(self) -> &'static str {
        match self {
            Phase::Gemm => "gemm",
            Phase::AttentionForward => "attention_forward",
            Phase::AttentionBackward => "attention_backward",
        }
    }
}

/// Each phase's wall time and number of calls, in [`Phase::ALL`]'s order.
pub type Totals = [(Phase, Duration, u64); Phase::ALL.len()];

static ENABLED: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; Phase::ALL.len()] = [const { AtomicU64::new(0) }; Phase::ALL.len()];
static CALLS: [AtomicU64; Phase::ALL.len()] = [const { AtomicU64::new(0) }; Phase::ALL.len()];

/// Starts (or stops) keeping the phases' times, for the whole process.
pub fn set_enabled(enabled: bool) {
    ENABLED.store(enabled, Ordering::Relaxed);
}

/// Whether the phases' times are being kept.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Each phase's time and calls since the last `take` (or the start), then zero again.
pub fn take() -> Totals {
    Phase::ALL.map(|phase| {
        let nanos = NANOS[phase as usize].swap(0, Ordering::Relaxed);
        (phase, Duration::from_nanos(nanos), CALLS[phase as usize].swap(0, Ordering::Relaxed))
    })
}

/// Runs `f`, adding its wall time to `phase` when keeping times is on.
#[inline]
pub(crate) fn timed<R>(phase: Phase, f: impl FnOnce() -> R) -> R {
    if !ENABLED.load(Ordering::Relaxed) {
        return f();
    }
    let start = Instant::now();
    let result = f();
    let nanos = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    NANOS[phase as usize].fetch_add(nanos, Ordering::Relaxed);
    CALLS[phase as usize].fetch_add(1, Ordering::Relaxed);
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_kept_only_while_enabled() {
        // The only test that enables it; other tests' kernel calls may add to `on` while it is.
        let sleep = || std::thread::sleep(Duration::from_millis(2));
        timed(Phase::Gemm, sleep);
        let off = take();
        set_enabled(true);
        timed(Phase::AttentionBackward, sleep);
        timed(Phase::AttentionBackward, sleep);
        let on = take();
        set_enabled(false);

        assert!(off.iter().all(|&(_, time, calls)| calls == 0 && time.is_zero()), "nothing is kept while off");
        let (phase, time, calls) = on[Phase::AttentionBackward as usize];
        assert_eq!(phase, Phase::AttentionBackward);
        assert!(calls >= 2 && time >= Duration::from_millis(4), "{calls} calls, {time:?}");
    }
}
