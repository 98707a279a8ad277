//! The machine's limits, measured: the float32 FMA peak of the cores the benchmark uses, and a
//! backend's own matrix-product rate.

use std::time::Instant;

use anyhow::Result;
use burn::tensor::{Device, Distribution, Tensor};

use super::{Reps, time};

/// Independent accumulator vectors per thread: enough to cover the FMA latency on both units.
const CHAINS: usize = 16;

/// The float32 FMA peak (GFLOP/s) of all of rayon's threads at once, on the widest vectors this
/// CPU has: every thread runs [`CHAINS`] independent chains of fused multiply-adds. This is the
/// floor no attention implementation on these cores can beat, whatever its library.
pub fn fma_peak_gflops() -> f64 {
    let iterations = 20_000_000; // about 50 ms a run: thread wake-up is noise
    let run = || {
        let start = Instant::now();
        let flops = rayon::broadcast(|_| fma_chains(iterations)).into_iter().sum::<f64>();
        flops / start.elapsed().as_secs_f64() / 1e9
    };
    run(); // warm up the cores' clocks and the pool
    (0..5).map(|_| run()).fold(0.0, f64::max)
}

/// FLOPs of `iterations` steps of [`CHAINS`] vector FMAs, on the widest instruction set here.
fn fma_chains(iterations: usize) -> f64 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("fma") {
            // SAFETY: the CPU has the features the function is compiled for.
            return unsafe { chains_avx512(iterations) };
        }
        if has!("avx2") && has!("fma") {
            // SAFETY: as above.
            return unsafe { chains_avx2(iterations) };
        }
    }
    chains::<4>(iterations)
}

/// `CHAINS` chains of `acc = acc * a + b` in vector registers, `iterations` steps.
macro_rules! chains_with {
    ($name:ident, $features:literal, $vector:ty, $lanes:literal, $set1:ident, $fmadd:ident, $store:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(iterations: usize) -> f64 {
            use std::arch::x86_64::*;
            let a = $set1(std::hint::black_box(0.999_999));
            let b = $set1(std::hint::black_box(1e-7));
            let mut acc: [$vector; CHAINS] = [$set1(1.0); CHAINS];
            for _ in 0..iterations {
                for chain in acc.iter_mut() {
                    *chain = $fmadd(*chain, a, b);
                }
            }
            let mut out = [0.0f32; $lanes];
            for chain in acc {
                // SAFETY: `out` holds one vector.
                unsafe { $store(out.as_mut_ptr(), chain) };
                std::hint::black_box(out);
            }
            (2 * $lanes * CHAINS * iterations) as f64
        }
    };
}

chains_with!(chains_avx512, "avx512f,fma", __m512, 16, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_storeu_ps);
chains_with!(chains_avx2, "avx2,fma", __m256, 8, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps);

/// The portable fallback: plain multiply-adds, as many lanes as the compiler vectorises.
fn chains<const L: usize>(iterations: usize) -> f64 {
    let (a, b) = (std::hint::black_box([0.999_999f32; L]), std::hint::black_box([1e-7f32; L]));
    let mut acc = [[1.0f32; L]; CHAINS];
    for _ in 0..iterations {
        for chain in acc.iter_mut() {
            *chain = std::array::from_fn(|i| chain[i] * a[i] + b[i]);
        }
    }
    std::hint::black_box(acc);
    (2 * L * CHAINS * iterations) as f64
}

/// The threads the kernels and the peak measurement run on (rayon's pool).
pub fn threads() -> usize {
    rayon::current_num_threads()
}

/// The float32 matrix-product rate (GFLOP/s) of `device` on a square `[n, n] x [n, n]` product.
pub fn matmul_gflops(device: &Device, n: usize, reps: Reps) -> Result<f64> {
    let a = Tensor::<2>::random([n, n], Distribution::Normal(0.0, 1.0), device);
    let b = Tensor::<2>::random([n, n], Distribution::Normal(0.0, 1.0), device);
    let timing = time(reps, 1, || {
        a.clone().matmul(b.clone()).sum().into_scalar::<f32>();
        Ok(())
    })?;
    Ok(2.0 * (n * n * n) as f64 / (timing.median_ms * 1e6))
}

/// The float32 rate (GFLOP/s) of this project's own GEMM ([`model::fused::gemm`], what the dense
/// layers use on the CPU backends) on a square `[n, n] x [n, n]` product.
pub fn gemm_gflops(n: usize, reps: Reps) -> Result<f64> {
    use model::fused::gemm::{View, matmul};
    let a: Vec<f32> = (0..n * n).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
    let timing = time(reps, 1, || {
        std::hint::black_box(matmul(View::new(&a, n, n), View::new(&b, n, n)));
        Ok(())
    })?;
    Ok(2.0 * (n * n * n) as f64 / (timing.median_ms * 1e6))
}
