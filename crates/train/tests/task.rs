//! The lookup task and the ladder's harder teachers: deterministic, splits independent of each
//! other's sizes, each teacher reading the positions it says it reads, and a real gap between
//! what a per-position model and attention can reach.

use train::task::{TaskConfig, Teacher, per_position_floor, teacher, teacher_row};

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
    let before = teacher(config.teacher, &x, config.seq_len, config.beta);
    x[5 * 4 + 1] = 10.0;
    let after = teacher(config.teacher, &x, config.seq_len, config.beta);
    assert!((after[0] - x[5 * 4 + 2]).abs() < 1e-3 && (after[1] - x[5 * 4 + 3]).abs() < 1e-3);
    assert!((before[0] - after[0]).abs() > 1e-3, "the target moved with another position");
}

/// A sequence of `small()` with position 0's query features at 1.
fn sequence(config: &TaskConfig) -> Vec<f64> {
    let data = config.generate();
    let mut x: Vec<f64> = data.train.x[..config.seq_len * 4].iter().map(|&v| v as f64).collect();
    x[..4].copy_from_slice(&[1.0; 4]);
    x
}

#[test]
fn four_heads_reads_one_lookup_per_target_from_rotated_features() {
    // Target i of position 0 asks with feature i, matches feature i+1 and reads feature i+2
    // (mod 4): a key of 10 at position 5 in feature i+1 makes target i position 5's feature i+2.
    let config = TaskConfig { teacher: Teacher::FourHeads, ..small() };
    for i in 0..4 {
        let mut x = sequence(&config);
        x[5 * 4 + (i + 1) % 4] = 10.0;
        let y = teacher_row(config.teacher, &x, config.seq_len, config.beta, 0);
        assert!((y[i] - x[5 * 4 + (i + 2) % 4]).abs() < 1e-3, "target {i}: {} vs {}", y[i], x[5 * 4 + (i + 2) % 4]);
    }
}

#[test]
fn two_hop_asks_its_second_lookup_with_the_first_ones_answer() {
    // Hop one: position 0's query (feature 0 = 1) finds position 5 (key 10), whose feature 2 is
    // -1. Hop two asks with that -1, so it finds the most negative key, position 7's -10, and
    // reads position 7's features 2 and 3; the lookup teacher would have answered from position 5.
    let config = TaskConfig { teacher: Teacher::TwoHop, ..small() };
    let mut x = sequence(&config);
    x[5 * 4 + 1] = 10.0;
    x[5 * 4 + 2] = -1.0;
    x[7 * 4 + 1] = -10.0;
    let two_hop = teacher_row(Teacher::TwoHop, &x, config.seq_len, config.beta, 0);
    let lookup = teacher_row(Teacher::Lookup, &x, config.seq_len, config.beta, 0);
    assert!((lookup[0] - x[5 * 4 + 2]).abs() < 1e-3, "hop one answers from position 5: {lookup:?}");
    assert!(
        (two_hop[0] - x[7 * 4 + 2]).abs() < 1e-3 && (two_hop[1] - x[7 * 4 + 3]).abs() < 1e-3,
        "hop two answers from position 7: {two_hop:?}"
    );
    assert_eq!(two_hop[2..], lookup[2..], "head B is the lookup's");
}

#[test]
fn every_teacher_needs_the_other_positions() {
    for teacher in [Teacher::Lookup, Teacher::FourHeads, Teacher::TwoHop] {
        let config = TaskConfig { teacher, ..TaskConfig::default() };
        let floor = per_position_floor(&config, 64, 64);
        let bayes = config.noise_std.powi(2);
        assert!(floor > 5.0 * bayes, "{teacher:?}: per-position floor {floor} vs Bayes {bayes}");
    }
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
