//! One training run: data, loop, evaluation, checkpoints, metrics and summary.
//!
//! `runs/<name>/` holds `config.toml` (resolved), `steps.csv` (loss per step), `epochs.csv`
//! (train/valid loss per epoch), `checkpoints/step-NNNNNN/` (weights, optimizer state, position),
//! `model.bpk` (burnpack) and `weights.safetensors` (the model's library vocabulary), and
//! `summary.json`. Every file is written to a temporary name and renamed into place.
//!
//! Resuming loads the newest complete checkpoint and replays the same batch order from there;
//! without dropout, the resumed run ends with the same weights as an uninterrupted one.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use burn::module::Module;
use burn::optim::{GradientsParams, ModuleOptimizer};
use burn::tensor::Device;
use model::weights::{write_atomic, write_atomic_with};
use model::{TensorFile, WeightMap};
use serde::{Deserialize, Serialize};

use crate::config::RunConfig;
use crate::loss::mse;
use crate::models::{ModelSpec, TaskModel};
use crate::progress::Progress;
use crate::rng::Rng;
use crate::task::{Split, per_position_floor};

/// One row of `steps.csv`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepRow {
    pub step: usize,
    pub epoch: usize,
    pub loss: f64,
    pub seconds: f64,
}

/// One row of `epochs.csv`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct EpochRow {
    pub epoch: usize,
    pub step: usize,
    pub train_loss: f64,
    pub valid_loss: f64,
    pub seconds: f64,
}

/// Where a run stands; saved with every checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Position {
    /// Optimizer steps taken.
    step: usize,
    /// Training seconds so far (excluding time lost to an interruption).
    seconds: f64,
    steps: Vec<StepRow>,
    epochs: Vec<EpochRow>,
}

/// The final report of a run (`summary.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Summary {
    pub name: String,
    pub model: String,
    pub backend: String,
    pub parameters: usize,
    pub steps: usize,
    pub epochs: usize,
    pub batch_size: usize,
    #[serde(with = "nan_as_null")]
    pub train_loss: f64,
    #[serde(with = "nan_as_null")]
    pub valid_loss: f64,
    #[serde(with = "nan_as_null")]
    pub test_loss: f64,
    /// `1 - loss / Var(target)` on the test split.
    #[serde(with = "nan_as_null")]
    pub test_r2: f64,
    /// The step whose loss was not finite, when the run stopped there ([`RunOptions::stop_on_divergence`]).
    #[serde(default)]
    pub diverged_at_step: Option<usize>,
    pub samples_per_second: f64,
    pub wall_seconds: f64,
    /// Best loss a per-position model can reach (Monte Carlo).
    pub per_position_floor: f64,
    /// `noise_std^2`.
    pub bayes_floor: f64,
    pub resumed: bool,
    /// Whether the kernels' choices that change rounding followed fixed rules
    /// ([`crate::config::TrainSection::reproducible`]).
    #[serde(default)]
    pub reproducible: bool,
}

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Folder that holds `runs/<name>/`.
    pub runs_dir: PathBuf,
    /// Folder of the task's cached data.
    pub data_dir: PathBuf,
    /// Continue from the newest checkpoint instead of starting over.
    pub resume: bool,
    /// Stop after this many steps in this invocation (to test interruption); `None` = run to the end.
    pub stop_after: Option<usize>,
    /// Print progress lines.
    pub progress: bool,
    /// A loss that is not finite ends the run with a summary that says so (a learning-rate
    /// sweep's divergence point) instead of an error.
    pub stop_on_divergence: bool,
}

/// A loss of a diverged run is NaN, which JSON writes as `null`; read it back as NaN.
mod nan_as_null {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
        match value.is_finite() {
            true => serializer.serialize_f64(*value),
            false => serializer.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
        Ok(Option::<f64>::deserialize(deserializer)?.unwrap_or(f64::NAN))
    }
}

