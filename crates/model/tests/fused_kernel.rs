//! The fused attention kernel (forward and its own backward) against the decomposed reference
//! path under burn-autodiff, on the CPU backends it runs on: outputs, and gradients with respect
//! to every weight and every input, at shapes the training fixtures do not cover.

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Gradients;
use burn::tensor::{Bool, Device, Tensor, TensorData};
use model::convert::keras_to_torch;
use model::torch_mha::{AttnMask, AttnWeights, TorchMha, TorchMhaInput, TorchMhaOutput};
use model::{Backend, HostTensor, KerasMha, KerasMhaConfig, KerasMhaInput, KerasMhaOutput, WeightMap};

use kernels::testing::values;

fn input<const D: usize>(shape: [usize; D], seed: u64, device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values(shape.iter().product(), seed), shape), device).require_grad()
}

/// An input for inference: no gradient recorded.
fn inference_input<const D: usize>(shape: [usize; D], seed: u64, device: &Device) -> Tensor<D> {
    Tensor::from_data(TensorData::new(values(shape.iter().product(), seed), shape), device)
}

/// Held by whatever draws from a device's generator: tests run in parallel threads, and the torch
/// dropout test seeds the generator, then relies on the next draws being its own.
static DEVICE_GENERATOR: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Random weights (biases included) for a Keras config.
fn keras_weights(config: &KerasMhaConfig, seed: u64) -> WeightMap {
    let fresh = {
        let _generator = DEVICE_GENERATOR.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        config.init(&Device::flex()).unwrap().keras_weights()
    };
    let mut weights = WeightMap::new();
    for (i, (name, t)) in fresh.iter().enumerate() {
        weights.insert(name, HostTensor::new(t.shape.clone(), values(t.data.len(), seed + i as u64)));
    }
    weights
}

/// Every parameter's gradient, in module order.
struct CollectGrads<'a> {
    grads: &'a Gradients,
    found: Vec<Vec<f32>>,
}

impl ModuleVisitor for CollectGrads<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let grad = param.val().grad(self.grads).expect("every parameter has a gradient");
        self.found.push(grad.into_data().convert::<f32>().try_into_vec::<f32>().unwrap());
    }
}

fn values_of<const D: usize>(t: Tensor<D>) -> Vec<f32> {
    t.into_data().convert::<f32>().try_into_vec::<f32>().unwrap()
}

/// The output, then the gradients of `Σ output · probe` (a fixed random probe, so that every output
/// element counts) with respect to every parameter of `module` and to each of `inputs`.
fn output_and_gradients<M: Module>(module: &M, output: Tensor<3>, inputs: &[&Tensor<3>]) -> Vec<Vec<f32>> {
    let probe =
        Tensor::from_data(TensorData::new(values(output.shape().num_elements(), 99), output.dims()), &output.device());
    let grads = (output.clone() * probe).sum().backward();
    let mut collect = CollectGrads { grads: &grads, found: vec![values_of(output)] };
    module.visit(&mut collect);
    collect.found.extend(inputs.iter().map(|input| values_of(input.grad(&grads).expect("the input takes part"))));
    collect.found
}

/// The largest difference relative to the largest reference magnitude (at least 1). Weight and
/// input gradients are sums over every (batch, position) with terms as large as the largest
/// gradient, so float32 rounding scales with that, also in entries that cancel to about zero
/// (the key bias's gradient is exactly zero in exact arithmetic).
fn max_scaled_diff(ours: &[Vec<f32>], reference: &[Vec<f32>]) -> f32 {
    assert_eq!(ours.len(), reference.len());
    let scale = reference.iter().flatten().fold(1.0f32, |m, x| m.max(x.abs()));
    let pairs = ours.iter().zip(reference).flat_map(|(a, b)| a.iter().zip(b));
    pairs.map(|(x, y)| (x - y).abs()).fold(0.0, f32::max) / scale
}

/// A Keras call on the exact path, or on the fastest one (the kernel on the CPU backends).
fn keras_call(layer: &KerasMha, call: KerasMhaInput, exact: bool) -> KerasMhaOutput {
    match exact {
        true => layer.forward_exact(call),
        false => layer.forward(call),
    }
    .unwrap()
}

