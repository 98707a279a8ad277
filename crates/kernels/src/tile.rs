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
//! Both keep `NR` accumulator vectors in registers (8 with AVX-512's 32 registers, 6 of two
//! halves with AVX2's 16) and broadcast each scalar of `rows` once per `NR` fused multiply-adds,
//! so their rate is that of the FMA units at any feature width, not of the loads. They are written on
//! explicit vectors ([`Vector`]): left to itself, LLVM vectorises the feature loop instead, with
//! gathers and scatters, at a tenth of the speed. Vector code here holds no closures: a closure
//! does not inherit its caller's target features, so the intrinsics in one that LLVM does not
//! inline become calls (the 16 x 16 transpose once ran at half speed that way).

use crate::simd::{LANES, Lanes, Vector};

/// The lane-wise maximum of `rows`, starting from `init`.
#[inline(always)]
pub(crate) fn lane_max<V: Vector>(rows: &[Lanes], init: Lanes) -> Lanes {
    let mut max = V::load(&init);
    for row in rows {
        max = max.max(V::load(row));
    }
    let mut out = [0.0; LANES];
    max.store(&mut out);
    out
}

/// `out[r] = Σ_d tile[d] · rows[r * row_stride + d * depth_stride]` for `d < tile.len()`, `NR`
/// rows at a time (then 4, 2 and 1 for the rest). The depth stride lets the GEMM read a
/// transposed operand in place (the kernel's rows are contiguous: `depth_stride = 1`).
#[inline(always)]
pub(crate) fn lane_dots<V: Vector, const NR: usize>(
    tile: &[Lanes],
    rows: &[f32],
    row_stride: usize,
    depth_stride: usize,
    out: &mut [Lanes],
) {
    let mut first = 0;
    while first < out.len() {
        let group = &mut out[first..];
        let done = match group.len() {
            left if left >= NR => dot_rows::<V, NR>(tile, rows, first, row_stride, depth_stride, group),
            left if left >= 4 => dot_rows::<V, 4>(tile, rows, first, row_stride, depth_stride, group),
            left if left >= 2 => dot_rows::<V, 2>(tile, rows, first, row_stride, depth_stride, group),
            _ => dot_rows::<V, 1>(tile, rows, first, row_stride, depth_stride, group),
        };
        first += done;
    }
}

/// [`lane_dots`] of the `R` rows `first ..` into `out[..R]`, held in registers over the depth;
/// returns `R`.
#[inline(always)]
fn dot_rows<V: Vector, const R: usize>(
    tile: &[Lanes],
    rows: &[f32],
    first: usize,
    row_stride: usize,
    depth_stride: usize,
    out: &mut [Lanes],
) -> usize {
    let width = tile.len();
    let first = first * row_stride;
    if width > 0 {
        let last = first + (R - 1) * row_stride + (width - 1) * depth_stride;
        assert!(last < rows.len(), "lane_dots reads element {last} of {}", rows.len());
    }
    // SAFETY: every element read below is at most `last`, checked above; checked per element,
    // the R bounds tests would cost as much as the multiply-adds. (A loop, not `array::from_fn`,
    // which LLVM left as a call: a cost per group of rows, large at narrow heads.)
    let mut starts = [rows.as_ptr(); R];
    for (r, start) in starts.iter_mut().enumerate() {
        *start = unsafe { rows.as_ptr().add(first + r * row_stride) };
    }
    let mut acc = [V::zero(); R];
    for (d, column) in tile.iter().enumerate() {
        let column = V::load(column);
        let offset = d * depth_stride;
        for r in 0..R {
            let x = unsafe { *starts[r].add(offset) };
            acc[r] = column.mul_add(V::splat(x), acc[r]);
        }
    }
    for (acc, out) in acc.into_iter().zip(out) {
        acc.store(out);
    }
    R
}