/// Trains `config` and returns its summary (`None` when stopped early by `stop_after`).
pub fn train(config: &RunConfig, options: &RunOptions) -> Result<Option<Summary>> {
    let dir = options.runs_dir.join(&config.name);
    let started = Instant::now();
    kernels::tuning::set_reproducible(config.train.reproducible);
    let device = config.backend().device(config.wgpu_kind())?;
    let ad = device.clone().autodiff();
    let spec = config.model_spec();
    let data = config.task.load_or_generate(&options.data_dir).context("task data")?;

    let checkpoint = if options.resume { latest_checkpoint(&dir)? } else { None };
    let resumed = checkpoint.is_some();
    if !resumed && dir.join("checkpoints").exists() {
        std::fs::remove_dir_all(dir.join("checkpoints")).with_context(|| format!("cannot clear {}", dir.display()))?;
    }
    write_atomic(&dir.join("config.toml"), config.to_toml().as_bytes())?;

    let (mut model, mut optim, mut position) = match &checkpoint {
        Some(path) => load_checkpoint(path, &spec, config, &ad)?,
        None => (initial_model(config, &spec, &ad)?, config.optimizer.init(), Position::default()),
    };
    let batch = config.train.batch_size;
    let steps_per_epoch = config.task.train_size / batch;
    let total_steps = steps_per_epoch * config.train.epochs;
    let progress =
        Progress::new(&config.name, options.progress, total_steps, config.train.epochs, config.train.log_every);
    let what = if resumed { format!("resuming at step {}", position.step) } else { "starting".to_string() };
    progress.line(&format!("{} model ({} parameters) on {}, {what}", spec.kind(), model.num_params(), config.backend));
    let mut steps_this_run = 0;
    let mut diverged_at_step = None;
    let mut window_start = Instant::now();
    while position.step < total_steps {
        let epoch = position.step / steps_per_epoch;
        let order = Rng::from_parts(&[config.train.seed, 7, epoch as u64]).permutation(config.task.train_size);
        let in_epoch = position.step % steps_per_epoch;
        let (x, y) = data.train.gather(&order[in_epoch * batch..(in_epoch + 1) * batch]);
        let loss = mse(model.forward(x.to_tensor("x", &ad)?, None, true)?, y.to_tensor("y", &ad)?);
        let loss_value = loss.clone().into_scalar::<f32>() as f64;
        if !loss_value.is_finite() {
            if options.stop_on_divergence {
                diverged_at_step = Some(position.step + 1);
                break;
            }
            bail!(
                "{}: the loss became {loss_value} at step {} (lower train.learning_rate)",
                config.name,
                position.step
            );
        }
        let grads = GradientsParams::from_grads(loss.backward(), &model);
        model = optim.step(config.train.learning_rate, model, grads);
        position.step += 1;
        steps_this_run += 1;
        position.seconds += window_start.elapsed().as_secs_f64();
        window_start = Instant::now();
        position.steps.push(StepRow {
            step: position.step,
            epoch: epoch + 1,
            loss: loss_value,
            seconds: position.seconds,
        });

        let epoch_done = position.step % steps_per_epoch == 0;
        if epoch_done {
            let eval_started = Instant::now();
            let rows = &position.steps[position.steps.len() - steps_per_epoch..];
            let train_loss = rows.iter().map(|r| r.loss).sum::<f64>() / rows.len() as f64;
            let valid_loss = evaluate(&model.valid(), &data.valid, batch, config.train.valid_batches, &device)?;
            position.seconds += eval_started.elapsed().as_secs_f64();
            position.epochs.push(EpochRow {
                epoch: epoch + 1,
                step: position.step,
                train_loss,
                valid_loss,
                seconds: position.seconds,
            });
            progress.line(&format!(
                "epoch {}/{} train_loss {train_loss:.5} valid_loss {valid_loss:.5}",
                epoch + 1,
                config.train.epochs
            ));
            window_start = Instant::now();
        }
        let recent = &position.steps[position.steps.len().saturating_sub(config.train.log_every)..];
        let recent_loss = recent.iter().map(|r| r.loss).sum::<f64>() / recent.len() as f64;
        progress.step(
            position.step,
            epoch + 1,
            recent_loss,
            (position.step * batch) as f64 / position.seconds.max(1e-9),
            batch,
        );
        if epoch_done || position.step % config.train.checkpoint_every == 0 {
            save_checkpoint(&dir, &model, &optim, &position)?;
        }
        if options.stop_after.is_some_and(|n| steps_this_run >= n) && position.step < total_steps {
            save_checkpoint(&dir, &model, &optim, &position)?;
            progress.finish();
            return Ok(None);
        }
    }

    progress.finish();
    let inference = model.valid();
    let test_loss = match diverged_at_step {
        Some(_) => f64::NAN,
        None => evaluate(&inference, &data.test, batch, 0, &device)?,
    };
    // A run that diverged (or finished no epoch) has no last epoch to report.
    let no_epoch = EpochRow { epoch: 0, step: 0, train_loss: f64::NAN, valid_loss: f64::NAN, seconds: 0.0 };
    let last = match diverged_at_step {
        Some(_) => no_epoch,
        None => position.epochs.last().copied().unwrap_or(no_epoch),
    };
    let summary = Summary {
        name: config.name.clone(),
        model: spec.kind().to_string(),
        backend: config.backend.clone(),
        parameters: inference.num_params(),
        steps: position.step,
        epochs: config.train.epochs,
        batch_size: batch,
        train_loss: last.train_loss,
        valid_loss: last.valid_loss,
        test_loss,
        test_r2: 1.0 - test_loss / target_variance(&data.test),
        samples_per_second: (position.step * batch) as f64 / position.seconds.max(1e-9),
        wall_seconds: position.seconds,
        per_position_floor: per_position_floor(&config.task, 256, 256),
        bayes_floor: config.task.noise_std.powi(2),
        resumed,
        reproducible: config.train.reproducible,
        diverged_at_step,
    };
    write_metrics(&dir, &position)?;
    let weights = TensorFile {
        tensors: inference.library_weights(),
        metadata: [("model".into(), spec.kind().to_string())].into(),
    };
    weights.write(&dir.join("weights.safetensors"))?;
    save_burnpack(inference, &dir.join("model.bpk"))?;
    write_atomic(&dir.join("summary.json"), serde_json::to_string_pretty(&summary)?.as_bytes())?;
    if options.progress {
        print_summary(&summary, started.elapsed().as_secs_f64());
    }
    Ok(Some(summary))
}

