//! `cargo xtask bench`: forward and training-step times of both models over a sweep of shapes
//! and masks, beside PyTorch and TensorFlow measured in the same invocation, each row's distance
//! from the cores' FMA peak, and a sequence-length scaling series with its plot.

mod reference;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kernels::Isa;
use model::Backend;
use serde_json::{Value, json};
use train::bench::peak::{Processor, fma_peak_gflops, gemm_gflops, matmul_gflops};
use train::bench::{
    Call, CallKind, Case, MaskKind, Memory, Reps, Shape, Timing, forward, median, parameters, step_memory, time_into,
    train_step,
};
use train::models::ModelKind;

use reference::{Python, Reference};

/// The long help of `cargo xtask bench --help`.
pub const LONG_ABOUT: &str = "\
Benchmark both models over a sweep of shapes (B,T,D,HxK) and masks (none, causal, padding):
the forward pass (inference) and a training step (forward, MSE, backward, Adam).

The default sweep is the seed's shape 32,136,4,6x4 and 8,512,256,8x32, 4,1024,512,8x64 and
1,4096,64,4x16, every mask, on flex. Masks are Keras' (use_causal_mask, attention_mask from
sequence lengths) for the Keras-exact layer and torch's (boolean attn_mask, key_padding_mask)
for the projected model. Then a scaling series: the Keras-exact layer at 8192 tokens per batch,
T = 128 to 8192 (B = 8192 / T), D = 64, 4 heads of 16, time and peak memory.

When a Python with torch is found (--python, $BENCH_PYTHON, or python3), it keeps
xtask/python/bench_reference.py running beside it and measures the same rows there (torch
scaled_dot_product_attention, torch nn.MultiheadAttention, and the real
keras.layers.MultiHeadAttention where tensorflow is there too) on the same threads (--threads,
default every core the process may use), in turns with ours: the whole plan in 3 passes, each
row and phase in 2 rounds of ours and of the references per pass, so that a drift of the
machine's speed reaches both sides and a slow spell of one side (seen lasting several rounds)
reaches at most a third of a row's rounds. It prints ours / fastest reference (below 1 is
faster), and ours / fastest round by round. Every row also states its floor:
its FLOPs over the cores' float32 FMA peak, measured in the same run, and the memory a training
step adds to the idle process on each side. The header names the processor, the instruction set in use,
and the matrix-product rates of ours and of torch's matmul. --isa avx2 restricts both sides to
AVX2 (ours by KERNELS_ISA, torch by ATEN_CPU_CAPABILITY, MKL_ENABLE_INSTRUCTIONS and oneDNN's
ONEDNN_MAX_CPU_ISA), so that an AVX2-only processor can be measured on a wider one. Results:
reports/bench/bench.json, reports/bench/scaling.md and scaling.png.

