//! The PyTorch/TensorFlow side of `cargo xtask bench`: `xtask/python/bench_reference.py --serve`
//! as a child process that measures a row's reference models when asked. Holding it open lets the
//! benchmark alternate rounds of ours and of the references on the same cores, so that the
//! machine's speed, which drifts by up to 2x over minutes here, reaches both sides of a ratio.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, Result, bail};
use kernels::Isa;
use serde_json::{Value, json};
use train::bench::{Case, Reps};

/// A Python to run the reference with.
pub struct Python {
    pub path: PathBuf,
    /// Whether it imports tensorflow too; without it the reference is torch alone.
    pub tensorflow: bool,
}

impl Python {
    /// `explicit`, else `$BENCH_PYTHON`, else `python3`, if it imports torch.
    pub fn find(explicit: Option<&Path>) -> Option<Python> {
        let path = explicit
            .map(Path::to_path_buf)
            .or_else(|| std::env::var_os("BENCH_PYTHON").map(PathBuf::from))
            .unwrap_or_else(|| "python3".into());
        let imports = |modules: &str| {
            Command::new(&path).args(["-c", &format!("import {modules}")]).output().is_ok_and(|o| o.status.success())
        };
        // torch first: importing it after tensorflow aborts in some environments.
        let tensorflow = imports("torch, tensorflow");
        (tensorflow || imports("torch")).then_some(Python { path, tensorflow })
    }
}

/// The reference script, running and waiting for requests.
pub struct Reference {
    child: Child,
    requests: ChildStdin,
    answers: BufReader<ChildStdout>,
    script: PathBuf,
}

