//! Semantics that the fixtures do not pin down on their own: mask polarity, defaults, errors,
//! fully masked rows, causal masking, dropout and the exactness of weight conversion.

use burn::tensor::{Bool, Device, Tensor, TensorData};
use model::convert::{keras_to_projected, keras_to_torch, projected_to_keras, torch_to_keras};
use model::projected::ProjectedInput;
use model::torch_mha::{AttnWeights, TorchMhaInput};
use model::{HostTensor, KerasMhaConfig, KerasMhaInput, ModelError, ProjectedConfig, WeightMap};

use kernels::testing::values;

fn device() -> Device {
    Device::flex()
}

fn tensor<const D: usize>(shape: [usize; D], seed: u64) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values(shape.iter().product(), seed), shape), &device())
}

fn host<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    HostTensor::from_tensor(t).data
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max)
}

/// Random Keras weights for a config (biases random too, so that bias handling is exercised).
fn random_keras_weights(config: &KerasMhaConfig, seed: u64) -> WeightMap {
    let fresh = config.init(&device()).unwrap().keras_weights();
    let mut weights = WeightMap::new();
    for (i, (name, t)) in fresh.iter().enumerate() {
        weights.insert(name, HostTensor::new(t.shape.clone(), values(t.data.len(), seed + i as u64)));
    }
    weights
}

#[test]
fn seed_layer_has_keras_defaults_and_460_parameters() {
    let config = KerasMhaConfig::new(6, 4, 4);
    let dims = config.dims().unwrap();
    assert_eq!((dims.value_dim, dims.key_input_dim, dims.value_input_dim, dims.output_dim), (4, 4, 4, 4));
    let layer = config.init(&device()).unwrap();
    assert_eq!(layer.num_params(), 460, "Keras count_params() of MultiHeadAttention(6, 4) on [B, 136, 4]");

    // Glorot-uniform over the (4, 6, 4) kernel with Keras 3.15's fans of an EinsumDense kernel,
    // its input axes (4) and output axes (6 * 4): limit sqrt(6 / 28), measured in the real Keras
    // (datasets/reference/initializers.json has the statistics at a wider shape).
    let limit = (6.0f32 / 28.0).sqrt();
    let weights = layer.keras_weights();
    let query = weights.get("query.kernel").unwrap();
    assert_eq!(query.shape, [4, 6, 4]);
    assert!(query.data.iter().all(|v| v.abs() <= limit));
    assert!(query.data.iter().any(|v| v.abs() > limit / 2.0), "not all near zero");
    assert!(weights.get("query.bias").unwrap().data.iter().all(|v| *v == 0.0), "Keras biases start at zero");
    assert_eq!(weights.get("attention_output.kernel").unwrap().shape, [6, 4, 4]);
}

#[test]
fn projected_port_has_2520_parameters_and_24_outputs() {
    let model = ProjectedConfig::new(4, 24, 6).init(&device()).unwrap();
    assert_eq!(burn::module::Module::num_params(&model), 2520);
    let out = model.forward(ProjectedInput::new(tensor([2, 136, 4], 1))).unwrap().output;
    assert_eq!(out.dims(), [2, 136, 24]);

    let with_head = ProjectedConfig::new(4, 24, 6).with_output_dim(Some(4)).init(&device()).unwrap();
    assert_eq!(burn::module::Module::num_params(&with_head), 2520 + 24 * 4 + 4);
}

#[test]
fn keras_mask_true_means_attend_and_torch_padding_true_means_ignore() {
    let config = KerasMhaConfig::new(6, 4, 24);
    let keras_weights = random_keras_weights(&config, 10);
    let keras = config.init_with_weights(&keras_weights, &device()).unwrap();
    let converted = keras_to_torch(&config, &keras_weights).unwrap();
    let torch = converted.config.init_with_state_dict(&converted.weights, &device()).unwrap();

    let (batch, t, s, valid) = (2, 5, 7, 4);
    let q = tensor([batch, t, 24], 20);
    let kv = tensor([batch, s, 24], 21);
    let keep: Vec<bool> = (0..batch * t * s).map(|i| i % s < valid).collect();
    let keras_mask = Tensor::<3, Bool>::from_data(TensorData::new(keep, [batch, t, s]), &device());
    let ignore: Vec<bool> = (0..batch * s).map(|i| i % s >= valid).collect();
    let padding = Tensor::<2, Bool>::from_data(TensorData::new(ignore, [batch, s]), &device());

    let keras_out = keras.forward(KerasMhaInput::new(q.clone(), kv.clone()).attention_mask(keras_mask)).unwrap().output;
    let torch_out =
        torch.forward(TorchMhaInput::new(q.clone(), kv.clone(), kv.clone()).key_padding_mask(padding)).unwrap().output;
    assert!(max_abs_diff(&host(keras_out.clone()), &host(torch_out)) < 1e-5);

    // And the mask matters: attending to the first `valid` keys only is attending to a shorter sequence.
    let short = kv.clone().narrow(1, 0, valid);
    let short_out = keras.forward(KerasMhaInput::new(q, short)).unwrap().output;
    assert!(max_abs_diff(&host(keras_out), &host(short_out)) < 1e-5);
}

