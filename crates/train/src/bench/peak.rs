//! The machine and its limits: the processor the benchmark runs on, the float32 FMA peak of the
//! cores it uses on the instruction set in use, and matrix-product rates.

use std::time::Instant;

use anyhow::Result;
use burn::tensor::{Device, Distribution, Tensor};
use kernels::{Isa, Tuning};
use serde::Serialize;

use super::{Reps, time};

/// Independent accumulator vectors per thread: enough to cover the FMA latency (4 cycles) on
/// both FMA units, and few enough to stay in registers with the two operands: AVX-512 has 32
/// vector registers, AVX2 16 (16 chains there spilled to memory and measured 130 GFLOP/s
/// where the units give 230 on a Zen 4, whose AVX2 and AVX-512 FMA peaks are the same).
const CHAINS: usize = 16;
const CHAINS_AVX2: usize = 12;

/// The float32 FMA peak (GFLOP/s) of all of rayon's threads at once, on the vectors of the
/// instruction set the kernels use ([`Isa::best`]: the widest this CPU has unless `KERNELS_ISA`
/// restricts it): every thread runs [`CHAINS`] independent chains of fused multiply-adds. This is
/// the floor no attention implementation on these cores can beat, whatever its library.
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

/// FLOPs of `iterations` steps of [`CHAINS`] vector FMAs, on the instruction set in use.
fn fma_chains(iterations: usize) -> f64 {
    match Isa::best().name() {
        // SAFETY: an `Isa` is only made for an instruction set the CPU runs.
        #[cfg(target_arch = "x86_64")]
        "avx512" => unsafe { chains_avx512(iterations) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        "avx2" => unsafe { chains_avx2(iterations) },
        _ => chains::<4>(iterations),
    }
}

/// `CHAINS` chains of `acc = acc * a + b` in vector registers, `iterations` steps.
macro_rules! chains_with {
    ($name:ident, $features:literal, $vector:ty, $lanes:literal, $chains:expr, $set1:ident, $fmadd:ident, $store:ident) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name(iterations: usize) -> f64 {
            use std::arch::x86_64::*;
            let a = $set1(std::hint::black_box(0.999_999));
            let b = $set1(std::hint::black_box(1e-7));
            let mut acc: [$vector; $chains] = [$set1(1.0); $chains];
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
            (2 * $lanes * $chains * iterations) as f64
        }
    };
}

chains_with!(chains_avx512, "avx512f,fma", __m512, 16, CHAINS, _mm512_set1_ps, _mm512_fmadd_ps, _mm512_storeu_ps);
chains_with!(chains_avx2, "avx2,fma", __m256, 8, CHAINS_AVX2, _mm256_set1_ps, _mm256_fmadd_ps, _mm256_storeu_ps);

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

/// What a benchmark ran on, so that figures from different machines can be told apart.
#[derive(Debug, Clone, Serialize)]
pub struct Processor {
    /// The CPU's model name (`/proc/cpuinfo`, or `sysctl` on macOS).
    pub model: String,
    /// The instruction set the kernels and the GEMM use, and its vector width in bits.
    pub isa: &'static str,
    pub vector_bits: usize,
    /// The widest instruction set the CPU has.
    pub widest_isa: &'static str,
    /// The threads the kernels run on.
    pub threads: usize,
    /// The L1 data cache and the kernel's step derived from it ([`Tuning`]).
    pub l1_kib: usize,
    pub kernel_step: usize,
    /// Whether the kernel's weighted sums of narrow heads keep more multiply-add chains, as this
    /// core's FMA units were measured to need (`kernels::tuning::split_narrow_sums`).
    pub split_narrow_sums: bool,
}

impl Processor {
    pub fn here() -> Self {
        let (isa, tuning) = (Isa::best(), Tuning::get());
        Self {
            model: cpu_model().unwrap_or_else(|| format!("unknown {} processor", std::env::consts::ARCH)),
            isa: isa.name(),
            vector_bits: isa.vector_bits(),
            widest_isa: Isa::detected().name(),
            threads: threads(),
            l1_kib: tuning.l1_bytes / 1024,
            kernel_step: tuning.step,
            split_narrow_sums: kernels::attention::splits_narrow_sums(),
        }
    }
}

impl std::fmt::Display for Processor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}; {} ({}-bit vectors{}), {} thread{}, L1d {} KiB (kernel step {}), narrow heads' sums {}",
            self.model,
            self.isa,
            self.vector_bits,
            if self.isa == self.widest_isa { String::new() } else { format!(", restricted from {}", self.widest_isa) },
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            self.l1_kib,
            self.kernel_step,
            if self.split_narrow_sums { "split" } else { "unsplit" }
        )
    }
}

