//! Dense float32 matrix products on host memory, for the layers' projections: `C = A B` with the
//! same register-blocked product as the attention kernel ([`tile::lane_dots`]).
//!
//! `B` is packed once into panels of 16 columns, `[K] x Lanes` each; a block of `A`'s rows is
//! multiplied by every panel while it stays in L2, `NR` rows at a time: each `B` panel vector is
//! loaded once per `NR` fused multiply-adds and each `A` scalar broadcast once per 16 outputs.
//! `A` is read in place in any layout (a weight gradient's `xᵀ` is never copied), and blocks of
//! rows run in parallel on rayon's pool, smaller blocks when `A` has few rows.

use rayon::prelude::*;

use super::kernel::{Isa, LANES, on_pool};
use super::tile::{Lanes, Portable, Vector, lane_dots};

/// The most rows of `A` per parallel task.
const ROWS: usize = 64;

/// The slice of `K` one pass over the panels covers.
const DEPTH: usize = 256;

/// A matrix in host memory: element `(i, j)` is `data[i * row_stride + j * col_stride]`.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub row_stride: usize,
    pub col_stride: usize,
}

impl<'a> View<'a> {
    /// A row-major `[rows, cols]` matrix.
    pub fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols, "matrix of {rows} x {cols}");
        Self { data, rows, cols, row_stride: cols, col_stride: 1 }
    }

    /// The transpose, without moving data.
    pub fn t(self) -> Self {
        Self { rows: self.cols, cols: self.rows, row_stride: self.col_stride, col_stride: self.row_stride, ..self }
    }
}

/// `A B` as a row-major `[M, N]` buffer.
pub fn matmul(a: View, b: View) -> Vec<f32> {
    on_pool(|| matmul_with(Isa::best(), a, b, None))
}

/// `A B + bias` (`bias`: `[N]`, added to every row) as a row-major `[M, N]` buffer: a dense
/// layer, its bias added as each product is stored rather than in a pass of its own.
pub fn matmul_bias(a: View, b: View, bias: &[f32]) -> Vec<f32> {
    assert_eq!(bias.len(), b.cols, "one bias per column");
    on_pool(|| matmul_with(Isa::best(), a, b, Some(bias)))
}

pub(crate) fn matmul_with(isa: Isa, a: View, b: View, bias: Option<&[f32]>) -> Vec<f32> {
    assert_eq!(a.cols, b.rows, "inner dimensions");
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let mut c = vec![0.0; m * n];
    if m == 0 || n == 0 {
        return c;
    }
    if k == 0 {
        if let Some(bias) = bias {
            c.chunks_exact_mut(n).for_each(|row| row.copy_from_slice(bias));
        }
        return c;
    }
    let panels = pack_panels(b); // [N/16, K] lanes
    let block_rows = rows_per_task(m);
    c.par_chunks_mut(block_rows * n).enumerate().for_each(|(block, c)| {
        // A's rows of this block, read in place whatever A's layout (a transpose included).
        let first = block * block_rows * a.row_stride;
        let a = Rows { data: &a.data[first..], rows: c.len() / n, stride: a.row_stride, depth_stride: a.col_stride };
        match isa {
            Isa::Baseline => block_product::<Portable, 2>(a, &panels, bias, k, n, c),
            // SAFETY: an `Isa` other than `Baseline` comes from `Isa::available`.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => unsafe { simd::block_product_avx2(a, &panels, bias, k, n, c) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { simd::block_product_avx512(a, &panels, bias, k, n, c) },
        }
    });
    c
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::*;
    use crate::fused::tile::{Avx2, Avx512};

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn block_product_avx512(
        a: Rows,
        panels: &[Lanes],
        bias: Option<&[f32]>,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) {
        block_product::<Avx512, 8>(a, panels, bias, k, n, c)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn block_product_avx2(
        a: Rows,
        panels: &[Lanes],
        bias: Option<&[f32]>,
        k: usize,
        n: usize,
        c: &mut [f32],
    ) {
        block_product::<Avx2, 4>(a, panels, bias, k, n, c)
    }
}

/// `B` as panels of 16 columns, `[N/16] x [K] x Lanes`, zero-padded past column `N`.
fn pack_panels(b: View) -> Vec<Lanes> {
    let (k, n) = (b.rows, b.cols);
    let mut panels = vec![[0.0; LANES]; n.div_ceil(LANES) * k];
    panels.par_chunks_mut(k).enumerate().for_each(|(panel, out)| {
        let first = panel * LANES;
        let width = LANES.min(n - first);
        for (row, lanes) in out.iter_mut().enumerate() {
            let source = &b.data[row * b.row_stride + first * b.col_stride..];
            if b.col_stride == 1 && width == LANES {
                *lanes = source[..LANES].try_into().expect("16 columns");
            } else {
                lanes[..width].iter_mut().enumerate().for_each(|(i, x)| *x = source[i * b.col_stride]);
            }
        }
    });
    panels
}

/// Rows of `A` per parallel task: at most 64 (`64 x K` floats stay in L2 while every panel
/// passes), fewer when `A` is short, so that both threads get work (a weight gradient `xᵀ dy`
/// has as few rows as the layer has inputs).
fn rows_per_task(m: usize) -> usize {
    let tasks = 4 * rayon::current_num_threads();
    m.div_ceil(tasks).next_multiple_of(8).clamp(8, ROWS)
}

/// A block of `A`'s rows: element `(i, d)` is `data[i * stride + d * depth_stride]`.
#[derive(Clone, Copy)]
struct Rows<'a> {
    data: &'a [f32],
    rows: usize,
    stride: usize,
    depth_stride: usize,
}