#[test]
fn fully_masked_rows_are_uniform_in_the_default_call_and_bias_with_scores_never_nan() {
    let config = KerasMhaConfig::new(2, 3, 5);
    let weights = random_keras_weights(&config, 30);
    let layer = config.init_with_weights(&weights, &device()).unwrap();
    let (t, s) = (3, 4);
    let x = tensor([1, t, 5], 31);
    let v = tensor([1, s, 5], 32);
    // Row 1 may attend nothing.
    let allowed: Vec<bool> = (0..t * s).map(|i| i / s != 1).collect();
    let mask = Tensor::<3, Bool>::from_data(TensorData::new(allowed, [1, t, s]), &device());

    let default_call =
        layer.forward(KerasMhaInput::new(x.clone(), v.clone()).attention_mask(mask.clone())).unwrap().output;
    let unmasked = layer.forward(KerasMhaInput::new(x.clone(), v.clone())).unwrap().output;
    // Uniform over all keys is what the unmasked layer does when every logit is equal; compare
    // with the mean of the projected values through the output layer instead.
    let values_mean = layer.value.forward(v.clone()).mean_dim(1); // [1, 1, h*v]
    let uniform_row = layer.output.forward(values_mean); // [1, 1, O]
    let row = |t_: Tensor<3>, r: usize| host(t_.narrow(1, r, 1));
    assert!(max_abs_diff(&row(default_call.clone(), 1), &host(uniform_row)) < 1e-5);
    assert!(max_abs_diff(&row(default_call.clone(), 0), &row(unmasked, 0)) < 1e-6, "other rows untouched");

    let with_scores =
        layer.forward(KerasMhaInput::new(x, v).attention_mask(mask).return_attention_scores(true)).unwrap();
    let bias = weights.get("attention_output.bias").unwrap().data.clone();
    assert!(max_abs_diff(&row(with_scores.output.clone(), 1), &bias) < 1e-6, "Keras' scores path: output = bias");
    let scores = host(with_scores.attention_scores.unwrap());
    assert!(scores.iter().all(|p| p.is_finite()));
    assert!(host(default_call).iter().all(|p| p.is_finite()));
}

#[test]
fn torch_style_fully_masked_rows_return_out_proj_bias_not_nan() {
    let config = KerasMhaConfig::new(2, 4, 8);
    let converted = keras_to_torch(&config, &random_keras_weights(&config, 40)).unwrap();
    let torch = converted.config.init_with_state_dict(&converted.weights, &device()).unwrap();
    let x = tensor([2, 3, 8], 41);
    let ignore_all = Tensor::<2, Bool>::from_data(TensorData::new(vec![true; 6], [2, 3]), &device());
    let out = torch.forward(TorchMhaInput::self_attention(x).key_padding_mask(ignore_all)).unwrap();
    let bias = converted.weights.get("out_proj.bias").unwrap().data.clone();
    let output = host(out.output);
    for row in output.chunks(8) {
        assert!(max_abs_diff(row, &bias) < 1e-6);
    }
    let Some(AttnWeights::Averaged(weights)) = out.attn_weights else { panic!("weights are returned by default") };
    assert!(host(weights).iter().all(|w| *w == 0.0));
}

#[test]
fn causal_mask_hides_the_future_top_left_aligned() {
    let layer = KerasMhaConfig::new(2, 4, 6).init(&device()).unwrap();
    let x = tensor([1, 5, 6], 50);
    let changed_future = Tensor::cat(vec![x.clone().narrow(1, 0, 2), tensor([1, 3, 6], 51)], 1);
    let run = |input: Tensor<3>| {
        layer
            .forward(KerasMhaInput::new(input.clone(), input).use_causal_mask(true).return_attention_scores(true))
            .unwrap()
    };
    let (a, b) = (run(x), run(changed_future));
    assert!(max_abs_diff(&host(a.output.clone().narrow(1, 0, 2)), &host(b.output.clone().narrow(1, 0, 2))) == 0.0);
    assert!(max_abs_diff(&host(a.output.narrow(1, 2, 3)), &host(b.output.narrow(1, 2, 3))) > 1e-3);
    // Query 0 attends only key 0.
    let scores = host(a.attention_scores.unwrap().narrow(2, 0, 1)); // [1, h, 1, 5]
    for head in scores.chunks(5) {
        assert_eq!(head, [1.0, 0.0, 0.0, 0.0, 0.0]);
    }
}