/// A fresh model from the run's seed, or the weights of `model.init_from`.
fn initial_model(config: &RunConfig, spec: &ModelSpec, device: &Device) -> Result<TaskModel> {
    let model = match &config.model.init_from {
        Some(path) => {
            let weights = init_weights(path, spec).with_context(|| format!("model.init_from = {}", path.display()))?;
            spec.init_with_weights(&weights, device).with_context(|| format!("model.init_from = {}", path.display()))?
        }
        None => {
            device.seed(config.train.seed);
            spec.init(device)?
        }
    };
    Ok(model.with_stable_param_ids())
}

/// Mean loss over `split` (the first `max_batches` batches, or all when 0), without autodiff.
pub fn evaluate(model: &TaskModel, split: &Split, batch: usize, max_batches: usize, device: &Device) -> Result<f64> {
    let batches = split.len.div_ceil(batch);
    let batches = if max_batches == 0 { batches } else { batches.min(max_batches) };
    let (mut total, mut count) = (0.0, 0usize);
    for b in 0..batches {
        let indices: Vec<usize> = (b * batch..((b + 1) * batch).min(split.len)).collect();
        let (x, y) = split.gather(&indices);
        let loss = mse(model.forward(x.to_tensor("x", device)?, None, false)?, y.to_tensor("y", device)?);
        total += loss.into_scalar::<f32>() as f64 * indices.len() as f64;
        count += indices.len();
    }
    Ok(total / count as f64)
}

