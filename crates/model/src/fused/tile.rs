//! The two register-blocked products every pass of the kernel is made of.
//!
//! A tile holds 16 rows (query rows, or keys) in the lanes of one vector, [`Lanes`]; a matrix
//! with rows in lanes is stored feature by feature, `[W] x Lanes`. Against it the kernel needs
//!
//! * [`lane_dots`]: `out[r] = Σ_d tile[d] · rows[r][d]`, the 16 dot products of each of `n` rows
//!   (scores `q kᵀ`, and `dO vᵀ`);
//! * [`lane_accumulate`]: `acc[d] += Σ_r weights[r] · rows[r][d]`, a weighted sum of `n` rows
//!   into a tile (`P v`, `dS k`, `Pᵀ dO`, `dSᵀ q`).
//!
//! Both keep `NR` accumulator vectors in registers (8 with AVX-512's 32 registers, fewer with
//! AVX2 or SSE) and broadcast each scalar of `rows` once per `NR` fused multiply-adds, so their
//! rate is that of the FMA units at any feature width, not of the loads. They are written on
//! explicit vectors ([`Vector`]): left to itself, LLVM vectorises the feature loop instead, with
//! gathers and scatters, at a tenth of the speed. Vector code here holds no closures: a closure
//! does not inherit its caller's target features, so the intrinsics in one that LLVM does not
//! inline become calls (the 16 x 16 transpose once ran at half speed that way).

use super::kernel::LANES;

/// 16 float32 values: one AVX-512 register, two AVX2 ones.
pub type Lanes = [f32; LANES];

/// A lane-wise expression as a vector.
#[inline(always)]
pub fn lanes(f: impl Fn(usize) -> f32) -> Lanes {
    std::array::from_fn(f)
}

/// 16 lanes in registers, for one instruction set. The x86 implementations call intrinsics of
/// their instruction set: they are only used inside functions compiled for it (see the
/// kernel's `dispatch!`), which only run on CPUs that have it.
pub trait Vector: Copy {
    fn zero() -> Self;
    fn splat(x: f32) -> Self;
    fn load(x: &Lanes) -> Self;
    fn store(self, out: &mut Lanes);
    /// `self * b + c` (fused where the instruction set has FMA)
    fn mul_add(self, b: Self, c: Self) -> Self;
    fn max(self, b: Self) -> Self;
    fn add(self, b: Self) -> Self;
    fn sub(self, b: Self) -> Self;
    fn mul(self, b: Self) -> Self;
    /// `self` in the lanes whose bit is set, 0 elsewhere.
    fn keep(self, bits: u16) -> Self;
    /// `2^n` for the `n` that [`exp`](super::exp)'s rounding trick holds in the low mantissa bits
    /// of `self`: the bit pattern `(bits(self) - bits(magic) + 127) << 23`.
    fn pow2_of_rounded(self, magic: f32) -> Self;
    /// `exp(self)` for lanes `<= 0` ([`exp::exp_nonpositive`](super::exp::exp_nonpositive)), unless
    /// the instruction set has a shorter way.
    #[inline(always)]
    fn exp_nonpositive(self) -> Self {
        super::exp::exp_nonpositive(self)
    }
    /// The 16 x 16 block `rows` transposed: lane `i` of output `j` is lane `j` of row `i`.
    #[inline(always)]
    fn transpose(rows: &[Lanes; LANES]) -> [Lanes; LANES] {
        std::array::from_fn(|j| std::array::from_fn(|i| rows[i][j]))
    }
}

/// The lane-wise maximum of `rows`, starting from `init`.
#[inline(always)]
pub fn lane_max<V: Vector>(rows: &[Lanes], init: Lanes) -> Lanes {
    let mut max = V::load(&init);
    for row in rows {
        max = max.max(V::load(row));
    }
    let mut out = [0.0; LANES];
    max.store(&mut out);
    out
}

/// The baseline: plain arrays, whatever the compiler makes of them.
#[derive(Clone, Copy)]
pub struct Portable(Lanes);