/// A torch call on the exact path, or on the fastest one (the kernel on the CPU backends).
fn torch_call(mha: &TorchMha, call: TorchMhaInput, exact: bool) -> TorchMhaOutput {
    match exact {
        true => mha.forward_exact(call),
        false => mha.forward(call),
    }
    .unwrap()
}

fn cpu_backends() -> [Device; 2] {
    [Backend::Ndarray.device(Default::default()).unwrap(), Backend::Flex.device(Default::default()).unwrap()]
}

#[test]
fn keras_kernel_matches_the_exact_path_with_gradients() {
    // (heads, key_dim, value_dim, query width, T, S): the seed, value_dim != key_dim with T != S,
    // widths that pad to 8 and 16 lanes of features.
    for (heads, key_dim, value_dim, width, query_len, source_len) in
        [(6, 4, 4, 4, 136, 136), (3, 2, 5, 6, 19, 37), (2, 7, 3, 5, 33, 20), (2, 16, 12, 8, 17, 9)]
    {
        let config = KerasMhaConfig::new(heads, key_dim, width).with_value_dim(Some(value_dim));
        let weights = keras_weights(&config, 7);
        for device in cpu_backends() {
            let device = device.autodiff();
            let layer = config.init_with_weights(&weights, &device).unwrap();
            let run = |exact: bool| {
                let query = input([2, query_len, width], 11, &device);
                let value = input([2, source_len, width], 12, &device);
                let call = KerasMhaInput::new(query.clone(), value.clone());
                let output = keras_call(&layer, call, exact).output;
                output_and_gradients(&layer, output, &[&query, &value])
            };
            let diff = max_scaled_diff(&run(false), &run(true));
            eprintln!("keras h={heads} k={key_dim} v={value_dim} T={query_len} S={source_len} on {device:?}: {diff:e}");
            assert!(diff < 1e-6, "keras h={heads} k={key_dim} v={value_dim}: kernel vs exact {diff:e}");
        }
    }
}

#[test]
fn keras_self_attention_matches_the_exact_path_packed_and_apart() {
    // One input: the kernel reads one packed projection where each of the three products would
    // run on one thread (the seed's shape), and three products apart above that (the three
    // weights are not joined anew every call where the GEMM splits each over threads anyway).
    // (heads, key_dim, width, batch, T), whether the layer packs there, and the tolerance: the
    // wider layer's gradients are sums of 64-wide products over 192 rows (1.6e-6 packed too).
    for (heads, key_dim, width, batch, seq_len, packs, tolerance) in
        [(6, 4, 4, 2, 136, true, 1e-6), (4, 16, 64, 2, 96, false, 4e-6)]
    {
        assert_eq!(kernels::gemm::runs_alone(batch * seq_len, width, heads * key_dim), packs);
        let config = KerasMhaConfig::new(heads, key_dim, width);
        let weights = keras_weights(&config, 3);
        for device in cpu_backends() {
            let device = device.autodiff();
            let layer = config.init_with_weights(&weights, &device).unwrap();
            let run = |exact: bool| {
                let x = input([batch, seq_len, width], 21, &device);
                let output = keras_call(&layer, KerasMhaInput::self_attention(x.clone()), exact).output;
                output_and_gradients(&layer, output, &[&x])
            };
            let diff = max_scaled_diff(&run(false), &run(true));
            eprintln!("keras self-attention h={heads} k={key_dim} D={width} packs={packs} on {device:?}: {diff:e}");
            assert!(diff < tolerance, "keras self-attention h={heads} k={key_dim} D={width}: kernel vs exact {diff:e}");
        }
    }
}

#[test]
fn torch_kernel_matches_the_exact_path_with_gradients() {
    let keras = KerasMhaConfig::new(6, 4, 24);
    let converted = keras_to_torch(&keras, &keras_weights(&keras, 21)).unwrap();
    for device in cpu_backends() {
        let device = device.autodiff();
        let mha = converted.config.init_with_state_dict(&converted.weights, &device).unwrap();
        let run = |exact: bool| {
            let query = input([3, 21, 24], 22, &device);
            let key = input([3, 30, 24], 23, &device);
            let call = TorchMhaInput::new(query.clone(), key.clone(), key.clone()).need_weights(false);
            let output = torch_call(&mha, call, exact).output;
            output_and_gradients(&mha, output, &[&query, &key])
        };
        let diff = max_scaled_diff(&run(false), &run(true));
        eprintln!("torch on {device:?}: {diff:e}");
        assert!(diff < 1e-6, "torch: kernel vs exact {diff:e}");
    }
}

