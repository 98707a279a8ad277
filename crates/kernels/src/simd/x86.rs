use std::arch::x86_64::*;

use super::{Lanes, Vector, WeightedRows};

/// One `__m512`. Only inside functions compiled with `avx512f`.
#[derive(Clone, Copy)]
pub(crate) struct Avx512(__m512);

// SAFETY (every block below): the vector types are only used in functions compiled for
// their instruction set, run on CPUs that have it; loads and stores are unaligned and within
// the 16 floats of a `Lanes`.
impl Vector for Avx512 {
    #[inline(always)]
    fn zero() -> Self {
        unsafe { Avx512(_mm512_setzero_ps()) }
    }
    #[inline(always)]
    fn splat(x: f32) -> Self {
        unsafe { Avx512(_mm512_set1_ps(x)) }
    }
    #[inline(always)]
    fn load(x: &Lanes) -> Self {
        unsafe { Avx512(_mm512_loadu_ps(x.as_ptr())) }
    }
    #[inline(always)]
    fn store(self, out: &mut Lanes) {
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), self.0) }
    }
    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        unsafe { Avx512(_mm512_fmadd_ps(self.0, b.0, c.0)) }
    }
    #[inline(always)]
    fn max(self, b: Self) -> Self {
        unsafe { Avx512(_mm512_max_ps(self.0, b.0)) }
    }
    #[inline(always)]
    fn add(self, b: Self) -> Self {
        unsafe { Avx512(_mm512_add_ps(self.0, b.0)) }
    }
    #[inline(always)]
    fn sub(self, b: Self) -> Self {
        unsafe { Avx512(_mm512_sub_ps(self.0, b.0)) }
    }
    #[inline(always)]
    fn mul(self, b: Self) -> Self {
        unsafe { Avx512(_mm512_mul_ps(self.0, b.0)) }
    }
    #[inline(always)]
    fn keep(self, bits: u16) -> Self {
        unsafe { Avx512(_mm512_maskz_mov_ps(bits, self.0)) }
    }
    #[inline(always)]
    fn pow2_of_rounded(self, magic: f32) -> Self {
        unsafe {
            let offset = _mm512_set1_epi32(127i32.wrapping_sub(magic.to_bits() as i32));
            let exponent = _mm512_add_epi32(_mm512_castps_si512(self.0), offset);
            Avx512(_mm512_castsi512_ps(_mm512_slli_epi32::<23>(exponent)))
        }
    }
    /// Four rounds of shuffles (64 instructions) instead of 256 scalar moves. Plain loops, no
    /// closures: a closure does not inherit the function's target features, and its
    /// intrinsics would be calls.
    #[inline(always)]
    fn transpose(rows: &[Lanes; 16]) -> [Lanes; 16] {
        unsafe {
            let mut r = [_mm512_setzero_ps(); 16];
            for i in 0..16 {
                r[i] = _mm512_loadu_ps(rows[i].as_ptr());
            }
            // Pairs of rows interleaved by element, then by pairs of elements...
            let mut t = [_mm512_setzero_ps(); 16];
            for i in (0..16).step_by(2) {
                t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
                t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
            }
            for base in (0..16).step_by(4) {
                for k in 0..4 {
                    let (a, b) = (_mm512_castps_pd(t[base + k / 2]), _mm512_castps_pd(t[base + k / 2 + 2]));
                    r[base + k] =
                        _mm512_castpd_ps(if k % 2 == 0 { _mm512_unpacklo_pd(a, b) } else { _mm512_unpackhi_pd(a, b) });
                }
            }
            // ...then by 128-bit quarters, across groups of four and of eight rows.
            for base in (0..16).step_by(8) {
                for k in 0..4 {
                    t[base + k] = _mm512_shuffle_f32x4::<0x88>(r[base + k], r[base + k + 4]);
                    t[base + k + 4] = _mm512_shuffle_f32x4::<0xdd>(r[base + k], r[base + k + 4]);
                }
            }
            let mut out = [[0.0; 16]; 16];
            for i in 0..8 {
                _mm512_storeu_ps(out[i].as_mut_ptr(), _mm512_shuffle_f32x4::<0x88>(t[i], t[i + 8]));
                _mm512_storeu_ps(out[i + 8].as_mut_ptr(), _mm512_shuffle_f32x4::<0xdd>(t[i], t[i + 8]));
            }
            out
        }
    }
    /// `exp(x) = 2^t` with `t = x log2(e)`: `vreduceps` gives `f = t - floor(t)` in `[0, 1)` and
    /// `vscalefps` multiplies `2^f` by `2^floor(t)`, taking underflow and `-inf` to 0 itself: no
    /// clamp and no integer exponent, 9 instructions where the portable `exp` takes 11 float and
    /// 2 integer ones (`super::exp` gives the error).
    #[inline(always)]
    fn exp_nonpositive(self) -> Self {
        unsafe { pow2(_mm512_mul_ps(self.0, _mm512_set1_ps(super::exp::LOG2_E))) }
    }
    /// `-shift log2(e)`, the start of [`Vector::exp_shifted`]'s multiply-add.
    #[inline(always)]
    fn shift_constant(shift: Self) -> Self {
        unsafe { Avx512(_mm512_mul_ps(shift.0, _mm512_set1_ps(-super::exp::LOG2_E))) }
    }
    /// `t = score log2(e) - shift log2(e)` in one multiply-add, where [`Vector::exp_nonpositive`]
    /// takes a subtraction and a multiplication.
    #[inline(always)]
    fn exp_shifted(score: Self, constant: Self) -> Self {
        unsafe { pow2(_mm512_fmadd_ps(score.0, _mm512_set1_ps(super::exp::LOG2_E), constant.0)) }
    }
}