impl Vector for Portable {
    #[inline(always)]
    fn zero() -> Self {
        Portable([0.0; LANES])
    }
    #[inline(always)]
    fn splat(x: f32) -> Self {
        Portable([x; LANES])
    }
    #[inline(always)]
    fn load(x: &Lanes) -> Self {
        Portable(*x)
    }
    #[inline(always)]
    fn store(self, out: &mut Lanes) {
        *out = self.0;
    }
    #[inline(always)]
    fn mul_add(self, b: Self, c: Self) -> Self {
        Portable(lanes(|i| self.0[i] * b.0[i] + c.0[i]))
    }
    #[inline(always)]
    fn max(self, b: Self) -> Self {
        Portable(lanes(|i| self.0[i].max(b.0[i])))
    }
    #[inline(always)]
    fn add(self, b: Self) -> Self {
        Portable(lanes(|i| self.0[i] + b.0[i]))
    }
    #[inline(always)]
    fn sub(self, b: Self) -> Self {
        Portable(lanes(|i| self.0[i] - b.0[i]))
    }
    #[inline(always)]
    fn mul(self, b: Self) -> Self {
        Portable(lanes(|i| self.0[i] * b.0[i]))
    }
    #[inline(always)]
    fn keep(self, bits: u16) -> Self {
        Portable(lanes(|i| if bits >> i & 1 == 1 { self.0[i] } else { 0.0 }))
    }
    #[inline(always)]
    fn pow2_of_rounded(self, magic: f32) -> Self {
        Portable(lanes(|i| f32::from_bits(self.0[i].to_bits().wrapping_sub(magic.to_bits()).wrapping_add(127) << 23)))
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{Lanes, Vector};

    /// One `__m512`. Only inside functions compiled with `avx512f`.
    #[derive(Clone, Copy)]
    pub struct Avx512(__m512);

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
                        r[base + k] = _mm512_castpd_ps(if k % 2 == 0 {
                            _mm512_unpacklo_pd(a, b)
                        } else {
                            _mm512_unpackhi_pd(a, b)
                        });
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
        /// The same reduction and polynomial as the portable `exp` in 13 instructions instead of
        /// 17: `n` by `vrndscaleps`, the polynomial by Horner's rule, `2^n` by `vscalefps`.
        #[inline(always)]
        fn exp_nonpositive(self) -> Self {
            use crate::fused::exp::{LN2_HI, LN2_LO, LOG2_E, POLYNOMIAL, UNDERFLOW};
            let [c5, c4, c3, c2, c1, c0] = POLYNOMIAL;
            unsafe {
                let x = _mm512_max_ps(self.0, _mm512_set1_ps(UNDERFLOW));
                let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
                    x,
                    _mm512_set1_ps(LOG2_E),
                ));
                let r = _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_LO), _mm512_fmadd_ps(n, _mm512_set1_ps(-LN2_HI), x));
                // exp(r) = 1 + r + r² P(r): Horner's rule over P's coefficients, then 1 and 1.
                let mut p = _mm512_set1_ps(c5);
                for c in [c4, c3, c2, c1, c0, 1.0, 1.0] {
                    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(c));
                }
                Avx512(_mm512_scalef_ps(p, n))
            }
        }
    }

    /// Two `__m256`. Only inside functions compiled with `avx2,fma`.
    #[derive(Clone, Copy)]
    pub struct Avx2([__m256; 2]);

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
            unsafe {
                // Lane i of each half tests bit i (low half) or 8 + i (high half).
                let lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
                let mut out = self.0;
                for (half, bits) in out.iter_mut().zip([i32::from(bits & 0xff), i32::from(bits >> 8)]) {
                    let set = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(bits), lane_bits), lane_bits);
                    *half = _mm256_and_ps(*half, _mm256_castsi256_ps(set));
                }
                Avx2(out)
            }
        }
        #[inline(always)]
        fn pow2_of_rounded(self, magic: f32) -> Self {
            unsafe {
                let offset = _mm256_set1_epi32(127i32.wrapping_sub(magic.to_bits() as i32));
                let mut out = self.0;
                for half in out.iter_mut() {
                    *half = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                        _mm256_castps_si256(*half),
                        offset,
                    )));
                }
                Avx2(out)
            }
        }
    }
}

