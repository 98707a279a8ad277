//! `exp` for arguments `<= 0` in straight-line float arithmetic, so that a loop over it
//! vectorises (libm's `expf` is a call per element).
//!
//! Cephes' `expf`: `exp(x) = 2^n * exp(r)` with `n = round(x / ln 2)`, `r = x - n ln 2` split in
//! two constants for precision, and a degree-6 polynomial for `exp(r)` on `|r| <= ln(2) / 2`.
//! Relative error under 2 ulp. Arguments below [`UNDERFLOW`] (and `-inf`) return
//! `exp(UNDERFLOW)`, about 1.2e-38, where the true value is a denormal or 0: nothing a softmax
//! row, whose largest term is 1, can tell apart.

/// Below this, `exp(x) < f32::MIN_POSITIVE`; arguments are clamped to it.
pub const UNDERFLOW: f32 = -87.336_54;

pub(crate) const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `ln 2 = LN2_HI + LN2_LO`, with `LN2_HI` exact in few bits so that `n * LN2_HI` is exact.
pub(crate) const LN2_HI: f32 = 0.693_359_4;
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
/// `P` of `exp(r) = 1 + r + r² P(r)`, highest degree first.
pub(crate) const POLYNOMIAL: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];
/// Adding 1.5 * 2^23 to a float of magnitude < 2^22 rounds it to the nearest integer `n`, held in
/// the low mantissa bits: the sum's bit pattern is `ROUND_MAGIC.to_bits() + n`.
const ROUND_MAGIC: f32 = 12_582_912.0;

use super::tile::Vector;

/// `a * b + c`, fused when the kernel is compiled for a CPU with FMA (a libm call otherwise).
#[inline(always)]
pub fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// `exp(x)` for `x <= 0`.
#[inline(always)]
pub fn exp_nonpositive<const FMA: bool>(x: f32) -> f32 {
    let clamped = x.max(UNDERFLOW);
    let rounded = clamped * LOG2_E + ROUND_MAGIC;
    let n = rounded - ROUND_MAGIC; // round(x / ln 2), in [-126, 0]
    let r = madd::<FMA>(n, -LN2_LO, madd::<FMA>(n, -LN2_HI, clamped)); // x - n ln 2, |r| <= ln(2)/2
    let [c5, c4, c3, c2, c1, c0] = POLYNOMIAL;
    let p = [c4, c3, c2, c1, c0].into_iter().fold(c5, |p, c| madd::<FMA>(p, r, c));
    let exp_r = madd::<FMA>(p, r * r, r) + 1.0; // exp(r)
    // 2^n from its exponent bits n + 127, in integer arithmetic that vectorises (no float -> int).
    let biased_exponent = rounded.to_bits().wrapping_sub(ROUND_MAGIC.to_bits()).wrapping_add(127);
    let two_to_n = f32::from_bits(biased_exponent << 23); // a normal float: n + 127 >= 1
    exp_r * two_to_n
}

/// [`exp_nonpositive`] on a vector, the same operations in the same order (fused multiply-adds
/// where `V` has them), for the kernel's per-key loops.
#[inline(always)]
pub fn exp_nonpositive_vector<V: Vector>(x: V) -> V {
    let clamped = x.max(V::splat(UNDERFLOW));
    let rounded = clamped.mul(V::splat(LOG2_E)).add(V::splat(ROUND_MAGIC));
    let n = rounded.sub(V::splat(ROUND_MAGIC));
    let r = n.mul_add(V::splat(-LN2_LO), n.mul_add(V::splat(-LN2_HI), clamped));
    let [c5, c4, c3, c2, c1, c0] = POLYNOMIAL;
    let p = [c4, c3, c2, c1, c0].into_iter().fold(V::splat(c5), |p, c| p.mul_add(r, V::splat(c)));
    let exp_r = p.mul_add(r.mul(r), r).add(V::splat(1.0));
    exp_r.mul(rounded.pow2_of_rounded(ROUND_MAGIC))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_libm_within_two_ulp_on_the_softmax_range() {
        let mut worst_ulps = 0.0f64;
        for i in 0..=200_000 {
            let x = -87.3f32 * i as f32 / 200_000.0;
            let exact = (x as f64).exp();
            for got in [exp_nonpositive::<false>(x), exp_nonpositive::<true>(x)] {
                let ulp = (exact as f32).abs() * f32::EPSILON;
                worst_ulps = worst_ulps.max((got as f64 - exact).abs() / ulp as f64);
            }
        }
        assert!(worst_ulps <= 2.0, "worst error {worst_ulps} ulp");
    }

    #[test]
    fn the_vector_exp_is_the_scalar_one_lane_by_lane() {
        use crate::fused::tile::{Lanes, Portable, lanes};
        for block in 0..1000 {
            let x: Lanes = lanes(|i| -90.0 * (block * 16 + i) as f32 / 16_000.0);
            let mut got = [0.0; 16];
            exp_nonpositive_vector(Portable::load(&x)).store(&mut got);
            for i in 0..16 {
                assert_eq!(got[i].to_bits(), exp_nonpositive::<false>(x[i]).to_bits(), "exp({})", x[i]);
            }
        }
    }

    /// `exp` of every vector `Vector::exp_nonpositive` is compiled for, against libm in float64.
    fn worst_ulps_of(exp16: impl Fn(&[f32; 16]) -> [f32; 16]) -> f64 {
        let mut worst_ulps = 0.0f64;
        for block in 0..=12_500 {
            let x: [f32; 16] = std::array::from_fn(|i| -87.3f32 * (block * 16 + i) as f32 / 200_000.0);
            for (x, got) in x.iter().zip(exp16(&x)) {
                let exact = (*x as f64).exp();
                worst_ulps = worst_ulps.max((got as f64 - exact).abs() / ((exact as f32).abs() * f32::EPSILON) as f64);
            }
        }
        worst_ulps
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx512_exp_matches_libm_within_two_ulp() {
        use crate::fused::tile::Avx512;
        if !std::arch::is_x86_feature_detected!("avx512f") {
            eprintln!("no AVX-512 here: the AVX-512 exp is not checked");
            return;
        }
        #[target_feature(enable = "avx512f,avx2,fma")]
        unsafe fn exp16(x: &[f32; 16]) -> [f32; 16] {
            let mut out = [0.0; 16];
            Avx512::load(x).exp_nonpositive().store(&mut out);
            out
        }
        // SAFETY: the CPU has AVX-512 (checked above).
        let worst = worst_ulps_of(|x| unsafe { exp16(x) });
        assert!(worst <= 2.0, "worst error {worst} ulp");
        let zero = unsafe { exp16(&[0.0; 16]) };
        let below = unsafe { exp16(&[f32::NEG_INFINITY; 16]) };
        assert!(zero.iter().all(|&y| y == 1.0) && below.iter().all(|&y| y > 0.0 && y < 1.3e-38), "{zero:?} {below:?}");
    }

    #[test]
    fn underflow_is_clamped_to_the_smallest_normal_range() {
        for x in [-88.0, -1e30, f32::NEG_INFINITY] {
            let y = exp_nonpositive::<true>(x);
            assert!(y > 0.0 && y < 1.3e-38, "exp({x}) = {y}");
        }
        assert_eq!(exp_nonpositive::<true>(0.0), 1.0);
    }
}
