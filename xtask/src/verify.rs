//! `cargo xtask verify`: every fixture, on every backend, one line per compared output.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use model::Backend;
use model::fixture::{self, Fixture, FixtureKind};

#[derive(clap::Args)]
pub struct Args {
    /// Fixture files (default: every `*.safetensors` under datasets/reference/).
    files: Vec<PathBuf>,
    /// Comma-separated backends (default: every backend with a device on this machine).
    #[arg(long, value_delimiter = ',')]
    backend: Vec<String>,
}

pub fn run(args: Args) -> Result<ExitCode> {
    let files = match args.files.is_empty() {
        true => fixture::discover(&train::paths::reference_dir())?,
        false => args.files,
    };
    if files.is_empty() {
        bail!("no fixture files found");
    }
    let backends = match args.backend.is_empty() {
        true => Backend::for_checks()?,
        false => args.backend.iter().map(|b| b.parse()).collect::<Result<_, _>>()?,
    };

    let (mut passed, mut failed) = (0usize, 0usize);
    for path in &files {
        let fixture = Fixture::read(path)?;
        for &backend in &backends {
            let device = backend.device(Default::default())?;
            let checks = match fixture.kind()? {
                FixtureKind::Train => train::parity::run(&fixture, backend.name(), &device),
                _ => fixture::run(&fixture, backend.name(), &device).map_err(Into::into),
            }
            .with_context(|| format!("{}: {backend}", path.display()))?;
            for check in checks {
                println!("{check}");
                if check.passed { passed += 1 } else { failed += 1 }
            }
        }
    }
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}
