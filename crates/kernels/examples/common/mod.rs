//! What the kernels' examples share: reading a shape argument and timing a call.

use std::time::Instant;

/// The comma-separated sizes of `arg` (`"32,136,6,4"`); an error names the argument.
pub fn sizes(arg: &str) -> Result<Vec<usize>, String> {
    arg.split(',').map(str::parse).collect::<Result<_, _>>().map_err(|e| format!("{arg}: {e}"))
}

/// The median milliseconds of `call`, called for `seconds` and at least `min_calls` times, and
/// the number of calls.
pub fn median_ms<R>(seconds: f64, min_calls: usize, mut call: impl FnMut() -> R) -> (f64, usize) {
    let mut times = Vec::new();
    let start = Instant::now();
    while times.len() < min_calls.max(1) || start.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        std::hint::black_box(call());
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    (times[times.len() / 2], times.len())
}