/// The per-element variance of a split's targets (the loss of predicting their mean).
pub fn target_variance(split: &Split) -> f64 {
    let n = split.y.len() as f64;
    let mean = split.y.iter().map(|&v| v as f64).sum::<f64>() / n;
    split.y.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n
}

fn checkpoint_dir(dir: &Path, step: usize) -> PathBuf {
    dir.join("checkpoints").join(format!("step-{step:06}"))
}

/// Writes a checkpoint into a temporary folder, renames it into place, keeps the newest two.
fn save_checkpoint(dir: &Path, model: &TaskModel, optim: &ModuleOptimizer, position: &Position) -> Result<()> {
    let target = checkpoint_dir(dir, position.step);
    if target.exists() {
        return Ok(());
    }
    write_atomic_with(&target, |tmp| -> Result<()> {
        std::fs::create_dir_all(tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
        TensorFile { tensors: model.library_weights(), metadata: Default::default() }
            .write(&tmp.join("model.safetensors"))?;
        optim
            .save(tmp.join("optimizer.bpk"))
            .map_err(|e| anyhow::anyhow!("cannot write the optimizer state to {}: {e:?}", tmp.display()))?;
        write_atomic(&tmp.join("position.json"), serde_json::to_string(position)?.as_bytes())?;
        Ok(())
    })?;
    write_metrics(dir, position)?;
    let mut all = complete_checkpoints(dir)?;
    all.sort();
    for old in all.iter().rev().skip(2) {
        std::fs::remove_dir_all(old).ok();
    }
    Ok(())
}

fn complete_checkpoints(dir: &Path) -> Result<Vec<PathBuf>> {
    let root = dir.join("checkpoints");
    if !root.exists() {
        return Ok(Vec::new());
    }
    let mut found = Vec::new();
    for entry in std::fs::read_dir(&root).with_context(|| format!("cannot read {}", root.display()))? {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy().into_owned();
        if name.starts_with("step-") && path.join("position.json").exists() {
            found.push(path);
        }
    }
    Ok(found)
}

fn latest_checkpoint(dir: &Path) -> Result<Option<PathBuf>> {
    Ok(complete_checkpoints(dir)?.into_iter().max())
}

fn load_checkpoint(
    path: &Path,
    spec: &ModelSpec,
    config: &RunConfig,
    device: &Device,
) -> Result<(TaskModel, ModuleOptimizer, Position)> {
    let weights = TensorFile::read(&path.join("model.safetensors"))?.tensors;
    let model = spec
        .init_with_weights(&weights, device)
        .with_context(|| format!("checkpoint {}", path.display()))?
        .with_stable_param_ids();
    let optim = config
        .optimizer
        .init()
        .load(path.join("optimizer.bpk"))
        .map_err(|e| anyhow::anyhow!("{}/optimizer.bpk: {e:?}", path.display()))?;
    let position: Position = serde_json::from_slice(&std::fs::read(path.join("position.json"))?)
        .with_context(|| format!("{}/position.json", path.display()))?;
    Ok((model, optim, position))
}

fn write_metrics(dir: &Path, position: &Position) -> Result<()> {
    let mut steps = String::from("step,epoch,loss,seconds\n");
    for r in &position.steps {
        steps.push_str(&format!("{},{},{},{:.4}\n", r.step, r.epoch, r.loss, r.seconds));
    }
    write_atomic(&dir.join("steps.csv"), steps.as_bytes())?;
    let mut epochs = String::from("epoch,step,train_loss,valid_loss,seconds\n");
    for r in &position.epochs {
        epochs.push_str(&format!("{},{},{},{},{:.4}\n", r.epoch, r.step, r.train_loss, r.valid_loss, r.seconds));
    }
    write_atomic(&dir.join("epochs.csv"), epochs.as_bytes())?;
    Ok(())
}

/// The weights `model.init_from` names, in the vocabulary of the run's model: a safetensors file
/// (an export, whose probe `inputs.*` / `outputs.*` is left out), or the one attention layer of a
/// Keras `.keras` / `.weights.h5` or PyTorch `.pt` / `.pth` file, converted exactly.
fn init_weights(path: &Path, spec: &ModelSpec) -> Result<WeightMap> {
    let extension = path.extension().map(|e| e.to_string_lossy().to_lowercase()).unwrap_or_default();
    let (heads, wants_projected) = match spec {
        ModelSpec::Keras { layer, .. } => (layer.num_heads, false),
        ModelSpec::Projected(projected) => (projected.num_heads, true),
        ModelSpec::Baseline { .. } => return Ok(model::fixture::model_weights(&TensorFile::read(path)?.tensors)),
    };
    let (config, keras_weights) = match extension.as_str() {
        "keras" | "h5" => {
            let layers = model::keras_file::read_keras_file(path)?;
            let [layer] = <[_; 1]>::try_from(layers).map_err(|layers: Vec<model::keras_file::KerasFileLayer>| {
                let names: Vec<String> = layers.iter().map(|l| l.name.clone()).collect();
                anyhow::anyhow!("{} holds {} attention layers {names:?}; extract one with `cargo xtask convert --layer NAME --to keras`", path.display(), layers.len())
            })?;
            (layer.config, layer.weights)
        }
        "pt" | "pth" => {
            let layers = model::torch_file::read_torch_file(path, heads)?;
            let [layer] = <[_; 1]>::try_from(layers).map_err(|layers: Vec<model::torch_file::TorchFileLayer>| {
                anyhow::anyhow!(
                    "{} holds {} nn.MultiheadAttention layers; extract one with `cargo xtask convert --layer PREFIX`",
                    path.display(),
                    layers.len()
                )
            })?;
            if wants_projected && matches!(layer.model, model::torch_file::TorchFileModel::Projected(_)) {
                return Ok(layer.weights); // already the projected model's state dict
            }
            let converted = layer.to_keras()?;
            (converted.config, converted.weights)
        }
        _ => return Ok(model::fixture::model_weights(&TensorFile::read(path)?.tensors)),
    };
    Ok(match wants_projected {
        true => model::convert::keras_to_projected(&config, &keras_weights)?.weights,
        false => keras_weights,
    })
}

/// Saves a module as burnpack, atomically.
pub fn save_burnpack<M: Module>(module: M, path: &Path) -> Result<()> {
    Ok(model::weights::save_burnpack(module, path)?)
}

fn print_summary(s: &Summary, wall: f64) {
    println!("--- {} ---", s.name);
    println!("model {} ({} parameters) on {}", s.model, s.parameters, s.backend);
    println!(
        "steps {} ({} epochs of batch {}), {:.0} samples/s, {:.1}s training, {wall:.1}s wall",
        s.steps, s.epochs, s.batch_size, s.samples_per_second, s.wall_seconds
    );
    println!(
        "loss  train {:.5}  valid {:.5}  test {:.5}  (test R2 {:.3})",
        s.train_loss, s.valid_loss, s.test_loss, s.test_r2
    );
    println!("floors: per-position model {:.5}, Bayes {:.5}", s.per_position_floor, s.bayes_floor);
}

/// Reads a run's library weights back as a host map.
pub fn read_weights(run_dir: &Path) -> Result<model::WeightMap> {
    let path = run_dir.join("weights.safetensors");
    if !path.exists() {
        bail!("{}: no weights.safetensors (the run has not finished; resume it with --resume)", run_dir.display());
    }
    Ok(TensorFile::read(&path)?.tensors)
}
