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

mod common;

use kernels::gemm::{View, matmul, matmul_bias};
use kernels::testing::values;

fn main() -> Result<(), String> {
    let mut shapes = Vec::new();
    for arg in std::env::args().skip(1) {
        let [m, k, n] = common::sizes(&arg)?[..] else {
            return Err(format!("{arg:?} is not M,K,N"));
        };
        shapes.push((m, k, n));
    }
    if shapes.is_empty() {
        shapes.push((2048, 512, 512));
    }
    for (m, k, n) in shapes {
        let (x, w) = (values(m * k, 1), values(k * n, 2)); // [M, K], [K, N]
        let (dy, bias) = (values(m * n, 3), values(n, 4)); // [M, N], [N]
        let layouts: [(&str, View, View, Option<&[f32]>); 4] = [
            ("x W + b", View::new(&x, m, k), View::new(&w, k, n), Some(&bias)),
            ("x W", View::new(&x, m, k), View::new(&w, k, n), None),
            ("dy Wt", View::new(&dy, m, n), View::new(&w, k, n).t(), None),
            ("xt dy", View::new(&x, m, k).t(), View::new(&dy, m, n), None),
        ];
        let flops = 2.0 * (m * k * n) as f64;
        let mut line = format!("{m},{k},{n}:");
        for (name, a, b, bias) in layouts {
            let (median_ms, _) = common::median_ms(1.0, 5, || match bias {
                Some(bias) => matmul_bias(a, b, bias),
                None => matmul(a, b),
            });
            line += &format!("  {name} {:.0} GFLOP/s ({median_ms:.3} ms)", flops / median_ms / 1e6);
        }
        println!("{line}");
    }
    Ok(())
}
