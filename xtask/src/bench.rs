//! `cargo xtask bench`: forward and training-step time of both models on every backend, beside
//! PyTorch and TensorFlow measured in the same invocation, and the arithmetic floor of each.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};
use model::Backend;
use serde_json::{Value, json};
use train::bench::{Reps, Shape, Timing, forward, matmul_gflops, parameters, peak_rss_mb, train_step};
use train::models::ModelKind;

/// The long help of `cargo xtask bench --help`.
pub const LONG_ABOUT: &str = "\
Benchmark both models at the seed's shape (batch 32, 136 steps, 4 features, 6 heads of 4).

When a Python with torch and tensorflow is found (--python, $BENCH_PYTHON, or python3), it also
runs xtask/python/bench_reference.py with the same shapes, thread count and optimizer, and
prints ours/theirs for each pair (below 1 is faster). Results go to reports/bench/bench.json.";

#[derive(clap::Args)]
pub struct Args {
    /// Few repetitions: checks that the benchmark works, not a measurement.
    #[arg(long)]
    quick: bool,
    /// Python interpreter with torch and tensorflow for the reference measurements.
    #[arg(long)]
    python: Option<PathBuf>,
    /// Comma-separated backends (default: every backend with a device here).
    #[arg(long, value_delimiter = ',')]
    backend: Vec<String>,
    /// JSON output (default: reports/bench/bench.json, or bench-quick.json with --quick).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Threads for the reference libraries (burn uses every core of the machine).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Internal: run 20 training steps and print the peak resident memory.
    #[arg(long, hide = true, value_names = ["BACKEND", "MODEL"], num_args = 2)]
    memory_child: Option<Vec<String>>,
}

const MODELS: [ModelKind; 2] = [ModelKind::Keras, ModelKind::Projected];

pub fn run(args: Args) -> Result<ExitCode> {
    let shape = Shape::SEED;
    if let Some(child) = &args.memory_child {
        let backend: Backend = child[0].parse()?;
        let model = if child[1] == "keras" { ModelKind::Keras } else { ModelKind::Projected };
        train_step(model, shape, &backend.device(Default::default())?, Reps { warmup: 0, measured: 20 })?;
        println!("{}", peak_rss_mb().context("no /proc/self/status")?);
        return Ok(ExitCode::SUCCESS);
    }
    let reps = if args.quick { Reps { warmup: 1, measured: 3 } } else { Reps { warmup: 10, measured: 50 } };
    let backends = match args.backend.is_empty() {
        true => Backend::for_checks()?,
        false => args.backend.iter().map(|b| b.parse()).collect::<Result<_, _>>()?,
    };
    let root = train::paths::repo_root();

    // The reference first, so that neither side shares the cores with the other.
    let reference = match python(&args) {
        Some(python) => Some(run_reference(&python, &root, args.quick, args.threads)?),
        None => {
            println!("note: no Python with torch and tensorflow (use --python or BENCH_PYTHON); reference skipped");
            None
        }
    };

    let mut rows = Vec::new();
    for &backend in &backends {
        let device = backend.device(Default::default())?;
        let gflops = matmul_gflops(&device, Reps { warmup: 2, measured: if args.quick { 3 } else { 20 } })?;
        for model in MODELS {
            let memory = peak_memory_child(backend, model)?;
            for (phase, timing, flops) in [
                ("forward", forward(model, shape, &device, reps)?, shape.forward_flops(model)),
                ("train_step", train_step(model, shape, &device, reps)?, shape.train_flops(model)),
            ] {
                rows.push(Row { backend, model, phase, timing, floor_ms: flops / (gflops * 1e6), gflops, peak_rss_mb: memory });
            }
        }
    }

    print_table(&rows, reference.as_ref());
    let json_path = args.json.unwrap_or_else(|| root.join("reports/bench").join(if args.quick { "bench-quick.json" } else { "bench.json" }));
    let out = json!({
        "shape": shape,
        "params": { "keras": parameters(ModelKind::Keras, shape)?, "projected": parameters(ModelKind::Projected, shape)? },
        "quick": args.quick,
        "rows": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        "reference": reference,
    });
    model::weights::write_atomic(&json_path, serde_json::to_string_pretty(&out)?.as_bytes())?;
    println!("wrote {}", json_path.display());
    Ok(ExitCode::SUCCESS)
}

