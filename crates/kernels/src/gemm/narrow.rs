//! Products whose inner dimension is narrow (`K <=` [`NARROW_DEPTH`]), with `A`'s rows and `B`
//! row-major: the layers' forward projections of a few features (`[B T, 4] x [4, 72]`, `[B T,
//! 24] x [24, 72]`), where the `gemm` crate's packing and blocking, made for deep products, cost
//! more than the multiply-adds (`[4352, 4] x [4, 72]` ran at 17 GFLOP/s with AVX2 on an Intel
//! Xeon). Here `B` is packed once into panels of 16 columns (one vector per step of depth), and
//! each block of [`ROWS`] rows of `A` meets each panel with the bias as its sums' start: the
//! panels and the block stay in L1, and each vector of `B` feeds [`ROWS`] multiply-adds.

use std::mem::MaybeUninit;

use super::View;
use crate::simd::{Isa, LANES, Lanes, Level, Portable, Vector};

/// The deepest product this path takes: its panels (`K` vectors a panel) stay in L1.
pub(crate) const NARROW_DEPTH: usize = 32;

/// Rows of `A` a block: 6 x 2 AVX2 registers of sums, beside the panel's vector and a broadcast.
const ROWS: usize = 6;

/// Whether [`product_into`] takes `A B`: a depth of 1 to [`NARROW_DEPTH`], `A`'s rows and `B`'s
/// rows each contiguous.
pub(crate) fn applies(a: &View, b: &View) -> bool {
    (1..=NARROW_DEPTH).contains(&a.cols) && a.col_stride == 1 && b.col_stride == 1
}

/// `B` (`[K, N]`) and the bias as the product reads them.
pub(crate) struct Panels {
    /// `[N/16, K]` lanes: column `16 j + i` of row `d` of `B` in lane `i` of vector `j K + d`,
    /// 0 past `N`.
    columns: Vec<Lanes>,
    /// `[N/16]` lanes: the bias (or 0) of the same columns.
    starts: Vec<Lanes>,
    depth: usize,
    width: usize,
}

impl Panels {
    pub(crate) fn new(b: &View, bias: Option<&[f32]>) -> Self {
        let (depth, width) = (b.rows, b.cols);
        let count = width.div_ceil(LANES);
        let mut columns = vec![[0.0; LANES]; count * depth];
        let mut starts = vec![[0.0; LANES]; count];
        for (j, (panel, start)) in columns.chunks_exact_mut(depth).zip(&mut starts).enumerate() {
            let cols = j * LANES..width.min((j + 1) * LANES);
            for (d, lanes) in panel.iter_mut().enumerate() {
                let row = &b.data[d * b.row_stride..];
                lanes[..cols.len()].copy_from_slice(&row[cols.clone()]);
            }
            if let Some(bias) = bias {
                start[..cols.len()].copy_from_slice(&bias[cols]);
            }
        }
        Self { columns, starts, depth, width }
    }
}

/// `A B (+ bias)` into the row-major `[M, N]` `c`, every element written, on `isa`.
pub(crate) fn product_into(isa: Isa, a: View, panels: &Panels, c: &mut [MaybeUninit<f32>]) {
    assert!(a.cols == panels.depth && c.len() == a.rows * panels.width, "narrow product: [M, K] x [K, N] into [M, N]");
    a.assert_in_bounds("A");
    match isa.level() {
        Level::Portable => rows_times_panels::<Portable>(a, panels, c),
        // SAFETY: every `Isa` is made by a constructor that checked the CPU for its instruction
        // set, which the function is compiled for.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { compiled::avx2(a, panels, c) },
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => unsafe { compiled::avx512(a, panels, c) },
    }
}

/// [`rows_times_panels`] compiled with wider instruction sets enabled.
#[cfg(target_arch = "x86_64")]
mod compiled {
    use super::*;
    use crate::simd::{Avx2, Avx512};

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn avx2(a: View, panels: &Panels, c: &mut [MaybeUninit<f32>]) {
        rows_times_panels::<Avx2>(a, panels, c)
    }

    #[target_feature(enable = "avx512f,avx512dq,avx2,fma")]
    pub unsafe fn avx512(a: View, panels: &Panels, c: &mut [MaybeUninit<f32>]) {
        rows_times_panels::<Avx512>(a, panels, c)
    }
}

/// Every block of [`ROWS`] rows (then single rows) against every panel.
#[inline(always)]
fn rows_times_panels<V: Vector>(a: View, panels: &Panels, c: &mut [MaybeUninit<f32>]) {
    let whole = a.rows / ROWS * ROWS;
    for first in (0..whole).step_by(ROWS) {
        block::<V, ROWS>(&a, first, panels, c);
    }
    for row in whole..a.rows {
        block::<V, 1>(&a, row, panels, c);
    }
}

/// Rows `first .. + R` of `A B (+ bias)`, panel by panel: `R` sums of 16 columns in registers
/// over the depth.
#[inline(always)]
fn block<V: Vector, const R: usize>(a: &View, first: usize, panels: &Panels, c: &mut [MaybeUninit<f32>]) {
    let (depth, width) = (panels.depth, panels.width);
    // SAFETY (the reads of `A` below): rows `first .. + R` exist and `A`'s elements are in
    // bounds (asserted by `product_into`), each row's `depth` elements contiguous.
    let rows: [*const f32; R] = std::array::from_fn(|r| unsafe { a.data.as_ptr().add((first + r) * a.row_stride) });
    for (j, (panel, start)) in panels.columns.chunks_exact(depth).zip(&panels.starts).enumerate() {
        let mut sums = [V::load(start); R];
        for (d, column) in panel.iter().enumerate() {
            let column = V::load(column);
            for (sum, row) in sums.iter_mut().zip(rows) {
                *sum = V::splat(unsafe { *row.add(d) }).mul_add(column, *sum);
            }
        }
        let cols = LANES.min(width - j * LANES);
        for (r, sum) in sums.iter().enumerate() {
            let out = &mut c[(first + r) * width + j * LANES..][..cols];
            if cols == LANES {
                // SAFETY: 16 floats of `c`, written whole (`MaybeUninit<f32>` is an `f32`'s layout).
                sum.store(unsafe { &mut *out.as_mut_ptr().cast::<Lanes>() });
            } else {
                let mut lanes = [0.0; LANES];
                sum.store(&mut lanes);
                out.iter_mut().zip(lanes).for_each(|(c, x)| _ = c.write(x));
            }
        }
    }
}
