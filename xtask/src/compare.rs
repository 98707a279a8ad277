//! `cargo xtask compare`: the study matrix {keras, projected, baseline} x backends x seeds, and its
//! report in reports/<name>/.

use std::process::{Command, ExitCode};

use anyhow::{Result, bail};
use model::Backend;
use train::config::RunConfig;
use train::models::ModelKind;
use train::study::{StudyConfig, run_study, write_report};

use crate::config_args::ConfigArgs;

/// The long help of `cargo xtask compare --help`.
pub const LONG_ABOUT: &str = "\
Train every model on every backend with several seeds, equal budgets and shared initial
weights, and write reports/<name>/ (report.md with the table and the verdict, results.json,
loss_curves.svg/png). Finished runs are reused, so an interrupted study resumes; reuse matches
configs, not code, so after changing the code pass --fresh to train every run again.

The default budget is configs/default.toml with train.epochs = 2 (256 steps of batch 32).";

#[derive(clap::Args)]
pub struct Args {
    /// The base run config of every run of the matrix.
    #[command(flatten)]
    config: ConfigArgs,
    /// A reduced matrix for CI: configs/tiny.toml, two seeds, seconds to a minute.
    #[arg(long)]
    quick: bool,
    /// Number of seeds (1, 2, ...); default 3, or 2 with --quick.
    #[arg(long)]
    seeds: Option<u64>,
    /// Comma-separated backends (default: every backend with a device here).
    #[arg(long, value_delimiter = ',')]
    backend: Vec<String>,
    /// Report name: reports/<name>/ (default: study, or study-quick with --quick).
    #[arg(long)]
    name: Option<String>,
    /// Smoothed train loss that "steps to threshold" counts to (default: 2 x the Bayes floor).
    #[arg(long)]
    threshold: Option<f64>,
    /// Train every run again instead of reusing finished ones (do this after changing the code).
    #[arg(long)]
    fresh: bool,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let root = train::paths::repo_root();
    let config_file = match (&args.config.config, args.quick) {
        (Some(path), _) => Some(path.clone()),
        (None, true) => Some(root.join("configs/tiny.toml")),
        (None, false) => None,
    };
    let mut overrides = Vec::new();
    if args.config.config.is_none() && !args.quick {
        overrides.push("train.epochs=2".to_string());
    }
    overrides.extend(args.config.overrides.iter().cloned());
    let base = RunConfig::load(config_file.as_deref(), &overrides)?;
    let seeds = args.seeds.unwrap_or(if args.quick { 2 } else { 3 });
    if seeds == 0 {
        bail!("--seeds 0: at least one seed is needed");
    }
    let backends = match args.backend.is_empty() {
        true => Backend::for_checks()?,
        false => args.backend.iter().map(|b| b.parse()).collect::<Result<_, _>>()?,
    };
    let name = args.name.unwrap_or_else(|| if args.quick { "study-quick".into() } else { "study".into() });
    let study = StudyConfig {
        name: name.clone(),
        threshold: args.threshold.unwrap_or(2.0 * base.task.noise_std.powi(2)),
        base,
        models: ModelKind::ALL.to_vec(),
        backends,
        seeds: (1..=seeds).collect(),
        fresh: args.fresh,
    };
    let results = run_study(&study, &root.join("runs"), &train::paths::task_data_dir())?;
    let mut command = String::from("cargo xtask compare");
    for arg in std::env::args().skip(2) {
        command.push(' ');
        command.push_str(&arg);
    }
    let command = format!("{command}` at commit `{}", git_commit());
    let report = write_report(&results, &root.join("reports").join(&name), &command)?;
    println!("\n{}", std::fs::read_to_string(&report)?);
    println!("wrote {}", report.display());
    Ok(ExitCode::SUCCESS)
}

/// The commit the study ran at (`-dirty` when the tree had changes).
fn git_commit() -> String {
    let run = |args: &[&str]| Command::new("git").args(args).output().ok().filter(|o| o.status.success()).map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match run(&["rev-parse", "--short", "HEAD"]) {
        Some(hash) => {
            let dirty = run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if dirty { format!("{hash}-dirty") } else { hash }
        }
        None => "unknown".into(),
    }
}
