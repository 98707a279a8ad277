//! `cargo xtask compare`: the study (a ladder of tasks x learning rates x training-set sizes x
//! seeds, the Keras-exact and projected models and a one-head control, on the CPU backends, a
//! subset on wgpu) and its report in reports/<name>/.

use std::process::{Command, ExitCode};

use anyhow::{Result, bail};
use model::Backend;
use train::config::RunConfig;
use train::study::{StudyConfig, run_study, write_report};

use crate::config_args::ConfigArgs;

/// The long help of `cargo xtask compare --help`.
pub const LONG_ABOUT: &str = "\
Train the Keras-exact and the projected model on a ladder of five tasks (lookup, sharp, noisy,
four_heads, two_hop), each over five learning rates (3e-3 to 3e-1) and three training-set sizes
(256 to 4096 sequences), five seeds each, with a one-head Keras layer as the positive control,
on flex and ndarray, and the lookup and two-hop rungs once more on wgpu. Every run is 128 steps
of batch 32 from initial weights shared by every condition and backend. Writes reports/<name>/:
report.md (verdict per condition with 95% intervals, learning-rate ranges, the control,
cross-backend agreement), results.json, loss_curves.png and heat maps (heat_lr.png,
heat_size.png). About 27 minutes on 2 cores for the CPU backends, plus about a minute per
wgpu run on lavapipe. --steps and --seeds scale it to a larger budget.

Finished runs are reused, so an interrupted study resumes; reuse matches configs, not code, so
after changing the code pass --fresh to train every run again.";

#[derive(clap::Args)]
pub struct Args {
    /// The base run config of every run (its learning rate and training-set size are the base
    /// condition; default: configs/default.toml with train.valid_batches = 4).
    #[command(flatten)]
    config: ConfigArgs,
    /// The reduced study for CI: configs/tiny.toml, 16 steps, three learning rates, two sizes,
    /// two seeds; about a minute.
    #[arg(long)]
    quick: bool,
    /// Number of seeds (default 5, or 2 with --quick).
    #[arg(long)]
    seeds: Option<u64>,
    /// Optimizer steps per run (default 128, or 16 with --quick); each training-set size over
    /// the batch size must divide it.
    #[arg(long)]
    steps: Option<usize>,
    /// Comma-separated backends that run every condition (default: flex,ndarray).
    #[arg(long, value_delimiter = ',')]
    backend: Vec<String>,
    /// Comma-separated backends that run the subset (default: wgpu when it has a device here;
    /// `none` for no subset).
    #[arg(long, value_delimiter = ',')]
    subset_backend: Vec<String>,
    /// Report name: reports/<name>/ (default: study, or study-quick with --quick).
    #[arg(long)]
    name: Option<String>,
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
        // The small training sets run many epochs: validate on a sample, not the whole split.
        overrides.push("train.valid_batches=4".to_string());
    }
    overrides.extend(args.config.overrides.iter().cloned());
    let base = RunConfig::load(config_file.as_deref(), &overrides)?;
    let backends = match args.backend.is_empty() {
        true => vec![Backend::Flex, Backend::Ndarray],
        false => parse_backends(&args.backend)?,
    };
    let subset_backends = match args.subset_backend.as_slice() {
        [] => Backend::for_checks()?.into_iter().filter(|b| *b == Backend::Wgpu && !backends.contains(b)).collect(),
        [none] if none == "none" => Vec::new(),
        list => parse_backends(list)?,
    };
    let name = args.name.unwrap_or_else(|| if args.quick { "study-quick".into() } else { "study".into() });
    let mut study = match args.quick {
        true => StudyConfig::quick(&name, base, backends, subset_backends),
        false => StudyConfig::standard(&name, base, backends, subset_backends),
    };
    if let Some(seeds) = args.seeds {
        if seeds == 0 {
            bail!("--seeds 0: at least one seed is needed");
        }
        study.seeds = (1..=seeds).collect();
    }
    if let Some(steps) = args.steps {
        study.steps = steps;
    }
    study.fresh = args.fresh;
    let planned = study.plan().len();
    println!(
        "study {name}: {} rungs, {} conditions, {planned} runs of {} steps on {} (subset on {})",
        study.rungs.len(),
        study.conditions().len(),
        study.steps,
        join(&study.backends),
        if study.subset_backends.is_empty() { "no backend".to_string() } else { join(&study.subset_backends) }
    );
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

fn parse_backends(names: &[String]) -> Result<Vec<Backend>> {
    let backends: Vec<Backend> = names.iter().map(|b| b.parse()).collect::<Result<_, _>>()?;
    for backend in &backends {
        backend.device(Default::default())?;
    }
    Ok(backends)
}

fn join(backends: &[Backend]) -> String {
    backends.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(", ")
}

/// The commit the study ran at (`-dirty` when the tree had changes).
fn git_commit() -> String {
    let run = |args: &[&str]| {
        Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    match run(&["rev-parse", "--short", "HEAD"]) {
        Some(hash) => {
            let dirty = run(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
            if dirty { format!("{hash}-dirty") } else { hash }
        }
        None => "unknown".into(),
    }
}