#[test]
fn dropout_acts_only_in_training_and_returned_scores_are_before_dropout() {
    device().seed(7);
    let layer = KerasMhaConfig::new(2, 4, 6).with_dropout(0.5).init(&device()).unwrap();
    let x = tensor([2, 8, 6], 60);
    let call = |training| {
        layer
            .forward(KerasMhaInput::new(x.clone(), x.clone()).training(training).return_attention_scores(true))
            .unwrap()
    };
    let (eval_a, eval_b, train) = (call(false), call(false), call(true));
    assert_eq!(host(eval_a.output.clone()), host(eval_b.output));
    assert!(max_abs_diff(&host(eval_a.output), &host(train.output)) > 1e-4);
    let row_sums = host(train.attention_scores.unwrap().sum_dim(3));
    assert!(row_sums.iter().all(|s| (s - 1.0).abs() < 1e-5));
}

/// Keras' `seed` seeds the dropout layer: two layers with the same seed drop the same entries
/// call for call, on every backend; successive calls draw new masks.
#[test]
fn a_seeded_layer_drops_the_same_entries_on_every_backend() {
    let config = KerasMhaConfig::new(2, 4, 6).with_dropout(0.4).with_seed(Some(11));
    let weights = random_keras_weights(&config, 5);
    let run = |device: &Device| -> Vec<Vec<f32>> {
        let layer = config.init_with_weights(&weights, device).unwrap();
        let x = HostTensor::new(vec![2, 8, 6], values(96, 61)).to_tensor::<3>("x", device).unwrap();
        (0..2)
            .map(|_| host(layer.forward(KerasMhaInput::new(x.clone(), x.clone()).training(true)).unwrap().output))
            .collect()
    };
    let ndarray_device = model::Backend::Ndarray.device(Default::default()).unwrap();
    let (flex, ndarray, again) = (run(&Device::flex()), run(&ndarray_device), run(&Device::flex()));
    assert!(
        max_abs_diff(&flex[0], &ndarray[0]) < 1e-5 && max_abs_diff(&flex[1], &ndarray[1]) < 1e-5,
        "same masks on both backends"
    );
    assert_eq!(flex, again, "a fresh layer with the same seed repeats its masks");
    assert!(max_abs_diff(&flex[0], &flex[1]) > 1e-3, "the second call draws a new mask");
}

/// torch's dropout: none in eval mode; in training, the returned per-head weights are the
/// weights after dropout (each entry dropped or scaled by 1 / (1 - p)), and the output uses them.
#[test]
fn torch_dropout_returns_the_weights_after_dropout() {
    device().seed(3);
    let p = 0.5;
    let layer = model::TorchMhaConfig::new(8, 2).with_dropout(p).init(&device()).unwrap();
    let x = tensor([2, 6, 8], 70);
    let call = |training| {
        layer
            .forward(TorchMhaInput::new(x.clone(), x.clone(), x.clone()).average_attn_weights(false).training(training))
            .unwrap()
    };
    let weights = |out: &model::TorchMhaOutput| match &out.attn_weights {
        Some(AttnWeights::PerHead(w)) => host(w.clone()),
        other => panic!("per-head weights expected, got {other:?}"),
    };
    let (eval, train) = (call(false), call(true));
    let (eval_w, train_w) = (weights(&eval), weights(&train));
    let mut dropped = 0;
    for (&e, &t) in eval_w.iter().zip(&train_w) {
        if t == 0.0 {
            dropped += 1;
        } else {
            assert!((t - e / (1.0 - p as f32)).abs() < 1e-5, "kept entries are scaled by 1/(1-p): {t} vs {e}");
        }
    }
    let fraction = dropped as f64 / eval_w.len() as f64;
    assert!((fraction - p).abs() < 0.15, "dropped {fraction} of the weights at p = {p}");
    assert!(max_abs_diff(&host(eval.output), &host(train.output)) > 1e-4);
}