/// `2^t` for lanes `t <= 0` (0 below float32's range): `vreduceps` gives `f = t - floor(t)` in
/// `[0, 1)`, a polynomial `2^f`, and `vscalefps` multiplies it by `2^floor(t)`. Only inside
/// functions compiled with `avx512f,avx512dq`.
#[inline(always)]
fn pow2(t: __m512) -> Avx512 {
    let [c6, c5, c4, c3, c2, c1] = super::exp::POW2_ON_UNIT;
    // SAFETY: see the `Vector` implementations.
    unsafe {
        // imm8 0b1001: keep no fraction bits, round down, suppress the precision exception.
        let f = _mm512_reduce_ps::<0b1001>(t);
        let mut p = _mm512_set1_ps(c6);
        for c in [c5, c4, c3, c2, c1, 1.0] {
            p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(c));
        }
        Avx512(_mm512_scalef_ps(p, t))
    }
}

/// Two `__m256`. Only inside functions compiled with `avx2,fma`.
#[derive(Clone, Copy)]
pub(crate) struct Avx2([__m256; 2]);

impl Vector for Avx2 {
    #[inline(always)]
    fn zero() -> Self {
        unsafe { Avx2([_mm256_setzero_ps(); 2]) }
    }
    #[inline(always)]
    fn splat(x: f32) -> Self {
        unsafe { Avx2([_mm256_set1_ps(x); 2]) }
    }
    #[inline(always)]
    fn load(x: &Lanes) -> Self {
        unsafe { Avx2([_mm256_loadu_ps(x.as_ptr()), _mm256_loadu_ps(x.as_ptr().add(8))]) }
    }
    #[inline(always)]
    fn store(self, out: &mut Lanes) {
        unsafe {
            _mm256_storeu_ps(out.as_mut_ptr(), self.0[0]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), self.0[1]);
        }
    }
    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        unsafe { Avx2([_mm256_fmadd_ps(self.0[0], b.0[0], c.0[0]), _mm256_fmadd_ps(self.0[1], b.0[1], c.0[1])]) }
    }
    #[inline(always)]
    fn max(self, b: Self) -> Self {
        unsafe { Avx2([_mm256_max_ps(self.0[0], b.0[0]), _mm256_max_ps(self.0[1], b.0[1])]) }
    }
    #[inline(always)]
    fn add(self, b: Self) -> Self {
        unsafe { Avx2([_mm256_add_ps(self.0[0], b.0[0]), _mm256_add_ps(self.0[1], b.0[1])]) }
    }
    #[inline(always)]
    fn sub(self, b: Self) -> Self {
        unsafe { Avx2([_mm256_sub_ps(self.0[0], b.0[0]), _mm256_sub_ps(self.0[1], b.0[1])]) }
    }
    #[inline(always)]
    fn mul(self, b: Self) -> Self {
        unsafe { Avx2([_mm256_mul_ps(self.0[0], b.0[0]), _mm256_mul_ps(self.0[1], b.0[1])]) }
    }
    #[inline(always)]
    fn keep(self, bits: u16) -> Self {
        // No closures here or below: a closure does not inherit the caller's target features.
        Avx2([keep_half(self.0[0], bits & 0xff), keep_half(self.0[1], bits >> 8)])
    }
    /// Four 8 x 8 blocks, each in three rounds of shuffles (24 instructions) instead of 64 scalar
    /// moves. Plain loops, no closures (see [`Avx512::transpose`]).
    #[inline(always)]
    fn transpose(rows: &[Lanes; 16]) -> [Lanes; 16] {
        let mut out = [[0.0; 16]; 16];
        unsafe {
            for (row_half, column_half) in [(0, 0), (0, 1), (1, 0), (1, 1)] {
                // r[k]: lanes 8c.. of row 8r + k; the block's transpose goes to out[8c + k][8r..].
                let mut r = [_mm256_setzero_ps(); 8];
                for k in 0..8 {
                    r[k] = _mm256_loadu_ps(rows[8 * row_half + k].as_ptr().add(8 * column_half));
                }
                // Pairs of rows interleaved by element, then by pairs of elements, then halves.
                let mut t = [_mm256_setzero_ps(); 8];
                for k in (0..8).step_by(2) {
                    t[k] = _mm256_unpacklo_ps(r[k], r[k + 1]);
                    t[k + 1] = _mm256_unpackhi_ps(r[k], r[k + 1]);
                }
                for base in [0, 4] {
                    r[base] = _mm256_shuffle_ps::<0x44>(t[base], t[base + 2]);
                    r[base + 1] = _mm256_shuffle_ps::<0xEE>(t[base], t[base + 2]);
                    r[base + 2] = _mm256_shuffle_ps::<0x44>(t[base + 1], t[base + 3]);
                    r[base + 3] = _mm256_shuffle_ps::<0xEE>(t[base + 1], t[base + 3]);
                }
                for k in 0..4 {
                    let (low, high) = (r[k], r[k + 4]);
                    let column = &mut out[8 * column_half..];
                    _mm256_storeu_ps(
                        column[k].as_mut_ptr().add(8 * row_half),
                        _mm256_permute2f128_ps::<0x20>(low, high),
                    );
                    _mm256_storeu_ps(
                        column[k + 4].as_mut_ptr().add(8 * row_half),
                        _mm256_permute2f128_ps::<0x31>(low, high),
                    );
                }
            }
        }
        out
    }
    #[inline(always)]
    fn exp_nonpositive(self) -> Self {
        Avx2([exp_half(self.0[0]), exp_half(self.0[1])])
    }
    /// `ceil(bound 8 log2(e)) / (8 log2(e))`: a shift whose multiple of `8 log2(e)` is an
    /// integer `K`, which [`Vector::shift_constant`] folds into the reduction's rounding constant.
    #[inline(always)]
    fn bounded_shift(bound: Self) -> Self {
        unsafe {
            let eight_log2_e = _mm256_set1_ps(8.0 * super::exp::LOG2_E);
            let [low, high] = bound.0;
            let low = _mm256_div_ps(_mm256_ceil_ps(_mm256_mul_ps(low, eight_log2_e)), eight_log2_e);
            let high = _mm256_div_ps(_mm256_ceil_ps(_mm256_mul_ps(high, eight_log2_e)), eight_log2_e);
            Avx2([low, high])
        }
    }
    /// `ROUND_MAGIC - K` for a shift `K / (8 log2(e))` ([`exp_half_shifted`]).
    #[inline(always)]
    fn shift_constant(shift: Self) -> Self {
        Avx2([shift_constant_half(shift.0[0]), shift_constant_half(shift.0[1])])
    }
    #[inline(always)]
    fn exp_shifted(score: Self, constant: Self) -> Self {
        Avx2([exp_half_shifted(score.0[0], constant.0[0]), exp_half_shifted(score.0[1], constant.0[1])])
    }
    /// [`Vector::exp_weighted_rows`] one half at a time: both halves' accumulators, the
    /// exponentials' temporaries and constants do not fit in AVX2's 16 registers together, and
    /// spilled they make each row a store and a reload.
    #[inline(always)]
    fn exp_weighted_rows<const W: usize, const MASKED: bool, const DROPOUT: bool, const BOUNDED: bool>(
        rows: WeightedRows,
        shift: Self,
        context: &mut [Lanes],
    ) -> Self {
        rows.check(W, context);
        let mut total = Self::zero().0;
        for (half, total) in total.iter_mut().enumerate() {
            unsafe {
                let mut acc = load_half::<W>(context, half);
                let (shift, mut sum) = (shift.0[half], _mm256_setzero_ps());
                let constant = shift_constant_half(shift);
                for (score, row, bits, keep) in rows.iter() {
                    let score = _mm256_loadu_ps(score[8 * half..].as_ptr());
                    let p = match BOUNDED {
                        true => exp_half_shifted(score, constant),
                        false => exp_half(_mm256_sub_ps(score, shift)),
                    };
                    let (bits, keep) = (bits >> (8 * half), keep >> (8 * half));
                    sum =
                        _mm256_add_ps(sum, add_weighted_half::<W, MASKED, DROPOUT>(p, bits, keep, &row[..W], &mut acc));
                }
                store_half(&acc, context, half);
                *total = sum;
            }
        }
        Avx2(total)
    }
    #[inline(always)]
    fn pow2_of_rounded(self, magic: f32) -> Self {
        unsafe {
            let offset = _mm256_set1_epi32(127i32.wrapping_sub(magic.to_bits() as i32));
            let mut out = self.0;
            for half in out.iter_mut() {
                *half =
                    _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_castps_si256(*half), offset)));
            }
            Avx2(out)
        }
    }
}