/// One block of `C`'s rows: `c [rows, N] = a [rows, K] · B (+ bias)`, `DEPTH` of `K` at a time
/// so that each panel's slice (`DEPTH x 16` floats) stays in L1 while the block's rows pass.
#[inline(always)]
fn block_product<V: Vector, const NR: usize>(
    a: Rows,
    panels: &[Lanes],
    bias: Option<&[f32]>,
    k: usize,
    n: usize,
    c: &mut [f32],
) {
    let full = a.rows / NR * NR;
    let mut out = [[0.0; LANES]; NR];
    for first_k in (0..k).step_by(DEPTH) {
        let depth = DEPTH.min(k - first_k);
        let rows_from = |start: usize| &a.data[start * a.stride + first_k * a.depth_stride..];
        for (panel, columns) in panels.chunks_exact(k).enumerate() {
            let columns = &columns[first_k..][..depth];
            let first = panel * LANES;
            let width = LANES.min(n - first);
            // The first slice of K writes C (with the bias), the others add to it.
            let bias = bias.filter(|_| first_k == 0).map(|bias| &bias[first..][..width]);
            let write = |c: &mut [f32], sums: &Lanes| match (first_k, bias) {
                (0, None) => c.copy_from_slice(&sums[..c.len()]),
                (0, Some(bias)) => c.iter_mut().zip(sums).zip(bias).for_each(|((c, s), b)| *c = s + b),
                _ => c.iter_mut().zip(sums).for_each(|(c, s)| *c += s),
            };
            for start in (0..full).step_by(NR) {
                lane_dots::<V, NR>(columns, rows_from(start), a.stride, a.depth_stride, &mut out);
                for (r, sums) in out.iter().enumerate() {
                    write(&mut c[(start + r) * n + first..][..width], sums);
                }
            }
            for start in full..a.rows {
                lane_dots::<V, 1>(columns, rows_from(start), a.stride, a.depth_stride, &mut out[..1]);
                write(&mut c[start * n + first..][..width], &out[0]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_of_every_layout_with_and_without_bias_match_the_definition_on_every_instruction_set() {
        for (m, k, n) in [(1, 1, 1), (7, 5, 3), (70, 33, 40), (130, 17, 16), (9, 64, 100), (20, 600, 24), (3, 0, 5)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 13) as f32 * 0.25 - 1.5).collect();
            let want: Vec<f32> =
                (0..m * n).map(|i| (0..k).map(|j| a[i / n * k + j] * b[j * n + i % n]).sum()).collect();
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.5 - 3.0).collect();
            let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
            for isa in Isa::available() {
                let layouts = [
                    (View::new(&a, m, k), View::new(&b, k, n)),
                    (View::new(&at, k, m).t(), View::new(&b, k, n)),
                    (View::new(&a, m, k), View::new(&bt, n, k).t()),
                ];
                for (x, y) in layouts {
                    let got = matmul_with(isa, x, y, None);
                    let error = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0, f32::max);
                    assert!(error < 1e-3, "{isa:?} {m}x{k}x{n}: error {error}");
                    let got = matmul_with(isa, x, y, Some(&bias));
                    let error = got
                        .iter()
                        .zip(&want)
                        .enumerate()
                        .map(|(i, (g, w))| (g - w - bias[i % n]).abs())
                        .fold(0.0, f32::max);
                    assert!(error < 1e-3, "{isa:?} {m}x{k}x{n} with a bias: error {error}");
                }
            }
        }
    }

    fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols).map(|i| x[(i % rows) * cols + i / rows]).collect()
    }
}