/// `acc[d] += Σ_r weights[r] · rows[r * stride + d]` for `d < acc.len()`, `NR` features at a
/// time (then 4, 2 and 1 for the rest).
///
/// Each feature's sum is a chain of dependent multiply-adds, one per row. A group of `C < NR`
/// features (every group of a head of 4 features) keeps only `C` chains in flight. With
/// AVX-512 that fills a core that retires one 512-bit FMA per cycle of its latency, but only
/// half of one that retires two (Intel's server cores); an AVX2 vector is two registers, so
/// there only groups of 2 and 1 fall short. With `split` such a group walks its rows in
/// `NR / C` interleaved sets with sums of their own, added at the end; whether this core needs
/// it is measured once ([`crate::tuning::split_narrow_sums`]).
#[inline(always)]
pub(crate) fn lane_accumulate<V: Vector, const NR: usize>(
    weights: &[Lanes],
    rows: &[f32],
    stride: usize,
    acc: &mut [Lanes],
    split: bool,
) {
    let width = acc.len();
    let mut first = 0;
    while first < width {
        let columns = &mut acc[first..];
        first += match columns.len() {
            left if left >= NR => accumulate_columns::<V, NR>(weights, rows, stride, first, columns),
            left if left >= 4 => accumulate_narrow::<V, 4, NR>(weights, rows, stride, first, columns, split),
            left if left >= 2 => accumulate_narrow::<V, 2, NR>(weights, rows, stride, first, columns, split),
            _ => accumulate_narrow::<V, 1, NR>(weights, rows, stride, first, columns, split),
        };
    }
}

/// [`accumulate_columns`] of `C < NR` features, or with `split` [`accumulate_in_sets`] in
/// `NR / C` sets.
#[inline(always)]
fn accumulate_narrow<V: Vector, const C: usize, const NR: usize>(
    weights: &[Lanes],
    rows: &[f32],
    stride: usize,
    first: usize,
    acc: &mut [Lanes],
    split: bool,
) -> usize {
    if split {
        accumulate_in_sets::<V, C>(weights, rows, stride, first, acc, NR / C)
    } else {
        accumulate_columns::<V, C>(weights, rows, stride, first, acc)
    }
}

/// [`lane_accumulate`] for the `C` features `first ..` into `acc[..C]`, held in registers over
/// all rows; returns `C`.
#[inline(always)]
fn accumulate_columns<V: Vector, const C: usize>(
    weights: &[Lanes],
    rows: &[f32],
    stride: usize,
    first: usize,
    acc: &mut [Lanes],
) -> usize {
    // A loop, not `array::from_fn`: a closure does not inherit the caller's target features.
    let mut sums = [V::zero(); C];
    for c in 0..C {
        sums[c] = V::load(&acc[c]);
    }
    for (r, weight) in weights.iter().enumerate() {
        add_weighted_row(&mut sums, weight, &rows[r * stride + first..][..C]);
    }
    for (sum, out) in sums.into_iter().zip(acc) {
        sum.store(out);
    }
    C
}

/// `sums[c] += weight · row[c]`: one row of a weighted sum, in registers.
#[inline(always)]
fn add_weighted_row<V: Vector, const C: usize>(sums: &mut [V; C], weight: &Lanes, row: &[f32]) {
    let weight = V::load(weight);
    for (sum, &x) in sums.iter_mut().zip(row) {
        *sum = weight.mul_add(V::splat(x), *sum);
    }
}

/// The most row sets [`accumulate_in_sets`] walks.
const MAX_SETS: usize = 8;

/// [`accumulate_columns`] with the rows walked in `sets` interleaved sets (row `r` in set
/// `r % sets`; a constant once inlined), each with sums of its own, added at the end. Not
/// merged with it as `sets = 1`: that one function made the unsplit seed's forward pass 2-4%
/// slower on a Zen 4, so the path every core without the split takes stays as it was.
#[inline(always)]
fn accumulate_in_sets<V: Vector, const C: usize>(
    weights: &[Lanes],
    rows: &[f32],
    stride: usize,
    first: usize,
    acc: &mut [Lanes],
    sets: usize,
) -> usize {
    let sets = sets.clamp(1, MAX_SETS);
    let mut sums = [[V::zero(); C]; MAX_SETS];
    for c in 0..C {
        sums[0][c] = V::load(&acc[c]);
    }
    let mut groups = weights.chunks_exact(sets);
    for (group, group_weights) in (&mut groups).enumerate() {
        for (set, (sums, weight)) in sums.iter_mut().zip(group_weights).enumerate() {
            add_weighted_row(sums, weight, &rows[(group * sets + set) * stride + first..][..C]);
        }
    }
    let whole = weights.len() - groups.remainder().len();
    for (r, weight) in groups.remainder().iter().enumerate() {
        add_weighted_row(&mut sums[0], weight, &rows[(whole + r) * stride + first..][..C]);
    }
    let (total, others) = sums.split_at_mut(1);
    for set in others.iter().take(sets - 1) {
        for (total, sum) in total[0].iter_mut().zip(set) {
            *total = total.add(*sum);
        }
    }
    for (sum, out) in total[0].into_iter().zip(acc) {
        sum.store(out);
    }
    C
}