/// A training call that returns the probabilities runs the kernel for the context and a softmax
/// beside it: the output, the probabilities and every gradient of a loss that reads both match
/// the exact path, with masks and the causal mask (Keras) and key padding (torch).
#[test]
fn calls_returning_probabilities_train_on_the_kernel_exactly() {
    let flat = |t: Tensor<3>| t.reshape([1, 1, -1]); // [1, 1, N]
    let config = KerasMhaConfig::new(3, 5, 6).with_value_dim(Some(4));
    let weights = keras_weights(&config, 31);
    for device in cpu_backends() {
        let device = device.autodiff();
        let layer = config.init_with_weights(&weights, &device).unwrap();
        let run = |exact: bool| {
            let query = input([2, 13, 6], 32, &device);
            let value = input([2, 17, 6], 33, &device);
            let mask = bool_tensor([2, 13, 17], |i| i % 17 < 17 - 5 * (i / (13 * 17)), &device); // lengths 17, 12
            let call = KerasMhaInput::new(query.clone(), value.clone())
                .attention_mask(mask)
                .use_causal_mask(true)
                .return_attention_scores(true);
            let out = keras_call(&layer, call, exact);
            let scores = out.attention_scores.expect("asked for"); // [B, h, T, S]
            let both = Tensor::cat(vec![flat(out.output), flat(scores.reshape([2, 3 * 13, 17]))], 2); // [1, 1, N + M]
            output_and_gradients(&layer, both, &[&query, &value])
        };
        let diff = max_scaled_diff(&run(false), &run(true));
        assert!(diff < 1e-6, "keras scores on {device:?}: kernel vs exact {diff:e}");
    }

    let keras = KerasMhaConfig::new(4, 3, 12);
    let converted = keras_to_torch(&keras, &keras_weights(&keras, 41)).unwrap();
    for device in cpu_backends() {
        let device = device.autodiff();
        let mha = converted.config.init_with_state_dict(&converted.weights, &device).unwrap();
        for average in [true, false] {
            let run = |exact: bool| {
                let query = input([2, 9, 12], 42, &device);
                let key = input([2, 11, 12], 43, &device);
                let ignored = bool_tensor([2, 11], |i| i % 11 >= 11 - 4 * (i / 11), &device); // lengths 11, 7
                // A float mask: -inf entries block, the rest adds to the logits of both branches.
                let bias: Vec<f32> = (0..9 * 11)
                    .map(|i| if i % 6 == 2 { f32::NEG_INFINITY } else { (i % 4) as f32 * 0.5 - 0.7 })
                    .collect();
                let bias = Tensor::<3>::from_data(TensorData::new(bias, [1, 9, 11]), &device);
                let mut call = TorchMhaInput::new(query.clone(), key.clone(), key.clone())
                    .need_weights(true)
                    .attn_mask(AttnMask::Additive(bias));
                call.key_padding_mask = Some(ignored);
                call.average_attn_weights = average;
                let out = torch_call(&mha, call, exact);
                let weights = match out.attn_weights.expect("asked for") {
                    AttnWeights::Averaged(w) => w,                        // [B, T, S]
                    AttnWeights::PerHead(w) => w.reshape([2, 4 * 9, 11]), // [B, h*T, S]
                };
                let both = Tensor::cat(vec![flat(out.output), flat(weights)], 2); // [1, 1, N + M]
                output_and_gradients(&mha, both, &[&query, &key])
            };
            let diff = max_scaled_diff(&run(false), &run(true));
            assert!(diff < 1e-6, "torch weights (average {average}) on {device:?}: kernel vs exact {diff:e}");
        }
    }
}

