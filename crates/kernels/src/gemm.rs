//! Dense float32 matrix products on host memory, for the layers' projections and their gradients:
//! `C = A B (+ bias)` by the `gemm` crate, which packs both operands into panels sized from the
//! cache hierarchy it reads at run time and runs micro-kernels compiled for each instruction set
//! (AVX-512, AVX2 + FMA, NEON, scalar), picking the CPU's at run time; products of a narrow depth
//! (the forward projections of a few features) by [`narrow`]'s kernel instead.
//!
//! `A` and `B` are read in place in any layout through their strides, so a weight gradient's
//! `xᵀ` is never copied, and the bias is the product's starting value rather than a pass of its own.
//! The instruction set follows [`Isa::best`], so `KERNELS_ISA` restricts the GEMM as it restricts
//! the attention kernel.

use std::mem::MaybeUninit;

use gemm::Parallelism;
use rayon::prelude::*;

mod narrow;

use crate::profile::Phase;
use crate::simd::{Isa, Level};
use crate::tuning::{self, ProductClass, Threads};
use crate::{on_caller, on_pool};

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

    /// Every element the strides address lies inside `data` (the condition for reading it through
    /// raw pointers).
    fn assert_in_bounds(&self, name: &str) {
        if self.rows > 0 && self.cols > 0 {
            let last = (self.rows - 1) * self.row_stride + (self.cols - 1) * self.col_stride;
            assert!(last < self.data.len(), "{name}: element {last} of a slice of {}", self.data.len());
        }
    }
}

/// `A B` as a row-major `[M, N]` buffer.
pub fn matmul(a: View, b: View) -> Vec<f32> {
    run(a, b, |threads| product(Isa::best(), a, b, None, threads))
}

/// `A B + bias` (`bias`: `[N]`, added to every row) as a row-major `[M, N]` buffer: a dense layer.
pub fn matmul_bias(a: View, b: View, bias: &[f32]) -> Vec<f32> {
    assert_eq!(bias.len(), b.cols, "one bias per column");
    run(a, b, |threads| product(Isa::best(), a, b, Some(bias), threads))
}

/// Whether the `gemm` crate runs `[m, k] x [k, n]` on one thread (fewer multiply-adds than its
/// threading threshold): a product small enough that its fixed costs (packing, the call) weigh
/// against its arithmetic, and that [`matmul`] runs on the caller's thread.
pub fn runs_alone(m: usize, k: usize, n: usize) -> bool {
    m.saturating_mul(k).saturating_mul(n) < gemm_common::gemm::get_threading_threshold()
}

/// Runs the product `f` of `a` and `b` on the caller's thread when the `gemm` crate would run it
/// on one thread anyway (fewer multiply-adds than its threading threshold): handing a call to
/// the pool costs two context switches, which were 40% of the time of the seed's projections
/// (`[4352, 4] x [4, 24]`, 60 µs on a Zen 4). Above it, the caller's thread alone or the pool,
/// whichever was faster for the shape ([`tuning::with_threads`]): on an Intel Xeon (2 threads)
/// the layers' narrow products crossed the threshold and ran slower on the pool, `[4352, 4] x
/// [4, 72]` in 0.18 ms against 0.07, `[4352, 24] x [24, 24]` in 0.11 against 0.07.
fn run(a: View, b: View, f: impl FnOnce(Threads) -> Vec<f32> + Send) -> Vec<f32> {
    if runs_alone(a.rows, a.cols, b.cols) {
        return on_caller(Phase::Gemm, || f(Threads::Caller));
    }
    let class = ProductClass { isa: Isa::best().name(), m: a.rows, k: a.cols, n: b.cols };
    tuning::with_threads(class, |threads| match threads {
        Threads::Caller => on_caller(Phase::Gemm, || f(threads)),
        Threads::Pool | Threads::Rows => on_pool(Phase::Gemm, || f(threads)),
    })
}

