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
//! Both work on `T` tiles of one shape at once (one, or two: 32 query rows or keys) and keep
//! `R x T` accumulator vectors in registers (`R` = 8 with AVX-512's 32 registers, 6 of two halves
//! with AVX2's 16; with two tiles 8 and 2). Each scalar of `rows` is loaded and broadcast once
//! for the `T` tiles, and each accumulator is a chain of its own, so the rate is that of the FMA
//! units at any feature width: with one tile a broadcast feeds one multiply-add, enough for a
//! core with one FMA unit of the vector's width (a Zen 4 with AVX-512); with two tiles it feeds
//! two, with twice the chains, which a core with two such units (Intel's server cores) needs.
//! Which serves a call is measured at run time ([`crate::tuning::Tiles`]). They are written on
//! explicit vectors ([`Vector`]): left to itself, LLVM vectorises the feature loop instead, with
//! gathers and scatters, at a tenth of the speed. Vector code here holds no closures: a closure
//! does not inherit its caller's target features, so the intrinsics in one that LLVM does not
//! inline become calls (the 16 x 16 transpose once ran at half speed that way).

use crate::simd::{LANES, Lanes, Vector};

/// Independent running maxima in [`lane_max`]: a maximum is an instruction of latency 4 on the
/// FMA ports, so one running maximum waits 4 cycles per row; 4 keep two ports busy.
const MAX_CHAINS: usize = 4;

/// The lane-wise maximum of `rows`, starting from `init`, in [`MAX_CHAINS`] running maxima.
/// With one chain, perf put 23% of the seed's forward tiles' samples on this pass (one thread of an
/// Intel Xeon); four took 3% off the whole forward pass.
#[inline(always)]
pub(crate) fn lane_max<V: Vector>(rows: &[Lanes], init: Lanes) -> Lanes {
    let mut max = [V::load(&init); MAX_CHAINS];
    let mut groups = rows.chunks_exact(MAX_CHAINS);
    for group in &mut groups {
        for (max, row) in max.iter_mut().zip(group) {
            *max = max.max(V::load(row));
        }
    }
    for row in groups.remainder() {
        max[0] = max[0].max(V::load(row));
    }
    let (pair0, pair1) = (max[0].max(max[1]), max[2].max(max[3]));
    let mut out = [0.0; LANES];
    pair0.max(pair1).store(&mut out);
    out
}

/// `out[t][r] = Σ_d tiles[t][d] · rows[r * row_stride + d * depth_stride]` for `d <
/// tiles[t].len()` (all `T` tiles of one width), `R` rows at a time (then 4, 2 and 1 for the
/// rest). Each element of `rows` is broadcast once for the `T` tiles: with two tiles (32 query
/// rows, or keys) a broadcast feeds two multiply-adds. The depth stride lets a caller read a
/// transposed operand in place (the kernel's rows are contiguous: `depth_stride = 1`).
#[inline(always)]
pub(crate) fn lane_dots<V: Vector, const R: usize, const T: usize>(
    tiles: [&[Lanes]; T],
    rows: &[f32],
    row_stride: usize,
    depth_stride: usize,
    mut out: [&mut [Lanes]; T],
) {
    let n = out[0].len();
    for t in 0..T {
        assert!(tiles[t].len() == tiles[0].len() && out[t].len() == n, "lane_dots: tiles of one shape");
    }
    let mut first = 0;
    while first < n {
        first += match n - first {
            left if left >= R => dot_rows::<V, R, T>(&tiles, rows, first, row_stride, depth_stride, &mut out),
            left if left >= 4 => dot_rows::<V, 4, T>(&tiles, rows, first, row_stride, depth_stride, &mut out),
            left if left >= 2 => dot_rows::<V, 2, T>(&tiles, rows, first, row_stride, depth_stride, &mut out),
            _ => dot_rows::<V, 1, T>(&tiles, rows, first, row_stride, depth_stride, &mut out),
        };
    }
}

