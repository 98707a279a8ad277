//! Deterministic test values, the same on every machine, backend and run, independent of any
//! backend's generator: the one generator the tests of every crate share. Not part of the API.

/// Knuth's MMIX linear congruential generator: `state = state · 6364136223846793005 +
/// 1442695040888963407`, each call returning the new state.
#[derive(Debug, Clone)]
pub struct Lcg {
    state: u64,
}

impl Lcg {
    /// The stream whose next call steps from `state`.
    pub const fn from_state(state: u64) -> Self {
        Self { state }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.state
    }
}

/// `n` values in `[-1, 1)` from `seed`, 24 random bits each (the top bits of the state after
/// one step from `seed`, then one per value). Scaling them by a power of two is exact.
pub fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut lcg = Lcg::from_state(seed);
    lcg.next_u64();
    (0..n).map(|_| ((lcg.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0).collect()
}
