//! The Keras-exact layer in a plain binary, as a library user embeds it: the public API only
//! (`KerasMhaConfig::init`, `KerasMhaInput`, `forward`), burn's Adam, and the system allocator.
//! It times the forward pass and a training step (forward, MSE, backward, Adam) on flex, so the
//! speed a user gets can be set beside `cargo xtask bench`, which installs mimalloc.
//!
//! ```text
//! cargo run --release -p model --example embedded -- 2,1024,1024,8,128 [causal]
//! ```
//!
//! `embedded_mimalloc` is the same program with mimalloc as the global allocator.

use std::time::Instant;

use burn::module::Module;
use burn::optim::{AdamConfig, GradientsParams};
use burn::tensor::{Device, Distribution, Tensor};
use model::{KerasMhaConfig, KerasMhaInput};

pub fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let shape = args.first().map(String::as_str).unwrap_or("32,136,4,6,4");
    let causal = args.get(1).is_some_and(|mask| mask == "causal");
    let sizes: Vec<usize> = shape.split(',').map(str::parse).collect::<Result<_, _>>()?;
    let [batch, seq_len, features, heads, key_dim] = sizes[..] else {
        return Err(format!("{shape:?} is not B,T,D,H,K").into());
    };

    let device = Device::flex().autodiff();
    let mut layer = KerasMhaConfig::new(heads, key_dim, features).init(&device)?;
    let x = Tensor::<3>::random([batch, seq_len, features], Distribution::Normal(0.0, 1.0), &device); // [B, T, D]
    let target = Tensor::<3>::random([batch, seq_len, features], Distribution::Normal(0.0, 1.0), &device); // [B, T, D]
    let input = |x: &Tensor<3>| KerasMhaInput { use_causal_mask: causal, ..KerasMhaInput::self_attention(x.clone()) };
    let mut optimizer = AdamConfig::new().init();

    // Inference on the layer without autodiff, as `cargo xtask bench` times it: on the autodiff
    // device every forward pass keeps its graph until a backward pass frees it.
    let inference = layer.valid();
    let x_inference = x.clone().inner(); // [B, T, D]
    let forward_ms = median_ms(|| {
        let output = inference.forward(input(&x_inference))?.output; // [B, T, D]
        output.sum().into_scalar::<f32>();
        Ok(())
    })?;
    let step_ms = median_ms(|| {
        let output = layer.forward(input(&x))?.output; // [B, T, D]
        let loss = (output - target.clone()).square().mean();
        let grads = GradientsParams::from_grads(loss.backward(), &layer);
        layer = optimizer.step(1e-3, layer.clone(), grads);
        Ok(())
    })?;
    println!(
        "{shape} {}: forward {forward_ms:.2} ms, training step {step_ms:.2} ms (median of 30 after 5)",
        if causal { "causal" } else { "none" }
    );
    Ok(())
}

/// The median time of 30 calls of `call` after 5 warm-up calls, in milliseconds.
fn median_ms(mut call: impl FnMut() -> model::Result<()>) -> model::Result<f64> {
    for _ in 0..5 {
        call()?;
    }
    let mut times = Vec::new();
    for _ in 0..30 {
        let start = Instant::now();
        call()?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}