/// [`lane_dots`] of the `R` rows `first ..` into `out[t][first..][..R]`, held in registers over
/// the depth; returns `R`.
#[inline(always)]
fn dot_rows<V: Vector, const R: usize, const T: usize>(
    tiles: &[&[Lanes]; T],
    rows: &[f32],
    first: usize,
    row_stride: usize,
    depth_stride: usize,
    out: &mut [&mut [Lanes]; T],
) -> usize {
    let width = tiles[0].len();
    let start = first * row_stride;
    if width > 0 {
        let last = start + (R - 1) * row_stride + (width - 1) * depth_stride;
        assert!(last < rows.len(), "lane_dots reads element {last} of {}", rows.len());
    }
    // SAFETY: every element read below is at most `last`, checked above, and every tile has
    // `width` vectors (checked by `lane_dots`); checked per element, the bounds tests would cost
    // as much as the multiply-adds. (A loop, not `array::from_fn`, which LLVM left as a call: a
    // cost per group of rows, large at narrow heads.)
    let mut starts = [rows.as_ptr(); R];
    for (r, row) in starts.iter_mut().enumerate() {
        *row = unsafe { rows.as_ptr().add(start + r * row_stride) };
    }
    let mut acc = [[V::zero(); R]; T];
    // Every depth `d` below is less than `width`: within every tile, and the rows' elements at
    // `d` end at `last`, as `dot_depth` requires.
    if T == 1 && width >= GROUPED_FROM {
        // One tile of wide rows: [`DEPTH_GROUP`] depths a turn, then the rest one at a time.
        let grouped = width - width % DEPTH_GROUP;
        for group in (0..grouped).step_by(DEPTH_GROUP) {
            for d in group..group + DEPTH_GROUP {
                // SAFETY: `d < grouped <= width` (above).
                unsafe { dot_depth::<V, R, T>(tiles, &starts, d, depth_stride, &mut acc) };
            }
        }
        for d in grouped..width {
            // SAFETY: `d < width` (above).
            unsafe { dot_depth::<V, R, T>(tiles, &starts, d, depth_stride, &mut acc) };
        }
    } else {
        // Not the remainder loop above with `grouped = 0`: narrow rows keep the loop they had
        // (that shared form read 5-8% slower at widths 4 and 8 in `tile_rates` on a Zen 4).
        for d in 0..width {
            // SAFETY: `d < width` (above).
            unsafe { dot_depth::<V, R, T>(tiles, &starts, d, depth_stride, &mut acc) };
        }
    }
    for t in 0..T {
        for (acc, out) in acc[t].into_iter().zip(&mut out[t][first..]) {
            acc.store(out);
        }
    }
    R
}

/// Depths [`dot_rows`] walks per turn of its loop where one tile's rows are wide. LLVM keeps the
/// `R` rows' addresses as a few bases and an index, rebuilt by integer adds every turn (5 of the
/// 27 instructions of AVX2's turn of one depth, beside 12 multiply-adds), which the Sapphire
/// Rapids model issues on the two FMA ports. Four depths a turn rebuild them once for 48
/// multiply-adds (89 instructions). llvm-mca-19, multiply-adds per cycle of one tile's dot
/// products, one depth a turn -> four: AVX2 `sapphirerapids` 1.62 -> 1.84 (`znver4` 1.98 ->
/// 1.99), AVX-512 `skylake-avx512` (the model with the server cores' two 512-bit FMA ports) 1.57
/// -> 1.77. Two tiles keep one depth a turn: in groups of 2 (16 accumulators, 4 broadcasts a
/// depth) their dot products ran 15% slower on a Zen 4, and in groups of 4 LLVM spilled them.
const DEPTH_GROUP: usize = 4;

/// The narrowest rows walked in groups of [`DEPTH_GROUP`] depths. Heads of 4 to 16 features take
/// one to four turns, and grouped they ran slower on a Zen 4: one tile's dot products at width
/// 4 (AVX-512, `tile_rates`) 57-81 GFLOP/s against 80-86, and the forward passes of heads of 16
/// (`xtask bench` at 1,4096,64,4x16) 1.04-1.06 of their time, where heads of 32 took a median
/// of 0.96-0.98 (8,512,256,8x32, AVX-512 and AVX2).
const GROUPED_FROM: usize = 32;

