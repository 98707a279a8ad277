//! Every forward and conversion fixture made with the real keras 3.15.1 and torch 2.15.0, on every
//! backend, at the fixture's absolute tolerance (1e-5).

mod common;

use model::fixture::{self, Fixture, FixtureKind};

/// Runs every fixture of the kinds whose file names start with `prefix`; fails listing every
/// failed output.
fn check_kind(prefix: &str, kind: FixtureKind) {
    let files: Vec<_> = fixture::discover(&common::reference_dir())
        .expect("datasets/reference is readable")
        .into_iter()
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(prefix)))
        .collect();
    assert!(!files.is_empty(), "no {prefix}* fixtures under datasets/reference");
    let mut failures = Vec::new();
    let mut compared = 0;
    for path in &files {
        let fixture = Fixture::read(path).unwrap();
        assert_eq!(fixture.kind().unwrap(), kind, "{}", path.display());
        for backend in common::backends() {
            let device = backend.device(Default::default()).unwrap();
            for check in fixture::run(&fixture, backend.name(), &device).unwrap() {
                compared += 1;
                if !check.passed {
                    failures.push(check.to_string());
                }
            }
        }
    }
    assert!(compared >= files.len() * 2, "each fixture compares at least one output per backend");
    assert!(
        failures.is_empty(),
        "{} of {compared} outputs differ from the real library:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn keras_fixtures_match_keras_3_15_within_1e_5() {
    check_kind("keras_", FixtureKind::Keras);
}

#[test]
fn torch_fixtures_match_torch_2_15_within_1e_5() {
    check_kind("torch_", FixtureKind::Torch);
}

#[test]
fn projected_fixtures_match_torch_2_15_within_1e_5() {
    check_kind("projected_", FixtureKind::Projected);
}

#[test]
fn conversion_fixtures_match_keras_and_torch_within_1e_5() {
    check_kind("conversion_", FixtureKind::Conversion);
}