/// The product on `isa`'s micro-kernels: `C = 1 · C₀ + 1 · A B`, where `C₀` is the bias in
/// every row ([`starts_from_bias`]), or nothing: then `C` is fresh memory that the crate writes
/// without reading it (`read_dst = false` sets its `alpha` to 0, and each of its paths, the
/// micro-kernels, the small products' and the matrix-vector ones, then stores `A B` alone, or
/// zeros where `K = 0`), and a bias is added after. Zeroed first, a `[4096, 256]` output was 4 MB
/// of stores before the product wrote it.
pub(crate) fn product(isa: Isa, a: View, b: View, bias: Option<&[f32]>, threads: Threads) -> Vec<f32> {
    assert_eq!(a.cols, b.rows, "inner dimensions");
    a.assert_in_bounds("A");
    b.assert_in_bounds("B");
    let (m, n) = (a.rows, b.cols);
    let mut c = Vec::with_capacity(m * n); // [M, N] once written
    if m == 0 || n == 0 {
        return c;
    }
    let out = &mut c.spare_capacity_mut()[..m * n];
    // Narrow products on their own kernel, `B` packed once for every block of rows.
    let panels = narrow::applies(&a, &b).then(|| narrow::Panels::new(&b, bias));
    let block = |a: View, parallelism: Parallelism, out: &mut [MaybeUninit<f32>]| match &panels {
        Some(panels) => narrow::product_into(isa, a, panels, out),
        None => product_into(isa, a, b, bias, parallelism, out),
    };
    match (threads, rayon::current_num_threads()) {
        (Threads::Pool, threads @ 2..) if panels.is_none() => block(a, Parallelism::Rayon(threads), out),
        // One block of rows per thread, each a single-threaded product (the narrow kernel's
        // split for both threaded candidates).
        (Threads::Pool | Threads::Rows, threads @ 2..) => {
            let rows = m.div_ceil(threads);
            out.par_chunks_mut(rows * n).enumerate().for_each(|(index, out)| {
                // (`A` without columns may hold no data at all.)
                let data = &a.data[(index * rows * a.row_stride).min(a.data.len())..];
                block(View { data, rows: out.len() / n, ..a }, Parallelism::None, out);
            });
        }
        _ => block(a, Parallelism::None, out),
    }
    // SAFETY: `product_into` wrote every element of each block, and the blocks cover `[M, N]`.
    unsafe { c.set_len(m * n) };
    c
}

