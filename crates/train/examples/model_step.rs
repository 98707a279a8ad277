//! The benchmark's whole-model rows, our side: a Keras model file (by default
//! `datasets/keras-models/bench_lstm.keras`) on `[B, T, D]` random inputs in Burn, the forward
//! pass (inference) and a training step (the mean square of the first output, Keras' Adam at
//! 1e-3) timed for a few seconds each. Prints one JSON line with the medians;
//! `xtask/python/bench_models.py` runs it in turns with the torch module `convert` writes and
//! with Keras itself on the same threads.
//!
//! ```text
//! cargo run --example model_step -- [MODEL.keras] [--shape 32,136,4] [--backend flex] [--seconds 2]
//! ```

use std::path::PathBuf;

/// The allocator `cargo xtask` runs on: mimalloc, freed memory kept (xtask's main.rs says why).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::optim::GradientsParams;
use burn::tensor::{Distribution, Tensor};
use keras::{DynTensor, KerasModel};
use model::Backend;
use train::optim::OptimizerConfig;

/// Every value of `--name value`.
fn option(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).cloned()
}

/// The median of `call`'s times in ms, called for `seconds` after two untimed calls.
fn median_ms(seconds: f64, mut call: impl FnMut() -> Result<()>) -> Result<(f64, usize)> {
    call()?;
    call()?;
    let (mut times, start) = (Vec::new(), Instant::now());
    while times.len() < 3 || start.elapsed().as_secs_f64() < seconds {
        let t = Instant::now();
        call()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], times.len()))
}

/// A model output of any rank as one vector.
fn flat(output: DynTensor) -> Result<Tensor<1>> {
    let count = output.shape().iter().product();
    Ok(output.reshape(&[count])?.rank_n::<1>("output")?)
}

fn main() -> Result<()> {
    /// `mi_option_purge_delay` of `mimalloc.h`, as xtask's main.rs sets it.
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: sets one of mimalloc's options, which it allows at any time.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) };
    let args: Vec<String> = std::env::args().skip(1).collect();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let path = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("datasets/keras-models/bench_lstm.keras"));
    let shape = option(&args, "--shape").unwrap_or_else(|| "32,136,4".into());
    let [batch, steps, features] = shape.split(',').map(str::parse::<usize>).collect::<Result<Vec<_>, _>>()?[..] else {
        bail!("--shape {shape:?} is not B,T,D");
    };
    let backend: Backend = option(&args, "--backend").unwrap_or_else(|| "flex".into()).parse()?;
    let seconds: f64 = option(&args, "--seconds").unwrap_or_else(|| "2".into()).parse()?;

    let plain = backend.device(Default::default())?;
    let inference = KerasModel::from_file(&path, &plain).with_context(|| format!("reading {}", path.display()))?;
    let x = Tensor::<3>::random([batch, steps, features], Distribution::Normal(0.0, 1.0), &plain); // [B, T, D]
    let (forward, forward_calls) = median_ms(seconds, || {
        let out = flat(inference.forward(vec![DynTensor::from(x.clone())], false)?.remove(0).tensor)?; // [N]
        out.sum().into_scalar::<f32>(); // on the host before the clock stops
        Ok(())
    })?;

    let device = plain.autodiff();
    let mut model = KerasModel::from_file(&path, &device)?;
    let x = Tensor::<3>::random([batch, steps, features], Distribution::Normal(0.0, 1.0), &device); // [B, T, D]
    let mut optim =
        OptimizerConfig::AdamKeras { beta_1: 0.9, beta_2: 0.999, epsilon: 1e-7, amsgrad: false, weight_decay: 0.0 }
            .init();
    let (train_step, train_calls) = median_ms(seconds, || {
        let out = flat(model.forward(vec![DynTensor::from(x.clone())], true)?.remove(0).tensor)?; // [N]
        let loss = out.powi_scalar(2).mean(); // the mean square of the first output

        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(1e-3, model.clone(), grads);
        Ok(())
    })?;
    println!(
        "{{\"model\": {:?}, \"shape\": [{batch}, {steps}, {features}], \"backend\": {:?}, \"forward_ms\": {forward:.4}, \
         \"forward_calls\": {forward_calls}, \"train_step_ms\": {train_step:.4}, \"train_step_calls\": {train_calls}}}",
        path.file_name().and_then(|n| n.to_str()).unwrap_or_default(),
        format!("{backend:?}").to_lowercase(),
    );
    Ok(())
}
