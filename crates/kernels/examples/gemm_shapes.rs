//! The dense layers' products alone, in each layout a layer's forward and backward passes use,
//! for comparing rates by shape: `x W + b` and `x W` (forward), `dy Wᵀ` (the input's gradient)
//! and `xᵀ dy` (the weight's gradient), each for `x: [M, K]`, `W: [K, N]`. It prints GFLOP/s per
//! layout.
//!
//! ```text
//! ./target/debug/examples/gemm_shapes 2048,512,512 2048,512,1536 4352,4,24
//! KERNELS_ISA=avx2 ./target/debug/examples/gemm_shapes 2048,512,512
//! ```
//!
//! Arguments: shapes `M,K,N` (default: the 8,256,512 projections). `KERNELS_ISA` applies.

use std::time::Instant;

use kernels::gemm::{View, matmul, matmul_bias};

fn main() -> Result<(), String> {
    let mut shapes = Vec::new();
    for arg in std::env::args().skip(1) {
        let sizes: Vec<usize> =
            arg.split(',').map(str::parse).collect::<Result<_, _>>().map_err(|e| format!("{arg}: {e}"))?;
        let [m, k, n] = sizes[..] else {
            return Err(format!("{arg:?} is not M,K,N"));
        };
        shapes.push((m, k, n));
    }
    if shapes.is_empty() {
        shapes.push((2048, 512, 512));
    }
    for (m, k, n) in shapes {
        let x: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 * 0.1).collect(); // [M, K]
        let w: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 * 0.1).collect(); // [K, N]
        let dy: Vec<f32> = (0..m * n).map(|i| (i % 3) as f32 * 0.1).collect(); // [M, N]
        let bias: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect(); // [N]
        let layouts: [(&str, View, View, Option<&[f32]>); 4] = [
            ("x W + b", View::new(&x, m, k), View::new(&w, k, n), Some(&bias)),
            ("x W", View::new(&x, m, k), View::new(&w, k, n), None),
            ("dy Wt", View::new(&dy, m, n), View::new(&w, k, n).t(), None),
            ("xt dy", View::new(&x, m, k).t(), View::new(&dy, m, n), None),
        ];
        let flops = 2.0 * (m * k * n) as f64;
        let mut line = format!("{m},{k},{n}:");
        for (name, a, b, bias) in layouts {
            let mut times = Vec::new();
            let start = Instant::now();
            while times.len() < 5 || (start.elapsed().as_secs_f64() < 1.0 && times.len() < 1000) {
                let t = Instant::now();
                std::hint::black_box(match bias {
                    Some(bias) => matmul_bias(a, b, bias),
                    None => matmul(a, b),
                });
                times.push(t.elapsed().as_secs_f64());
            }
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            line += &format!("  {name} {:.0} GFLOP/s ({:.3} ms)", flops / median / 1e9, median * 1e3);
        }
        println!("{line}");
    }
    Ok(())
}
