//! The attention kernel alone, called in a loop, for a profiler: `perf record` on this process
//! shows the kernel's own costs (its tiles, its layout changes, its threads) without Burn's ops
//! around them. It prints the median time of one call.
//!
//! ```text
//! cargo run -p kernels --example attention_loop -- 32,136,6,4 backward 5
//! RAYON_NUM_THREADS=1 perf record ./target/debug/examples/attention_loop 32,136,6,4 forward
//! ```
//!
//! The dev profile already builds this crate at `opt-level = 3` (the workspace's Cargo.toml), so
//! the debug binary runs the kernel as a release build does, without a release build of Burn.
//! Arguments: the shape `B,T,H,K` (self-attention, value width K; default the seed's), the pass
//! (`forward` or `backward`, default `forward`), the seconds to run (default 5) and the mask
//! (`none`, `causal`, or `padding`: a `[B, T, S]` boolean mask whose rows each allow the first
//! `S - S/4 b/B` keys of batch `b`, as Keras users pass padding; default `none`). The mask is
//! packed inside the timed call, as a layer's call does.
//! `KERNELS_ISA`, `KERNELS_STEP`, `KERNELS_SPLIT_SUMS` and `KERNELS_TILES` apply as everywhere; the
//! tiles walked together that the measurement chose are printed at the end.

mod common;

use kernels::attention::{backward, forward};
use kernels::mask::{BoolMask, Mask};
use kernels::{Dims, FullyMaskedRows};

fn main() -> Result<(), String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let shape = args.first().map_or("32,136,6,4", String::as_str);
    let [batch, len, heads, key_dim] = common::sizes(shape)?[..] else {
        return Err(format!("{shape:?} is not B,T,H,K"));
    };
    let pass = args.get(1).map_or("forward", String::as_str);
    if pass != "forward" && pass != "backward" {
        return Err(format!("{pass:?} is neither forward nor backward"));
    }
    let seconds: f64 = match args.get(2) {
        Some(s) => s.parse().map_err(|e| format!("{s}: {e}"))?,
        None => 5.0,
    };

    let mask_name = args.get(3).map_or("none", String::as_str);
    let dims = Dims { batch, heads, query_len: len, source_len: len, key_dim, value_dim: key_dim };
    let padding = BoolMask {
        dims: [batch, 1, len, len],
        allowed: (0..batch * len * len).map(|i| i % len < len - len / 4 * (i / (len * len)) / batch).collect(),
    };
    let mask = move || match mask_name {
        "none" => Ok(Mask::new(false, FullyMaskedRows::Uniform)),
        "causal" => Ok(Mask::new(true, FullyMaskedRows::Uniform)),
        "padding" => Ok(Mask::with_mask(false, FullyMaskedRows::Uniform, Some(padding.clone()), dims)),
        other => Err(format!("{other:?} is none of none, causal, padding")),
    };
    mask()?;
    let n = batch * len * heads * key_dim;
    let values = |seed: usize| (0..n).map(|i| ((i * seed) % 13) as f32 * 0.1 - 0.6).collect::<Vec<f32>>();
    let (query, key, value) = (values(7), values(5), values(3)); // [B, T, H, K] each
    let scale = 1.0 / (key_dim as f32).sqrt();
    let (output, saved) = forward(&query, &key, &value, dims, scale, mask()?); // [B, T, H, K]

    let (median, calls) = common::median_ms(seconds, 1, || {
        if pass == "forward" {
            std::hint::black_box(forward(&query, &key, &value, dims, scale, mask().expect("checked")));
        } else {
            std::hint::black_box(backward(&saved, &output));
        }
    });
    println!("{shape} {pass} {mask_name}: median {median:.3} ms over {calls} calls");
    if mask_name != "none" {
        let (packing, _) = common::median_ms(seconds.min(1.0), 1, || mask().expect("checked"));
        println!("of which the mask's packing: median {packing:.3} ms");
    }
    for choice in kernels::tuning::tile_choices() {
        println!("tiles walked together: {choice:?}");
    }
    Ok(())
}
