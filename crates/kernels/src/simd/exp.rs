//! `exp` for arguments `<= 0` in straight-line float arithmetic, so that a loop over it
//! vectorises (libm's `expf` is a call per element).
//!
//! Both versions compute `exp(x) = 2^t` with `t = x log2(e)`, split as `2^n 2^f` for an integer
//! `n` and `|f| <= 1/2` (here) or `0 <= f < 1` (AVX-512's, `x86.rs`), with a polynomial of degree
//! 6 for `2^f` whose coefficients are fitted for the least largest relative error (a Lawson
//! iteration, float64, on 4001 Chebyshev points; about 2e-9 in exact arithmetic), `1` kept exact
//! so that `exp(0) = 1`. The reduction rounds `t` once, where Cephes' `expf` reduces `x - n ln 2`
//! with `ln 2` in two constants: `2^t` is then off by up to `|t| 2^-24 ln 2` relative, which is
//! at most 2.3e-8 absolute (at `x = -1`), a fifth of a float32 ulp of 1, the largest term of a
//! softmax row, and exceeds 2 ulp of the value itself only below `x = -2` (the test's bound is 2
//! ulp or 3e-8 absolute). For that, four instructions less per vector than Cephes' reduction:
//! the seed's forward pass (4 features a head), whose time goes mostly to `exp`, took 10-13%
//! less with AVX-512 on an Intel Xeon. Arguments below [`UNDERFLOW`] (and `-inf`) return
//! `exp(UNDERFLOW)` here, about 1.2e-38, and 0 with AVX-512, where the true value is a denormal
//! or 0: nothing a softmax row can tell apart.
//!
//! AVX2's `exp` (`x86.rs`) reduces to eighths instead: `2^t = 2^e 2^(j/8) 2^(g/8)` with `8t`
//! rounded to `n = 8e + j` and `|g| <= 1/2`, `2^(j/8)` looked up in a register ([`EIGHTHS`],
//! one `vpermps`, which runs on the shuffle port) and a cubic for `2^(g/8)`
//! ([`POW2_ON_EIGHTHS`]), with no integer add of its own (the table's bits absorb it): 11
//! instructions per 8 lanes, 9 of them on the two ports that AVX2's float work shares on Intel
//! cores, where the sextic takes 13 and 12. The kernel's forward pass at the seed's shape took
//! 10% less with AVX2 on an Intel Xeon (one thread, 2.33 to 2.10 ms). Its error stays within the
//! same test's bound: at most 6.9e-8 absolute (6.6e-8 for the sextic), under 1.3 ulp above
//! `x = -4`.
//!
//! The attention kernel's bounded steps take `exp(score - shift)` with the subtraction folded
//! into the reduction (`Vector::exp_shifted`): AVX2 rounds `8 log2(e) score + (1.5 * 2^23 - K)`
//! for a shift of `K / (8 log2(e))` with an integer `K` (`Vector::bounded_shift` rounds the
//! bound up to one), AVX-512 takes `t = score log2(e) - shift log2(e)` in one multiply-add: one
//! float instruction less per vector and no rounding of `score - shift` first. llvm-mca-19 on
//! the bounded loop of heads of 4 (exponential and weighted sum), cycles per AVX2 half-row:
//! `sapphirerapids` 6.22 -> 5.78, `znver4` 7.68 -> 6.72 (`docs/benchmarks.md`).

/// Below this, `exp(x) < f32::MIN_POSITIVE`; arguments are clamped to it.
pub const UNDERFLOW: f32 = -87.336_54;

pub(crate) const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// `Q` of `2^f = 1 + f Q(f)` on `|f| <= 1/2`, highest degree first (largest relative error
/// 2.0e-9 in exact arithmetic).
pub(crate) const POW2_ON_HALVES: [f32; 6] =
    [1.535_336_2e-4, 1.339_887_5e-3, 9.618_437e-3, 5.550_332_4e-2, 2.402_264_8e-1, 6.931_472e-1];
/// `Q` of `2^f = 1 + f Q(f)` on `0 <= f < 1`, highest degree first, for AVX-512's `exp`, which
/// reduces with `vreduceps` to `f = t - floor(t)` (largest relative error 2.0e-9).
pub(crate) const POW2_ON_UNIT: [f32; 6] =
    [2.161_292e-4, 1.246_784_6e-3, 9.675_452e-3, 5.548_528_2e-2, 2.402_293_1e-1, 6.931_470_6e-1];
