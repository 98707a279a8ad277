//! The attention kernel's blocking, chosen for the processor it runs on.
//!
//! A tile walks its keys (or, for `dk` and `dv`, its query rows) `step` at a time: the step's
//! scores and their gradients, `2 x step` vectors of 16 lanes (128 bytes per key), stay in the L1
//! data cache while the keys and values stream past. The step is therefore derived from the L1
//! size that the `gemm` crate reads at run time (`/sys` on Linux, `sysctl` on macOS, `cpuid`
//! elsewhere): half of L1 for the step's scores, the rest for the streamed rows. A 32 KiB L1 (Zen 4,
//! most Intel client cores) gives 128 keys, a 48 KiB one (Intel server cores since Ice Lake)
//! 192, Apple's 128 KiB 512. `KERNELS_STEP` overrides it, for measurements.

use std::sync::OnceLock;

use crate::simd::LANES;

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
    fn an_override_must_be_a_multiple_of_16_in_range() {
        assert_eq!(Tuning::parse_step("96"), Ok(96));
        for bad in ["0", "100", "8192", "x", "-16"] {
            let error = Tuning::parse_step(bad).unwrap_err();
            assert!(error.contains(STEP_VARIABLE) && error.contains(bad), "{error}");
        }
    }
}