/// `out[r] = Σ_d tile[d] · rows[r * row_stride + d * depth_stride]` for `d < tile.len()`;
/// `out.len()` must be a multiple of `NR`. The depth stride lets the GEMM read a transposed
/// operand in place (the kernel's rows are contiguous: `depth_stride = 1`).
#[inline(always)]
pub fn lane_dots<V: Vector, const NR: usize>(
    tile: &[Lanes],
    rows: &[f32],
    row_stride: usize,
    depth_stride: usize,
    out: &mut [Lanes],
) {
    let width = tile.len();
    for (group, out) in out.chunks_exact_mut(NR).enumerate() {
        let first = group * NR * row_stride;
        if width > 0 {
            let last = first + (NR - 1) * row_stride + (width - 1) * depth_stride;
            assert!(last < rows.len(), "lane_dots reads element {last} of {}", rows.len());
        }
        // SAFETY: every element read below is at most `last`, checked above; checked per
        // element, the NR bounds tests would cost as much as the multiply-adds.
        let starts: [*const f32; NR] = std::array::from_fn(|r| unsafe { rows.as_ptr().add(first + r * row_stride) });
        let mut acc = [V::zero(); NR];
        for (d, column) in tile.iter().enumerate() {
            let column = V::load(column);
            let offset = d * depth_stride;
            for r in 0..NR {
                let x = unsafe { *starts[r].add(offset) };
                acc[r] = column.mul_add(V::splat(x), acc[r]);
            }
        }
        for (acc, out) in acc.into_iter().zip(out) {
            acc.store(out);
        }
    }
}

/// `acc[d] += Σ_r weights[r] · rows[r * stride + d]` for `d < acc.len()`, a multiple of 4.
#[inline(always)]
pub fn lane_accumulate<V: Vector, const NR: usize>(weights: &[Lanes], rows: &[f32], stride: usize, acc: &mut [Lanes]) {
    let width = acc.len();
    let mut first = 0;
    while first < width {
        if width - first >= NR {
            accumulate_columns::<V, NR>(weights, rows, stride, first, &mut acc[first..first + NR]);
            first += NR;
        } else {
            accumulate_columns::<V, 4>(weights, rows, stride, first, &mut acc[first..first + 4]);
            first += 4;
        }
    }
}

/// [`lane_accumulate`] for the `C` features `first ..`, held in registers over all rows.
#[inline(always)]
fn accumulate_columns<V: Vector, const C: usize>(
    weights: &[Lanes],
    rows: &[f32],
    stride: usize,
    first: usize,
    acc: &mut [Lanes],
) {
    // A loop, not `array::from_fn`: a closure does not inherit the caller's target features.
    let mut sums = [V::zero(); C];
    for c in 0..C {
        sums[c] = V::load(&acc[c]);
    }
    for (r, weight) in weights.iter().enumerate() {
        let row = &rows[r * stride + first..][..C];
        let weight = V::load(weight);
        for c in 0..C {
            sums[c] = weight.mul_add(V::splat(row[c]), sums[c]);
        }
    }
    for (sum, out) in sums.into_iter().zip(acc) {
        sum.store(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transposes_match_the_definition_on_every_instruction_set() {
        let rows: [Lanes; LANES] = std::array::from_fn(|i| lanes(|j| (i * 16 + j) as f32));
        let want: [Lanes; LANES] = std::array::from_fn(|j| lanes(|i| rows[i][j]));
        assert_eq!(Portable::transpose(&rows), want);
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn avx512(rows: &[Lanes; LANES]) -> [Lanes; LANES] {
                Avx512::transpose(rows)
            }
            // SAFETY: the CPU has AVX-512 (checked above).
            assert_eq!(unsafe { avx512(&rows) }, want);
        }
    }

    #[test]
    fn products_match_their_definitions() {
        let (n, width, stride) = (16, 12, 13);
        let tile: Vec<Lanes> = (0..width).map(|d| lanes(|i| (d * 16 + i) as f32 * 0.01)).collect();
        let rows: Vec<f32> = (0..n * stride).map(|x| (x % 7) as f32 - 3.0).collect();
        let mut out = vec![[0.0; LANES]; n];
        lane_dots::<Portable, 8>(&tile, &rows, stride, 1, &mut out);
        for r in 0..n {
            for i in 0..LANES {
                let want: f32 = (0..width).map(|d| tile[d][i] * rows[r * stride + d]).sum();
                assert!((out[r][i] - want).abs() < 1e-4, "dots r {r} lane {i}");
            }
        }
        for nr in [2, 4, 8] {
            let mut acc = vec![[1.0; LANES]; width];
            match nr {
                2 => lane_accumulate::<Portable, 2>(&out, &rows, stride, &mut acc),
                4 => lane_accumulate::<Portable, 4>(&out, &rows, stride, &mut acc),
                _ => lane_accumulate::<Portable, 8>(&out, &rows, stride, &mut acc),
            }
            for d in 0..width {
                for i in 0..LANES {
                    let want: f32 = 1.0 + (0..n).map(|r| out[r][i] * rows[r * stride + d]).sum::<f32>();
                    assert!((acc[d][i] - want).abs() < 1e-3 * want.abs().max(1.0), "accumulate nr {nr} d {d} lane {i}");
                }
            }
        }
    }
}
