//! The study on a reduced matrix (what `cargo xtask compare --quick` runs): the report has its
//! table, verdict, cross-backend agreement and plots, and every number in it is finite.

use model::Backend;
use train::config::RunConfig;
use train::models::ModelKind;
use train::study::{StudyConfig, run_study, write_report};

#[test]
fn quick_study_writes_a_complete_report_with_finite_numbers() {
    let root = std::env::temp_dir().join(format!("kmha-study-test-{}", std::process::id()));
    std::fs::remove_dir_all(&root).ok();
    let base = RunConfig::load(Some(&train::paths::repo_root().join("configs/tiny.toml")), &["train.epochs=1".into()]).unwrap();
    let backends = Backend::for_checks().unwrap();
    let study = StudyConfig { name: "quick".into(), threshold: 0.02, base, models: ModelKind::ALL.to_vec(), backends: backends.clone(), seeds: vec![1, 2], fresh: false };
    let results = run_study(&study, &root.join("runs"), &root.join("data")).unwrap();
    assert_eq!(results.runs.len(), 3 * backends.len() * 2);
    for run in &results.runs {
        let s = &run.summary;
        for value in [s.train_loss, s.valid_loss, s.test_loss, s.samples_per_second, s.wall_seconds] {
            assert!(value.is_finite(), "{}: non-finite value in {s:?}", run.backend);
        }
        assert!(run.losses.iter().all(|l| l.is_finite()) && run.losses.len() == s.steps);
    }

    let report = write_report(&results, &root.join("report"), "test").unwrap();
    let text = std::fs::read_to_string(&report).unwrap();
    assert!(text.contains("| model | parameters | backend | valid loss | test loss |"));
    for model in ["keras", "projected", "baseline"] {
        for backend in &backends {
            assert!(text.contains(&format!("| {model} | ")) && text.contains(&format!(" | {backend} | ")));
        }
    }
    assert!(text.contains("## Verdict") && text.contains("Welch's t"));
    assert!(text.contains("## Cross-backend agreement"));
    assert!(!text.contains("NaN") && !text.contains("inf"), "{text}");
    for plot in ["loss_curves.svg", "loss_curves.png"] {
        let size = std::fs::metadata(root.join("report").join(plot)).unwrap().len();
        assert!(size > 10_000, "{plot} is {size} bytes");
    }
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(root.join("report/results.json")).unwrap()).unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), results.runs.len());

    // A second study over the same runs reuses them instead of training again.
    // (summary.json is read back, so the recorded wall times come back equal, up to JSON's decimals.)
    let again = run_study(&study, &root.join("runs"), &root.join("data")).unwrap();
    for (a, b) in again.runs.iter().zip(&results.runs) {
        assert!((a.summary.wall_seconds - b.summary.wall_seconds).abs() <= 1e-12 * b.summary.wall_seconds, "{} was trained again", a.summary.name);
    }
    // A fresh study (after a code change) trains them again, same configs notwithstanding.
    let fresh = StudyConfig { fresh: true, backends: vec![Backend::Flex], ..study.clone() };
    for a in run_study(&fresh, &root.join("runs"), &root.join("data")).unwrap().runs {
        let b = results.runs.iter().find(|b| (b.model, b.backend, b.seed) == (a.model, a.backend, a.seed)).unwrap();
        assert_ne!(a.summary.wall_seconds, b.summary.wall_seconds, "{} was reused", a.summary.name);
    }
    std::fs::remove_dir_all(&root).ok();
}