/// Inference calls that return probabilities: the kernel writes them (and the context) in one
/// call, equal to the decomposed path's, for Keras under masks (zeroed fully masked rows, as
/// Keras' scores path gives them) and for torch with key padding and a float mask.
#[test]
fn probabilities_in_inference_come_from_the_kernel() {
    let config = KerasMhaConfig::new(3, 16, 6).with_value_dim(Some(4));
    let weights = keras_weights(&config, 51);
    for device in cpu_backends() {
        let layer = config.init_with_weights(&weights, &device).unwrap();
        let query = inference_input([2, 37, 6], 52, &device);
        let value = inference_input([2, 45, 6], 53, &device);
        let mask = bool_tensor([2, 37, 45], |i| i % 45 < 45 - 45 * (i / (37 * 45)), &device); // lengths 45, 0
        for causal in [false, true] {
            let call = || {
                KerasMhaInput::new(query.clone(), value.clone())
                    .attention_mask(mask.clone())
                    .use_causal_mask(causal)
                    .return_attention_scores(true)
            };
            let (ours, exact) = (keras_call(&layer, call(), false), keras_call(&layer, call(), true));
            let values =
                |out: KerasMhaOutput| vec![values_of(out.output), values_of(out.attention_scores.expect("asked for"))];
            let diff = max_scaled_diff(&values(ours), &values(exact));
            assert!(diff < 1e-6, "keras scores (causal {causal}) on {device:?}: kernel vs exact {diff:e}");
        }
    }

    let keras = KerasMhaConfig::new(4, 3, 12);
    let converted = keras_to_torch(&keras, &keras_weights(&keras, 61)).unwrap();
    for device in cpu_backends() {
        let mha = converted.config.init_with_state_dict(&converted.weights, &device).unwrap();
        let (query, key) = (inference_input([2, 19, 12], 62, &device), inference_input([2, 23, 12], 63, &device));
        let ignored = bool_tensor([2, 23], |i| i % 23 >= 23 - 6 * (i / 23), &device); // lengths 23, 17
        let bias: Vec<f32> =
            (0..19 * 23).map(|i| if i % 7 == 3 { f32::NEG_INFINITY } else { (i % 5) as f32 * 0.4 - 0.8 }).collect();
        let bias = Tensor::<3>::from_data(TensorData::new(bias, [1, 19, 23]), &device);
        for average in [true, false] {
            let call = || {
                let mut call = TorchMhaInput::new(query.clone(), key.clone(), key.clone())
                    .need_weights(true)
                    .key_padding_mask(ignored.clone());
                call.average_attn_weights = average;
                call.attn_mask(AttnMask::Additive(bias.clone()))
            };
            let values = |out: TorchMhaOutput| {
                let weights = match out.attn_weights.expect("asked for") {
                    AttnWeights::Averaged(w) => values_of(w),
                    AttnWeights::PerHead(w) => values_of(w),
                };
                vec![values_of(out.output), weights]
            };
            let diff =
                max_scaled_diff(&values(torch_call(&mha, call(), false)), &values(torch_call(&mha, call(), true)));
            assert!(diff < 1e-6, "torch weights (average {average}) on {device:?}: kernel vs exact {diff:e}");
        }
    }
}