/// Seconds per vector multiply-add of `CHAINS` independent chains of them, `iterations` rounds:
/// the rate [`accumulate_columns`] with that many sums can reach.
#[inline(always)]
pub(crate) fn multiply_add_time<V: Vector, const CHAINS: usize>(iterations: usize) -> f64 {
    let (a, b) = (V::splat(std::hint::black_box(0.999_999)), V::splat(std::hint::black_box(1e-7)));
    let mut sums = [V::splat(1.0); CHAINS];
    let start = std::time::Instant::now();
    for _ in 0..iterations {
        for sum in sums.iter_mut() {
            *sum = sum.mul_add(a, b);
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    let mut out = [0.0; LANES];
    for sum in sums {
        sum.store(&mut out);
        std::hint::black_box(&out);
    }
    seconds / (iterations * CHAINS) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "x86_64")]
    use crate::simd::{Avx2, Avx512};
    use crate::simd::{Portable, lanes};

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
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2(rows: &[Lanes; LANES]) -> [Lanes; LANES] {
                Avx2::transpose(rows)
            }
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            assert_eq!(unsafe { avx2(&rows) }, want);
        }
    }

    #[test]
    fn products_match_their_definitions_for_every_register_block_and_any_length() {
        // 18 rows and 13 features: every block size leaves a remainder of 4, 2 or 1.
        let (n, width, stride) = (18, 13, 14);
        let tile: Vec<Lanes> = (0..width).map(|d| lanes(|i| (d * 16 + i) as f32 * 0.01)).collect();
        let rows: Vec<f32> = (0..n * stride).map(|x| (x % 7) as f32 - 3.0).collect();
        for nr in [2, 4, 6, 8] {
            let mut out = vec![[f32::NAN; LANES]; n];
            match nr {
                2 => lane_dots::<Portable, 2>(&tile, &rows, stride, 1, &mut out),
                4 => lane_dots::<Portable, 4>(&tile, &rows, stride, 1, &mut out),
                6 => lane_dots::<Portable, 6>(&tile, &rows, stride, 1, &mut out),
                _ => lane_dots::<Portable, 8>(&tile, &rows, stride, 1, &mut out),
            }
            for r in 0..n {
                for i in 0..LANES {
                    let want: f32 = (0..width).map(|d| tile[d][i] * rows[r * stride + d]).sum();
                    assert!((out[r][i] - want).abs() < 1e-4, "dots nr {nr} r {r} lane {i}");
                }
            }
            for split in [false, true] {
                let mut acc = vec![[1.0; LANES]; width];
                match nr {
                    2 => lane_accumulate::<Portable, 2>(&out, &rows, stride, &mut acc, split),
                    4 => lane_accumulate::<Portable, 4>(&out, &rows, stride, &mut acc, split),
                    6 => lane_accumulate::<Portable, 6>(&out, &rows, stride, &mut acc, split),
                    _ => lane_accumulate::<Portable, 8>(&out, &rows, stride, &mut acc, split),
                }
                for d in 0..width {
                    for i in 0..LANES {
                        let want: f32 = 1.0 + (0..n).map(|r| out[r][i] * rows[r * stride + d]).sum::<f32>();
                        let error = (acc[d][i] - want).abs();
                        assert!(error < 1e-3 * want.abs().max(1.0), "accumulate nr {nr} split {split} d {d} lane {i}");
                    }
                }
            }
        }
    }
}
