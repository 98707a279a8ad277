//! `cargo xtask <command>`: the way into the project. Each command lives in its own module and
//! only parses arguments and prints; the work is done by the `model` and `train` crates.

mod bench;
mod compare;
mod config_args;
mod convert;
mod export;
mod flatten;
mod predict;
mod train;
mod verify;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Attention allocates and frees a few 14 MB score tensors per step; glibc's malloc returns each
/// to the kernel (mmap threshold) and the next one page-faults back in, which profiling showed as
/// ~15% of a training step on flex. mimalloc keeps the memory.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc still hands freed memory back to the kernel 10 ms after it is freed (its default
/// `purge_delay`), and a training step of a wide layer (hundreds of ms, buffers of tens of MB)
/// then page-faults its buffers back in every step: about 4% of the step in perf's profile, and
/// measured in turns, 383-416 ms against 422-450 ms a step at 2,1024,1024,8x128. Kept, freed
/// memory is reused by the next step; the price is a higher peak (224 -> 239-257 MB there, where
/// torch's process holds about 700 MB). A `MIMALLOC_PURGE_DELAY` in the environment wins.
fn keep_freed_memory() {
    /// `mi_option_purge_delay` of `mimalloc.h` (15 in v2 and v3), which libmimalloc-sys does not name.
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // SAFETY: sets one of mimalloc's options, which it allows at any time.
        unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) };
    }
}

/// Mesa's implicit Vulkan layer `VK_LAYER_MESA_device_select` (installed with lavapipe) asks the
/// Wayland compositor which GPU drives the display each time an instance that enabled Wayland
/// surfaces (every wgpu instance does) lists its devices; on a machine without a display,
/// libwayland then prints `error: XDG_RUNTIME_DIR is invalid or not set in the environment.` to
/// stderr, once per listing (six times in a `verify`), which reads as the command failing. With
/// no display there is nothing to select by, so the layer is switched off by its documented
/// variable. A user's own `NODEVICE_SELECT`, `MESA_VK_DEVICE_SELECT` or `DRI_PRIME`, or a display,
/// leaves it on.
fn quiet_device_select_without_display() {
    let set = |name: &str| std::env::var_os(name).is_some();
    let display = ["DISPLAY", "WAYLAND_DISPLAY", "WAYLAND_SOCKET"].into_iter().any(set);
    let chosen = ["NODEVICE_SELECT", "MESA_VK_DEVICE_SELECT", "DRI_PRIME"].into_iter().any(set);
    if !display && !chosen {
        // SAFETY: called first thing in `main`, before any thread is started.
        unsafe { std::env::set_var("NODEVICE_SELECT", "1") };
    }
}

#[derive(Parser)]
#[command(name = "cargo xtask", about = "Keras-exact vs PyTorch-style multi-head attention on Burn")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Train a model on the seq_len-136 lookup task (default: the embedded config).
    #[command(long_about = train::LONG_ABOUT)]
    Train(train::Args),
    /// Time forward and training steps of both models, beside PyTorch and TensorFlow.
    #[command(long_about = bench::LONG_ABOUT)]
    Bench(bench::Args),
    /// The study: every model on every backend with several seeds, and its report.
    #[command(long_about = compare::LONG_ABOUT)]
    Compare(compare::Args),
    /// Convert an attention layer of a Keras model file to Keras, PyTorch or Burn weights.
    #[command(long_about = convert::long_about())]
    Convert(convert::Args),
    /// Export a trained run for Burn, Keras or PyTorch.
    #[command(long_about = export::LONG_ABOUT)]
    Export(export::Args),
    /// Re-trace a Keras model's custom layers into built-in layers (runs Python and Keras).
    #[command(long_about = flatten::LONG_ABOUT)]
    Flatten(flatten::Args),
    /// Run a whole Keras model (.keras) in Burn on inputs from a safetensors file.
    #[command(long_about = predict::long_about())]
    Predict(predict::Args),
    /// Check the modules against fixtures made with the real Keras and PyTorch.
    Verify(verify::Args),
}

fn main() -> ExitCode {
    quiet_device_select_without_display();
    keep_freed_memory();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Train(args) => train::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Compare(args) => compare::run(args),
        Command::Convert(args) => convert::run(args),
        Command::Export(args) => export::run(args),
        Command::Flatten(args) => flatten::run(args),
        Command::Predict(args) => predict::run(args),
        Command::Verify(args) => verify::run(args),
    };
    match result {
        Ok(code) => code,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
