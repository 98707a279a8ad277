//! The config arguments shared by the commands that run training.

use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ConfigArgs {
    /// TOML run config (default: the embedded configs/default.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override a config key, e.g. --set backend=wgpu --set train.epochs=5 (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}
