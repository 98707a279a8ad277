//! Keras model files written by the real keras 3.15.1 (`datasets/model-files/make_model_files.py`):
//! reading them finds every attention layer with its arguments and weights, and our layer on
//! those weights reproduces the real layer's output on the probe the script saved.

#![allow(clippy::type_complexity)] // the case tables are tuples, read where they are written
mod common;

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use model::keras_file::{KerasFileLayer, read_keras_file};
use model::{KerasMhaInput, TensorFile};

fn model_files() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../datasets/model-files")
}

/// The largest difference between our layer's output and Keras' on the saved probe.
fn probe_error(layer: &KerasFileLayer, probe: &TensorFile, device: &Device) -> f32 {
    let tensor = |suffix: &str| {
        probe.tensors.get(&format!("{}.{suffix}", layer.name)).unwrap().to_tensor::<3>(suffix, device).unwrap()
    };
    let mha = layer.config.init_with_weights(&layer.weights, device).unwrap();
    let input = KerasMhaInput::new(tensor("query"), tensor("value")).key(tensor("key"));
    let output = mha.forward(input).unwrap().output; // [B, T, O]
    let want = probe.tensors.get(&format!("{}.output", layer.name)).unwrap();
    assert_eq!(output.dims().to_vec(), want.shape, "{}: output shape", layer.name);
    let got = output.into_data().try_to_vec::<f32>().unwrap();
    got.iter().zip(&want.data).map(|(g, w)| (g - w).abs()).fold(0.0, f32::max)
}