#[test]
fn flash_attention_follows_keras_rules() {
    let err = |c: KerasMhaConfig| c.init(&device()).unwrap_err().to_string();
    assert!(err(KerasMhaConfig::new(2, 4, 6).with_flash_attention(true).with_dropout(0.1)).contains("flash_attention"));
    let flash = KerasMhaConfig::new(2, 4, 6).with_flash_attention(true);
    let weights = random_keras_weights(&flash, 9);
    let (with, without) = (
        flash.init_with_weights(&weights, &device()).unwrap(),
        flash.clone().with_flash_attention(false).init_with_weights(&weights, &device()).unwrap(),
    );
    let x = tensor([2, 5, 6], 71);
    let call = || KerasMhaInput::new(x.clone(), x.clone()).use_causal_mask(true);
    assert_eq!(
        host(with.forward(call()).unwrap().output),
        host(without.forward(call()).unwrap().output),
        "the same function"
    );
    assert!(with.forward(call().return_attention_scores(true)).unwrap_err().to_string().contains("flash_attention"));
}

#[test]
fn bad_configs_are_errors_naming_the_field() {
    let err = |c: KerasMhaConfig| c.init(&device()).unwrap_err().to_string();
    assert!(err(KerasMhaConfig::new(6, 0, 4)).contains("key_dim = 0"));
    assert!(err(KerasMhaConfig::new(0, 4, 4)).contains("num_heads = 0"));
    // use_gate is supported: the gate adds Dq * h * v + h * v parameters (Keras' count).
    let gated = KerasMhaConfig::new(6, 4, 4).with_use_gate(true).init(&device()).unwrap();
    assert_eq!(gated.num_params(), 460 + 4 * 24 + 24);
    assert!(err(KerasMhaConfig::new(6, 4, 4).with_attention_axes(Some(vec![]))).contains("attention_axes = []"));
    assert!(err(KerasMhaConfig::new(6, 4, 4).with_dropout(1.0)).contains("dropout"));
    assert!(err(KerasMhaConfig::new(6, 4, 4).with_sliding_window(Some(0))).contains("sliding_window = 0"));
    assert!(KerasMhaConfig::new(6, 4, 4).with_sliding_window(Some(8)).init(&device()).is_ok());
    assert!(KerasMhaConfig::new(6, 4, 4).with_attention_axes(Some(vec![1])).init(&device()).is_ok());
    let torch = model::TorchMhaConfig::new(4, 6).init(&device()).unwrap_err().to_string();
    assert!(torch.contains("num_heads = 6") && torch.contains("embed_dim = 4"), "{torch}");
}

#[test]
fn shape_errors_name_the_input_or_tensor() {
    let config = KerasMhaConfig::new(2, 3, 5);
    let layer = config.init(&device()).unwrap();
    let wrong = layer.forward(KerasMhaInput::new(tensor([1, 4, 6], 1), tensor([1, 4, 5], 2))).unwrap_err();
    assert!(matches!(wrong, ModelError::InputShape { input: "query", .. }), "{wrong}");

    let mut weights = layer.keras_weights();
    weights.insert("key.kernel", HostTensor::zeros(vec![5, 2, 4]));
    let err = config.init_with_weights(&weights, &device()).unwrap_err().to_string();
    assert_eq!(err, "tensor `key.kernel`: expected shape [5, 2, 3], found [5, 2, 4]");

    let mut weights = layer.keras_weights();
    weights.take("value.bias");
    assert!(config.init_with_weights(&weights, &device()).unwrap_err().to_string().contains("value.bias"));

    let mut weights = layer.keras_weights();
    weights.insert("query.kernal", HostTensor::zeros(vec![1]));
    assert!(config.init_with_weights(&weights, &device()).unwrap_err().to_string().contains("query.kernal"));
}

#[test]
fn keras_to_torch_to_keras_round_trip_is_bit_exact() {
    for (config, seed) in [
        (KerasMhaConfig::new(6, 4, 24), 70),
        (KerasMhaConfig::new(2, 4, 8).with_key_input_dim(Some(6)).with_value_input_dim(Some(5)), 71),
        (KerasMhaConfig::new(3, 2, 6).with_use_bias(false), 72),
    ] {
        let keras = random_keras_weights(&config, seed);
        let torch = keras_to_torch(&config, &keras).unwrap();
        let back = torch_to_keras(&torch.config, &torch.weights).unwrap();
        assert_eq!(back.weights, keras);
        // The module's own weight export is the same bits too.
        let layer = back.config.init_with_weights(&back.weights, &device()).unwrap();
        assert_eq!(layer.keras_weights(), keras);
    }
}

