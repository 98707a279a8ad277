//! KerasHub's models (`datasets/keras-hub/`, made by keras-hub 0.32.0 on keras 3.15.1): each
//! backbone family the converter reads and three task models, flattened by `cargo xtask flatten
//! --import hub.py` with none of KerasHub's layers left, run in Burn within 1e-5 of Keras'
//! outputs on every backend. Needs `python3` with keras-hub (CI installs it and sets
//! REQUIRE_KERAS=1; elsewhere a machine without it skips these cases, saying so).

mod support;

use std::path::PathBuf;

use model::TensorFile;
use support::{differences_on_every_backend, probed};

fn models_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../datasets/keras-hub")
}

#[test]
fn keras_hub_models_flatten_and_match_keras_on_every_backend() {
    if !support::python_has("keras_hub", "REQUIRE_KERAS", "KerasHub cases") {
        return;
    }
    let dir = models_dir();
    let stems = probed(&dir);
    assert!(stems.len() >= 18, "the KerasHub fixtures are missing: {stems:?}");
    let out = support::scratch("keras-hub", "flatten");
    let mut failures = Vec::new();
    for stem in &stems {
        let probe = TensorFile::read(&dir.join(format!("{stem}.probe.safetensors"))).unwrap();
        let flat = out.join(format!("{stem}.flat.keras"));
        let stdout = support::flatten(&dir, stem, &dir.join("hub.py"), &probe, &flat);
        assert!(!stdout.contains("kept "), "{stem}: a KerasHub layer was left:\n{stdout}");
        failures.extend(differences_on_every_backend(stem, &flat, &probe));
        failures.extend(written_blocks(stem, &flat, &out));
    }
    std::fs::remove_dir_all(&out).ok();
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The torch module of a backbone keeps its blocks: one class per kind of block, constructed
/// once per layer and called from `forward` in one line each (ALBERT's shared encoder: one
/// attribute called twice), its state dict keyed by the blocks' attributes. The numbers are the
/// wheel's tests' (`python/tests/test_wheel.py`, against Keras).
fn written_blocks(stem: &str, flat: &std::path::Path, out: &std::path::Path) -> Vec<String> {
    // The block's class, the attributes holding its layers, and the calls of them in forward.
    let (class, attributes, calls): (&str, &[&str], usize) = match stem {
        "bert" => ("TransformerEncoder", &["transformer_layer_0", "transformer_layer_1"], 2),
        "llama" => ("LlamaTransformerDecoder", &["transformer_layer_0", "transformer_layer_1"], 2),
        "albert" => ("TransformerEncoder", &["group_0_inner_layer_0"], 2),
        _ => return Vec::new(),
    };
    let target = out.join(format!("{stem}.port"));
    if let Err(e) = keras::convert::convert_model_to_torch(flat, Some(target.clone())) {
        return vec![format!("{stem}: convert --to torch: {e:#}")];
    }
    let source = std::fs::read_to_string(target.with_extension("py")).unwrap();
    let state = TensorFile::read(&target.with_extension("safetensors")).unwrap();
    let model = &source[source.find("class Model(").expect("the model's class")..];
    let mut failures = Vec::new();
    let definitions = source.matches(&format!("class {class}(torch.nn.Module)")).count();
    if definitions != 1 {
        failures.push(format!("{stem}: {definitions} definitions of class {class}, 1 expected"));
    }
    for attribute in attributes {
        if !model.contains(&format!("self.{attribute} = {class}()")) {
            failures.push(format!("{stem}: the model does not construct self.{attribute} = {class}()"));
        }
        if !state.tensors.names().any(|name| name.starts_with(&format!("{attribute}."))) {
            failures.push(format!("{stem}: no state-dict entry under {attribute}."));
        }
    }
    let called: usize = attributes.iter().map(|a| model.matches(&format!("= self.{a}(")).count()).sum();
    if called != calls {
        failures.push(format!("{stem}: forward calls the {class} blocks {called} times, {calls} expected"));
    }
    failures
}
