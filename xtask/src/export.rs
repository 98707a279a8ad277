//! `cargo xtask export`: a finished run's weights for Burn, Keras or PyTorch.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use train::export::{Format, export};

/// The long help of `cargo xtask export --help`.
pub const LONG_ABOUT: &str = "\
Export a trained run: burnpack (burn), safetensors with Keras names (keras; with a .keras archive
and a .weights.h5 beside it that Keras opens itself) or with torch state_dict names (torch). The safetensors files carry a probe batch and this model's output on
it; check them with `cargo xtask verify FILE` and `python3 xtask/python/check_export.py FILE`.";

#[derive(clap::Args)]
pub struct Args {
    /// The run folder, e.g. runs/keras-flex.
    #[arg(long)]
    run: PathBuf,
    /// burn | keras | torch
    #[arg(long)]
    format: Format,
    /// Output file (default: <run>/export/<format>.<ext>).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Folder of the task's cached data, for the probe batch (default: datasets/task).
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let data_dir = args.data_dir.unwrap_or_else(train::paths::task_data_dir);
    let path = export(&args.run, args.format, args.out, &data_dir)?;
    println!("wrote {}", path.display());
    if args.format == Format::Keras {
        let stem = path.with_extension("");
        println!(
            "wrote {}.keras (keras.saving.load_model) and {}.weights.h5 (Model.load_weights)",
            stem.display(),
            stem.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
