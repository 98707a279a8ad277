//! Dense float32 matrix products on host memory, for the layers' projections: `C = A B` with the
//! same register-blocked product as the attention kernel ([`tile::lane_dots`]).
//!
//! `B` is packed once into panels of 16 columns, `[K] x Lanes` each; a block of `A`'s rows is
//! multiplied by every panel while it stays in L2, `NR` rows at a time: each `B` panel vector is
//! loaded once per `NR` fused multiply-adds and each `A` scalar broadcast once per 16 outputs.
//! Blocks of rows run in parallel on rayon's pool.

use rayon::prelude::*;

use super::kernel::{Isa, LANES};
use super::tile::{Lanes, Portable, Vector, lane_dots};

/// Rows of `A` per parallel task: `ROWS x K` floats stay in L2 while every panel passes.
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

    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> f32 {
        self.data[i * self.row_stride + j * self.col_stride]
    }

    /// The rows, contiguous: borrowed when already row-major, copied otherwise.
    fn row_major(&self) -> std::borrow::Cow<'a, [f32]> {
        if self.col_stride == 1 && self.row_stride == self.cols {
            return std::borrow::Cow::Borrowed(&self.data[..self.rows * self.cols]);
        }
        // Strided reads, in tiles of 32 x 32 so that each source line is used while cached.
        const TILE: usize = 32;
        let mut out = vec![0.0; self.rows * self.cols];
        out.par_chunks_mut(TILE * self.cols.max(1)).enumerate().for_each(|(block, out)| {
            let first_row = block * TILE;
            let rows = out.len() / self.cols.max(1);
            for first_col in (0..self.cols).step_by(TILE) {
                let cols = TILE.min(self.cols - first_col);
                for j in first_col..first_col + cols {
                    for i in 0..rows {
                        out[i * self.cols + j] = self.at(first_row + i, j);
                    }
                }
            }
        });
        std::borrow::Cow::Owned(out)
    }
}

/// `A B` as a row-major `[M, N]` buffer.
pub fn matmul(a: View, b: View) -> Vec<f32> {
    matmul_with(Isa::best(), a, b)
}

pub(crate) fn matmul_with(isa: Isa, a: View, b: View) -> Vec<f32> {
    assert_eq!(a.cols, b.rows, "inner dimensions");
    let (m, k, n) = (a.rows, a.cols, b.cols);
    let mut c = vec![0.0; m * n];
    if m == 0 || n == 0 || k == 0 {
        return c;
    }
    let a = a.row_major(); // [M, K]
    let panels = pack_panels(b); // [N/16, K] lanes
    c.par_chunks_mut(ROWS * n).enumerate().for_each(|(block, c)| {
        let rows = c.len() / n;
        let a = &a[block * ROWS * k..][..rows * k];
        match isa {
            Isa::Baseline => block_product::<Portable, 2>(a, &panels, k, n, c),
            // SAFETY: an `Isa` other than `Baseline` comes from `Isa::available`.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => unsafe { simd::block_product_avx2(a, &panels, k, n, c) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { simd::block_product_avx512(a, &panels, k, n, c) },
        }
    });
    c
}

#[cfg(target_arch = "x86_64")]
mod simd {
    use super::*;
    use crate::fused::tile::{Avx2, Avx512};

    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn block_product_avx512(a: &[f32], panels: &[Lanes], k: usize, n: usize, c: &mut [f32]) {
        block_product::<Avx512, 8>(a, panels, k, n, c)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn block_product_avx2(a: &[f32], panels: &[Lanes], k: usize, n: usize, c: &mut [f32]) {
        block_product::<Avx2, 4>(a, panels, k, n, c)
    }
}

/// `B` as panels of 16 columns, `[N/16] x [K] x Lanes`, zero-padded past column `N`.
fn pack_panels(b: View) -> Vec<Lanes> {
    let (k, n) = (b.rows, b.cols);
    let mut panels = vec![[0.0; LANES]; n.div_ceil(LANES) * k];
    panels.par_chunks_mut(k).enumerate().for_each(|(panel, out)| {
        let first = panel * LANES;
        for (row, lanes) in out.iter_mut().enumerate() {
            for (i, x) in lanes.iter_mut().enumerate().take(n - first.min(n)) {
                *x = b.at(row, first + i);
            }
        }
    });
    panels
}

/// One block of `C`'s rows: `c [rows, N] = a [rows, K] · B`, `DEPTH` of `K` at a time so that
/// each panel's slice (`DEPTH x 16` floats) stays in L1 while the block's rows pass.
#[inline(always)]
fn block_product<V: Vector, const NR: usize>(a: &[f32], panels: &[Lanes], k: usize, n: usize, c: &mut [f32]) {
    let rows = a.len() / k;
    let full = rows / NR * NR;
    let mut out = [[0.0; LANES]; NR];
    for first_k in (0..k).step_by(DEPTH) {
        let depth = DEPTH.min(k - first_k);
        // The first slice of K writes C, the others add to it.
        let write = |c: &mut [f32], sums: &Lanes| match first_k {
            0 => c.copy_from_slice(&sums[..c.len()]),
            _ => c.iter_mut().zip(sums).for_each(|(c, s)| *c += s),
        };
        for (panel, columns) in panels.chunks_exact(k).enumerate() {
            let columns = &columns[first_k..][..depth];
            let first = panel * LANES;
            let width = LANES.min(n - first);
            for start in (0..full).step_by(NR) {
                lane_dots::<V, NR>(columns, &a[start * k + first_k..], k, &mut out);
                for (r, sums) in out.iter().enumerate() {
                    write(&mut c[(start + r) * n + first..][..width], sums);
                }
            }
            for start in full..rows {
                lane_dots::<V, 1>(columns, &a[start * k + first_k..], k, &mut out[..1]);
                write(&mut c[start * n + first..][..width], &out[0]);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_of_every_layout_match_the_definition_on_every_instruction_set() {
        for (m, k, n) in [(1, 1, 1), (7, 5, 3), (70, 33, 40), (130, 17, 16), (9, 64, 100), (20, 600, 24)] {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 13) as f32 * 0.25 - 1.5).collect();
            let want: Vec<f32> = (0..m * n).map(|i| (0..k).map(|j| a[i / n * k + j] * b[j * n + i % n]).sum()).collect();
            let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
            for isa in Isa::available() {
                let layouts = [
                    (View::new(&a, m, k), View::new(&b, k, n)),
                    (View::new(&at, k, m).t(), View::new(&b, k, n)),
                    (View::new(&a, m, k), View::new(&bt, n, k).t()),
                ];
                for (x, y) in layouts {
                    let got = matmul_with(isa, x, y);
                    let error = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0, f32::max);
                    assert!(error < 1e-3, "{isa:?} {m}x{k}x{n}: error {error}");
                }
            }
        }
    }

    fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols).map(|i| x[(i % rows) * cols + i / rows]).collect()
    }
}