/// The lanes of `x` whose bit of `bits` is set (lane `i`, bit `i`; bits above 8 ignored), 0
/// elsewhere. Only inside functions compiled with `avx2`.
#[inline(always)]
fn keep_half(x: __m256, bits: u16) -> __m256 {
    // SAFETY: see the `Vector` implementations.
    unsafe {
        let lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
        let set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(i32::from(bits & 0xff)), lane_bits), lane_bits);
        _mm256_and_ps(x, _mm256_castsi256_ps(set))
    }
}

/// `exp(x)` for lanes `x <= 0` of one AVX2 register: clamped to [`super::exp::UNDERFLOW`], then
/// [`exp_half_shifted`] with no shift. Only inside functions compiled with `avx2,fma`.
#[inline(always)]
fn exp_half(x: __m256) -> __m256 {
    // SAFETY: see the `Vector` implementations.
    unsafe {
        let clamped = _mm256_max_ps(x, _mm256_set1_ps(super::exp::UNDERFLOW));
        exp_half_shifted(clamped, _mm256_set1_ps(super::exp::ROUND_MAGIC))
    }
}

/// [`exp_half_shifted`]'s constant for a shift `s = K / (8 log2(e))` with an integer `K` (from
/// [`Vector::bounded_shift`]): `ROUND_MAGIC - K`, exact (`8 log2(e) s` is within 1e-5 of `K`,
/// and the multiply-add rounds to the integers there). Only inside functions compiled with
/// `avx2,fma`.
#[inline(always)]
fn shift_constant_half(shift: __m256) -> __m256 {
    use super::exp::{LOG2_E, ROUND_MAGIC};
    // SAFETY: see the `Vector` implementations.
    unsafe { _mm256_fnmadd_ps(shift, _mm256_set1_ps(8.0 * LOG2_E), _mm256_set1_ps(ROUND_MAGIC)) }
}

