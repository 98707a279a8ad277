//! Dropout on the attention probabilities as a counter-based keep-mask: whether the pair
//! (query `t`, key `s`) of (batch, head) pair `pair` is kept is a hash of the call's seed and
//! `(pair, t, s)`, so the kernel's forward pass and both backward walks regenerate the same
//! mask wherever they visit the pair, and the decomposed path draws the very same mask on the
//! host ([`KeepMask::tensor_values`]).

/// The keep-mask of one call: entries are kept with probability `1 - rate` (to 2^-32) and kept
/// probabilities are scaled by `1 / (1 - rate)`, as Keras' and torch's `Dropout` do.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KeepMask {
    seed: u64,
    /// An entry is dropped when its 32-bit hash is below this.
    threshold: u32,
    /// `1 / (1 - rate)`.
    pub scale: f32,
}

impl KeepMask {
    /// The mask of a call with `rate` in `(0, 1)` from a `(seed, call index)` pair.
    pub fn new(rate: f64, seed: [u64; 2]) -> Self {
        assert!(rate > 0.0 && rate < 1.0, "dropout rate {rate} outside (0, 1)");
        let threshold = (rate * 4_294_967_296.0).round().min(u32::MAX as f64) as u32;
        Self { seed: mix64(mix64(seed[0]) ^ seed[1]), threshold, scale: (1.0 / (1.0 - rate)) as f32 }
    }

    /// The hash every entry of row `t` of pair `pair` starts from.
    #[inline(always)]
    pub fn row(&self, pair: usize, t: usize) -> u32 {
        (mix64(self.seed ^ mix64(((pair as u64) << 32) ^ t as u64)) >> 32) as u32
    }

    /// Whether key `s` of the row with hash `row` is kept.
    #[inline(always)]
    pub fn keeps(&self, row: u32, s: usize) -> bool {
        // murmur3's finaliser on the row hash and the key: a bijection of the key for each row.
        let mut z = row ^ (s as u32).wrapping_mul(0x9E37_79B1);
        z ^= z >> 16;
        z = z.wrapping_mul(0x85EB_CA6B);
        z ^= z >> 13;
        z = z.wrapping_mul(0xC2B2_AE35);
        z ^= z >> 16;
        z >= self.threshold
    }

    /// Bit `i` set: key `first_key + i` of the row with hash `row` is kept.
    #[inline(always)]
    pub fn key_bits(&self, row: u32, first_key: usize) -> u16 {
        (0..16).fold(0u16, |bits, i| bits | (u16::from(self.keeps(row, first_key + i)) << i))
    }

    /// Bit `i` set: row `first_row + i` (hashes `rows[i]`) keeps key `s`.
    #[inline(always)]
    pub fn row_bits(&self, rows: &[u32; 16], s: usize) -> u16 {
        (0..16).fold(0u16, |bits, i| bits | (u16::from(self.keeps(rows[i], s)) << i))
    }

    /// The mask as `[pairs, T, S]` values, `scale` where kept and 0 where dropped, for the
    /// decomposed path.
    pub fn tensor_values(&self, pairs: usize, query_len: usize, source_len: usize) -> Vec<f32> {
        let mut values = Vec::with_capacity(pairs * query_len * source_len);
        for pair in 0..pairs {
            for t in 0..query_len {
                let row = self.row(pair, t);
                values.extend((0..source_len).map(|s| if self.keeps(row, s) { self.scale } else { 0.0 }));
            }
        }
        values
    }
}

/// splitmix64's finaliser.
#[inline(always)]
fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_one_minus_rate_of_the_entries_and_the_bits_agree_with_the_entries() {
        for rate in [0.1, 0.5, 0.9] {
            let mask = KeepMask::new(rate, [7, 3]);
            let values = mask.tensor_values(4, 64, 96);
            let kept = values.iter().filter(|&&v| v > 0.0).count() as f64 / values.len() as f64;
            // 24576 draws: the standard error of the kept fraction is below 0.0032.
            assert!((kept - (1.0 - rate)).abs() < 0.015, "rate {rate}: kept {kept}");
            assert!(values.iter().all(|&v| v == 0.0 || v == mask.scale));
            let (pair, t) = (2, 37);
            let rows: [u32; 16] = std::array::from_fn(|i| mask.row(pair, 32 + i));
            let at = |t: usize, s: usize| values[(pair * 64 + t) * 96 + s] > 0.0;
            assert_eq!(
                mask.key_bits(mask.row(pair, t), 16),
                (0..16).fold(0u16, |b, i| b | (u16::from(at(t, 16 + i)) << i))
            );
            assert_eq!(mask.row_bits(&rows, 50), (0..16).fold(0u16, |b, i| b | (u16::from(at(32 + i, 50)) << i)));
        }
        assert_ne!(
            KeepMask::new(0.5, [7, 3]).tensor_values(1, 8, 8),
            KeepMask::new(0.5, [7, 4]).tensor_values(1, 8, 8),
            "the call index changes the mask"
        );
    }
}