/// The CPU's model name, where the system says it.
fn cpu_model() -> Option<String> {
    if let Ok(info) = std::fs::read_to_string("/proc/cpuinfo") {
        return info.lines().find_map(|line| {
            line.strip_prefix("model name")?.split_once(':').map(|(_, name)| name.trim().to_string())
        });
    }
    let output = std::process::Command::new("sysctl").args(["-n", "machdep.cpu.brand_string"]).output().ok()?;
    let name = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (!name.is_empty()).then_some(name)
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

/// The float32 rate (GFLOP/s) of the GEMM the dense layers use on the CPU backends
/// ([`kernels::gemm`], the `gemm` crate) on a square `[n, n] x [n, n]` product.
pub fn gemm_gflops(n: usize, reps: Reps) -> Result<f64> {
    use kernels::gemm::{View, matmul};
    let a: Vec<f32> = (0..n * n).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
    let b: Vec<f32> = (0..n * n).map(|i| ((i * 5) % 11) as f32 - 5.0).collect();
    let timing = time(reps, 1, || {
        std::hint::black_box(matmul(View::new(&a, n, n), View::new(&b, n, n)));
        Ok(())
    })?;
    Ok(2.0 * (n * n * n) as f64 / (timing.median_ms * 1e6))
}

/// The attention kernel's choices of tiles walked together, one line per class of calls
/// (`kernels::tuning::tile_choices`): each candidate's best time per 1000 (row, key) pairs of a
/// (batch, head) pair, and the one chosen, as a Markdown table.
pub fn tile_choices_table() -> String {
    let choices = kernels::tuning::tile_choices();
    if choices.is_empty() {
        return "tiles walked together: one candidate on this instruction set, nothing measured\n".into();
    }
    let mut table = String::from(
        "| pass | isa | widths (key, value) | causal | one tile ns | two tiles ns | chosen |\n|---|---|---|---|---:|---:|---|\n",
    );
    for choice in choices {
        let nanos = |n: Option<f64>| n.map_or("-".into(), |n| format!("{n:.1}"));
        let class = choice.class;
        table.push_str(&format!(
            "| {:?} | {} | {}, {} | {} | {} | {} | {} |\n",
            class.pass,
            class.isa,
            class.key_width,
            class.value_width,
            if class.causal { "yes" } else { "no" },
            nanos(choice.nanos[0]),
            nanos(choice.nanos[1]),
            choice.chosen.map_or("measuring".into(), |tiles| format!("{}", tiles.count())),
        ));
    }
    table
}

/// The GEMM's choices of threads, one line per shape of product that crossed the `gemm` crate's
/// threading threshold (`kernels::tuning::gemm_choices`): each candidate's best time a call, and
/// the one chosen, as a Markdown table.
pub fn gemm_choices_table() -> String {
    let choices = kernels::tuning::gemm_choices();
    if choices.is_empty() {
        return "no product crossed the threading threshold: every one ran on its caller's thread\n".into();
    }
    let mut table = String::from(
        "| isa | [M, K] x [K, N] | caller's thread µs | pool µs | rows µs | chosen |\n|---|---|---:|---:|---:|---|\n",
    );
    for choice in choices {
        let micros = |m: Option<f64>| m.map_or("-".into(), |m| format!("{m:.1}"));
        let class = choice.class;
        table.push_str(&format!(
            "| {} | [{}, {}] x [{}, {}] | {} | {} | {} | {} |\n",
            class.isa,
            class.m,
            class.k,
            class.k,
            class.n,
            micros(choice.micros[0]),
            micros(choice.micros[1]),
            micros(choice.micros[2]),
            choice.chosen.map_or("measuring".into(), |threads| format!("{threads:?}").to_lowercase()),
        ));
    }
    table
}

/// [`gemm_choices_table`]'s rows as JSON.
pub fn gemm_choices_json() -> serde_json::Value {
    kernels::tuning::gemm_choices()
        .into_iter()
        .map(|choice| {
            serde_json::json!({
                "isa": choice.class.isa,
                "m": choice.class.m,
                "k": choice.class.k,
                "n": choice.class.n,
                "micros": choice.micros,
                "chosen": choice.chosen.map(|threads| format!("{threads:?}").to_lowercase()),
            })
        })
        .collect()
}

/// [`tile_choices_table`]'s rows as JSON.
pub fn tile_choices_json() -> serde_json::Value {
    kernels::tuning::tile_choices()
        .into_iter()
        .map(|choice| {
            serde_json::json!({
                "pass": format!("{:?}", choice.class.pass),
                "isa": choice.class.isa,
                "key_width": choice.class.key_width,
                "value_width": choice.class.value_width,
                "causal": choice.class.causal,
                "ns_per_1000_pairs": choice.nanos,
                "chosen_tiles": choice.chosen.map(|tiles| tiles.count()),
            })
        })
        .collect()
}
