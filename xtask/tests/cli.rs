//! The `cargo xtask` commands end to end, as a user runs them: exit codes, output lines, files.

use std::ffi::OsStr;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The whole Keras models made by the real Keras, with their probes.
const KERAS_MODELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../datasets/keras-models");

fn xtask(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask")).args(args).output().expect("xtask runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A test's folder under the system's temporary folder, removed when the test ends, kept (with
/// what the commands wrote) when it fails.
struct Scratch(PathBuf);

impl Deref for Scratch {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<OsStr> for Scratch {
    fn as_ref(&self) -> &OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            std::fs::remove_dir_all(&self.0).ok();
        }
    }
}

fn scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("kmha-cli-test-{}-{name}", std::process::id()));
    std::fs::remove_dir_all(&dir).ok();
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

#[test]
fn verify_prints_one_line_per_output_and_a_summary() {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../datasets/reference/keras_causal.safetensors");
    let out = xtask(&["verify", fixture, "--backend", "flex"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    assert!(text.lines().any(|l| l.starts_with("PASS keras_causal flex output max_abs_err=")), "{text}");
    assert_eq!(text.lines().last(), Some("3 passed, 0 failed"));
}

/// On a machine without a display, a `verify` that passes prints nothing on stderr that reads as
/// an error: Mesa's device-select Vulkan layer (installed with lavapipe) printed libwayland's
/// `error: XDG_RUNTIME_DIR is invalid or not set` once per adapter listing.
#[test]
fn verify_without_a_display_prints_no_error_line() {
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/../datasets/reference/keras_causal.safetensors");
    let mut command = Command::new(env!("CARGO_BIN_EXE_xtask"));
    command.args(["verify", fixture]);
    for name in ["XDG_RUNTIME_DIR", "DISPLAY", "WAYLAND_DISPLAY", "WAYLAND_SOCKET", "NODEVICE_SELECT"] {
        command.env_remove(name);
    }
    let out = command.output().expect("xtask runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}{stderr}", stdout(&out));
    assert!(!stderr.lines().any(|l| l.starts_with("error")), "{stderr}");
}

#[test]
fn verify_fails_naming_an_unreadable_file() {
    let dir = scratch("unreadable");
    let bad = dir.join("broken.safetensors");
    std::fs::write(&bad, b"not a safetensors file").unwrap();
    let out = xtask(&["verify", bad.to_str().unwrap(), "--backend", "flex"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("broken.safetensors"));
}

/// A projected probe whose `final.weight` is a scalar (a hand-made or damaged file): an error
/// naming the file and the tensor, not a panic on its shape.
#[test]
fn verify_names_the_file_and_tensor_of_a_scalar_head_weight() {
    use model::{HostTensor, TensorFile};
    let dir = scratch("scalar-head");
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/../datasets/reference/projected_in6_e16_h4.safetensors");
    let mut file = TensorFile::read(std::path::Path::new(source)).unwrap();
    file.tensors.insert("final.weight", HostTensor::new(vec![], vec![0.5]));
    let probe = dir.join("scalar_head.projected.safetensors");
    file.write(&probe).unwrap();
    let out = xtask(&["verify", probe.to_str().unwrap(), "--backend", "flex"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("scalar_head.projected.safetensors")
            && stderr.contains("final.weight")
            && !stderr.contains("panicked"),
        "{stderr}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_config_is_a_one_line_error_not_a_panic() {
    let dir = scratch("badconfig");
    let config = dir.join("bad.toml");
    std::fs::write(&config, "[model]\nkey_dim = 0\n").unwrap();
    let out = xtask(&["train", "--config", config.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("bad.toml") && stderr.contains("model.key_dim = 0") && !stderr.contains("panicked"),
        "{stderr}"
    );
}

#[test]
fn train_then_export_and_verify_the_export() {
    let dir = scratch("train");
    let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/tiny.toml");
    let (runs, data) = (dir.join("runs"), dir.join("data"));
    let (runs_dir, data_dir) = (runs.to_str().unwrap(), data.to_str().unwrap());
    let out = xtask(&["train", "--config", tiny, "--set", "name=cli", "--runs-dir", runs_dir, "--data-dir", data_dir]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    assert!(text.contains("--- cli ---") && text.contains("loss  train"), "{text}");
    let exported = dir.join("keras.safetensors");
    let out = xtask(&[
        "export",
        "--run",
        runs.join("cli").to_str().unwrap(),
        "--format",
        "keras",
        "--out",
        exported.to_str().unwrap(),
        "--data-dir",
        data_dir,
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = xtask(&["verify", exported.to_str().unwrap(), "--backend", "flex"]);
    assert!(out.status.success(), "{}", stdout(&out));
    assert!(data.read_dir().unwrap().next().is_some(), "the task's data cached under --data-dir");
    std::fs::remove_dir_all(&dir).ok();
}

/// `cargo xtask bench --quick` works (a smoke test: nothing about the times is asserted), and
/// `--profile` puts each row's time in the phases that ran in it.
#[test]
fn bench_quick_writes_its_table_and_json() {
    let dir = scratch("bench");
    let json = dir.join("bench.json");
    let out = xtask(&[
        "bench",
        "--quick",
        "--backend",
        "flex",
        "--call",
        "plain,scores,dropout",
        "--profile",
        "--python",
        "/nonexistent/python",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = stdout(&out);
    for row in [
        "| 32,136,4,6x4 | causal | keras | plain | train_step | flex |",
        "| 32,136,4,6x4 | padding | projected | plain | forward | flex |",
        "| 32,136,4,6x4 | padding | keras | scores | train_step | flex |",
        "| 32,136,4,6x4 | causal | projected | dropout | train_step | flex |",
    ] {
        assert!(text.contains(row), "no row {row:?} in\n{text}");
    }
    let value: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = value["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 36, "the seed's shape x 3 masks x 2 models x 3 calls x 2 phases");
    assert!(value["limits"][0]["gflops"].as_f64().is_some_and(|g| g > 0.0), "the FMA peak is measured");
    assert!(rows.iter().all(|r| r["timing"]["median_ms"].as_f64().is_some_and(|v| v > 0.0)
        && r["floor_ms"].as_f64().is_some_and(|v| v > 0.0)));
    for row in rows.iter().filter(|r| r["case"]["call"] == "plain") {
        let ms = |phase: &str| row["profile"][phase].as_f64().unwrap_or_else(|| panic!("no {phase} in {row}"));
        let training = row["phase"] == "train_step";
        assert!(ms("gemm_ms") > 0.0 && ms("attention_forward_ms") > 0.0 && ms("rest_ms") >= 0.0, "{row}");
        assert_eq!(ms("attention_backward_ms") > 0.0, training, "a backward pass only in training: {row}");
    }
    assert!(text.contains("profile    gemm"), "the profile is printed");
}

/// `convert` on files the real Keras wrote: every target that can be exact is written, checked by
/// `verify` against the source layer's output, and reported with a difference ≤ 1e-5; the others
/// are refused with the reason.
#[test]
fn convert_writes_every_exact_target_and_refuses_the_rest() {
    let files = concat!(env!("CARGO_MANIFEST_DIR"), "/../datasets/model-files");
    let dir = scratch("convert");
    // (file, layer, target, exact)
    let cases = [
        ("functional.keras", "attn_values", "keras", true),
        ("functional.keras", "attn_values", "projected", true),
        ("functional.keras", "attn_values", "torch", false),
        ("functional.keras", "attn_values", "burn", true),
        ("functional.keras", "attn_nobias", "keras", true),
        ("functional.keras", "attn_nobias", "projected", false),
        ("functional.keras", "attn_nobias", "torch", false),
        ("functional.weights.h5", "attn_nobias", "burn", true),
        ("nested.keras", "multi_head_attention", "keras", true),
        ("nested.keras", "multi_head_attention", "projected", true),
        ("nested.keras", "multi_head_attention", "torch", true),
        ("torch_packed.pt", "attn.", "keras", true),
        ("torch_packed.pt", "attn.", "projected", true),
        ("torch_checkpoint.pt", "model_state_dict.attn", "torch", true),
        ("torch_kdim.pt", "mha", "keras", true),
        ("torch_kdim.pt", "mha", "projected", false),
        ("gated.keras", "gated", "keras", true),
        ("gated.keras", "gated", "torch", false),
        ("torch_projected.pt", "port", "keras", true),
        ("torch_projected.pt", "port", "projected", true),
        // attention_axes=(1, 2): Keras and Burn hold it, torch's layer cannot.
        ("axes.keras", "axes", "keras", true),
        ("axes.keras", "axes", "burn", true),
        ("axes.keras", "axes", "projected", false),
    ];
    for (file, layer, target, exact) in cases {
        let stem = dir.join(format!("{}-{}-{target}", file.replace('.', "_"), layer.trim_end_matches('.')));
        // A Keras export is three files named from the stem; the others one file.
        let (out, checked) = match target {
            "keras" => (stem.clone(), PathBuf::from(format!("{}.keras.safetensors", stem.display()))),
            // The probe beside the burnpack, which verify runs on the burnpack's weights.
            "burn" => (stem.with_extension("bpk"), PathBuf::from(format!("{}.bpk.probe.safetensors", stem.display()))),
            _ => (stem.with_extension("safetensors"), stem.with_extension("safetensors")),
        };
        let input = format!("{files}/{file}");
        let heads = if file == "torch_projected.pt" { "6" } else { "2" };
        let run = xtask(&[
            "convert",
            &input,
            "--to",
            target,
            "--layer",
            layer,
            "--num-heads",
            heads,
            "--out",
            out.to_str().unwrap(),
        ]);
        let (text, errors) = (stdout(&run), String::from_utf8_lossy(&run.stderr).into_owned());
        if !exact {
            assert!(
                !run.status.success() && errors.contains("cannot be exact"),
                "{file} {layer} -> {target}: {text}{errors}"
            );
            continue;
        }
        assert!(run.status.success(), "{file} {layer} -> {target}: {errors}");
        let difference: f64 = text
            .lines()
            .find_map(|l| l.split("on the probe: ").nth(1))
            .and_then(|d| d.trim().parse().ok())
            .unwrap_or_else(|| panic!("{file} {layer} -> {target}: no difference line in {text}"));
        assert!(difference <= 1e-5, "{file} {layer} -> {target}: difference {difference}");
        let verified = xtask(&["verify", checked.to_str().unwrap(), "--backend", "flex"]);
        let lines = stdout(&verified);
        assert!(
            verified.status.success() && lines.lines().last().is_some_and(|l| l.ends_with(" 0 failed")),
            "{file} {layer} -> {target}: {lines}"
        );
        if target == "torch" || target == "projected" {
            let module = std::fs::read_to_string(stem.with_extension("py")).unwrap_or_default();
            assert!(
                module.contains("load_state_dict(state, strict=True)"),
                "{file} {layer} -> {target}: no module file beside the weights"
            );
        }
        if target == "keras" {
            // The written .keras and .weights.h5 are Keras files again, each with the one layer.
            for written in [format!("{}.keras", stem.display()), format!("{}.weights.h5", stem.display())] {
                let listed = stdout(&xtask(&["convert", &written]));
                assert!(listed.contains("(layers/multi_head_attention)"), "{written}: {listed}");
            }
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// `--out NAME` without an extension: the file gets the target's extension, and the module
/// written beside a torch export loads that file.
#[test]
fn convert_out_without_an_extension_gets_the_targets() {
    let files = concat!(env!("CARGO_MANIFEST_DIR"), "/../datasets/model-files");
    let dir = scratch("out-extension");
    for (file, layer, target, written, checked) in [
        ("functional.keras", "attn_values", "projected", "mha0.safetensors", "mha0.safetensors"),
        ("nested.keras", "multi_head_attention", "torch", "mha0.safetensors", "mha0.safetensors"),
        ("functional.keras", "attn_values", "burn", "mha0.bpk", "mha0.bpk.probe.safetensors"),
    ] {
        let run = xtask(&[
            "convert",
            &format!("{files}/{file}"),
            "--to",
            target,
            "--layer",
            layer,
            "--out",
            dir.join("mha0").to_str().unwrap(),
        ]);
        assert!(run.status.success(), "{target}: {}", String::from_utf8_lossy(&run.stderr));
        assert!(!dir.join("mha0").exists(), "{target}: wrote a file without an extension");
        assert!(stdout(&run).contains(&format!("wrote {}", dir.join(written).display())), "{target}: {}", stdout(&run));
        let verified = xtask(&["verify", dir.join(checked).to_str().unwrap(), "--backend", "flex"]);
        assert!(verified.status.success(), "{target}: {}", stdout(&verified));
        if target != "burn" {
            let module = std::fs::read_to_string(dir.join("mha0.py")).unwrap();
            assert!(module.contains("\"mha0.safetensors\")"), "{target}: the module does not load mha0.safetensors");
        }
        std::fs::remove_dir_all(&dir).ok();
        std::fs::create_dir_all(&dir).unwrap();
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// A Keras layer built with dropout 0.1, converted to torch and to projected: the generated
/// `nn.Module` and the written file carry the rate, so training the port trains the same model.
#[test]
fn convert_carries_the_dropout_rate_into_the_torch_module() {
    use model::keras_file::write_keras_archive;
    use model::{HostTensor, KerasMhaConfig, TensorFile, WeightMap};
    let dir = scratch("dropout");
    // MultiHeadAttention(num_heads=4, key_dim=2, dropout=0.1) on width 8: torch-exact sizes.
    let config = KerasMhaConfig::new(4, 2, 8).with_dropout(0.1);
    let dims = config.dims().unwrap();
    let mut weights = WeightMap::new();
    let mut seed = 0;
    let mut tensor = |shape: Vec<usize>| {
        seed += 1;
        let data = kernels::testing::values(shape.iter().product(), seed).into_iter().map(|x| x * 0.5);
        HostTensor::new(shape, data.collect())
    };
    for (name, shape) in ["query", "key", "value", "attention_output"].into_iter().zip(dims.kernel_shapes()) {
        weights.insert(format!("{name}.kernel"), tensor(shape.to_vec()));
    }
    for (name, shape) in [("query", [4, 2]), ("key", [4, 2]), ("value", [4, 2])] {
        weights.insert(format!("{name}.bias"), tensor(shape.to_vec()));
    }
    weights.insert("attention_output.bias", tensor(vec![8]));
    let source = dir.join("dropout.keras");
    write_keras_archive(&source, "dropout_model", &config, &weights).unwrap();
    for (target, built) in [
        ("torch", "torch.nn.MultiheadAttention(8, 4, bias=True, kdim=8, vdim=8, dropout=0.1, batch_first=True)"),
        ("projected", "Projected(8, 8, 4, 8, bias=True, dropout=0.1)"),
    ] {
        let out = dir.join(format!("{target}.safetensors"));
        // `--layer`: one layer's torch counterpart (without it, `--to torch` ports the whole model).
        let run = xtask(&[
            "convert",
            source.to_str().unwrap(),
            "--layer",
            "attention",
            "--to",
            target,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(run.status.success(), "{target}: {}", String::from_utf8_lossy(&run.stderr));
        let module = std::fs::read_to_string(dir.join(format!("{target}.py"))).unwrap();
        assert!(module.contains(built), "{target}: the module does not build {built}:\n{module}");
        let metadata: serde_json::Value =
            serde_json::from_str(&TensorFile::read(&out).unwrap().metadata["config"]).unwrap();
        assert_eq!(metadata["dropout"].as_f64(), Some(0.1), "{target}: {metadata}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn convert_lists_the_layers_and_asks_which_one() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../datasets/model-files/functional.keras");
    let listed = xtask(&["convert", file]);
    let text = stdout(&listed);
    assert!(listed.status.success(), "{text}");
    assert!(
        text.contains("attn_values (layers/multi_head_attention): num_heads=2, key_dim=4, value_dim=3, output_shape=6"),
        "{text}"
    );
    assert!(text.contains("attn_nobias (layers/multi_head_attention_1): num_heads=3, key_dim=2"), "{text}");
    let ambiguous = xtask(&["convert", file, "--to", "keras"]);
    let errors = String::from_utf8_lossy(&ambiguous.stderr);
    assert!(!ambiguous.status.success() && errors.contains("2 attention layers; choose one with --layer"), "{errors}");
}

/// One layer that cannot be read or converted does not make the file unusable: `convert FILE`
/// lists every layer (the others' reasons beside them), the chosen one converts, and
/// `--num-heads` is the chosen layer's only.
#[test]
fn convert_lists_every_layer_and_converts_the_chosen_one() {
    let files = concat!(env!("CARGO_MANIFEST_DIR"), "/../datasets/model-files");
    let (keras, torch) = (format!("{files}/mixed.keras"), format!("{files}/torch_mixed.pt"));
    let listed = |args: &[&str]| {
        let run = xtask(args);
        assert!(run.status.success(), "{args:?}: {}", String::from_utf8_lossy(&run.stderr));
        stdout(&run)
    };
    let text = listed(&["convert", &keras]);
    assert!(text.contains("  attn_ok (layers/multi_head_attention): num_heads=2, key_dim=4"), "{text}");
    assert!(
        text.contains("  attn_2d_out (layers/multi_head_attention_1): cannot be converted: output_shape: ")
            && text.contains("multi-axis outputs are not supported"),
        "{text}"
    );
    // No head count: every layer listed, with its width; the one no count can convert, with why.
    let text = listed(&["convert", &torch]);
    for line in ["  wide (wide.): embed_dim=12;", "  narrow (narrow.): embed_dim=10;"] {
        assert!(text.contains(line) && text.contains("pass --num-heads"), "{line}: {text}");
    }
    assert!(text.contains("  biased (biased.): cannot be converted: ") && text.contains("add_bias_kv"), "{text}");
    let text = listed(&["convert", &torch, "--num-heads", "3"]);
    assert!(text.contains("  wide (wide.): num_heads=3, key_dim=4"), "{text}");
    assert!(text.contains("  narrow (narrow.): cannot be converted: ") && text.contains("num_heads = 3"), "{text}");

    let dir = scratch("mixed");
    for (file, layer, heads, target) in
        [(&keras, "attn_ok", "1", "keras"), (&torch, "wide", "3", "keras"), (&torch, "narrow", "2", "projected")]
    {
        let out = dir.join(format!("{layer}.safetensors"));
        let args =
            ["convert", file, "--layer", layer, "--num-heads", heads, "--to", target, "--out", out.to_str().unwrap()];
        let text = listed(&args);
        let difference: f64 = text
            .lines()
            .find_map(|l| l.split("on the probe: ").nth(1))
            .and_then(|d| d.trim().parse().ok())
            .unwrap_or_else(|| panic!("{layer}: no difference line in {text}"));
        assert!(difference <= 1e-5, "{layer}: difference {difference}");
    }
    for (file, layer, why) in [(&keras, "attn_2d_out", "attn_2d_out"), (&torch, "biased", "add_bias_kv")] {
        let run = xtask(&["convert", file, "--layer", layer, "--num-heads", "2", "--to", "keras"]);
        let errors = String::from_utf8_lossy(&run.stderr);
        assert!(!run.status.success() && errors.contains("cannot be converted") && errors.contains(why), "{errors}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn convert_names_the_file_when_it_holds_no_attention_layer() {
    let file = concat!(env!("CARGO_MANIFEST_DIR"), "/../datasets/model-files/dense_only.keras");
    let run = xtask(&["convert", file, "--to", "projected"]);
    let errors = String::from_utf8_lossy(&run.stderr);
    assert!(
        !run.status.success() && errors.contains("dense_only.keras: no MultiHeadAttention layer in this model"),
        "{errors}"
    );
}

#[test]
fn predict_reproduces_keras_and_writes_the_outputs() {
    let models = KERAS_MODELS;
    let dir = scratch("predict");
    let out = dir.join("classes.safetensors");
    let output = xtask(&[
        "predict",
        &format!("{models}/text_classifier.keras"),
        "--inputs",
        &format!("{models}/text_classifier.probe.safetensors"),
        "--out",
        out.to_str().unwrap(),
        "--backend",
        "ndarray",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let text = stdout(&output);
    let line = text.lines().find(|l| l.starts_with("outputs.classes")).expect("a line per output");
    let diff: f32 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(diff <= 1e-5, "{line}");
    let written = model::TensorFile::read(&out).unwrap();
    assert_eq!(written.tensors.get("outputs.classes").unwrap().shape, vec![3, 3]);
}

#[test]
fn predict_refuses_an_unsupported_layer_with_status_1_and_no_file() {
    let models = KERAS_MODELS;
    let dir = scratch("predict-lambda");
    let out = dir.join("never.safetensors");
    let output = xtask(&[
        "predict",
        &format!("{models}/lambda_layer.keras"),
        "--inputs",
        &format!("{models}/small.probe.safetensors"),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("layer double (Lambda, called on "), "{stderr}");
    assert!(!out.exists());
}

#[test]
fn convert_writes_a_whole_keras_model_as_a_torch_module_with_its_probe() {
    let models = KERAS_MODELS;
    let dir = scratch("whole-torch");
    let out = dir.join("classifier");
    let run = xtask(&[
        "convert",
        &format!("{models}/text_classifier.keras"),
        "--to",
        "torch",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let printout = stdout(&run);
    for node in ["embedding (Embedding)", "self_attention (MultiHeadAttention)", "pool (GlobalAveragePooling1D)"] {
        assert!(printout.contains(node), "{node} missing from:\n{printout}");
    }
    let source = std::fs::read_to_string(dir.join("classifier.py")).unwrap();
    assert!(
        source.contains("load_state_dict(load_file(path), strict=True)")
            && source.contains("class Model(torch.nn.Module)")
    );
    // forward reads as the Keras code: torch's functions where exact, the prelude's by keyword.
    for line in ["F.gelu(self.ffn_up(x4), approximate=\"none\")", "global_average_pooling1d(x6, mask=x8)"] {
        assert!(source.contains(line), "{line} missing from:\n{source}");
    }
    let weights = model::TensorFile::read(&dir.join("classifier.safetensors")).unwrap();
    // Keras' (in, out) kernel becomes torch's (out, in) weight.
    assert_eq!(weights.tensors.get("ffn_up.weight").unwrap().shape, vec![16, 8]);
    let probe = model::TensorFile::read(&dir.join("classifier.probe.safetensors")).unwrap();
    assert!(probe.tensors.contains("inputs.tokens") && probe.tensors.contains("nodes.self_attention"));
    // With the real torch where it is installed (CI's is in the wheel's virtual environment,
    // KERAS2TORCH_VENV): the module loads strictly and matches Burn.
    let venv_python = std::env::var_os("KERAS2TORCH_VENV").map(|v| PathBuf::from(v).join("bin/python"));
    let python = venv_python.filter(|p| p.exists()).unwrap_or_else(|| PathBuf::from("python3"));
    let torch = Command::new(&python).args(["-c", "import torch, safetensors"]).output();
    if torch.is_ok_and(|o| o.status.success()) {
        let check = Command::new(&python).arg(dir.join("classifier.py")).output().unwrap();
        assert!(check.status.success(), "{}{}", stdout(&check), String::from_utf8_lossy(&check.stderr));
    } else {
        eprintln!("note: no torch here; the generated module was not run");
    }
}

#[test]
fn convert_writes_each_repeated_operation_once_and_an_identity_as_its_input() {
    // A comparison recorded twice and casts to bool of booleans, as flattened graphs record
    // Keras' implicit masks: one statement each in torch; the casts that change a dtype stay.
    let dir = scratch("whole-shared");
    let out = dir.join("shared");
    let model = format!("{KERAS_MODELS}/zoo_shared_values.keras");
    let run = xtask(&["convert", &model, "--to", "torch", "--out", out.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let source = std::fs::read_to_string(dir.join("shared.py")).unwrap();
    let forward = &source[source.find("    def forward(self, ids)").expect("forward")..];
    assert_eq!(forward.matches("torch.ne(x0, 0)").count(), 1, "{forward}");
    assert!(!forward.contains(".to(torch.bool)"), "{forward}");
    for kept in ["x2[:, :, None]", "x2[:, None, :]", "x2.to(torch.int64)", "x2.to(torch.float32)"] {
        assert!(forward.contains(kept), "{kept} missing from:\n{forward}");
    }
    // An Identity layer (the model's last output here) is its input: no `x26 = x0`.
    let model = format!("{KERAS_MODELS}/zoo_activations.keras");
    let out = dir.join("activations");
    let run = xtask(&["convert", &model, "--to", "torch", "--out", out.to_str().unwrap()]);
    assert!(run.status.success(), "{}", String::from_utf8_lossy(&run.stderr));
    let source = std::fs::read_to_string(dir.join("activations.py")).unwrap();
    assert!(source.contains(", x25, x0)\n") && !source.contains("x26 = "), "{source}");
}

#[test]
fn convert_refuses_a_whole_model_with_a_lambda_and_writes_nothing() {
    let models = KERAS_MODELS;
    let dir = scratch("whole-lambda");
    let out = dir.join("never");
    let run =
        xtask(&["convert", &format!("{models}/lambda_layer.keras"), "--to", "torch", "--out", out.to_str().unwrap()]);
    assert_eq!(run.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&run.stderr).contains("(Lambda, called on "));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0, "files were written");
}

/// `flatten` with an interpreter that lacks numpy and Keras (a bare virtual environment): one line
/// that names the interpreter, what it lacks and `--python`; no traceback, exit status 1, nothing
/// written.
#[test]
fn flatten_names_what_its_interpreter_lacks_in_one_line() {
    let dir = scratch("flatten-bare-python");
    let venv = dir.join("bare");
    let made = Command::new("python3").args(["-m", "venv", "--without-pip"]).arg(&venv).status();
    if !made.is_ok_and(|s| s.success()) {
        eprintln!("note: python3 cannot make a virtual environment here; the bare-interpreter case is skipped");
        return;
    }
    let python = venv.join("bin").join("python");
    let out = dir.join("flat.keras");
    let output = xtask(&[
        "flatten",
        &format!("{KERAS_MODELS}/small.keras"),
        "--out",
        out.to_str().unwrap(),
        "--python",
        python.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("Traceback"), "{stderr}");
    let line = stderr.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("no error line: {stderr}"));
    assert!(line.contains("numpy is not installed") && line.contains("--python PATH"), "{line}");
    assert!(line.contains(python.to_str().unwrap()), "the interpreter is not named: {line}");
    assert!(!out.exists());
}

/// A training run gives the same weights, byte for byte, in every process on this machine: run
/// again with each of the kernels' timed choices pushed to another candidate by its variable
/// (which a reproducible run follows rules instead of), and stopped after a checkpoint in one
/// process and resumed in another. The task at its full 136 positions and a batch of 32, so that
/// the projections are products the `gemm` crate would split, and heads of 4 features, whose sums
/// the kernel may split.
#[test]
fn training_gives_the_same_weights_in_every_process_whatever_the_kernels_would_choose() {
    let tiny = concat!(env!("CARGO_MANIFEST_DIR"), "/../configs/tiny.toml");
    let pushed = [("KERNELS_TILES", "2"), ("KERNELS_SPLIT_SUMS", "1"), ("KERNELS_GEMM_THREADS", "rows")];
    let other = [("KERNELS_TILES", "1"), ("KERNELS_SPLIT_SUMS", "0"), ("KERNELS_GEMM_THREADS", "caller")];
    for backend in ["flex", "ndarray"] {
        let dir = scratch(&format!("reproducible-{backend}"));
        let (runs, data) = (dir.join("runs"), dir.join("data"));
        let run = |name: &str, env: &[(&str, &str)], extra: &[&str]| {
            let sets = [
                format!("name={name}"),
                format!("backend={backend}"),
                "task.seq_len=136".into(),
                "task.train_size=256".into(),
                "train.batch_size=32".into(),
                "train.checkpoint_every=4".into(),
            ];
            let mut command = Command::new(env!("CARGO_BIN_EXE_xtask"));
            command.args(["train", "--config", tiny, "--runs-dir"]).arg(&runs).arg("--data-dir").arg(&data);
            for set in &sets {
                command.args(["--set", set]);
            }
            let output = command.args(extra).envs(env.iter().copied()).output().expect("xtask runs");
            assert!(output.status.success(), "{backend} {name}: {}", String::from_utf8_lossy(&output.stderr));
        };
        let weights = |name: &str| std::fs::read(runs.join(name).join("weights.safetensors")).unwrap();
        run("plain", &[], &[]);
        run("pushed", &pushed, &[]);
        run("other", &other, &[]);
        run("resumed", &pushed, &["--stop-after", "6"]);
        run("resumed", &other, &["--resume"]);
        let plain = weights("plain");
        for name in ["pushed", "other", "resumed"] {
            assert!(weights(name) == plain, "{backend}: the {name} run's weights differ from the plain run's");
        }
        let summary = std::fs::read_to_string(runs.join("plain").join("summary.json")).unwrap();
        assert!(summary.contains("\"reproducible\": true"), "{summary}");
    }
}