/// `exp(x - s)` for lanes `x - s` in `[UNDERFLOW, 0]` of one AVX2 register (below, the exponent
/// bits wrap), for `constant = ROUND_MAGIC - K` and `s = K / (8 log2(e))`
/// ([`shift_constant_half`]; `ROUND_MAGIC` itself for no shift): `exp(x - s) = 2^(u/8)` with
/// `u = 8 log2(e) x - K` rounded to `n = 8e + j` by the multiply-add `8 log2(e) x + constant`,
/// which leaves `ROUND_MAGIC + n` (1.5 * 2^23 puts `n` in the sum's low mantissa bits), so the
/// shift costs no instruction of its own; `g = u - n = 8 log2(e) x + (constant - rounded)`,
/// `|g| <= 1/2` (the difference exact, the multiply-add rounding once). `2^(g/8)` from a cubic,
/// times `2^(j/8)` from a register indexed by the low 3 bits of `n`, whose entries hold their
/// bits minus `j << 20` so that adding `n << 20` sets the exponent `e` in the same integer add
/// (`super::exp` gives the error). Only inside functions compiled with `avx2,fma`.
#[inline(always)]
fn exp_half_shifted(x: __m256, constant: __m256) -> __m256 {
    use super::exp::{EIGHTHS, LOG2_E, POW2_ON_EIGHTHS};
    const TABLE: [i32; 8] = {
        let mut table = [0; 8];
        let mut j = 0;
        while j < 8 {
            table[j] = EIGHTHS[j].to_bits() as i32 - ((j as i32) << 20);
            j += 1;
        }
        table
    };
    let [c3, c2, c1] = POW2_ON_EIGHTHS;
    // SAFETY: see the `Vector` implementations.
    unsafe {
        let table = _mm256_loadu_si256(TABLE.as_ptr().cast());
        let eight_log2_e = _mm256_set1_ps(8.0 * LOG2_E);
        let rounded = _mm256_fmadd_ps(x, eight_log2_e, constant); // ROUND_MAGIC + n
        let minus_k_n = _mm256_sub_ps(constant, rounded); // -K - n, exact
        let g = _mm256_fmadd_ps(x, eight_log2_e, minus_k_n); // u - n, |g| <= 1/2
        let q = _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(c3), g, _mm256_set1_ps(c2)), g, _mm256_set1_ps(c1));
        let n = _mm256_castps_si256(rounded); // low mantissa bits: n
        let scale = _mm256_add_epi32(_mm256_permutevar8x32_epi32(table, n), _mm256_slli_epi32::<20>(n));
        let scale = _mm256_castsi256_ps(scale); // 2^e 2^(j/8)
        // scale (1 + g Q(g)): the small term added to the exact scale, no constant 1.
        _mm256_fmadd_ps(_mm256_mul_ps(q, g), scale, scale)
    }
}

