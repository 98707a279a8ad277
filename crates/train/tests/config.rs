//! Config files: documented defaults, and one-line errors naming the file, the key and the value.

use std::path::PathBuf;

use train::config::{DEFAULT_TOML, RunConfig};

fn write(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("kmha-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn error(name: &str, text: &str) -> String {
    let path = write(name, text);
    format!("{:#}", RunConfig::load(Some(&path), &[]).unwrap_err())
}

#[test]
fn embedded_default_toml_spells_out_the_struct_defaults() {
    let parsed: RunConfig = toml::from_str(DEFAULT_TOML).unwrap();
    assert_eq!(parsed, RunConfig::default());
    assert_eq!(RunConfig::load(None, &[]).unwrap(), RunConfig::default());
}

#[test]
fn an_empty_file_is_the_default_config() {
    let path = write("empty.toml", "");
    assert_eq!(RunConfig::load(Some(&path), &[]).unwrap(), RunConfig::default());
}

#[test]
fn every_config_in_configs_loads() {
    let dir = train::paths::repo_root().join("configs");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            let config = RunConfig::load(Some(&path), &["backend=flex".into()]);
            assert!(config.is_ok(), "{}: {:#}", path.display(), config.unwrap_err());
            count += 1;
        }
    }
    assert!(count >= 7, "one config per model x backend plus the tiny one");
}

#[test]
fn unknown_keys_are_errors_naming_file_and_key() {
    let e = error("typo.toml", "[train]\nlerning_rate = 0.1\n");
    assert!(e.contains("typo.toml") && e.contains("train.lerning_rate"), "{e}");
    let e = error("typo2.toml", "[optimizer]\nname = \"adam_keras\"\nmomentum = 0.9\n");
    assert!(e.contains("momentum"), "{e}");
}

#[test]
fn wrong_types_and_impossible_values_are_errors_naming_key_and_value() {
    let e = error("type.toml", "[model]\nkey_dim = \"four\"\n");
    assert!(e.contains("type.toml") && e.contains("model.key_dim = \"four\""), "{e}");
    let e = error("zero.toml", "[model]\nkey_dim = 0\n");
    assert!(e.contains("zero.toml") && e.contains("model.key_dim = 0"), "{e}");
    let e = error("backend.toml", "backend = \"cuda\"\n");
    assert!(e.contains("backend = \"cuda\""), "{e}");
    let e = error("optimizer.toml", "[optimizer]\nname = \"adamw\"\n");
    assert!(e.contains("adamw"), "{e}");
    let e = error("lr.toml", "[train]\nlearning_rate = -1.0\n");
    assert!(e.contains("train.learning_rate = -1"), "{e}");
    let e = error("missing.toml", "[model]\ninit_from = \"/nonexistent/w.safetensors\"\n");
    assert!(e.contains("model.init_from"), "{e}");
}

#[test]
fn set_overrides_apply_dotted_keys_and_keep_checks() {
    let config =
        RunConfig::load(None, &["backend=ndarray".into(), "train.epochs=7".into(), "model.kind=\"projected\"".into()])
            .unwrap();
    assert_eq!((config.backend.as_str(), config.train.epochs), ("ndarray", 7));
    assert_eq!(config.model.kind, train::models::ModelKind::Projected);
    let e = format!("{:#}", RunConfig::load(None, &["train.batch_size=0".into()]).unwrap_err());
    assert!(e.contains("train.batch_size = 0"), "{e}");
}
