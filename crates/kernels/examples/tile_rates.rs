//! The attention kernel's two tile products alone, on one thread with their operands in L1: the
//! dot products (`q kᵀ`) and the weighted sums (`P v`) of one tile of 16 rows and of two walked
//! together, beside the FMA units' own rate (16 independent chains of multiply-adds), per head
//! width. The share of that rate is what a model of the core (`xtask/python/mca_loops.py`)
//! predicts as FMAs per cycle over the core's FMA units.
//!
//! ```text
//! cargo run -p kernels --example tile_rates -- 4 16 32 64 128
//! KERNELS_ISA=avx2 ./target/debug/examples/tile_rates 32
//! ```
//!
//! Arguments: head widths (default 4 16 32 64 128). `KERNELS_ISA` applies; 192 rows, the step of
//! a 48 KiB L1.

use kernels::Isa;
use kernels::attention::product_rates;

fn main() -> Result<(), String> {
    let widths: Vec<usize> = match std::env::args().skip(1).map(|a| a.parse::<usize>()).collect::<Result<Vec<_>, _>>() {
        Ok(widths) if !widths.is_empty() => widths,
        Ok(_) => vec![4, 16, 32, 64, 128],
        Err(error) => return Err(format!("widths: {error}")),
    };
    let isa = Isa::from_env().map_err(|e| e.to_string())?.unwrap_or_else(Isa::detected);
    println!("{} on one thread, 192 rows; GFLOP/s and the share of the FMA chains' rate", isa.name());
    println!("| width | FMA chains | dots, one tile | dots, two tiles | sums, one tile | sums, two tiles |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for width in widths {
        let rates = product_rates(isa, width, 192);
        let cell = |rate: f64| format!("{rate:.0} ({:.0}%)", 100.0 * rate / rates.fma_peak);
        println!(
            "| {width} | {:.0} | {} | {} | {} | {} |",
            rates.fma_peak,
            cell(rates.dots[0]),
            cell(rates.dots[1]),
            cell(rates.sums[0]),
            cell(rates.sums[1])
        );
    }
    Ok(())
}
