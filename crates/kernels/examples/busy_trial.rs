//! A product whose threading is chosen while another thread holds a core, then freed: whether
//! the choice's review ([`kernels::tuning`]) puts it right. A spinning thread keeps one core busy
//! for the first calls (by default the ten of the trial), as another process did in the bench;
//! then it stops. Prints each call's time in windows of calls, and the choice after each window.
//!
//! ```text
//! ./target/debug/examples/busy_trial 4096,256,256 --busy 10 --calls 200
//! KERNELS_ISA=avx2 ./target/debug/examples/busy_trial
//! ```
//!
//! Arguments: the shape `M,K,N` of `[M, K] x [K, N]` (default 4096,256,256, 8,512,256's
//! projections), `--busy N` calls with the core held, `--calls N` in all. `KERNELS_ISA` applies.

#[allow(dead_code)] // its timing helper: this example times each call itself
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use kernels::gemm::{View, matmul};
use kernels::testing::values;

fn main() -> Result<(), String> {
    let (mut shape, mut busy, mut calls) = ((4096, 256, 256), 10, 200);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut count = |name: &str| {
            let value = args.next().ok_or(format!("{name} needs a count"))?;
            value.parse::<usize>().map_err(|_| format!("{name} {value:?} is not a count"))
        };
        match arg.as_str() {
            "--busy" => busy = count("--busy")?,
            "--calls" => calls = count("--calls")?,
            _ => match common::sizes(&arg)?[..] {
                [m, k, n] => shape = (m, k, n),
                _ => return Err(format!("{arg:?} is not M,K,N")),
            },
        }
    }
    let (m, k, n) = shape;
    let (x, w) = (values(m * k, 1), values(k * n, 2)); // [M, K], [K, N]
    let (x, w) = (View::new(&x, m, k), View::new(&w, k, n));

    let held = Arc::new(AtomicBool::new(busy > 0));
    let spinner = {
        let held = Arc::clone(&held);
        std::thread::spawn(move || {
            while held.load(Ordering::Relaxed) {
                std::hint::spin_loop();
            }
        })
    };
    println!("[{m}, {k}] x [{k}, {n}], a core held for the first {busy} calls of {calls}");
    let mut window: Vec<f64> = Vec::new();
    for call in 1..=calls {
        if call == busy + 1 {
            held.store(false, Ordering::Relaxed);
        }
        let start = Instant::now();
        std::hint::black_box(matmul(x, w)); // [M, N]
        window.push(start.elapsed().as_secs_f64() * 1e3);
        let ends_window = call == busy || call == calls || (call > busy && (call - busy) % 10 == 0);
        if ends_window {
            window.sort_by(f64::total_cmp);
            let choice =
                kernels::tuning::gemm_choices().into_iter().find(|c| (c.class.m, c.class.k, c.class.n) == shape);
            let (chosen, micros) = choice.map_or((None, [None; 3]), |c| (c.chosen, c.micros));
            let best: Vec<String> =
                micros.iter().map(|t| t.map_or("-".into(), |t| format!("{:.2}", t / 1e3))).collect();
            println!(
                "calls {:>4}-{call:<4} median {:.2} ms  chosen {:<6}  best ms (caller pool rows) {}",
                call + 1 - window.len(),
                window[window.len() / 2],
                chosen.map_or("-".into(), |c| format!("{c:?}")),
                best.join(" ")
            );
            window.clear();
        }
    }
    held.store(false, Ordering::Relaxed);
    spinner.join().map_err(|_| "the spinning thread panicked".to_string())
}
