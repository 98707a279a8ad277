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
//! rate is that of the FMA units at any feature width, not of the loads.

use super::exp::madd;
use super::kernel::LANES;

/// 16 float32 values: one AVX-512 register, two AVX2 ones.
pub type Lanes = [f32; LANES];

/// A lane-wise expression as a vector.
#[inline(always)]
pub fn lanes(f: impl Fn(usize) -> f32) -> Lanes {
    std::array::from_fn(f)
}

/// `out[r] = Σ_d tile[d] · rows[r * stride + d]` for `d < tile.len()`; `out.len()` must be a
/// multiple of `NR`.
#[inline(always)]
pub fn lane_dots<const NR: usize, const FMA: bool>(tile: &[Lanes], rows: &[f32], stride: usize, out: &mut [Lanes]) {
    let width = tile.len();
    for (group, out) in out.chunks_exact_mut(NR).enumerate() {
        let rows: [&[f32]; NR] = std::array::from_fn(|r| &rows[(group * NR + r) * stride..][..width]);
        let mut acc = [[0.0; LANES]; NR];
        for (d, column) in tile.iter().enumerate() {
            for r in 0..NR {
                let x = rows[r][d];
                acc[r] = lanes(|i| madd::<FMA>(column[i], x, acc[r][i]));
            }
        }
        out.copy_from_slice(&acc);
    }
}

/// `acc[d] += Σ_r weights[r] · rows[r * stride + d]` for `d < acc.len()`, a multiple of 4.
#[inline(always)]
pub fn lane_accumulate<const NR: usize, const FMA: bool>(weights: &[Lanes], rows: &[f32], stride: usize, acc: &mut [Lanes]) {
    let width = acc.len();
    let mut first = 0;
    while first < width {
        if width - first >= NR {
            accumulate_columns::<NR, FMA>(weights, rows, stride, first, &mut acc[first..first + NR]);
            first += NR;
        } else {
            accumulate_columns::<4, FMA>(weights, rows, stride, first, &mut acc[first..first + 4]);
            first += 4;
        }
    }
}

/// [`lane_accumulate`] for the `C` features `first ..`, held in registers over all rows.
#[inline(always)]
fn accumulate_columns<const C: usize, const FMA: bool>(weights: &[Lanes], rows: &[f32], stride: usize, first: usize, acc: &mut [Lanes]) {
    let mut sums: [Lanes; C] = std::array::from_fn(|c| acc[c]);
    for (r, weight) in weights.iter().enumerate() {
        let row = &rows[r * stride + first..][..C];
        for c in 0..C {
            let x = row[c];
            sums[c] = lanes(|i| madd::<FMA>(weight[i], x, sums[c][i]));
        }
    }
    acc.copy_from_slice(&sums);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_match_their_definitions() {
        let (n, width, stride) = (16, 12, 13);
        let tile: Vec<Lanes> = (0..width).map(|d| lanes(|i| (d * 16 + i) as f32 * 0.01)).collect();
        let rows: Vec<f32> = (0..n * stride).map(|x| (x % 7) as f32 - 3.0).collect();
        let mut out = vec![[0.0; LANES]; n];
        lane_dots::<8, true>(&tile, &rows, stride, &mut out);
        for r in 0..n {
            for i in 0..LANES {
                let want: f32 = (0..width).map(|d| tile[d][i] * rows[r * stride + d]).sum();
                assert!((out[r][i] - want).abs() < 1e-4, "dots r {r} lane {i}");
            }
        }
        for nr in [2, 4, 8] {
            let mut acc = vec![[1.0; LANES]; width];
            match nr {
                2 => lane_accumulate::<2, false>(&out, &rows, stride, &mut acc),
                4 => lane_accumulate::<4, true>(&out, &rows, stride, &mut acc),
                _ => lane_accumulate::<8, true>(&out, &rows, stride, &mut acc),
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