#[test]
fn conversions_that_cannot_be_exact_say_why() {
    let v_ne_k = KerasMhaConfig::new(2, 3, 6).with_value_dim(Some(5));
    let err = keras_to_torch(&v_ne_k, &random_keras_weights(&v_ne_k, 1)).unwrap_err().to_string();
    assert!(err.contains("value_dim = 5") && err.contains("key_dim = 3"), "{err}");

    let narrow = KerasMhaConfig::new(1, 2, 4);
    let err = keras_to_projected(&narrow, &random_keras_weights(&narrow, 2)).unwrap_err().to_string();
    assert!(err.contains("cannot be exact") && err.contains("2 < input width 4"), "{err}");
}

/// The padded, rescaled mapping for `value_dim != key_dim`: the projected model computes the
/// Keras layer's function (checked numerically here; the fixtures check it against torch).
#[test]
fn keras_with_value_dim_ne_key_dim_maps_exactly_to_the_projected_model() {
    let config = KerasMhaConfig::new(2, 3, 5).with_value_dim(Some(6)).with_output_shape(Some(7));
    let keras_weights = random_keras_weights(&config, 80);
    let keras = config.init_with_weights(&keras_weights, &device()).unwrap();
    let converted = keras_to_projected(&config, &keras_weights).unwrap();
    assert_eq!(converted.config.embed_dim, 12, "h * max(k, v)");
    let projected = converted.config.init_with_state_dict(&converted.weights, &device()).unwrap();
    let x = tensor([2, 9, 5], 81);
    let ours = projected.forward(ProjectedInput::new(x.clone())).unwrap().output;
    let theirs = keras.forward(KerasMhaInput::new(x.clone(), x.clone())).unwrap().output;
    assert!(max_abs_diff(&host(ours), &host(theirs)) < 1e-5);

    // And back: projected -> Keras gives the same function again.
    let back = projected_to_keras(&converted.config, &converted.weights).unwrap();
    let keras_again = back.config.init_with_weights(&back.weights, &device()).unwrap();
    let again = keras_again.forward(KerasMhaInput::new(x.clone(), x.clone())).unwrap().output;
    let theirs = keras.forward(KerasMhaInput::new(x.clone(), x)).unwrap().output;
    assert!(max_abs_diff(&host(again), &host(theirs)) < 1e-5);
}

/// The fused inference path (burn's attention op) against the decomposed reference path, at the
/// fixtures' tolerance (they differ by float32 reduction order; measured up to 2e-6).
#[test]
fn fused_inference_path_matches_the_exact_path_within_1e_5() {
    let config = KerasMhaConfig::new(6, 4, 4);
    let layer = config.init_with_weights(&random_keras_weights(&config, 90), &device()).unwrap();
    let x = tensor([2, 136, 4], 91);
    for causal in [false, true] {
        let call = || KerasMhaInput::new(x.clone(), x.clone()).use_causal_mask(causal);
        let fast = host(layer.forward(call()).unwrap().output);
        let exact = host(layer.forward_exact(call()).unwrap().output);
        let diff = max_abs_diff(&fast, &exact);
        eprintln!("keras causal={causal}: fused vs exact max_abs_diff={diff:e}");
        assert!(diff < 1e-5, "keras causal={causal}: {diff:e}");
    }

    let converted =
        keras_to_torch(&KerasMhaConfig::new(6, 4, 24), &random_keras_weights(&KerasMhaConfig::new(6, 4, 24), 92))
            .unwrap();
    let torch = converted.config.init_with_state_dict(&converted.weights, &device()).unwrap();
    let q = tensor([2, 9, 24], 93);
    // Batch 1 ignores every key: a fully masked row, zero attention on both paths.
    let ignore: Vec<bool> = (0..2 * 9).map(|i| i >= 9 || i % 9 > 6).collect();
    let padding = Tensor::<2, Bool>::from_data(TensorData::new(ignore, [2, 9]), &device());
    let call = || TorchMhaInput::self_attention(q.clone()).key_padding_mask(padding.clone()).need_weights(false);
    let fast = host(torch.forward(call()).unwrap().output);
    let exact = host(torch.forward_exact(call()).unwrap().output);
    assert!(fast.iter().all(|v| v.is_finite()));
    let diff = max_abs_diff(&fast, &exact);
    eprintln!("torch with a fully masked row: fused vs exact max_abs_diff={diff:e}");
    assert!(diff < 1e-5, "{diff:e}");
}