/// One row's exponentials `p` of one half into [`Avx2::exp_weighted_rows`]' sums: masked by
/// `bits` where `MASKED` and returned for the sum; `acc[d] += p · row[d]`, `p` kept by `keep`
/// first where `DROPOUT`. Only inside functions compiled with `avx2,fma`.
#[inline(always)]
fn add_weighted_half<const W: usize, const MASKED: bool, const DROPOUT: bool>(
    mut p: __m256,
    bits: u16,
    keep: u16,
    row: &[f32],
    acc: &mut [__m256; W],
) -> __m256 {
    if MASKED {
        p = keep_half(p, bits);
    }
    let counted = p;
    if DROPOUT {
        p = keep_half(p, keep);
    }
    // SAFETY: see the `Vector` implementations.
    unsafe {
        for (acc, v) in acc.iter_mut().zip(&row[..W]) {
            *acc = _mm256_fmadd_ps(p, _mm256_broadcast_ss(v), *acc);
        }
    }
    counted
}

/// Half `half` (lanes `8 half..8 half + 8`) of the first `W` vectors of `x`, in registers. Only
/// inside functions compiled with `avx2`.
#[inline(always)]
fn load_half<const W: usize>(x: &[Lanes], half: usize) -> [__m256; W] {
    let mut out = [unsafe { _mm256_setzero_ps() }; W];
    for (out, x) in out.iter_mut().zip(&x[..W]) {
        // SAFETY: see the `Vector` implementations; 8 of the 16 floats.
        *out = unsafe { _mm256_loadu_ps(x[8 * half..].as_ptr()) };
    }
    out
}

/// `acc` into half `half` of the first `W` vectors of `x`. Only inside functions compiled with
/// `avx2`.
#[inline(always)]
fn store_half<const W: usize>(acc: &[__m256; W], x: &mut [Lanes], half: usize) {
    for (acc, x) in acc.iter().zip(&mut x[..W]) {
        // SAFETY: see the `Vector` implementations; 8 of the 16 floats.
        unsafe { _mm256_storeu_ps(x[8 * half..].as_mut_ptr(), *acc) };
    }
}