/// `Q` of `2^(g/8) = 1 + g Q(g)` on `|g| <= 1/2`, highest degree first, for AVX2's `exp`, which
/// takes `2^(j/8)` from [`EIGHTHS`] (largest relative error 2.5e-8 in exact arithmetic).
pub(crate) const POW2_ON_EIGHTHS: [f32; 3] = [1.083_910_6e-4, 3.754_025_6e-3, 8.664_340_5e-2];
/// `2^(j/8)` for `j` in `0..8`, rounded to float32.
pub(crate) const EIGHTHS: [f32; 8] =
    [1.0, 1.090_507_7, 1.189_207_1, 1.296_839_6, std::f32::consts::SQRT_2, 1.542_210_8, 1.681_792_8, 1.834_008_1];
/// Adding 1.5 * 2^23 to a float of magnitude < 2^22 rounds it to the nearest integer `n`, held in
/// the low mantissa bits: the sum's bit pattern is `ROUND_MAGIC.to_bits() + n`.
pub(crate) const ROUND_MAGIC: f32 = 12_582_912.0;

use super::Vector;

/// `exp(x)` for lanes `x <= 0`, with fused multiply-adds where `V` has them: 11 float and 2
/// integer instructions per vector.
#[inline(always)]
pub(crate) fn exp_nonpositive<V: Vector>(x: V) -> V {
    let clamped = x.max(V::splat(UNDERFLOW));
    // t = x log2(e) and its rounding in one multiply-add (fused where `V` has FMA: the sum then
    // rounds the exact product).
    let rounded = clamped.mul_add(V::splat(LOG2_E), V::splat(ROUND_MAGIC));
    let minus_n = V::splat(ROUND_MAGIC).sub(rounded); // -round(t), in [0, 126]
    let f = clamped.mul_add(V::splat(LOG2_E), minus_n); // t - n, |f| <= 1/2
    let [c6, c5, c4, c3, c2, c1] = POW2_ON_HALVES;
    let mut p = V::splat(c6);
    for c in [c5, c4, c3, c2, c1, 1.0] {
        p = p.mul_add(f, V::splat(c)); // a loop, not a fold: no closure around vector code (tile.rs)
    }
    // 2^n from its exponent bits n + 127, in integer arithmetic (no float -> int conversion).
    p.mul(rounded.pow2_of_rounded(ROUND_MAGIC))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{Lanes, Portable};

    /// The largest absolute error allowed where 2 ulp of the value is less: a quarter of an ulp of
    /// 1, the largest term of a softmax row.
    const ABSOLUTE: f64 = 3e-8;

    /// `exp16` (one vector of 16 lanes) against libm in float64 on the softmax range: within 2
    /// ulp, or [`ABSOLUTE`]; exactly 1 at 0; below [`UNDERFLOW`] (and at `-inf`) 0 or
    /// `exp(UNDERFLOW)`. Returns the worst error in ulp and the worst absolute error.
    fn check(name: &str, exp16: impl Fn(&Lanes) -> Lanes) -> (f64, f64) {
        let (mut worst_ulps, mut worst_absolute) = (0.0f64, 0.0f64);
        for block in 0..=12_500 {
            let x: Lanes = std::array::from_fn(|i| -87.3f32 * (block * 16 + i) as f32 / 200_000.0);
            for (x, got) in x.iter().zip(exp16(&x)) {
                let exact = (*x as f64).exp();
                let error = (got as f64 - exact).abs();
                let ulps = error / ((exact as f32).abs() * f32::EPSILON) as f64;
                assert!(ulps <= 2.0 || error <= ABSOLUTE, "{name}: exp({x}) = {got}, {ulps} ulp and {error:e} off");
                worst_ulps = worst_ulps.max(ulps);
                worst_absolute = worst_absolute.max(error);
            }
        }
        assert!(exp16(&[0.0; 16]).iter().all(|&y| y == 1.0), "{name}: exp(0)");
        for x in [-88.0, -1e30, f32::NEG_INFINITY] {
            let y = exp16(&[x; 16]);
            assert!(y.iter().all(|&y| (0.0..1.3e-38).contains(&y)), "{name}: exp({x}) = {y:?}");
        }
        (worst_ulps, worst_absolute)
    }

    /// `V`'s bounded shift for each of `bounds` (lanes), and `exp_shifted` of `x` against it.
    fn shifted<V: Vector>(bounds: &Lanes, x: &Lanes) -> (Lanes, Lanes) {
        let (mut shift, mut out) = ([0.0; 16], [0.0; 16]);
        let bounded = V::bounded_shift(V::load(bounds));
        bounded.store(&mut shift);
        V::exp_shifted(V::load(x), V::shift_constant(bounded)).store(&mut out);
        (shift, out)
    }

    /// A bounded step's shift is at least its bound and at most `1 / (8 log2 e)` above it, and
    /// `exp_shifted` is `exp(x - shift)` within 1e-6 relative (8 ulp; rounding `x - shift` to
    /// float32 first, as the portable path does, costs up to 4.8e-7) or [`ABSOLUTE`] for
    /// `x - shift` in `[-BOUNDED_GAP - 1, 0]`, on every instruction set, at bounds from 0 to half
    /// the gap.
    fn check_shifted(name: &str, shifted: impl Fn(&Lanes, &Lanes) -> (Lanes, Lanes)) {
        let gap = crate::attention::BOUNDED_GAP;
        for block in 0..400 {
            let bounds: Lanes = std::array::from_fn(|i| (block * 16 + i) as f32 * gap / 2.0 / 6400.0);
            let (shift, _) = shifted(&bounds, &[0.0; 16]);
            for (bound, shift) in bounds.iter().zip(shift) {
                assert!(*bound <= shift && shift <= bound + 0.0867, "{name}: shift {shift} for bound {bound}");
            }
            for step in 0..=16 {
                let x: Lanes = std::array::from_fn(|i| shift[i] - step as f32 * (gap + 1.0) / 16.0);
                let (_, got) = shifted(&bounds, &x);
                for i in 0..16 {
                    let exact = (x[i] as f64 - shift[i] as f64).exp();
                    let error = (got[i] as f64 - exact).abs();
                    assert!(
                        error <= 1e-6 * exact || error <= ABSOLUTE,
                        "{name}: exp({} - {}) = {}, {error:e} off",
                        x[i],
                        shift[i],
                        got[i]
                    );
                }
            }
        }
    }

    #[test]
    fn the_shifted_exponential_matches_libm_on_every_instruction_set() {
        check_shifted("portable", shifted::<Portable>);
        #[cfg(target_arch = "x86_64")]
        {
            use crate::simd::{Avx2, Avx512};
            use std::arch::is_x86_feature_detected as has;
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2(bounds: &Lanes, x: &Lanes) -> (Lanes, Lanes) {
                shifted::<Avx2>(bounds, x)
            }
            #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
            unsafe fn avx512(bounds: &Lanes, x: &Lanes) -> (Lanes, Lanes) {
                shifted::<Avx512>(bounds, x)
            }
            // SAFETY (both): the CPU has the features, checked first.
            if has!("avx2") && has!("fma") {
                check_shifted("avx2", |bounds, x| unsafe { avx2(bounds, x) });
            }
            if has!("avx512f") && has!("avx512dq") && has!("avx2") && has!("fma") {
                check_shifted("avx512", |bounds, x| unsafe { avx512(bounds, x) });
            }
        }
    }

    #[test]
    fn the_eighths_are_the_rounded_powers() {
        for (j, &x) in EIGHTHS.iter().enumerate() {
            assert_eq!(x, 2f64.powf(j as f64 / 8.0) as f32, "2^({j}/8)");
        }
    }

    #[test]
    fn matches_libm_on_every_instruction_set() {
        let (ulps, absolute) = check("portable", |x| {
            let mut out = [0.0; 16];
            Portable::load(x).exp_nonpositive().store(&mut out);
            out
        });
        eprintln!("portable exp: worst {ulps:.1} ulp, {absolute:.1e} absolute");
        #[cfg(target_arch = "x86_64")]
        {
            use crate::simd::{Avx2, Avx512};
            use std::arch::is_x86_feature_detected as has;
            // AVX2's exp and AVX-512's, each its instruction set's own.
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2(x: &Lanes) -> Lanes {
                let mut out = [0.0; 16];
                Avx2::load(x).exp_nonpositive().store(&mut out);
                out
            }
            #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
            unsafe fn avx512(x: &Lanes) -> Lanes {
                let mut out = [0.0; 16];
                Avx512::load(x).exp_nonpositive().store(&mut out);
                out
            }
            // SAFETY (both): the CPU has the features, checked first.
            if has!("avx2") && has!("fma") {
                let (ulps, absolute) = check("avx2", |x| unsafe { avx2(x) });
                eprintln!("avx2 exp: worst {ulps:.1} ulp, {absolute:.1e} absolute");
            }
            if has!("avx512f") && has!("avx512dq") && has!("avx2") && has!("fma") {
                let (ulps, absolute) = check("avx512", |x| unsafe { avx512(x) });
                eprintln!("avx512 exp: worst {ulps:.1} ulp, {absolute:.1e} absolute");
            } else {
                eprintln!("no AVX-512 here: the AVX-512 exp is not checked");
            }
        }
    }
}
