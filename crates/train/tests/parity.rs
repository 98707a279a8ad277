//! Training parity with the real libraries: every `train_*` trajectory fixture (keras 3.15.1 Adam,
//! torch 2.15.0 Adam and SGD), on every backend, at each fixture's own tolerances (1e-5 to 2e-5
//! absolute; the key bias against the Adam step bound).

use model::Backend;
use model::fixture::{self, Fixture};

#[test]
fn trajectories_match_keras_and_torch_training_within_fixture_tolerances() {
    let dir = train::paths::reference_dir().join("train");
    let files = fixture::discover(&dir).unwrap();
    assert!(files.len() >= 4, "the four public trajectory fixtures are in {}", dir.display());
    let mut failures = Vec::new();
    let mut compared = 0;
    for path in &files {
        let fixture = Fixture::read(path).unwrap();
        for backend in Backend::for_checks().unwrap() {
            let device = backend.device(Default::default()).unwrap();
            let checks = train::parity::run(&fixture, backend.name(), &device).unwrap();
            assert!(checks.iter().any(|c| c.output == "loss"), "every run compares the loss");
            assert!(checks.iter().any(|c| c.output.starts_with("final.")), "and the final weights");
            for check in checks {
                compared += 1;
                if !check.passed {
                    failures.push(check.to_string());
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {compared} quantities differ from the real library:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
