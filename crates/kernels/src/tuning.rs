//! The attention kernel's blocking, chosen for the processor it runs on.
//!
//! A tile walks its keys (or, for `dk` and `dv`, its query rows) `step` at a time: the step's
//! scores and their gradients, `2 x step` vectors of 16 lanes (128 bytes per key), stay in the L1
//! data cache while the keys and values stream past. The step is therefore derived from the L1
//! size that the `gemm` crate reads at run time (`/sys` on Linux, `sysctl` on macOS, `cpuid`
//! elsewhere): half of L1 for the step's scores, the rest for the streamed rows. A 32 KiB L1 (Zen 4,
//! most Intel client cores) gives 128 keys, a 48 KiB one (Intel server cores since Ice Lake)
//! 192, Apple's 128 KiB 512. `KERNELS_STEP` overrides it, for measurements.
//!
//! Whether the tiles' weighted sums of narrow heads split their rows to keep more multiply-add
//! chains in flight ([`split_narrow_sums`]) depends on how many FMA units a core has, which no
//! register or file reports: it is measured, once per instruction set, on first use (about a
//! millisecond). `KERNELS_SPLIT_SUMS` overrides it. The split changes the order of the sums, so
//! the outputs' last bits depend on it: where two processes must agree bit for bit, set it.

use std::sync::OnceLock;

use crate::simd::{LANES, Level};

/// The variable that overrides [`Tuning::step`]: a multiple of 16 from 16 to 4096.
pub const STEP_VARIABLE: &str = "KERNELS_STEP";

/// The blocking the kernel uses, read once per process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Keys (or query rows) per step of a tile's walk, a multiple of 16.
    pub step: usize,
    /// The L1 data cache it was derived from, in bytes.
    pub l1_bytes: usize,
}

/// The bytes one key of a step keeps in L1: its scores and their gradients, 16 lanes each.
const BYTES_PER_STEP_KEY: usize = 2 * LANES * size_of::<f32>();

impl Tuning {
    /// This process's blocking: [`STEP_VARIABLE`] if it is set and valid (an invalid value is
    /// reported on stderr and ignored), else the rule for this CPU's L1.
    pub fn get() -> Tuning {
        static TUNING: OnceLock<Tuning> = OnceLock::new();
        *TUNING.get_or_init(|| {
            let l1_bytes = gemm_common::cache::CACHE_INFO[0].cache_bytes;
            let derived = Tuning::for_l1(l1_bytes);
            match std::env::var(STEP_VARIABLE).ok().filter(|v| !v.is_empty()).map(|v| Tuning::parse_step(&v)) {
                None => derived,
                Some(Ok(step)) => Tuning { step, ..derived },
                Some(Err(error)) => {
                    eprintln!("warning: {error}; using {}", derived.step);
                    derived
                }
            }
        })
    }

    /// The rule: as many keys as fill half of an L1 of `l1_bytes` with their scores, rounded
    /// down to a multiple of 16, from 64 to 512 (an L1 that reads as 0 counts as 32 KiB).
    pub fn for_l1(l1_bytes: usize) -> Tuning {
        let l1 = if l1_bytes == 0 { 32 * 1024 } else { l1_bytes };
        let step = (l1 / 2 / BYTES_PER_STEP_KEY / LANES * LANES).clamp(64, 512);
        Tuning { step, l1_bytes }
    }

    fn parse_step(value: &str) -> Result<usize, String> {
        match value.trim().parse::<usize>() {
            Ok(step) if step % LANES == 0 && (LANES..=4096).contains(&step) => Ok(step),
            _ => Err(format!("{STEP_VARIABLE}={value:?} is not a multiple of {LANES} from {LANES} to 4096")),
        }
    }
}

/// The variable that overrides [`split_narrow_sums`]: `1` splits, `0` does not.
pub const SPLIT_VARIABLE: &str = "KERNELS_SPLIT_SUMS";

/// How much slower a multiply-add of half as many chains as the tiles' accumulators must be for
/// the split to pay: on a core whose FMA units half the chains already fill, the two rates are
/// equal (1.00 measured on a Zen 4 with AVX-512; 1.33 with AVX2, whose half nearly fill them);
/// on one whose units need twice as many chains to stay busy, the half take twice as long. The
/// measurement is aimed at AVX-512: an AVX2 vector is two registers, so a group of 4 features
/// already keeps 8 of them in flight, and there the split only ever reaches groups of 2 and 1.
const SPLIT_WHEN_SLOWER: f64 = 1.5;

/// Whether `lane_accumulate` splits the rows of a group of fewer features than its accumulators
/// on the instruction set `level`: [`SPLIT_VARIABLE`] if set (`0` or `1`; another value is
/// reported on stderr and ignored), else the measurement `times`, run once per instruction set,
/// which returns the seconds per multiply-add of the tiles' accumulators' number of chains and
/// of half as many.
pub(crate) fn split_narrow_sums(level: Level, times: impl FnOnce() -> (f64, f64)) -> bool {
    static SPLIT: [OnceLock<bool>; 3] = [const { OnceLock::new() }; 3];
    *SPLIT[level as usize].get_or_init(|| split_from(std::env::var(SPLIT_VARIABLE).ok().as_deref(), times))
}

/// [`split_narrow_sums`]'s rule, given the override's value.
fn split_from(variable: Option<&str>, times: impl FnOnce() -> (f64, f64)) -> bool {
    match variable.map(str::trim).filter(|v| !v.is_empty()) {
        Some("1") => return true,
        Some("0") => return false,
        Some(other) => eprintln!("warning: {SPLIT_VARIABLE}={other:?} is neither 0 nor 1; measuring"),
        None => {}
    }
    let (full, half) = times();
    half > SPLIT_WHEN_SLOWER * full
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_follows_the_l1_size_in_multiples_of_16() {
        let step = |kib: usize| Tuning::for_l1(kib * 1024).step;
        assert_eq!([step(16), step(32), step(48), step(64), step(128), step(1024)], [64, 128, 192, 256, 512, 512]);
        assert_eq!(Tuning::for_l1(0).step, 128, "an unreadable L1 counts as 32 KiB");
        assert_eq!(Tuning::for_l1(40 * 1024).step % LANES, 0);
    }

    #[test]
    fn narrow_sums_split_where_half_the_chains_run_at_half_the_rate() {
        let never = || -> (f64, f64) { panic!("an override is not measured") };
        assert!(split_from(Some("1"), never) && !split_from(Some(" 0 "), never));
        // A core with twice the FMA units that half the chains fill; one they fill (a Zen 4 with
        // AVX-512: 0.271 and 0.271 ns); one they nearly fill (its AVX2: 0.271 and 0.361 ns).
        assert!(split_from(None, || (1.0, 2.0)));
        assert!(!split_from(None, || (0.271, 0.271)));
        assert!(!split_from(None, || (0.271, 0.361)));
        assert!(split_from(Some("yes"), || (1.0, 2.0)), "an invalid override is ignored");
    }

    #[test]
    fn an_override_must_be_a_multiple_of_16_in_range() {
        assert_eq!(Tuning::parse_step("96"), Ok(96));
        for bad in ["0", "100", "8192", "x", "-16"] {
            let error = Tuning::parse_step(bad).unwrap_err();
            assert!(error.contains(STEP_VARIABLE) && error.contains(bad), "{error}");
        }
    }
}