impl Reference {
    /// Starts the script with `python` and waits until torch (and TensorFlow, where `python`
    /// has it) is imported. `isa` restricts torch, MKL and oneDNN as our kernels are restricted
    /// (the script's `--isa`).
    pub fn start(python: &Python, root: &Path, threads: usize, quick: bool, isa: Isa) -> Result<Self> {
        let script = root.join("xtask/python/bench_reference.py");
        let mut command = Command::new(&python.path);
        command.arg(&script).args(["--serve", "--threads", &threads.to_string(), "--isa", isa.name()]);
        if quick {
            command.arg("--quick");
        }
        if !python.tensorflow {
            command.args(["--only", "torch"]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("cannot run {} {}", python.path.display(), script.display()))?;
        let requests = child.stdin.take().context("the reference script's stdin")?;
        let answers = BufReader::new(child.stdout.take().context("the reference script's stdout")?);
        let mut reference = Self { child, requests, answers, script };
        reference.answer()?; // {"ok": true, "ready": true}
        Ok(reference)
    }

    /// torch's float32 matmul rate on `[n, n] x [n, n]` (GFLOP/s, the median of `reps`).
    pub fn matmul_gflops(&mut self, n: usize, reps: usize) -> Result<f64> {
        let answer = self.ask(json!({ "op": "matmul", "n": n, "reps": reps }))?;
        answer["gflops"].as_f64().with_context(|| format!("{}: a matmul answer without gflops", self.script.display()))
    }

    /// The row's torch peak memory, measured by the script in a fresh child of its own.
    pub fn memory(&mut self, case: &Case) -> Result<()> {
        self.ask(json!({ "op": "memory", "case": case }))?;
        Ok(())
    }

    /// One round of `phase` of every reference model of `case`: this round's times (ms) by
    /// `framework/model` name.
    pub fn measure(&mut self, case: &Case, phase: &str, reps: Reps) -> Result<BTreeMap<String, Vec<f64>>> {
        let answer = self.ask(json!({
            "op": "measure", "case": case, "phase": phase, "warmup": reps.warmup, "reps": reps.measured,
            "minimum": reps.minimum, "budget_s": reps.budget.as_secs_f64(),
        }))?;
        serde_json::from_value(answer["times"].clone())
            .with_context(|| format!("{}: a measurement without times", self.script.display()))
    }

    /// Every result so far (the rounds of a row and phase summarised together), peak memory,
    /// versions and errors; the script exits.
    pub fn report(mut self) -> Result<Value> {
        self.send(json!({ "op": "report" }))?;
        let report = self.answer()?;
        drop(self.requests);
        let status = self.child.wait().with_context(|| format!("waiting for {}", self.script.display()))?;
        if !status.success() {
            bail!("{} ended with {status}", self.script.display());
        }
        Ok(report)
    }

    fn ask(&mut self, request: Value) -> Result<Value> {
        self.send(request)?;
        let answer = self.answer()?;
        if answer["ok"] != json!(true) {
            bail!("{}: {}", self.script.display(), answer["error"].as_str().unwrap_or("an answer without \"ok\""));
        }
        Ok(answer)
    }

    fn send(&mut self, request: Value) -> Result<()> {
        writeln!(self.requests, "{request}")
            .and_then(|()| self.requests.flush())
            .with_context(|| format!("{} stopped taking requests (its output is above)", self.script.display()))
    }

    fn answer(&mut self) -> Result<Value> {
        let mut line = String::new();
        let read =
            self.answers.read_line(&mut line).with_context(|| format!("reading {}'s answer", self.script.display()))?;
        if read == 0 {
            bail!("{} ended without answering (its output is above)", self.script.display());
        }
        serde_json::from_str(&line).with_context(|| format!("{} answered {line:?}, not JSON", self.script.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use train::bench::{CallKind, MaskKind, Shape};
    use train::models::ModelKind;

    /// A stand-in for the reference script, speaking its protocol: one answer a request, as many
    /// times as the request's `reps` asks for, under a name that says whether it was started for
    /// torch alone; no peak memory; and it dies when asked for a
    /// training step, as a script that crashes mid-run would.
    const STAND_IN: &str = r#"
import json, sys
print(json.dumps({"ok": True, "ready": True}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    if request["op"] == "measure":
        if request["phase"] == "train_step":
            sys.exit(3)
        times = [float(request["reps"])] * request["reps"]
        alone = "--only" in sys.argv and sys.argv[sys.argv.index("--only") + 1] == "torch"
        name = "torch/stand_in_alone" if alone else "torch/stand_in"
        print(json.dumps({"ok": True, "times": {name: times}}), flush=True)
    elif request["op"] == "matmul":
        isa = sys.argv[sys.argv.index("--isa") + 1]
        print(json.dumps({"ok": True, "gflops": request["n"] * request["reps"] + (0.5 if isa == "portable" else 0)}), flush=True)
    elif request["op"] == "memory":
        print(json.dumps({"ok": False, "error": "no memory today"}), flush=True)
    elif request["op"] == "report":
        print(json.dumps({"results": [], "errors": ["none"]}), flush=True)
        break
"#;

    /// python3 running the stand-in, as a Python with or without tensorflow.
    fn stand_in(tensorflow: bool) -> Python {
        Python { path: "python3".into(), tensorflow }
    }

    #[test]
    fn requests_are_answered_and_a_refusal_or_a_dead_script_is_an_error_naming_it() {
        let root = std::env::temp_dir().join(format!("kmha-reference-test-{}", std::process::id()));
        std::fs::create_dir_all(root.join("xtask/python")).unwrap();
        std::fs::write(root.join("xtask/python/bench_reference.py"), STAND_IN).unwrap();
        let case = Case { shape: Shape::SEED, mask: MaskKind::Padding, model: ModelKind::Keras, call: CallKind::Plain };
        let reps = Reps::FULL.round(1, 3);

        let mut reference = Reference::start(&stand_in(true), &root, 2, false, Isa::PORTABLE).unwrap();
        let times = reference.measure(&case, "forward", reps).unwrap();
        assert_eq!(times["torch/stand_in"], vec![reps.measured as f64; reps.measured]);
        assert_eq!(reference.matmul_gflops(64, 3).unwrap(), 192.5, "the rate, and --isa passed on");
        let refused = reference.memory(&case).unwrap_err().to_string();
        assert!(refused.contains("no memory today") && refused.contains("bench_reference.py"), "{refused}");
        let report = reference.report().unwrap();
        assert_eq!(report["errors"], json!(["none"]));

        let mut reference = Reference::start(&stand_in(false), &root, 2, false, Isa::PORTABLE).unwrap();
        let times = reference.measure(&case, "forward", reps).unwrap();
        assert_eq!(times.keys().collect::<Vec<_>>(), ["torch/stand_in_alone"], "--only torch passed on");
        let died = reference.measure(&case, "train_step", reps).unwrap_err().to_string();
        assert!(died.contains("ended without answering") && died.contains("bench_reference.py"), "{died}");
        std::fs::remove_dir_all(&root).ok();
    }
}