struct Row {
    backend: Backend,
    model: ModelKind,
    phase: &'static str,
    timing: Timing,
    floor_ms: f64,
    gflops: f64,
    peak_rss_mb: Option<f64>,
}

impl Row {
    fn to_json(&self) -> Value {
        json!({
            "backend": self.backend, "model": self.model, "phase": self.phase, "timing": self.timing,
            "floor_ms": self.floor_ms, "matmul_gflops": self.gflops, "peak_rss_mb": self.peak_rss_mb,
        })
    }
}

/// The reference entries that do what `model` does, by name.
fn reference_names(model: ModelKind) -> &'static [&'static str] {
    match model {
        ModelKind::Keras => &["torch/keras_style_sdpa", "torch/keras_style_manual", "tensorflow/keras_mha", "tensorflow/keras_mha_xla"],
        _ => &["torch/projected_mha"],
    }
}

fn reference_ms(reference: &Value, name: &str, phase: &str) -> Option<f64> {
    let (framework, model) = name.split_once('/')?;
    reference["results"].as_array()?.iter().find_map(|r| {
        (r["framework"] == framework && r["model"] == model && r["phase"] == phase).then(|| r["median_ms"].as_f64()).flatten()
    })
}

fn print_table(rows: &[Row], reference: Option<&Value>) {
    println!("\n| model | phase | backend | ms (median) | samples/s | floor ms | ours/floor | peak RSS MB | ours / reference (ms) | ours / fastest |");
    println!("|---|---|---|---:|---:|---:|---:|---:|---|---:|");
    for r in rows {
        let mut pairs = Vec::new();
        let mut fastest: Option<f64> = None;
        if let Some(reference) = reference {
            for name in reference_names(r.model) {
                if let Some(ms) = reference_ms(reference, name, r.phase) {
                    pairs.push(format!("{name} {:.2} ({ms:.2})", r.timing.median_ms / ms));
                    fastest = Some(fastest.map_or(ms, |f: f64| f.min(ms)));
                }
            }
        }
        println!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.2} | {:.1} | {} | {} | {} |",
            r.model,
            r.phase,
            r.backend,
            r.timing.median_ms,
            r.timing.samples_per_s,
            r.floor_ms,
            r.timing.median_ms / r.floor_ms,
            r.peak_rss_mb.map_or("-".into(), |m| format!("{m:.0}")),
            if pairs.is_empty() { "-".into() } else { pairs.join("; ") },
            fastest.map_or("-".into(), |f| format!("{:.2}", r.timing.median_ms / f)),
        );
    }
    if let Some(reference) = reference {
        println!("\nreference peak RSS (MB): {}", reference["peak_rss_mb"]);
    }
}

/// Peak resident memory of a fresh process that takes 20 training steps.
fn peak_memory_child(backend: Backend, model: ModelKind) -> Result<Option<f64>> {
    let exe = std::env::current_exe()?;
    let output = Command::new(exe).args(["bench", "--memory-child", backend.name(), model.name()]).output()?;
    if !output.status.success() {
        bail!("memory measurement of {model} on {backend} failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    Ok(String::from_utf8_lossy(&output.stdout).lines().last().and_then(|l| l.trim().parse().ok()))
}

/// The Python to run the reference with, if one with torch and tensorflow is there.
fn python(args: &Args) -> Option<PathBuf> {
    let candidate = args.python.clone().or_else(|| std::env::var_os("BENCH_PYTHON").map(PathBuf::from)).unwrap_or_else(|| "python3".into());
    let ok = Command::new(&candidate).args(["-c", "import torch, tensorflow"]).output().is_ok_and(|o| o.status.success());
    ok.then_some(candidate)
}

fn run_reference(python: &Path, root: &Path, quick: bool, threads: usize) -> Result<Value> {
    let json = std::env::temp_dir().join(format!("bench-reference-{}.json", std::process::id()));
    let mut command = Command::new(python);
    command.arg(root.join("xtask/python/bench_reference.py")).args(["--threads", &threads.to_string(), "--json"]).arg(&json);
    if quick {
        command.arg("--quick");
    }
    println!("running the PyTorch/TensorFlow reference ({})...", python.display());
    let status = command.status().context("cannot run the reference script")?;
    if !status.success() {
        bail!("xtask/python/bench_reference.py failed ({status})");
    }
    let text = std::fs::read_to_string(&json).with_context(|| format!("{} was not written", json.display()))?;
    std::fs::remove_file(&json).ok();
    Ok(serde_json::from_str(&text)?)
}
