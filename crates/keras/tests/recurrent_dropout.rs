//! Dropout of recurrent layers in training, against the real Keras' law of it
//! (`datasets/keras-models/recurrent_dropout.stats.safetensors`, keras 3.15.1): the random masks
//! are Burn's, so the outputs cannot match draw by draw, but each output element's mean and
//! standard deviation over many draws must, and they depend on the rates, the scale
//! `1 / (1 - rate)` and which steps and gates share a mask (one mask per sequence; one per gate
//! where a gated cell has a recurrent dropout). The probe input is tiled along the batch, each row
//! drawing its own masks, as the fixture's script does on the Keras side.

use std::path::PathBuf;

use keras::{DynTensor, KerasModel};
use model::{Backend, HostTensor, TensorFile, WgpuKind};

/// Draws on our side: the tolerances below follow from it and from Keras' draws.
const DRAWS: usize = 20000;

#[test]
fn recurrent_dropout_in_training_has_the_moments_of_keras_dropout() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../datasets/keras-models");
    let stats = TensorFile::read(&dir.join("recurrent_dropout.stats.safetensors")).unwrap();
    let keras_draws: f64 = stats.metadata.get("draws").and_then(|d| d.parse().ok()).expect("the draws' count");
    let x = stats.tensors.get("inputs.series").unwrap(); // [4, 5, 2]
    let tiled = HostTensor::new(
        [vec![DRAWS * x.shape[0]], x.shape[1..].to_vec()].concat(),
        (0..DRAWS).flat_map(|_| x.data.iter().copied()).collect(),
    ); // [N·4, 5, 2]: row n·4 + b is draw n of row b
    for backend in [Backend::Ndarray, Backend::Flex] {
        let device = backend.device(WgpuKind::default()).unwrap();
        device.seed(11);
        let model = KerasModel::from_file(&dir.join("recurrent_dropout.keras"), &device).unwrap();
        let inference = model.forward(vec![DynTensor::from_host(x, &device).unwrap()], false).unwrap();
        let outputs = model.forward(vec![DynTensor::from_host(&tiled, &device).unwrap()], true).unwrap();
        for ((name, value), plain) in model.output_names().iter().zip(outputs).zip(inference) {
            let ours = value.tensor.to_host(); // [N·4, 5, u]
            let per_draw = ours.data.len() / DRAWS;
            let (mean, std) = moments(&ours.data, per_draw);
            let keras_mean = stats.tensors.get(&format!("mean.{name}")).unwrap();
            let keras_std = stats.tensors.get(&format!("std.{name}")).unwrap();
            let mut worst = (0.0f64, 0.0f64);
            for i in 0..per_draw {
                let (km, ks) = (keras_mean.data[i] as f64, keras_std.data[i] as f64);
                // Five standard errors of the difference of the two means; the sample standard
                // deviations within 8% (their relative standard error is 1 / sqrt(2 N) = 0.5% for
                // a normal law; a few masked inputs make a lumpier one: at 4000 draws an element
                // of the SimpleRNN was 7.6% off, at 20000 2.6%), or 0.005 where the dropout
                // barely moves an element.
                let standard_error = (ks * ks / keras_draws + std[i] * std[i] / DRAWS as f64).sqrt();
                let mean_error = (mean[i] - km).abs() / standard_error.max(1e-6);
                let std_error = (std[i] - ks).abs() / ks.max(0.005 / 0.08);
                assert!(mean_error <= 5.0, "{name} on {backend:?}, element {i}: mean {} against Keras' {km}", mean[i]);
                assert!(std_error <= 0.08, "{name} on {backend:?}, element {i}: std {} against Keras' {ks}", std[i]);
                worst = (worst.0.max(mean_error), worst.1.max(std_error));
            }
            // The masks are drawn: training differs from inference (whose dropout is the identity).
            let spread = std.iter().copied().fold(0.0f64, f64::max);
            assert!(spread > 0.01, "{name} on {backend:?}: no spread over the draws in training");
            assert_eq!(plain.tensor.shape(), [x.shape[0], x.shape[1], ours.shape[2]], "{name}");
            eprintln!(
                "{name} on {backend:?}: worst mean {:.2} standard errors, worst std {:.1}%",
                worst.0,
                worst.1 * 100.0
            );
        }
    }
}

/// Each element's mean and standard deviation over the draws of `values` (`DRAWS` blocks of
/// `per_draw`).
fn moments(values: &[f32], per_draw: usize) -> (Vec<f64>, Vec<f64>) {
    let mut sum = vec![0.0f64; per_draw];
    let mut squares = vec![0.0f64; per_draw];
    for draw in values.chunks_exact(per_draw) {
        for (i, &v) in draw.iter().enumerate() {
            sum[i] += v as f64;
            squares[i] += (v as f64) * (v as f64);
        }
    }
    let n = (values.len() / per_draw) as f64;
    let mean: Vec<f64> = sum.iter().map(|s| s / n).collect();
    let std = squares.iter().zip(&mean).map(|(q, m)| (q / n - m * m).max(0.0).sqrt()).collect();
    (mean, std)
}