fn read(name: &str) -> Vec<KerasFileLayer> {
    read_keras_file(&model_files().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn archives_and_weights_files_reproduce_the_real_layers() {
    let device = Device::flex();
    let cases: [(&str, &str, &[(&str, &str)]); 5] = [
        (
            "functional.keras",
            "functional",
            &[("attn_values", "layers/multi_head_attention"), ("attn_nobias", "layers/multi_head_attention_1")],
        ),
        (
            "functional.weights.h5",
            "functional",
            &[("attn_values", "layers/multi_head_attention"), ("attn_nobias", "layers/multi_head_attention_1")],
        ),
        ("nested.keras", "nested", &[("multi_head_attention", "layers/functional/layers/multi_head_attention")]),
        // An attribute of a custom layer: not in the config's layer lists, found by the layout.
        ("sequential_custom.keras", "sequential_custom", &[("inner_attention", "layers/transformer_block/attention")]),
        // use_gate (its `_gate_dense` sublayer) and sliding_window from the archive's config.
        ("gated.keras", "gated", &[("gated", "layers/multi_head_attention")]),
    ];
    for (file, stem, want) in cases {
        let layers = read(file);
        let found: Vec<(&str, &str)> = layers.iter().map(|l| (l.name.as_str(), l.path.as_str())).collect();
        assert_eq!(found, want, "{file}: layers found");
        let probe = TensorFile::read(&model_files().join(format!("{stem}.probe.safetensors"))).unwrap();
        for layer in &layers {
            let error = probe_error(layer, &probe, &device);
            assert!(error <= 1e-5, "{file} {}: max |ours - keras| = {error:e}", layer.name);
        }
    }
}

#[test]
fn constructor_arguments_come_from_the_archive() {
    let layers = read("functional.keras");
    let values = &layers[0].config;
    assert_eq!(
        (values.num_heads, values.key_dim, values.value_dim, values.output_shape, values.use_bias),
        (2, 4, Some(3), Some(6), true)
    );
    let gated = &read("gated.keras")[0].config;
    assert_eq!((gated.use_gate, gated.sliding_window), (true, Some(3)));
    let nobias = &layers[1].config;
    assert_eq!(
        (nobias.num_heads, nobias.key_dim, nobias.use_bias, nobias.key_input_dim, nobias.value_input_dim),
        (3, 2, false, Some(5), Some(5))
    );
    // The bare weights file gives the same layers, sizes read off the kernels.
    for (archive, weights) in layers.iter().zip(read("functional.weights.h5")) {
        assert_eq!(archive.config.dims().unwrap(), weights.config.dims().unwrap(), "{}", archive.name);
        assert_eq!(archive.weights, weights.weights, "{}", archive.name);
    }
}

/// `attention_axes=(1, 2)` on an image-like `[B, 3, 4, 6]` input: read from the archive Keras
/// wrote, run by `forward_nd` on the probe, written back with its axes, refused by torch.
#[test]
fn a_layer_attending_over_two_axes_reads_runs_and_writes() {
    let device = Device::flex();
    let [layer] = read("axes.keras").try_into().expect("one attention layer");
    assert_eq!(layer.config.attention_axes, Some(vec![1, 2]));
    let mha = layer.config.init_with_weights(&layer.weights, &device).unwrap();
    let probe = TensorFile::read(&model_files().join("axes.probe.safetensors")).unwrap();
    let query = probe.tensors.get("axes.query").unwrap().to_tensor::<4>("query", &device).unwrap(); // [2, 3, 4, 6]
    let output = mha.forward_nd(model::KerasMhaNdInput::new(query.clone(), query.clone())).unwrap().output; // [2, 3, 4, 6]
    let want = probe.tensors.get("axes.output").unwrap();
    let got = output.into_data().try_to_vec::<f32>().unwrap();
    let error = got.iter().zip(&want.data).map(|(g, w)| (g - w).abs()).fold(0.0, f32::max);
    assert!(error <= 1e-5, "max |ours - keras| = {error:e}");
    // A 3-D call on a layer that attends over two axes is an error that says what to call.
    let flat = query.reshape([2, 12, 6]);
    let wrong = mha.forward(KerasMhaInput::new(flat.clone(), flat)).unwrap_err().to_string();
    assert!(wrong.contains("attention_axes") && wrong.contains("forward_nd"), "{wrong}");

    let written = std::env::temp_dir().join(format!("axes-roundtrip-{}.keras", std::process::id()));
    model::keras_file::write_keras_archive(&written, "axes", &layer.config, &layer.weights).unwrap();
    let [back] = read_keras_file(&written).unwrap().try_into().expect("one attention layer");
    std::fs::remove_file(&written).ok();
    assert_eq!((back.config.attention_axes, back.weights), (Some(vec![1, 2]), layer.weights.clone()));
    let refused = model::convert::keras_to_torch(&layer.config, &layer.weights).unwrap_err().to_string();
    assert!(refused.contains("attention_axes"), "{refused}");
}

/// Every read of a damaged file returns an error naming the file, never a panic: truncations
/// at every 1/64 of the file, and corruptions of 1 to 4 bytes throughout it (200 per file, or
/// `KERAS_FILE_MUTATIONS` for a longer fuzzing run).
#[test]
fn damaged_files_are_errors_not_panics() {
    for name in ["functional.keras", "functional.weights.h5", "nested.keras", "torch_packed.pt", "torch_kdim.pt"] {
        let bytes = std::fs::read(model_files().join(name)).unwrap();
        let dir = std::env::temp_dir().join(format!("keras-file-damage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(name);
        let mut tried = 0;
        let mut check = |damaged: &[u8]| {
            std::fs::write(&path, damaged).unwrap();
            tried += 1;
            let read = match name.ends_with(".pt") {
                true => model::torch_file::read_torch_file(&path, 2).map(|_| ()),
                false => read_keras_file(&path).map(|_| ()),
            };
            if let Err(error) = read {
                assert!(
                    error.to_string().contains(&path.display().to_string()),
                    "{name}: error without the file: {error}"
                );
            }
        };
        for cut in (0..64).map(|i| bytes.len() * i / 64) {
            check(&bytes[..cut]);
        }
        let mutations: usize = std::env::var("KERAS_FILE_MUTATIONS").ok().and_then(|n| n.parse().ok()).unwrap_or(200);
        let mut lcg = kernels::testing::Lcg::from_state(0x9e3779b97f4a7c15);
        let mut next = || lcg.next_u64() >> 33;
        for _ in 0..mutations {
            let mut damaged = bytes.clone();
            for _ in 0..1 + next() % 4 {
                let at = next() as usize % damaged.len();
                damaged[at] = next() as u8;
            }
            check(&damaged);
        }
        std::fs::remove_dir_all(&dir).ok();
        assert_eq!(tried, 64 + mutations);
    }
}

#[test]
fn a_file_of_another_kind_is_named_in_the_error() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let error = read_keras_file(&path).unwrap_err().to_string();
    assert!(error.contains("Cargo.toml") && error.contains("neither a .keras archive"), "{error}");
}

/// `functional.keras` with `attn_values`' config edited by `edit`, written to a scratch archive.
fn edited_archive(tag: &str, edit: impl Fn(&mut serde_json::Value)) -> PathBuf {
    use std::io::{Read, Write};
    let source = std::fs::File::open(model_files().join("functional.keras")).unwrap();
    let mut archive = zip::ZipArchive::new(source).unwrap();
    let path = std::env::temp_dir().join(format!("keras-file-{tag}-{}.keras", std::process::id()));
    let mut writer = zip::ZipWriter::new(std::fs::File::create(&path).unwrap());
    for i in 0..archive.len() {
        let mut member = archive.by_index(i).unwrap();
        let mut bytes = Vec::new();
        member.read_to_end(&mut bytes).unwrap();
        if member.name() == "config.json" {
            let mut config: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            let layers = config.pointer_mut("/config/layers").unwrap().as_array_mut().unwrap();
            let layer = layers
                .iter_mut()
                .find(|l| l.pointer("/config/name").and_then(|n| n.as_str()) == Some("attn_values"))
                .unwrap();
            edit(layer.get_mut("config").unwrap());
            bytes = serde_json::to_vec(&config).unwrap();
        }
        writer
            .start_file(
                member.name(),
                zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored),
            )
            .unwrap();
        writer.write_all(&bytes).unwrap();
    }
    writer.finish().unwrap();
    path
}

#[test]
fn configs_that_cannot_be_honoured_are_errors_naming_the_layer_and_argument() {
    let cases: [(&str, fn(&mut serde_json::Value), &str); 4] = [
        ("heads", |c| c["num_heads"] = 4.into(), "layer attn_values: its weights do not match its config"),
        ("gate", |c| c["use_gate"] = true.into(), "use_gate"),
        ("axes", |c| c["attention_axes"] = serde_json::json!([]), "attention_axes"),
        ("unknown", |c| c["temperature"] = 2.0.into(), "layer attn_values: temperature"),
    ];
    for (tag, edit, expected) in cases {
        let path = edited_archive(tag, edit);
        let error = read_keras_file(&path).unwrap_err().to_string();
        std::fs::remove_file(&path).ok();
        assert!(error.contains(expected) && error.contains(&path.display().to_string()), "{tag}: {error}");
    }
}

/// PyTorch checkpoints written by torch 2.15: every `nn.MultiheadAttention` found by prefix,
/// packed and separate projections, a checkpoint dict; our layer on the read weights
/// reproduces torch's output on the saved probe.
#[test]
fn torch_checkpoints_reproduce_the_real_layers() {
    use model::torch_file::read_torch_file;
    use model::torch_mha::TorchMhaInput;
    let device = Device::flex();
    let probe = TensorFile::read(&model_files().join("torch.probe.safetensors")).unwrap();
    for (file, prefix, probe_name, kdim, bias) in [
        ("torch_packed.pt", "attn.", "attn", None, true),
        ("torch_checkpoint.pt", "model_state_dict.attn.", "attn", None, true),
        ("torch_kdim.pt", "", "bare", Some(5), false),
        // torch.save(module): a pickle naming the module's class, read without running it.
        ("torch_full_module.pt", "attn.", "attn", None, true),
    ] {
        let layers = read_torch_file(&model_files().join(file), 2).unwrap_or_else(|e| panic!("{file}: {e}"));
        let [layer] = layers.as_slice() else { panic!("{file}: {} layers", layers.len()) };
        let model::torch_file::TorchFileModel::Attention(config) = &layer.model else {
            panic!("{file}: read as a projected model")
        };
        assert_eq!((layer.prefix.as_str(), config.kdim, config.bias), (prefix, kdim, bias), "{file}");
        let tensor = |suffix: &str| {
            probe.tensors.get(&format!("{probe_name}.{suffix}")).unwrap().to_tensor::<3>(suffix, &device).unwrap()
        };
        let mha = config.init_with_state_dict(&layer.weights, &device).unwrap();
        let output = mha
            .forward(TorchMhaInput::new(tensor("query"), tensor("key"), tensor("value")).need_weights(false))
            .unwrap()
            .output;
        let want = probe.tensors.get(&format!("{probe_name}.output")).unwrap();
        let got = output.into_data().try_to_vec::<f32>().unwrap();
        let error = got.iter().zip(&want.data).map(|(g, w)| (g - w).abs()).fold(0.0, f32::max);
        assert!(error <= 1e-5, "{file}: max |ours - torch| = {error:e}");
    }
    // The projected model (the seed's port) inside a larger module, read as that whole model.
    let layers = read_torch_file(&model_files().join("torch_projected.pt"), 6).unwrap();
    let [layer] = layers.as_slice() else { panic!("torch_projected.pt: {} layers", layers.len()) };
    let model::torch_file::TorchFileModel::Projected(config) = &layer.model else {
        panic!("torch_projected.pt: not read as the projected model")
    };
    assert_eq!(
        (layer.prefix.as_str(), config.in_features, config.embed_dim, config.output_dim),
        ("port.", 4, 24, Some(4))
    );
    let model = config.init_with_state_dict(&layer.weights, &device).unwrap();
    let x = probe.tensors.get("port.x").unwrap().to_tensor::<3>("x", &device).unwrap();
    let got = model
        .forward(model::projected::ProjectedInput::new(x))
        .unwrap()
        .output
        .into_data()
        .try_to_vec::<f32>()
        .unwrap();
    let error =
        got.iter().zip(&probe.tensors.get("port.output").unwrap().data).map(|(g, w)| (g - w).abs()).fold(0.0, f32::max);
    assert!(error <= 1e-5, "torch_projected.pt: max |ours - torch| = {error:e}");
    let error = read_torch_file(&model_files().join("torch_packed.pt"), 3).unwrap_err().to_string();
    assert!(error.contains("torch_packed.pt") && error.contains("num_heads = 3"), "{error}");
}

/// A Keras file in which one layer cannot be read (`output_shape=(2, 3)`, refused) beside one that
/// can: scanning lists both, the refused one with the reason, and the other reproduces Keras.
#[test]
fn one_unreadable_keras_layer_leaves_the_others_readable() {
    use model::keras_file::scan_keras_file;
    let path = model_files().join("mixed.keras");
    let entries = scan_keras_file(&path).unwrap();
    let found: Vec<(&str, &str)> = entries.iter().map(|e| (e.name.as_str(), e.path.as_str())).collect();
    assert_eq!(found, [("attn_ok", "layers/multi_head_attention"), ("attn_2d_out", "layers/multi_head_attention_1")]);
    let layer = entries[0].layer.as_ref().unwrap();
    let probe = TensorFile::read(&model_files().join("mixed.probe.safetensors")).unwrap();
    let error = probe_error(layer, &probe, &Device::flex());
    assert!(error <= 1e-5, "attn_ok: max |ours - keras| = {error:e}");
    let refused = entries[1].layer.as_ref().unwrap_err().to_string();
    assert!(refused.contains("mixed.keras") && refused.contains("attn_2d_out"), "{refused}");
    // Read as a whole, the file is still an error naming the layer.
    let whole = read_keras_file(&path).unwrap_err().to_string();
    assert!(whole.contains("attn_2d_out"), "{whole}");
}

/// A PyTorch file whose layers have different head counts, and one with `add_bias_kv`: each is
/// read with its own head count, and one that does not fit does not stop the others.
#[test]
fn each_torch_layer_takes_its_own_head_count() {
    use model::torch_file::{TorchFileModel, scan_torch_file};
    let path = model_files().join("torch_mixed.pt");
    let entries = scan_torch_file(&path).unwrap();
    let prefixes: Vec<&str> = entries.iter().map(|e| e.prefix.as_str()).collect();
    assert_eq!(prefixes, ["biased.", "narrow.", "wide."]);
    for (entry, heads, width) in [(&entries[2], 3, 12), (&entries[1], 2, 10), (&entries[0], 2, 8)] {
        assert_eq!(entry.embed_dim().unwrap(), width, "{}", entry.prefix);
        let layer = entry.layer(heads).unwrap_or_else(|e| panic!("{}: {e}", entry.prefix));
        let TorchFileModel::Attention(config) = &layer.model else { panic!("{}: read as projected", entry.prefix) };
        assert_eq!((config.embed_dim, config.num_heads), (width, heads), "{}", entry.prefix);
    }
    let wrong = entries[1].layer(3).unwrap_err().to_string();
    assert!(
        wrong.contains("torch_mixed.pt") && wrong.contains("narrow.") && wrong.contains("num_heads = 3"),
        "{wrong}"
    );
    // add_bias_kv has no Keras counterpart: a reason, for that layer only.
    let biased = entries[0].layer(2).unwrap().to_keras().unwrap_err().to_string();
    assert!(biased.contains("add_bias_kv"), "{biased}");
}