/// `A B (+ bias)` into the row-major `[M, N]` `c`, every element written.
fn product_into(
    isa: Isa,
    a: View,
    b: View,
    bias: Option<&[f32]>,
    parallelism: Parallelism,
    c: &mut [MaybeUninit<f32>],
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert_eq!(c.len(), m * n, "an output of [{m}, {n}]");
    let start = bias.filter(|_| starts_from_bias(m, n));
    if let Some(bias) = start {
        for row in c.chunks_exact_mut(n) {
            row.iter_mut().zip(bias).for_each(|(c, &b)| _ = c.write(b));
        }
    }
    let stride = |s: usize| s as isize;
    // The micro-kernels vectorise along a column of the destination, and `C` is row-major: the
    // crate computes `Cᵀ = Bᵀ Aᵀ` (`[N, M]`, whose columns are `C`'s rows). `gemm::gemm` turns a
    // call around itself, the narrower drivers do not (stored a column at a time, one float per
    // store, the AVX2 product of 1024³ ran at 102 GFLOP/s against 177 for torch's on a Zen 4):
    // so every call is made the right way round here.
    // SAFETY: `C` has room for a row-major `[M, N]` (asserted above); every element of `A` and
    // `B` that their strides address is in bounds (asserted by the caller, and a block of `A`'s
    // rows lies inside `A`); `isa` was checked against the CPU when it was made. The crate
    // writes all `M N` elements, reading them first only where they hold the bias.
    unsafe {
        gemm_for(isa)(
            n,
            m,
            k,
            c.as_mut_ptr().cast(),
            stride(n),
            1,
            start.is_some(),
            b.data.as_ptr(),
            stride(b.row_stride),
            stride(b.col_stride),
            a.data.as_ptr(),
            stride(a.row_stride),
            stride(a.col_stride),
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
    if let (Some(bias), None) = (bias, start) {
        // SAFETY: written by the product above.
        let c = unsafe { &mut *(c as *mut [MaybeUninit<f32>] as *mut [f32]) };
        add_to_rows(c, bias, parallelism);
    }
}

/// Whether a product with a bias starts from it (the crate's micro-kernels then read it back as
/// they store each block of `A B`), which is the faster where the `[M, N]` output fits in the L2
/// cache (the bias rows are still there when read); a larger output is written fresh and the bias
/// added after, in one streaming pass. On an Intel Xeon (2 MiB of L2 a core, 2 threads,
/// `gemm_shapes`, in turns): `[4352, 4] x [4, 72]` (1.25 MB) 0.069 ms from the bias against 0.077
/// after it; `[4096, 512] x [512, 1536]` (25 MB) with AVX2 34.3-41.0 ms from the bias, 33.5-34.6
/// after it (32.7-34.1 without a bias), with AVX-512 20.9-22.4 against 20.0-21.3.
pub(crate) fn starts_from_bias(m: usize, n: usize) -> bool {
    let l2_bytes = gemm_common::cache::CACHE_INFO[1].cache_bytes;
    m.saturating_mul(n).saturating_mul(size_of::<f32>()) <= l2_bytes
}

/// `c[i, j] += bias[j]` for the rows `[M, N]` of `c`, on the pool where the product ran there.
fn add_to_rows(c: &mut [f32], bias: &[f32], parallelism: Parallelism) {
    let n = bias.len();
    let add = |rows: &mut [f32]| {
        for row in rows.chunks_exact_mut(n) {
            row.iter_mut().zip(bias).for_each(|(c, b)| *c += b);
        }
    };
    match parallelism {
        Parallelism::None => add(c),
        // Blocks of 64 rows: a few hundred tasks at the layers' sizes.
        _ => c.par_chunks_mut(64 * n).for_each(add),
    }
}

/// `gemm`'s entry point: `(m, n, k, dst, dst_cs, dst_rs, read_dst, lhs, lhs_cs, lhs_rs, rhs,
/// rhs_cs, rhs_rs, alpha, beta, conj_dst, conj_lhs, conj_rhs, parallelism)` computes
/// `dst = alpha · dst + beta · lhs · rhs`.
type GemmFn = unsafe fn(
    usize,
    usize,
    usize,
    *mut f32,
    isize,
    isize,
    bool,
    *const f32,
    isize,
    isize,
    *const f32,
    isize,
    isize,
    f32,
    f32,
    bool,
    bool,
    bool,
    Parallelism,
) -> ();

/// The crate's own dispatch for the widest instruction set of the CPU; for a narrower one that
/// `KERNELS_ISA` asked for, the same driver on that instruction set's micro-kernels (the crate
/// picks by CPU only, and a benchmark of an AVX2-only processor needs its AVX2 path).
fn gemm_for(isa: Isa) -> GemmFn {
    if isa == Isa::detected() {
        return gemm::gemm::<f32>;
    }
    match isa.level() {
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => narrower::avx2,
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => gemm::gemm::<f32>,
        Level::Portable => narrower::portable,
    }
}

/// `gemm-common`'s driver on one instruction set's micro-kernels from `gemm-f32`, as the `gemm`
/// crate instantiates it for that instruction set (`gemm_common::gemm::gemm_def!`).
mod narrower {
    use gemm::Parallelism;
    use gemm_common::gemm::gemm_basic_generic;

    macro_rules! on_kernels {
        ($name:ident, $simd:ty, $kernels:path, $lanes:expr) => {
            /// [`super::GemmFn`] on these micro-kernels.
            ///
            /// # Safety
            /// The pointers and strides address valid `[m, k]`, `[k, n]` and `[m, n]` matrices,
            /// and the CPU runs the instruction set (checked again here).
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn $name(
                m: usize,
                n: usize,
                k: usize,
                dst: *mut f32,
                dst_cs: isize,
                dst_rs: isize,
                read_dst: bool,
                lhs: *const f32,
                lhs_cs: isize,
                lhs_rs: isize,
                rhs: *const f32,
                rhs_cs: isize,
                rhs_rs: isize,
                alpha: f32,
                beta: f32,
                conj_dst: bool,
                conj_lhs: bool,
                conj_rhs: bool,
                parallelism: Parallelism,
            ) {
                use gemm_common::simd::MixedSimd;
                use $kernels as kernels;
                let simd = <$simd as MixedSimd<f32, f32, f32, f32>>::try_new()
                    .expect("an Isa is only made for an instruction set the CPU runs");
                // SAFETY: the caller's contract.
                unsafe {
                    gemm_basic_generic::<
                        _,
                        f32,
                        { $lanes },
                        { kernels::MR_DIV_N * $lanes },
                        { kernels::NR },
                        { kernels::MR_DIV_N },
                        { kernels::H_M },
                        { kernels::H_N },
                    >(
                        simd,
                        m,
                        n,
                        k,
                        dst,
                        dst_cs,
                        dst_rs,
                        read_dst,
                        lhs,
                        lhs_cs,
                        lhs_rs,
                        rhs,
                        rhs_cs,
                        rhs_rs,
                        alpha,
                        beta,
                        conj_dst,
                        conj_lhs,
                        conj_rhs,
                        |a, b, c| a * b + c,
                        &kernels::UKR,
                        &kernels::H_UKR,
                        false,
                        parallelism,
                    )
                }
            }
        };
    }

    #[cfg(target_arch = "x86_64")]
    on_kernels!(avx2, gemm_common::simd::V3, gemm_f32::microkernel::fma::f32, 8);
    on_kernels!(portable, gemm_common::simd::Scalar, gemm_f32::microkernel::scalar::f32, 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn products_of_every_layout_with_and_without_bias_match_the_definition_on_every_instruction_set() {
        // The last but two crosses the crate's threading threshold: on the pool it is split. The
        // last has an output of 12.6 MB, more than any L2: its bias is added after.
        let shapes = [
            (1, 1, 1),
            (7, 5, 3),
            (70, 33, 40),
            (130, 17, 16),
            (9, 64, 100),
            (20, 600, 24),
            (200, 150, 40),
            (3, 0, 5),
            (1500, 3, 2100),
        ];
        let starts = shapes.map(|(m, _, n)| starts_from_bias(m, n));
        assert!(starts.contains(&true) && starts.contains(&false), "both ways of adding a bias: {starts:?}");
        for (m, k, n) in shapes {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7) % 11) as f32 - 5.0).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 5) % 13) as f32 * 0.25 - 1.5).collect();
            let want: Vec<f32> =
                (0..m * n).map(|i| (0..k).map(|j| a[i / n * k + j] * b[j * n + i % n]).sum()).collect();
            let bias: Vec<f32> = (0..n).map(|j| j as f32 * 0.5 - 3.0).collect();
            let (at, bt) = (transpose(&a, m, k), transpose(&b, k, n));
            for (isa, threads) in
                Isa::available().into_iter().flat_map(|isa| Threads::ALL.map(|threads| (isa, threads)))
            {
                let layouts = [
                    (View::new(&a, m, k), View::new(&b, k, n)),
                    (View::new(&at, k, m).t(), View::new(&b, k, n)),
                    (View::new(&a, m, k), View::new(&bt, n, k).t()),
                ];
                for (x, y) in layouts {
                    // Without a bias the output starts as uninitialised memory: freed just before
                    // with a poison in it, it is likely this block, so an element the product
                    // left unwritten shows as an error of 1e30.
                    drop(std::hint::black_box(vec![1e30f32; m * n]));
                    let got = product(isa, x, y, None, threads);
                    assert_eq!(got.len(), m * n, "{isa:?} {threads:?} {m}x{k}x{n}: length");
                    let error = got.iter().zip(&want).map(|(g, w)| (g - w).abs()).fold(0.0, f32::max);
                    assert!(error < 1e-3, "{isa:?} {threads:?} {m}x{k}x{n}: error {error}");
                    let got = product(isa, x, y, Some(&bias), threads);
                    let error = got
                        .iter()
                        .zip(&want)
                        .enumerate()
                        .map(|(i, (g, w))| (g - w - bias[i % n]).abs())
                        .fold(0.0, f32::max);
                    assert!(error < 1e-3, "{isa:?} {threads:?} {m}x{k}x{n} with a bias: error {error}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "A: element")]
    fn a_view_whose_strides_leave_its_slice_is_refused_before_any_read() {
        let data = [0.0; 6];
        let a = View { data: &data, rows: 3, cols: 2, row_stride: 3, col_stride: 1 };
        product(Isa::PORTABLE, a, View::new(&data, 2, 3), None, Threads::Caller);
    }

    fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        (0..rows * cols).map(|i| x[(i % rows) * cols + i / rows]).collect()
    }
}
