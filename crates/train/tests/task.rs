//! The lookup task: deterministic, splits independent of each other's sizes, and a real gap
//! between what a per-position model and attention can reach.

use train::task::{TaskConfig, per_position_floor, teacher};

fn small() -> TaskConfig {
    TaskConfig { seq_len: 12, train_size: 6, valid_size: 3, test_size: 3, ..TaskConfig::default() }
}

#[test]
fn data_is_deterministic_and_splits_do_not_depend_on_other_split_sizes() {
    let a = small().generate();
    assert_eq!(a, small().generate());
    let bigger_train = TaskConfig { train_size: 9, ..small() }.generate();
    assert_eq!(a.valid, bigger_train.valid);
    assert_eq!(a.test, bigger_train.test);
    assert_eq!(a.train.x[..], bigger_train.train.x[..a.train.x.len()]);
    assert_ne!(a.valid.x, a.test.x);
}

#[test]
fn targets_need_other_positions() {
    // Give position 5 a key that answers position 0's query far more strongly than any other:
    // head A of position 0 then recalls position 5's features 2 and 3.
    let config = small();
    let data = config.generate();
    let mut x: Vec<f64> = data.train.x[..config.seq_len * 4].iter().map(|&v| v as f64).collect();
    x[0] = 1.0;
    let before = teacher(&x, config.seq_len, config.beta);
    x[5 * 4 + 1] = 10.0;
    let after = teacher(&x, config.seq_len, config.beta);
    assert!((after[0] - x[5 * 4 + 2]).abs() < 1e-3 && (after[1] - x[5 * 4 + 3]).abs() < 1e-3);
    assert!((before[0] - after[0]).abs() > 1e-3, "the target moved with another position");
}

#[test]
fn per_position_floor_is_far_above_the_bayes_floor_at_the_seed_shape() {
    let config = TaskConfig::default();
    assert_eq!(config.seq_len, 136);
    let floor = per_position_floor(&config, 128, 128);
    let bayes = config.noise_std.powi(2);
    assert!(floor > 10.0 * bayes, "per-position floor {floor} vs Bayes {bayes}");
    assert!(floor < 0.3, "and below the target variance");
}

#[test]
fn cached_data_loads_back_identically() {
    let dir = std::env::temp_dir().join(format!("kmha-task-test-{}", std::process::id()));
    let config = small();
    let generated = config.load_or_generate(&dir).unwrap();
    assert!(config.cache_path(&dir).is_file());
    assert_eq!(config.load_or_generate(&dir).unwrap(), generated);
    std::fs::remove_dir_all(&dir).ok();
}