--models measures whole models instead (xtask/python/bench_models.py): an LSTM, keras.io's
time-series Transformer at its own sizes and a causal forecaster of the question's layer, each
run in Burn from its .keras file, as the torch module `convert` writes (as its load() returns it,
keeping freed memory, and with glibc's default malloc) and in Keras, in turns on the same threads
(reports/bench/models.json).";

#[derive(clap::Args)]
pub struct Args {
    /// Few repetitions and small shapes: checks that the benchmark works, not a measurement.
    #[arg(long)]
    quick: bool,
    /// A shape B,T,D,H,K to measure (repeatable; default: the sweep).
    #[arg(long = "shape", value_name = "B,T,D,H,K")]
    shapes: Vec<String>,
    /// Comma-separated masks: none, causal, padding (default: all three).
    #[arg(long, value_delimiter = ',')]
    mask: Vec<String>,
    /// Comma-separated calls: plain, scores (the probabilities returned too), dropout (0.1 on
    /// the probabilities, in the training step) (default: plain).
    #[arg(long, value_delimiter = ',')]
    call: Vec<String>,
    /// Comma-separated models: keras, projected (default: both).
    #[arg(long, value_delimiter = ',')]
    model: Vec<String>,
    /// Comma-separated backends (default: flex).
    #[arg(long, value_delimiter = ',')]
    backend: Vec<String>,
    /// Python interpreter with torch (and tensorflow, when it has it) for the reference measurements.
    #[arg(long)]
    python: Option<PathBuf>,
    /// JSON output (default: reports/bench/bench.json, or bench-quick.json with --quick).
    #[arg(long)]
    json: Option<PathBuf>,
    /// Threads for both sides: our kernels and burn (rayon's pool) and the reference libraries
    /// (default: every core this process may run on).
    #[arg(long)]
    threads: Option<usize>,
    /// Restrict our kernels and GEMM and the references to one instruction set: avx512, avx2 or
    /// portable (default: the widest this CPU has, or KERNELS_ISA).
    #[arg(long)]
    isa: Option<String>,
    /// Also print where each row's time goes: milliseconds per call in our GEMM, the attention
    /// kernel's forward and backward passes, and the rest (Burn's own ops, autodiff, the
    /// optimizer, copies); the JSON rows get a "profile" entry.
    #[arg(long)]
    profile: bool,
    /// Skip the sequence-length scaling series.
    #[arg(long)]
    no_scaling: bool,
    /// Instead of the sweep, the whole-model rows (xtask/python/bench_models.py): Keras files run
    /// in Burn, as the torch module `convert` writes (with glibc's allocator and with freed
    /// memory kept) and in Keras itself, in turns on the same threads; writes
    /// reports/bench/models.json (or --json).
    #[arg(long)]
    models: bool,
    /// Internal: take 3 training steps of one row and print the memory they take (JSON).
    #[arg(long, hide = true, value_names = ["BACKEND", "MODEL", "MASK", "CALL", "SHAPE"], num_args = 5)]
    memory_child: Option<Vec<String>>,
}

/// Passes over the whole plan, and rounds per row and phase in each pass: ours and the
/// references take turns `PASSES * ROUNDS` times per row (see [`interleaved`]), in passes minutes
/// apart. The machine has slow spells that take one side for many seconds: in nine invocations
/// of 8,256,512,16x32's projected training step, six rounds in a row took turns with torch, and
/// our step ran at 122-126 ms in some and at 145-156 ms in others, for up to all six rounds of a
/// row (torch's had such spells too), so one row's ratio read 0.91 in one invocation and 1.04 in
/// the next (AMD EPYC Zen 4, docs/benchmarks.md). Rounds spread over three passes put a spell in
/// at most a third of a row's samples, and each side's median is its time outside the spells.
const PASSES: usize = 3;
const ROUNDS: usize = 2;

/// The scaling series: tokens per batch, and the sequence lengths.
const SCALING_TOKENS: usize = 8192;
const SCALING_LENGTHS: [usize; 7] = [128, 256, 512, 1024, 2048, 4096, 8192];

pub fn run(args: Args) -> Result<ExitCode> {
    if let Some(child) = &args.memory_child {
        let case = child_case(child)?;
        let backend: Backend = child[0].parse()?;
        let step = train_step(case, &backend.device(Default::default())?)?;
        println!("{}", serde_json::to_string(&step_memory(step, 3)?)?);
        return Ok(ExitCode::SUCCESS);
    }
    let threads = use_threads(args.threads)?;
    if args.models {
        return whole_models(&args, threads);
    }
    kernels::profile::set_enabled(args.profile);
    let isa = match &args.isa {
        Some(name) => Isa::parse(name)?,
        None => Isa::from_env()?.unwrap_or_else(Isa::detected),
    };
    if let Err(in_use) = Isa::use_for_process(isa) {
        bail!("--isa {}: the kernels already run on {}", isa.name(), in_use.name());
    }
    let plan = Plan::from_args(&args)?;
    let root = train::paths::repo_root();
    let reps = if args.quick { Reps::QUICK } else { Reps::FULL };

    let mut reference = match Python::find(args.python.as_deref()) {
        Some(python) => {
            if python.tensorflow {
                println!("starting the PyTorch/TensorFlow reference ({})...", python.path.display());
            } else {
                println!("note: {} has torch but no tensorflow: the reference is PyTorch alone", python.path.display());
            }
            Some(Reference::start(&python, &root, threads, args.quick, isa)?)
        }
        None => {
            println!("note: no Python with torch (use --python or BENCH_PYTHON); reference skipped");
            None
        }
    };

    let processor = Processor::here();
    println!("processor: {processor}");
    println!("measuring the machine: FMA peak and matrix-product rates...");
    let fma_peak = fma_peak_gflops();
    let mut limits = vec![json!({ "what": "fma_peak", "gflops": fma_peak, "threads": processor.threads })];
    let matmul_n = if args.quick { 256 } else { 1024 };
    let matmul_reps = if args.quick { Reps::QUICK } else { Reps { measured: 20, ..Reps::FULL } };
    let gemm = gemm_gflops(matmul_n, matmul_reps)?;
    limits.push(json!({ "what": "gemm", "n": matmul_n, "gflops": gemm }));
    let library = match reference.as_mut() {
        Some(reference) => Some(reference.matmul_gflops(matmul_n, matmul_reps.measured)?),
        None => None,
    };
    println!(
        "  FMA peak {fma_peak:.0} GFLOP/s; {matmul_n}^3 matrix product: ours (the gemm crate) {gemm:.0}, torch's matmul {}",
        library.map_or("- (no reference)".into(), |g| format!("{g:.0}"))
    );
    if let Some(gflops) = library {
        limits.push(json!({ "what": "matmul", "library": "torch", "n": matmul_n, "gflops": gflops }));
    }
    let passes = if args.quick { 1 } else { PASSES };
    let mut measured: Vec<Measured> = Vec::new();
    for pass in 0..passes {
        if passes > 1 {
            println!("pass {} of {passes}", pass + 1);
        }
        let mut row = 0;
        for (b, &backend) in plan.backends.iter().enumerate() {
            let device = backend.device(Default::default())?;
            if pass == 0 {
                let matmul = matmul_gflops(&device, matmul_n, matmul_reps)?;
                println!("  {backend}'s own matmul: {matmul_n}^3 {matmul:.0} GFLOP/s");
                limits.push(json!({ "what": "matmul", "backend": backend, "n": matmul_n, "gflops": matmul }));
            }
            for (series, cases) in [("sweep", &plan.cases), ("scaling", &plan.scaling)] {
                for &case in cases {
                    println!("  {backend} {series}: {} {} {} {}", case.shape, case.mask, case.model, case.call);
                    let memory = match pass {
                        0 => Some(memory_child(backend, case, isa)?),
                        _ => None,
                    };
                    if let Some(reference) = reference.as_mut().filter(|_| b == 0 && pass == 0) {
                        reference.memory(&case)?;
                    }
                    for (phase, call, flops) in [
                        ("forward", forward(case, &device)?, case.forward_flops()),
                        ("train_step", train_step(case, &device)?, case.train_flops()),
                    ] {
                        if let Some(memory) = memory {
                            let floor_ms = flops / (fma_peak * 1e6);
                            let samples = Samples::default();
                            measured.push(Measured { series, backend, case, phase, floor_ms, memory, samples });
                        }
                        let turns = Turns { pass, passes, reps };
                        interleaved(call, turns, reference.as_mut(), &mut measured[row])?;
                        row += 1;
                    }
                }
            }
        }
    }
    let rows: Vec<Row> = measured.into_iter().map(Measured::into_row).collect();
    let reference = reference.map(Reference::report).transpose()?;
    if let Some(errors) = reference.as_ref().and_then(|r| r["errors"].as_array()) {
        errors.iter().for_each(|e| println!("note: reference: {}", e.as_str().unwrap_or_default()));
    }

    let table = sweep_table(&rows, reference.as_ref());
    println!("\n{table}");
    println!("attention kernel, tiles of 16 rows walked together, chosen by measurement per class of calls:");
    println!("{}", train::bench::peak::tile_choices_table());
    println!(
        "matrix products on the caller's thread, rayon's pool or one block of rows a thread, chosen by measurement per shape:"
    );
    println!("{}", train::bench::peak::gemm_choices_table());
    let scaling = scaling_table(&rows, reference.as_ref());
    if !plan.scaling.is_empty() {
        println!("{scaling}");
    }
    let bench_dir = root.join("reports/bench");
    let json_path =
        args.json.clone().unwrap_or_else(|| bench_dir.join(if args.quick { "bench-quick.json" } else { "bench.json" }));
    let out = json!({
        "quick": args.quick,
        "processor": processor,
        "limits": limits,
        "tile_choices": train::bench::peak::tile_choices_json(),
        "gemm_choices": train::bench::peak::gemm_choices_json(),
        "params": plan.cases.iter().map(|c| Ok(json!({ "case": c, "params": parameters(*c)? }))).collect::<Result<Vec<_>>>()?,
        "rows": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
        "reference": reference,
    });
    model::weights::write_atomic(&json_path, serde_json::to_string_pretty(&out)?.as_bytes())?;
    println!("wrote {}", json_path.display());
    if !plan.scaling.is_empty() && !args.quick {
        model::weights::write_atomic(&bench_dir.join("scaling.md"), scaling.as_bytes())?;
        let points = scaling_points(&rows, reference.as_ref());
        train::bench::plot::scaling(&points, &bench_dir.join("scaling.png"))?;
        println!("wrote {} and scaling.png", bench_dir.join("scaling.md").display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Which rounds of a row a call of [`interleaved`] takes: those of pass `pass` of `passes`, the
/// row's repetitions split between all of them.
#[derive(Debug, Clone, Copy)]
struct Turns {
    pass: usize,
    passes: usize,
    reps: Reps,
}

impl Turns {
    /// Round `round` of this pass: the pass's first warms up in full (the row was just built
    /// again, on both sides), later ones make one untimed call.
    fn reps(self, round: usize) -> Reps {
        let mut reps = self.reps.round(self.pass * ROUNDS + round, self.passes * ROUNDS);
        if round == 0 {
            reps.warmup = self.reps.warmup;
        }
        reps
    }
}

/// Times `call` in [`ROUNDS`] rounds, each followed (or, every other round, preceded) by a round
/// of the reference's models of the same row and phase, adds them to `row`, and prints them. The
/// machine's speed drifts by up to 2x over minutes here; measured minutes apart, one side of a
/// ratio could run in a slow spell and the other not (a row measured 1.34 that way ran at
/// 0.6-0.9 of torch's time when the two were timed in turns). Taking turns every half second or
/// so puts both sides in the same short spells, and the passes (see [`PASSES`]) keep a long one
/// to a third of a row's rounds; all rounds' samples make one median per side.
fn interleaved(mut call: Call, turns: Turns, mut reference: Option<&mut Reference>, row: &mut Measured) -> Result<()> {
    let (mut ours, mut theirs) = (Vec::new(), BTreeMap::<String, Vec<f64>>::new());
    // Every call of ours this pass (warm-ups too) and its wall time, for the profile.
    let (mut calls, mut wall) = (0u32, Duration::ZERO);
    kernels::profile::take();
    for round in 0..ROUNDS {
        let reps = turns.reps(round);
        // Ours first in even rounds, the reference first in odd ones.
        for turn in [round % 2, 1 - round % 2] {
            if turn == 0 {
                let mut this_round = Vec::new();
                time_into(reps, &mut this_round, || {
                    let start = Instant::now();
                    let result = call();
                    (calls, wall) = (calls + 1, wall + start.elapsed());
                    result
                })?;
                row.samples.rounds.ours.push(median(&this_round));
                ours.extend(this_round);
            } else if let Some(reference) = reference.as_deref_mut() {
                for (name, times) in reference.measure(&row.case, row.phase, reps)? {
                    row.samples.rounds.references.entry(name.clone()).or_default().push(median(&times));
                    theirs.entry(name).or_default().extend(times);
                }
            }
        }
    }
    let others: Vec<String> = theirs.iter().map(|(name, times)| format!("{name} {:.2}", median(times))).collect();
    println!(
        "    {:<10} ours {:.2} ms ({} reps){}{}",
        row.phase,
        median(&ours),
        ours.len(),
        if others.is_empty() { "" } else { " | " },
        others.join(" | ")
    );
    if let Some((name, ratios)) = row.samples.rounds.ratios() {
        let ratios: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
        println!("    rounds     ours / {name}, every pass so far: {}", ratios.join(" "));
    }
    let phases = kernels::profile::take();
    if kernels::profile::enabled() {
        println!("    profile    {}", profile(phases, calls, wall).1);
    }
    row.samples.ours.extend(ours);
    for (total, (_, time, count)) in row.samples.phases.iter_mut().zip(phases) {
        (total.1, total.2) = (total.1 + time, total.2 + count);
    }
    (row.samples.calls, row.samples.wall) = (row.samples.calls + calls, row.samples.wall + wall);
    Ok(())
}

/// A row and phase while the passes measure it: what it is, and its samples so far.
struct Measured {
    series: &'static str,
    backend: Backend,
    case: Case,
    phase: &'static str,
    floor_ms: f64,
    memory: Memory,
    samples: Samples,
}

/// Every round's samples of a row and phase so far.
struct Samples {
    /// Our timed calls' milliseconds, all rounds.
    ours: Vec<f64>,
    rounds: Rounds,
    /// The kernel phases' times over every call of ours (warm-ups too), and those calls' count
    /// and wall time, for the profile.
    phases: kernels::profile::Totals,
    calls: u32,
    wall: Duration,
}

impl Default for Samples {
    fn default() -> Self {
        let phases = kernels::profile::Phase::ALL.map(|phase| (phase, Duration::ZERO, 0));
        Self { ours: Vec::new(), rounds: Rounds::default(), phases, calls: 0, wall: Duration::ZERO }
    }
}

impl Measured {
    fn into_row(self) -> Row {
        let Self { series, backend, case, phase, floor_ms, memory, samples } = self;
        let profile = kernels::profile::enabled().then(|| profile(samples.phases, samples.calls, samples.wall).0);
        let timing = Timing::from_samples(samples.ours, case.shape.batch);
        Row { series, backend, case, phase, timing, rounds: samples.rounds, floor_ms, memory, profile }
    }
}

/// The median time of each round of a row and phase, ours and each reference's, in the JSON
/// and printed as ratios: whether a row's ratio held in every round or came from a slow spell
/// of one side.
#[derive(Debug, Default)]
struct Rounds {
    ours: Vec<f64>,
    references: BTreeMap<String, Vec<f64>>,
}

impl Rounds {
    /// The reference with the lowest median round, and ours over it round by round.
    fn ratios(&self) -> Option<(&str, Vec<f64>)> {
        let (name, theirs) = self.references.iter().min_by(|a, b| median(a.1).total_cmp(&median(b.1)))?;
        Some((name, self.ours.iter().zip(theirs).map(|(ours, theirs)| ours / theirs).collect()))
    }
}

/// Milliseconds per call (the mean over `calls` calls that took `wall`) in each kernel phase and
/// in the rest: as a row's JSON "profile", and as a line to print.
fn profile(phases: kernels::profile::Totals, calls: u32, wall: Duration) -> (Value, String) {
    let per_call = |time: Duration| time.as_secs_f64() * 1e3 / f64::from(calls.max(1));
    let mut entry = serde_json::Map::new();
    let mut line = String::new();
    for (phase, time, _) in phases {
        entry.insert(format!("{}_ms", phase.name()), json!(per_call(time)));
        line += &format!("{} {:.2} ms | ", phase.name(), per_call(time));
    }
    let rest = wall.saturating_sub(phases.iter().map(|&(_, time, _)| time).sum());
    entry.insert("rest_ms".into(), json!(per_call(rest)));
    line += &format!("the rest {:.2} ms (mean per call)", per_call(rest));
    (Value::Object(entry), line)
}

/// What one invocation measures.
struct Plan {
    backends: Vec<Backend>,
    cases: Vec<Case>,
    scaling: Vec<Case>,
}

impl Plan {
    fn from_args(args: &Args) -> Result<Self> {
        let shapes: Vec<Shape> = match (args.shapes.is_empty(), args.quick) {
            (false, _) => args.shapes.iter().map(|s| s.parse()).collect::<Result<_>>()?,
            (true, false) => Shape::SWEEP.to_vec(),
            (true, true) => vec![Shape::SEED],
        };
        let masks: Vec<MaskKind> = match args.mask.is_empty() {
            true => MaskKind::ALL.to_vec(),
            false => args.mask.iter().map(|m| m.parse()).collect::<Result<_>>()?,
        };
        let models: Vec<ModelKind> = match args.model.is_empty() {
            true => vec![ModelKind::Keras, ModelKind::Projected],
            false => args.model.iter().map(|m| parse_model(m)).collect::<Result<_>>()?,
        };
        let calls: Vec<CallKind> = match args.call.is_empty() {
            true => vec![CallKind::Plain],
            false => args.call.iter().map(|c| c.parse()).collect::<Result<_>>()?,
        };
        let backends = match args.backend.is_empty() {
            true => vec![Backend::Flex],
            false => args.backend.iter().map(|b| b.parse()).collect::<Result<_, _>>()?,
        };
        let mut cases = Vec::new();
        for &shape in &shapes {
            for &model in &models {
                for &mask in &masks {
                    for &call in &calls {
                        cases.push(Case { shape, mask, model, call });
                    }
                }
            }
        }
        // The scaling series runs only with the default sweep (an explicit --shape asks for rows).
        let scaling = match args.no_scaling || !args.shapes.is_empty() || args.quick {
            true => Vec::new(),
            false => SCALING_LENGTHS
                .iter()
                .map(|&t| Case {
                    shape: Shape { batch: SCALING_TOKENS / t, seq_len: t, features: 64, heads: 4, key_dim: 16 },
                    mask: MaskKind::None,
                    model: ModelKind::Keras,
                    call: CallKind::Plain,
                })
                .collect(),
        };
        Ok(Self { backends, cases, scaling })
    }
}

fn parse_model(name: &str) -> Result<ModelKind> {
    match name {
        "keras" => Ok(ModelKind::Keras),
        "projected" => Ok(ModelKind::Projected),
        _ => bail!("--model {name:?}: expected keras or projected"),
    }
}

/// The row of a memory child's arguments `[backend, model, mask, call, shape]`.
fn child_case(child: &[String]) -> Result<Case> {
    Ok(Case {
        model: parse_model(&child[1])?,
        mask: child[2].parse()?,
        call: child[3].parse()?,
        shape: child[4].parse()?,
    })
}

struct Row {
    series: &'static str,
    backend: Backend,
    case: Case,
    phase: &'static str,
    timing: Timing,
    rounds: Rounds,
    floor_ms: f64,
    memory: Memory,
    /// Where the time went, with `--profile`.
    profile: Option<Value>,
}

impl Row {
    fn to_json(&self) -> Value {
        json!({
            "series": self.series, "backend": self.backend, "case": self.case, "phase": self.phase,
            "timing": self.timing, "rounds": { "ours": self.rounds.ours, "references": self.rounds.references },
            "floor_ms": self.floor_ms, "memory": self.memory, "profile": self.profile,
        })
    }
}

/// The reference entries measured for a row, by `framework/model` name (SDPA cannot return
/// the probabilities: a scores row's torch Keras-style model writes the softmax out).
fn reference_names(case: &Case) -> &'static [&'static str] {
    match (case.model, case.call) {
        (ModelKind::Keras, CallKind::Scores) => &["torch/keras_style_explicit", "tensorflow/keras_mha"],
        (ModelKind::Keras, _) => &["torch/keras_style_sdpa", "tensorflow/keras_mha"],
        (_, CallKind::Scores) => &["torch/projected_mha"],
        _ => &["torch/projected_mha", "torch/projected_sdpa"],
    }
}

/// The reference time of `name` for a row's case and phase.
fn reference_ms(reference: &Value, name: &str, case: &Case, phase: &str) -> Option<f64> {
    let (framework, model) = name.split_once('/')?;
    let case = serde_json::to_value(case).ok()?;
    reference["results"].as_array()?.iter().find_map(|r| {
        (r["framework"] == framework && r["model"] == model && r["phase"] == phase && r["case"] == case)
            .then(|| r["median_ms"].as_f64())
            .flatten()
    })
}

/// The memory torch's training steps added to its idle process for a row.
fn reference_memory(reference: &Value, case: &Case) -> Option<f64> {
    let case = serde_json::to_value(case).ok()?;
    reference["peak_rss_mb"]
        .as_array()?
        .iter()
        .find_map(|r| (r["case"] == case).then(|| r["step_mb"].as_f64()).flatten())
}

/// The fastest reference for a row: its name and time.
fn fastest(reference: Option<&Value>, case: &Case, phase: &str) -> Option<(&'static str, f64)> {
    let reference = reference?;
    let times =
        reference_names(case).iter().filter_map(|name| Some((*name, reference_ms(reference, name, case, phase)?)));
    times.min_by(|a, b| a.1.total_cmp(&b.1))
}

fn mb(value: Option<f64>) -> String {
    value.map_or("-".into(), |m| format!("{m:.0}"))
}

fn sweep_table(rows: &[Row], reference: Option<&Value>) -> String {
    let mut out = String::from(
        "| shape B,T,D,HxK | mask | model | call | phase | backend | ours ms | fastest reference ms | ours / fastest | floor ms | ours / floor | ours step MB | torch step MB |\n\
         |---|---|---|---|---|---|---:|---|---:|---:|---:|---:|---:|\n",
    );
    for r in rows.iter().filter(|r| r.series == "sweep") {
        let best = fastest(reference, &r.case, r.phase);
        out += &format!(
            "| {} | {} | {} | {} | {} | {} | {:.2} | {} | {} | {:.2} | {:.1} | {} | {} |\n",
            r.case.shape,
            r.case.mask,
            r.case.model,
            r.case.call,
            r.phase,
            r.backend,
            r.timing.median_ms,
            best.map_or("-".into(), |(name, ms)| format!("{ms:.2} ({name})")),
            best.map_or("-".into(), |(_, ms)| format!("**{:.2}**", r.timing.median_ms / ms)),
            r.floor_ms,
            r.timing.median_ms / r.floor_ms,
            mb(r.memory.step_mb),
            mb(reference.and_then(|reference| reference_memory(reference, &r.case))),
        );
    }
    out
}

fn scaling_points(rows: &[Row], reference: Option<&Value>) -> Vec<train::bench::plot::ScalingPoint> {
    let train = rows.iter().filter(|r| r.series == "scaling" && r.phase == "train_step");
    train
        .map(|r| {
            let torch = reference
                .and_then(|reference| reference_ms(reference, "torch/keras_style_sdpa", &r.case, "train_step"));
            train::bench::plot::ScalingPoint {
                seq_len: r.case.shape.seq_len,
                ours_ms: r.timing.median_ms,
                torch_ms: torch,
                ours_mb: r.memory.step_mb,
                torch_mb: reference.and_then(|reference| reference_memory(reference, &r.case)),
            }
        })
        .collect()
}

fn scaling_table(rows: &[Row], reference: Option<&Value>) -> String {
    let mut out = format!(
        "Scaling: the Keras-exact layer, {SCALING_TOKENS} tokens per batch (B = {SCALING_TOKENS} / T), D = 64, 4 heads of 16, no mask.\n\n\
         | T | B | phase | ours ms | torch SDPA ms | ours / torch | ours step MB | torch step MB |\n|---:|---:|---|---:|---:|---:|---:|---:|\n"
    );
    for r in rows.iter().filter(|r| r.series == "scaling") {
        let torch = reference.and_then(|reference| reference_ms(reference, "torch/keras_style_sdpa", &r.case, r.phase));
        out += &format!(
            "| {} | {} | {} | {:.2} | {} | {} | {} | {} |\n",
            r.case.shape.seq_len,
            r.case.shape.batch,
            r.phase,
            r.timing.median_ms,
            torch.map_or("-".into(), |ms| format!("{ms:.2}")),
            torch.map_or("-".into(), |ms| format!("{:.2}", r.timing.median_ms / ms)),
            mb(r.memory.step_mb),
            mb(reference.and_then(|reference| reference_memory(reference, &r.case))),
        );
    }
    out
}

/// Sizes rayon's global pool, which burn's CPU backends and our kernels run on, to `threads`
/// (default: every core the process may run on), so that both sides of a ratio get the same
/// cores. Returns the count.
/// `--models`: builds the Burn side (`model_step`, an example of the workspace, beside this
/// binary) and runs `xtask/python/bench_models.py` with the Python `--python` names.
fn whole_models(args: &Args, threads: usize) -> Result<ExitCode> {
    let root = train::paths::repo_root();
    let python = Python::find(args.python.as_deref())
        .context("the whole-model rows need a Python with torch (and Keras on TensorFlow): --python or BENCH_PYTHON")?;
    println!("building the Burn side (cargo build --workspace --examples)...");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = Command::new(cargo)
        .args(["build", "--workspace", "--examples", "--locked", "--quiet"])
        .current_dir(&root)
        .status()
        .context("running cargo")?;
    if !built.success() {
        bail!("cargo build --workspace --examples failed");
    }
    let xtask = std::env::current_exe().context("this binary's path")?;
    let ours = xtask.with_file_name("examples").join("model_step");
    let json = args.json.clone().unwrap_or_else(|| root.join("reports/bench/models.json"));
    let mut command = Command::new(&python.path);
    command
        .arg(root.join("xtask/python/bench_models.py"))
        .args(["--threads", &threads.to_string(), "--rounds", if args.quick { "1" } else { "3" }])
        .args(["--seconds", if args.quick { "0.5" } else { "2" }])
        .arg("--ours")
        .arg(&ours)
        .arg("--xtask")
        .arg(&xtask)
        .arg("--json")
        .arg(&json);
    let status = command.status().with_context(|| format!("running {}", python.path.display()))?;
    Ok(if status.success() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn use_threads(threads: Option<usize>) -> Result<usize> {
    let threads = match threads {
        Some(0) => bail!("--threads 0: at least one thread is needed"),
        Some(threads) => threads,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .with_context(|| format!("--threads {threads}: rayon's pool was already started"))?;
    Ok(threads)
}

/// The memory of a fresh process that takes 3 training steps of `case` on `isa`.
fn memory_child(backend: Backend, case: Case, isa: Isa) -> Result<Memory> {
    let exe = std::env::current_exe()?;
    let shape = case.shape;
    let shape_arg = format!("{},{},{},{},{}", shape.batch, shape.seq_len, shape.features, shape.heads, shape.key_dim);
    let output = Command::new(exe)
        .args([
            "bench",
            "--memory-child",
            backend.name(),
            case.model.name(),
            case.mask.name(),
            case.call.name(),
            &shape_arg,
        ])
        .env(kernels::simd::ISA_VARIABLE, isa.name())
        .env("RAYON_NUM_THREADS", rayon::current_num_threads().to_string())
        .output()?;
    if !output.status.success() {
        bail!(
            "memory measurement of {} {} {} {} on {backend} failed: {}",
            shape,
            case.mask,
            case.model,
            case.call,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().last().unwrap_or_default();
    serde_json::from_str(last).with_context(|| format!("the memory child answered {last:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_are_compared_with_the_reference_of_the_lowest_median_round() {
        let rounds = Rounds {
            ours: vec![9.0, 12.0, 10.0],
            references: BTreeMap::from([
                ("torch/slow".to_string(), vec![20.0, 20.0, 20.0]),
                ("torch/fast".to_string(), vec![10.0, 10.0, 12.5]),
            ]),
        };
        let (name, ratios) = rounds.ratios().unwrap();
        assert_eq!(name, "torch/fast");
        assert_eq!(ratios, [0.9, 1.2, 0.8]);
        assert!(Rounds::default().ratios().is_none(), "no reference, no ratios");
    }
}
