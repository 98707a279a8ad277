//! Training a whole Keras model in Burn reproduces the real Keras: the keras.io time-series
//! Transformer (dropout 0) and an LSTM -> attention -> pooling classifier (gradients through 136
//! steps) for 3 Adam steps each, against float64 trajectories made by keras 3.15.1
//! (`datasets/keras-models/<case>.trajectory.safetensors`).

use std::path::PathBuf;

use burn::optim::GradientsParams;
use burn::tensor::{Int, Tensor, TensorData};
use keras::{DynTensor, KerasModel};
use model::{Backend, TensorFile, WeightMap};
use train::models::gradients_as_module;
use train::optim::OptimizerConfig;

const TOLERANCE: f32 = 1e-5;

fn max_difference(ours: &WeightMap, keras: &TensorFile, prefix: &str) -> (f32, String) {
    let mut worst = (0.0f32, String::new());
    for (path, theirs) in keras.tensors.iter().filter_map(|(k, v)| Some((k.strip_prefix(prefix)?, v))) {
        let mine = ours.get(path).unwrap_or_else(|_| panic!("no variable {path} in the Burn model"));
        assert_eq!(mine.shape, theirs.shape, "{path}");
        let d = mine.data.iter().zip(&theirs.data).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        if d > worst.0 || !d.is_finite() {
            worst = (d, path.to_string());
        }
    }
    worst
}

#[test]
fn the_time_series_transformer_trains_as_keras_trains_it() {
    trains_as_keras("timeseries_train");
}

#[test]
fn an_lstm_attention_classifier_trains_as_keras_trains_it() {
    trains_as_keras("recurrent_train");
}

/// `<case>.keras` trained 3 Adam steps on every backend: each loss, the first gradients and the
/// final weights within [`TOLERANCE`] of Keras' float64 trajectory.
fn trains_as_keras(case: &str) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../datasets/keras-models");
    let fixture = TensorFile::read(&dir.join(format!("{case}.trajectory.safetensors"))).unwrap();
    // ndarray and flex, and wgpu where an adapter exists (required in CI).
    for backend in Backend::for_checks().unwrap() {
        let device = backend.device(Default::default()).unwrap().autodiff();
        let mut model = KerasModel::from_file(&dir.join(format!("{case}.keras")), &device).unwrap();
        let init = model.keras_variables();
        let (init_diff, at) = max_difference(&init, &fixture, "init.");
        assert_eq!(init_diff, 0.0, "{at}: the archive's weights are the fixture's init");
        let mut optim =
            OptimizerConfig::AdamKeras { beta_1: 0.9, beta_2: 0.999, epsilon: 1e-7, amsgrad: false, weight_decay: 0.0 }
                .init();
        let (x, y) = (fixture.tensors.get("data.x").unwrap(), fixture.tensors.get("data.y").unwrap());
        let expected = fixture.tensors.get("expected.loss").unwrap();
        for step in 0..expected.data.len() {
            let inputs = DynTensor::from_host(&x.index_first(step), &device).unwrap(); // [B, 136, 4]
            let labels = y.index_first(step); // [B]
            let batch = labels.data.len();
            let probs =
                model.forward(vec![inputs], true).unwrap().remove(0).tensor.rank_n::<2>("probabilities").unwrap(); // [B, 2]
            let ids = Tensor::<2, Int>::from_data(
                TensorData::new(labels.data.iter().map(|&l| l as i64).collect(), [batch, 1]),
                &device,
            );
            // sparse categorical cross-entropy: mean over the batch of -log(clip(p[b, y_b]))
            let picked = probs.gather(1, ids).clamp(1e-7, 1.0 - 1e-7); // [B, 1]
            let loss = picked.log().neg().mean();
            let value = loss.clone().into_data().convert::<f32>().try_to_vec::<f32>().unwrap()[0];
            assert!(
                (value - expected.data[step]).abs() <= TOLERANCE,
                "{case} on {backend:?} step {step}: loss {value}, Keras {}",
                expected.data[step]
            );
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            if step == 0 {
                let gradients = gradients_as_module(model.clone(), &grads).keras_variables();
                let (diff, at) = max_difference(&gradients, &fixture, "grads0.");
                assert!(diff <= TOLERANCE, "{case} on {backend:?}: first gradients differ by {diff} at {at}");
                eprintln!("{case} on {backend:?}: grads0 max |diff| {diff:.2e} ({at})");
            }
            model = optim.step(1e-3, model, grads);
        }
        let (diff, at) = max_difference(&model.keras_variables(), &fixture, "final.");
        eprintln!("{case} on {backend:?}: final weights max |diff| {diff:.2e} ({at})");
        assert!(diff <= TOLERANCE, "{case} on {backend:?}: final weights differ by {diff} at {at}");
    }
}