/// Dropout inside the kernel: the forward pass and both backward walks regenerate the keep-mask
/// the exact path draws, so outputs and every gradient match it, for a seeded Keras layer with
/// masks (its scores, before dropout, too) and for torch (whose seed comes from the device).
#[test]
fn dropout_in_the_kernel_matches_the_exact_path_with_gradients() {
    let flat = |t: Tensor<3>| t.reshape([1, 1, -1]); // [1, 1, N]
    // Heads of 4 features take the kernel's fused narrow step, of 5 and 16 its two passes.
    for (heads, key_dim, width, query_len, source_len) in [(3, 5, 6, 13, 17), (3, 4, 6, 13, 17), (2, 16, 8, 40, 33)] {
        let config = KerasMhaConfig::new(heads, key_dim, width).with_dropout(0.3).with_seed(Some(5));
        let weights = keras_weights(&config, 51);
        for device in cpu_backends() {
            let device = device.autodiff();
            let run = |exact: bool| {
                // A fresh layer per run: the same call index, so the same keep-mask.
                let layer = config.init_with_weights(&weights, &device).unwrap();
                let query = input([2, query_len, width], 52, &device);
                let value = input([2, source_len, width], 53, &device);
                let mask = bool_tensor(
                    [2, query_len, source_len],
                    |i| i % source_len < source_len - 5 * (i / (query_len * source_len)),
                    &device,
                );
                let call = KerasMhaInput::new(query.clone(), value.clone())
                    .attention_mask(mask)
                    .use_causal_mask(true)
                    .training(true)
                    .return_attention_scores(true);
                let out = keras_call(&layer, call, exact);
                let scores = out.attention_scores.expect("asked for"); // [B, h, T, S]
                let both =
                    Tensor::cat(vec![flat(out.output), flat(scores.reshape([2, heads * query_len, source_len]))], 2);
                output_and_gradients(&layer, both, &[&query, &value])
            };
            let (kernel, exact) = (run(false), run(true));
            let diff = max_scaled_diff(&kernel, &exact);
            assert!(diff < 1e-6, "keras dropout h={heads} k={key_dim} on {device:?}: kernel vs exact {diff:e}");
            // And dropout did something: the output differs from the same call without it.
            let plain = config.clone().with_dropout(0.0).init_with_weights(&weights, &device).unwrap();
            let without = plain
                .forward(
                    KerasMhaInput::new(
                        input([2, query_len, width], 52, &device),
                        input([2, source_len, width], 53, &device),
                    )
                    .use_causal_mask(true),
                )
                .unwrap()
                .output;
            assert_ne!(values_of(without), kernel[0][..2 * query_len * width].to_vec(), "no dropout happened");
        }
    }

    let keras = KerasMhaConfig::new(4, 3, 12);
    let mut converted = keras_to_torch(&keras, &keras_weights(&keras, 61)).unwrap();
    converted.config = converted.config.with_dropout(0.2);
    for device in cpu_backends() {
        let device = device.autodiff();
        let mha = converted.config.init_with_state_dict(&converted.weights, &device).unwrap();
        // With weights too, which torch returns after dropout: the kernel's keep-mask in both.
        for need_weights in [false, true] {
            let run = |exact: bool| {
                device.seed(62); // the keep-mask's seed comes from the device's generator
                let query = input([2, 9, 12], 63, &device);
                let key = input([2, 11, 12], 64, &device);
                let ignored = bool_tensor([2, 11], |i| i % 11 >= 11 - 4 * (i / 11), &device);
                let mut call = TorchMhaInput::new(query.clone(), key.clone(), key.clone())
                    .need_weights(need_weights)
                    .training(true);
                call.key_padding_mask = Some(ignored);
                call.average_attn_weights = false;
                let out = torch_call(&mha, call, exact);
                let output = match out.attn_weights {
                    Some(AttnWeights::PerHead(weights)) => {
                        Tensor::cat(vec![flat(out.output), flat(weights.reshape([2, 4 * 9, 11]))], 2)
                    }
                    _ => out.output,
                };
                output_and_gradients(&mha, output, &[&query, &key])
            };
            let (kernel, exact) = {
                let _generator = DEVICE_GENERATOR.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                (run(false), run(true))
            };
            let diff = max_scaled_diff(&kernel, &exact);
            assert!(diff < 1e-6, "torch dropout (weights {need_weights}) on {device:?}: kernel vs exact {diff:e}");
        }
    }
}

fn bool_tensor<const D: usize>(shape: [usize; D], f: impl Fn(usize) -> bool, device: &Device) -> Tensor<D, Bool> {
    let values: Vec<bool> = (0..shape.iter().product()).map(f).collect();
    Tensor::from_data(TensorData::new(values, shape), device)
}

