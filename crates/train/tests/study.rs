//! The study on a reduced plan (`StudyConfig::quick`, what `cargo xtask compare --quick` runs, on
//! two rungs): every run trains to finite numbers, the report has every section, every rung and
//! both sweeps, the plots are drawn, and finished runs are reused unless the study is fresh.

use model::Backend;
use train::config::RunConfig;
use train::study::{StudyConfig, Variant, run_study, write_report};

#[test]
fn quick_study_writes_a_complete_report_and_reuses_its_runs() {
    let root = std::env::temp_dir().join(format!("kmha-study-test-{}", std::process::id()));
    std::fs::remove_dir_all(&root).ok();
    let base = RunConfig::load(Some(&train::paths::repo_root().join("configs/tiny.toml")), &[]).unwrap();
    let subset: Vec<Backend> = Backend::for_checks().unwrap().into_iter().filter(|b| *b == Backend::Wgpu).collect();
    let mut study = StudyConfig::quick("quick", base, vec![Backend::Flex, Backend::Ndarray], subset.clone());
    study.rungs.retain(|r| ["lookup", "two_hop"].contains(&r.name.as_str()));
    let results = run_study(&study, &root.join("runs"), &root.join("data")).unwrap();

    // Per rung: 3 learning rates + 1 more size = 4 conditions x 2 models x 2 seeds x 2 backends,
    // the control at the base condition (2 seeds x 2 backends), the subset on the lookup rung.
    assert_eq!(results.runs.len(), 2 * (4 * 2 * 2 * 2 + 2 * 2) + 2 * subset.len());
    for run in &results.runs {
        let s = &run.summary;
        for value in [s.train_loss, s.valid_loss, s.test_loss, s.wall_seconds] {
            assert!(value.is_finite(), "{}: non-finite value in {s:?}", s.name);
        }
        assert!(run.losses.iter().all(|l| l.is_finite()) && run.losses.len() == 16, "{}", s.name);
    }
    for floors in &results.rungs {
        assert!(floors.bayes_floor < floors.threshold && floors.threshold < floors.per_position_floor, "{floors:?}");
    }
    assert!(results.runs.iter().any(|r| r.variant == Variant::OneHead));

    let report_dir = root.join("report");
    let report = write_report(&results, &report_dir, "test").unwrap();
    let text = std::fs::read_to_string(&report).unwrap();
    for section in [
        "## The ladder",
        "## Verdict per condition",
        "## Learning rates per rung",
        "## Positive control: one head",
        "## Verdict\n",
        "## Cross-backend agreement",
    ] {
        assert!(text.contains(section), "no {section:?} in\n{text}");
    }
    for rung in ["lookup", "two_hop"] {
        for lr in ["3e-3", "1e-2", "3e-2"] {
            assert!(text.contains(&format!("| {rung} | {lr} | 64 |")), "no row {rung} lr {lr} in\n{text}");
        }
        assert!(text.contains(&format!("| {rung} | 1e-2 | 32 |")), "no row {rung} size 32 in\n{text}");
    }
    if !subset.is_empty() {
        assert!(text.contains("flex vs wgpu"), "{text}");
    }
    assert!(text.contains("flex vs ndarray"), "{text}");
    assert!(!text.contains("NaN") && !text.contains("inf"), "{text}");
    for plot in ["loss_curves.png", "heat_lr.png", "heat_size.png"] {
        let size = std::fs::metadata(report_dir.join(plot)).unwrap().len();
        assert!(size > 10_000, "{plot} is {size} bytes");
    }
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(report_dir.join("results.json")).unwrap()).unwrap();
    assert_eq!(json["runs"].as_array().unwrap().len(), results.runs.len());

    // A second study over the same runs reuses them instead of training again.
    // (summary.json is read back, so the recorded wall times come back equal, up to JSON's decimals.)
    let again = run_study(&study, &root.join("runs"), &root.join("data")).unwrap();
    for (a, b) in again.runs.iter().zip(&results.runs) {
        assert!(
            (a.summary.wall_seconds - b.summary.wall_seconds).abs() <= 1e-12 * b.summary.wall_seconds,
            "{} was trained again",
            a.summary.name
        );
    }
    // A fresh study (after a code change) trains them again, same configs notwithstanding.
    let fresh = StudyConfig {
        fresh: true,
        backends: vec![Backend::Flex],
        subset_backends: vec![],
        learning_rates: vec![1e-2],
        train_sizes: vec![],
        seeds: vec![1],
        ..study.clone()
    };
    for a in run_study(&fresh, &root.join("runs"), &root.join("data")).unwrap().runs {
        let b = results.runs.iter().find(|b| b.summary.name == a.summary.name).unwrap();
        assert_ne!(a.summary.wall_seconds, b.summary.wall_seconds, "{} was reused", a.summary.name);
    }
    std::fs::remove_dir_all(&root).ok();
}