/// One depth `d` of [`dot_rows`]: `acc[t][r] += tiles[t][d] · row r's element d`.
///
/// # Safety
/// `d` is below every tile's length and `starts[r] + d * depth_stride` lies in the rows.
#[inline(always)]
unsafe fn dot_depth<V: Vector, const R: usize, const T: usize>(
    tiles: &[&[Lanes]; T],
    starts: &[*const f32; R],
    d: usize,
    depth_stride: usize,
    acc: &mut [[V; R]; T],
) {
    let mut columns = [V::zero(); T];
    for t in 0..T {
        columns[t] = V::load(unsafe { tiles[t].get_unchecked(d) });
    }
    let offset = d * depth_stride;
    for r in 0..R {
        let x = V::splat(unsafe { *starts[r].add(offset) });
        for t in 0..T {
            acc[t][r] = columns[t].mul_add(x, acc[t][r]);
        }
    }
}

/// `acc[t][d] += Σ_r weights[t][r] · rows[r * stride + d]` for `d < acc[t].len()` (all `T`
/// tiles of one shape), `R` features at a time (then 4, 2 and 1 for the rest). Each element of
/// `rows` is broadcast once for the `T` tiles.
///
/// Each feature's sum is a chain of dependent multiply-adds, one per row. A group of `C < R`
/// features of one tile (every group of a head of 4 features) keeps only `C` chains in flight.
/// With AVX-512 that fills a core that retires one 512-bit FMA per cycle of its latency, but
/// only half of one that retires two (Intel's server cores); an AVX2 vector is two registers, so
/// there only groups of 2 and 1 fall short. With `split` such a group of one tile walks its rows
/// in `R / C` interleaved sets with sums of their own, added at the end; whether this core needs
/// it is measured once ([`crate::tuning::split_narrow_sums`]). Two tiles have twice the chains
/// and do not split.
#[inline(always)]
pub(crate) fn lane_accumulate<V: Vector, const R: usize, const T: usize>(
    weights: [&[Lanes]; T],
    rows: &[f32],
    stride: usize,
    mut acc: [&mut [Lanes]; T],
    split: bool,
) {
    let width = acc[0].len();
    for t in 0..T {
        assert!(weights[t].len() == weights[0].len() && acc[t].len() == width, "lane_accumulate: tiles of one shape");
    }
    let split = split && T == 1;
    let mut first = 0;
    while first < width {
        first += match width - first {
            left if left >= R => accumulate_columns::<V, R, T>(&weights, rows, stride, first, &mut acc),
            left if left >= 4 => accumulate_narrow::<V, 4, R, T>(&weights, rows, stride, first, &mut acc, split),
            left if left >= 2 => accumulate_narrow::<V, 2, R, T>(&weights, rows, stride, first, &mut acc, split),
            _ => accumulate_narrow::<V, 1, R, T>(&weights, rows, stride, first, &mut acc, split),
        };
    }
}

/// [`accumulate_columns`] of `C < R` features, or with `split` (one tile) [`accumulate_in_sets`]
/// in `R / C` sets.
#[inline(always)]
fn accumulate_narrow<V: Vector, const C: usize, const R: usize, const T: usize>(
    weights: &[&[Lanes]; T],
    rows: &[f32],
    stride: usize,
    first: usize,
    acc: &mut [&mut [Lanes]; T],
    split: bool,
) -> usize {
    if split {
        accumulate_in_sets::<V, C>(weights[0], rows, stride, first, &mut acc[0][first..], R / C)
    } else {
        accumulate_columns::<V, C, T>(weights, rows, stride, first, acc)
    }
}