/// Keras masks through the kernel: causal, padding from lengths (one sequence empty: fully masked
/// rows), a general mask with fully masked rows under the causal rule; both of Keras' conventions
/// for such rows (uniform for the default call, zero for a layer with dropout); wide heads.
#[test]
fn keras_kernel_matches_the_exact_path_under_every_mask() {
    let (batch, query_len, source_len) = (2, 37, 150);
    for (heads, key_dim, value_dim, dropout) in [(3, 4, 4, 0.0), (2, 32, 24, 0.0), (2, 5, 7, 0.1)] {
        let config = KerasMhaConfig::new(heads, key_dim, 6).with_value_dim(Some(value_dim)).with_dropout(dropout);
        let weights = keras_weights(&config, 31);
        for device in cpu_backends() {
            let device = device.autodiff();
            let layer = config.init_with_weights(&weights, &device).unwrap();
            let lengths = [57, 0];
            let padding = bool_tensor(
                [batch, query_len, source_len],
                |i| i % source_len < lengths[i / (query_len * source_len)],
                &device,
            );
            let general = bool_tensor(
                [batch, query_len, source_len],
                |i| (i / source_len) % 7 != 2 && (i * 5 + i / 3) % 4 != 0,
                &device,
            );
            for (name, mask, causal) in
                [("causal", None, true), ("padding", Some(padding), false), ("general+causal", Some(general), true)]
            {
                let run = |exact: bool| {
                    let query = input([batch, query_len, 6], 32, &device);
                    let value = input([batch, source_len, 6], 33, &device);
                    let mut call = KerasMhaInput::new(query.clone(), value.clone()).use_causal_mask(causal);
                    if let Some(mask) = mask.clone() {
                        call = call.attention_mask(mask);
                    }
                    let output = keras_call(&layer, call, exact);
                    output_and_gradients(&layer, output.output, &[&query, &value])
                };
                let diff = max_scaled_diff(&run(false), &run(true));
                eprintln!("keras {name} h={heads} k={key_dim} dropout={dropout} on {device:?}: {diff:e}");
                assert!(diff < 2e-6, "keras {name} h={heads} k={key_dim} dropout={dropout}: kernel vs exact {diff:e}");
            }
        }
    }
}

/// torch masks through the kernel: key padding (one sequence fully ignored), boolean `attn_mask`
/// shared (`[T, S]`) and per head (`[B*h, T, S]`), and both at once.
#[test]
fn torch_kernel_matches_the_exact_path_under_every_mask() {
    let keras = KerasMhaConfig::new(4, 8, 32);
    let converted = keras_to_torch(&keras, &keras_weights(&keras, 41)).unwrap();
    let (batch, heads, query_len, source_len) = (2, 4, 21, 40);
    for device in cpu_backends() {
        let device = device.autodiff();
        let mha = converted.config.init_with_state_dict(&converted.weights, &device).unwrap();
        let padding = bool_tensor([batch, source_len], |i| i >= source_len || i % source_len > 30, &device);
        let shared = bool_tensor([query_len, source_len], |i| i % source_len > i / source_len + 3, &device);
        let per_head = bool_tensor([batch * heads, query_len, source_len], |i| (i * 7 + i / 5) % 3 == 0, &device);
        // Float masks: -inf entries (whole rows of some heads) block, the others add to the logits.
        let float = |slices: usize| {
            let values: Vec<f32> = (0..slices * query_len * source_len)
                .map(|i| match ((i * 5 + i / 7) % 4, i / source_len % 9) {
                    (_, 4) if slices > 1 => f32::NEG_INFINITY,
                    (0, _) => f32::NEG_INFINITY,
                    (r, _) => r as f32 * 0.7 - 1.0,
                })
                .collect();
            AttnMask::Additive(Tensor::from_data(TensorData::new(values, [slices, query_len, source_len]), &device))
        };
        let cases = [
            ("key_padding_mask", Some(padding.clone()), None),
            ("attn_mask [T, S]", None, Some(AttnMask::bool_2d(shared))),
            ("both, per head", Some(padding.clone()), Some(AttnMask::Bool(per_head))),
            ("float attn_mask [1, T, S]", None, Some(float(1))),
            ("float attn_mask per head and key padding", Some(padding), Some(float(batch * heads))),
        ];
        for (name, padding, attn) in cases {
            let run = |exact: bool| {
                let query = input([batch, query_len, 32], 42, &device);
                let key = input([batch, source_len, 32], 43, &device);
                let mut call = TorchMhaInput::new(query.clone(), key.clone(), key.clone()).need_weights(false);
                if let Some(padding) = padding.clone() {
                    call = call.key_padding_mask(padding);
                }
                if let Some(attn) = attn.clone() {
                    call = call.attn_mask(attn);
                }
                let output = torch_call(&mha, call, exact);
                output_and_gradients(&mha, output.output, &[&query, &key])
            };
            let diff = max_scaled_diff(&run(false), &run(true));
            eprintln!("torch {name} on {device:?}: {diff:e}");
            // Measured up to 2.4e-6 (a float mask per head with key padding, rows with few
            // allowed keys): float32 rounding of either path; a wrong mask, bias or convention
            // shows as 1e-2 or more.
            assert!(diff < 4e-6, "torch {name}: kernel vs exact {diff:e}");
        }
    }
}