/// [`lane_accumulate`] for the `C` features `first ..` into `acc[t][first..][..C]`, held in
/// registers over all rows; returns `C`.
#[inline(always)]
fn accumulate_columns<V: Vector, const C: usize, const T: usize>(
    weights: &[&[Lanes]; T],
    rows: &[f32],
    stride: usize,
    first: usize,
    acc: &mut [&mut [Lanes]; T],
) -> usize {
    // Loops, not `array::from_fn`: a closure does not inherit the caller's target features.
    let mut sums = [[V::zero(); C]; T];
    for t in 0..T {
        for c in 0..C {
            sums[t][c] = V::load(&acc[t][first + c]);
        }
    }
    let n = weights[0].len();
    if n > 0 {
        let last = (n - 1) * stride + first + C - 1;
        assert!(last < rows.len(), "lane_accumulate reads element {last} of {}", rows.len());
    }
    // SAFETY: the rows read below end at `last`, checked above, and every tile has `n` weights
    // (checked by `lane_accumulate`). A pointer that steps by `stride` instead of a bounds test
    // and an index computation per row: those are instructions beside the multiply-adds, and
    // without them one tile's sums of 16 and 32 features ran at 168 GFLOP/s instead of 150-159
    // on one thread of an Intel Xeon (Sapphire Rapids class).
    let mut row = unsafe { rows.as_ptr().add(first) };
    for r in 0..n {
        let mut weight = [V::zero(); T];
        for t in 0..T {
            weight[t] = V::load(unsafe { weights[t].get_unchecked(r) });
        }
        for c in 0..C {
            let x = V::splat(unsafe { *row.add(c) });
            for (sums, weight) in sums.iter_mut().zip(weight) {
                sums[c] = weight.mul_add(x, sums[c]);
            }
        }
        row = row.wrapping_add(stride);
    }
    for t in 0..T {
        for (sum, out) in sums[t].into_iter().zip(&mut acc[t][first..]) {
            sum.store(out);
        }
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
            #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
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

    /// Both products of `T` tiles with `R` rows or features a group, against their definitions:
    /// 18 rows, and 13 features (every group of rows or features leaves a remainder of 4, 2
    /// or 1) or [`GROUPED_FROM`] + 3 (one tile's dot products walk groups of [`DEPTH_GROUP`]
    /// depths, then three more).
    fn check_products<const R: usize, const T: usize>() {
        for (width, stride) in [(13, 14), (GROUPED_FROM + 3, GROUPED_FROM + 5)] {
            check_products_of_width::<R, T>(18, width, stride);
        }
    }

    fn check_products_of_width<const R: usize, const T: usize>(n: usize, width: usize, stride: usize) {
        let tiles: [Vec<Lanes>; T] =
            std::array::from_fn(|t| (0..width).map(|d| lanes(|i| (d * 16 + i + 7 * t) as f32 * 0.01)).collect());
        let rows: Vec<f32> = (0..n * stride).map(|x| (x % 7) as f32 - 3.0).collect();
        let mut out: [Vec<Lanes>; T] = std::array::from_fn(|_| vec![[f32::NAN; LANES]; n]);
        lane_dots::<Portable, R, T>(
            std::array::from_fn(|t| &tiles[t][..]),
            &rows,
            stride,
            1,
            out.each_mut().map(|o| &mut o[..]),
        );
        for t in 0..T {
            for r in 0..n {
                for i in 0..LANES {
                    let want: f32 = (0..width).map(|d| tiles[t][d][i] * rows[r * stride + d]).sum();
                    assert!((out[t][r][i] - want).abs() < 1e-4, "dots R {R} T {T}: tile {t} row {r} lane {i}");
                }
            }
        }
        for split in [false, true] {
            let mut acc: [Vec<Lanes>; T] = std::array::from_fn(|_| vec![[1.0; LANES]; width]);
            lane_accumulate::<Portable, R, T>(
                std::array::from_fn(|t| &out[t][..]),
                &rows,
                stride,
                acc.each_mut().map(|a| &mut a[..]),
                split,
            );
            for t in 0..T {
                for d in 0..width {
                    for i in 0..LANES {
                        let want = 1.0 + (0..n).map(|r| out[t][r][i] * rows[r * stride + d]).sum::<f32>();
                        let error = (acc[t][d][i] - want).abs();
                        assert!(
                            error < 1e-3 * want.abs().max(1.0),
                            "accumulate R {R} T {T} split {split}: tile {t} feature {d} lane {i}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn products_match_their_definitions_for_every_group_size_tile_count_and_length() {
        check_products::<2, 1>();
        check_products::<3, 1>();
        check_products::<4, 1>();
        check_products::<6, 1>();
        check_products::<8, 1>();
        check_products::<2, 2>();
        check_products::<3, 2>();
        check_products::<8, 2>();
    }
}
