//! Training-trajectory fixtures (`datasets/reference/train/README.md`): start from the fixture's
//! `init.*`, take its steps on its batches with the optimizer it names, and compare the loss at
//! every step, the first gradients, the weights after the first update and the final weights.
//!
//! The key bias has an exactly-zero gradient in exact arithmetic (softmax is shift-invariant per
//! row); in float32 its gradient is rounding noise that Adam normalises into lr-sized steps. Those
//! entries (`config.zero_gradient_weights`) are compared against the Adam step bound
//! (`tolerance_zero_gradient_*`) on their own line, as the fixture's `tolerance_rule` says.

use anyhow::{Context, Result, bail};
use burn::optim::GradientsParams;
use burn::tensor::Device;
use model::fixture::{Check, Fixture, compare};
use model::{HostTensor, KerasMhaConfig, ProjectedConfig, WeightMap};
use serde_json::Value;

use crate::loss::mse;
use crate::models::ModelSpec;
use crate::optim::OptimizerConfig;

/// What a trajectory fixture asks for.
#[derive(Debug, Clone)]
pub struct Trajectory {
    pub model: ModelSpec,
    pub optimizer: OptimizerConfig,
    pub learning_rate: f64,
    pub steps: usize,
}

/// The slices of one weight whose gradient is exactly zero: `rows = None` is the whole tensor.
#[derive(Debug, Clone)]
struct ZeroGradient {
    name: String,
    rows: Option<(usize, usize)>,
}

/// The recorded outputs of a run, in the library's names.
pub struct Recorded {
    pub losses: Vec<f32>,
    pub grads0: WeightMap,
    pub step1: WeightMap,
    pub last: WeightMap,
}

impl Trajectory {
    pub fn from_fixture(fixture: &Fixture) -> Result<Self> {
        let model = fixture.field("model")?;
        let init = fixture.tensors.with_prefix_stripped("init.");
        let flag = |name: &str| model.get(name).and_then(Value::as_bool).unwrap_or(false);
        let number = |name: &str| model.get(name).and_then(Value::as_f64).unwrap_or(0.0);
        let spec = match model.get("kind").and_then(Value::as_str) {
            Some("keras_mha") => ModelSpec::Keras {
                layer: KerasMhaConfig::from_weights(&init)?.with_dropout(number("dropout")),
                use_causal_mask: flag("use_causal_mask"),
            },
            Some("projected") => {
                let count = |name: &str| {
                    model
                        .get(name)
                        .and_then(Value::as_u64)
                        .map(|v| v as usize)
                        .with_context(|| format!("config.model.{name} is missing"))
                };
                let config = ProjectedConfig::new(count("in_features")?, count("embed_dim")?, count("num_heads")?)
                    .with_output_dim(fixture.head_width(&fixture.tensors, "init.final.weight")?)
                    .with_bias(model.get("bias").and_then(Value::as_bool).unwrap_or(true))
                    .with_dropout(number("dropout"));
                ModelSpec::Projected(config)
            }
            other => bail!("config.model.kind {other:?} is not a known model kind"),
        };
        let (optimizer, learning_rate) = optimizer_from_fixture(fixture.field("optimizer")?)?;
        Ok(Self { model: spec, optimizer, learning_rate, steps: fixture.usize("steps")? })
    }

    /// Runs the trajectory on `device` (autodiff is added here).
    pub fn run(&self, fixture: &Fixture, device: &Device) -> Result<Recorded> {
        let device = device.clone().autodiff();
        let init = fixture.tensors.with_prefix_stripped("init.");
        let mut model = self.model.init_with_weights(&init, &device)?;
        let mut optim = self.optimizer.init();
        let (x, y) = (fixture.tensor("data.x")?, fixture.tensor("data.y")?);
        let mask = fixture.tensor("data.attention_mask").ok();
        let mut recorded =
            Recorded { losses: Vec::new(), grads0: WeightMap::new(), step1: WeightMap::new(), last: WeightMap::new() };
        for step in 0..self.steps {
            let x = x.index_first(step).to_tensor::<3>("data.x", &device)?; // [B, T, in]
            let y = y.index_first(step).to_tensor::<3>("data.y", &device)?; // [B, T, out]
            let mask =
                mask.map(|m| m.index_first(step).to_bool_tensor::<3>("data.attention_mask", &device)).transpose()?; // [B, T, T]
            let loss = mse(model.forward(x, mask, true)?, y);
            recorded.losses.push(loss.clone().into_scalar::<f32>());
            let grads = GradientsParams::from_grads(loss.backward(), &model);
            if step == 0 {
                recorded.grads0 = model.library_gradients(&grads);
            }
            model = optim.step(self.learning_rate, model, grads);
            if step == 0 {
                recorded.step1 = model.library_weights();
            }
        }
        recorded.last = model.library_weights();
        Ok(recorded)
    }
}

/// Runs a trajectory fixture on one backend and compares everything it records.
pub fn run(fixture: &Fixture, backend: &str, device: &Device) -> Result<Vec<Check>> {
    let trajectory = Trajectory::from_fixture(fixture).with_context(|| format!("{}", fixture.path.display()))?;
    let recorded = trajectory.run(fixture, device)?;
    let tol = |name: &str| fixture.f64(name);
    let zero = zero_gradient_entries(fixture)?;

    let mut checks = Vec::new();
    let losses = HostTensor::new(vec![recorded.losses.len()], recorded.losses);
    let expected_losses = fixture.tensor("expected.loss")?;
    let mut loss_check = compare(&fixture.case, backend, "loss", &losses, expected_losses, tol("tolerance_loss")?);
    if let Some((worst, _)) = losses
        .data
        .iter()
        .zip(&expected_losses.data)
        .map(|(a, b)| (a - b).abs())
        .enumerate()
        .max_by(|a, b| a.1.total_cmp(&b.1))
    {
        loss_check.note.get_or_insert_with(|| format!("worst at step {worst} of {}", losses.data.len()));
    }
    checks.push(loss_check);
    let groups = [
        ("grads0", &recorded.grads0, tol("tolerance_grads")?, tol("tolerance_grads")?),
        ("step1", &recorded.step1, tol("tolerance_step1")?, tol("tolerance_zero_gradient_step1")?),
        ("final", &recorded.last, tol("tolerance_weights")?, tol("tolerance_zero_gradient_final")?),
    ];
    for (prefix, ours, regular_tol, zero_tol) in groups {
        for (name, expected) in fixture.tensors.with_prefix_stripped(&format!("{prefix}.")).iter() {
            let output = format!("{prefix}.{name}");
            let Ok(ours) = ours.get(name) else {
                bail!("{}: the model has no weight `{name}` to compare with `{output}`", fixture.path.display());
            };
            // The gradient itself is compared whole: its zero entries are small in both runs.
            let split = zero.iter().find(|z| z.name == name).filter(|_| prefix != "grads0");
            match split {
                None => checks.push(compare(&fixture.case, backend, &output, ours, expected, regular_tol)),
                Some(z) => {
                    let (a, b) = z.rows.unwrap_or((0, expected.shape[0]));
                    let ((ours_regular, ours_zero), (expected_regular, expected_zero)) =
                        (split_rows(ours, a, b), split_rows(expected, a, b));
                    if let (Some(ours_regular), Some(expected_regular)) = (ours_regular, expected_regular) {
                        checks.push(compare(
                            &fixture.case,
                            backend,
                            &output,
                            &ours_regular,
                            &expected_regular,
                            regular_tol,
                        ));
                    }
                    let zero_output = format!("{output}[{a}:{b}](zero-gradient)");
                    checks.push(compare(&fixture.case, backend, &zero_output, &ours_zero, &expected_zero, zero_tol));
                }
            }
        }
    }
    Ok(checks)
}

/// Splits a tensor along its first axis into the rows outside `[a, b)` (`None` when there are
/// none) and the rows inside.
fn split_rows(t: &HostTensor, a: usize, b: usize) -> (Option<HostTensor>, HostTensor) {
    let row: usize = t.shape[1..].iter().product();
    let shape_of = |rows: usize| [vec![rows], t.shape[1..].to_vec()].concat();
    let inside = HostTensor::new(shape_of(b - a), t.data[a * row..b * row].to_vec());
    let outside_rows = t.shape[0] - (b - a);
    let outside = (outside_rows > 0)
        .then(|| HostTensor::new(shape_of(outside_rows), [&t.data[..a * row], &t.data[b * row..]].concat()));
    (outside, inside)
}

fn zero_gradient_entries(fixture: &Fixture) -> Result<Vec<ZeroGradient>> {
    let Some(Value::Array(entries)) = fixture.config.get("zero_gradient_weights") else { return Ok(Vec::new()) };
    entries
        .iter()
        .map(|e| {
            let name = e
                .get("name")
                .and_then(Value::as_str)
                .context("zero_gradient_weights entry without a name")?
                .to_string();
            let rows = match e.get("rows") {
                Some(Value::Array(r)) if r.len() == 2 => Some((
                    r[0].as_u64().context("rows must be integers")? as usize,
                    r[1].as_u64().context("rows must be integers")? as usize,
                )),
                _ => None,
            };
            Ok(ZeroGradient { name, rows })
        })
        .collect()
}

/// The optimizer and learning rate of a fixture's `config.optimizer`. Options the formulas here
/// do not implement are errors, never ignored.
fn optimizer_from_fixture(optimizer: &Value) -> Result<(OptimizerConfig, f64)> {
    let name = optimizer.get("name").and_then(Value::as_str).context("config.optimizer.name is missing")?;
    let hp = optimizer.get("hyperparameters").context("config.optimizer.hyperparameters is missing")?;
    let num = |key: &str, default: f64| hp.get(key).and_then(Value::as_f64).unwrap_or(default);
    let flag = |key: &str| hp.get(key).and_then(Value::as_bool).unwrap_or(false);
    let unsupported = |keys: &[&str]| -> Result<()> {
        for key in keys {
            match hp.get(*key) {
                None | Some(Value::Null) | Some(Value::Bool(false)) => {}
                Some(value) => bail!("optimizer {name}: `{key}` = {value} is not supported"),
            }
        }
        Ok(())
    };
    Ok(match name {
        "keras.optimizers.Adam" => {
            unsupported(&[
                "clipnorm",
                "clipvalue",
                "global_clipnorm",
                "use_ema",
                "loss_scale_factor",
                "gradient_accumulation_steps",
            ])?;
            let config = OptimizerConfig::AdamKeras {
                beta_1: num("beta_1", 0.9),
                beta_2: num("beta_2", 0.999),
                epsilon: num("epsilon", 1e-7),
                amsgrad: flag("amsgrad"),
                weight_decay: num("weight_decay", 0.0),
            };
            (config, num("learning_rate", 1e-3))
        }
        "keras.optimizers.SGD" => {
            unsupported(&[
                "clipnorm",
                "clipvalue",
                "global_clipnorm",
                "use_ema",
                "loss_scale_factor",
                "gradient_accumulation_steps",
                "weight_decay",
            ])?;
            (
                OptimizerConfig::SgdKeras { momentum: num("momentum", 0.0), nesterov: flag("nesterov") },
                num("learning_rate", 1e-2),
            )
        }
        "torch.optim.Adam" => {
            unsupported(&["maximize", "capturable", "differentiable", "decoupled_weight_decay"])?;
            let betas = hp.get("betas").and_then(Value::as_array);
            let beta = |i: usize, default: f64| betas.and_then(|b| b.get(i)).and_then(Value::as_f64).unwrap_or(default);
            let config = OptimizerConfig::AdamTorch {
                beta_1: beta(0, 0.9),
                beta_2: beta(1, 0.999),
                eps: num("eps", 1e-8),
                amsgrad: flag("amsgrad"),
                weight_decay: num("weight_decay", 0.0),
            };
            (config, num("lr", 1e-3))
        }
        "torch.optim.SGD" => {
            unsupported(&["maximize"])?;
            let config = OptimizerConfig::Sgd {
                momentum: num("momentum", 0.0),
                dampening: num("dampening", 0.0),
                nesterov: flag("nesterov"),
                weight_decay: num("weight_decay", 0.0),
            };
            (config, num("lr", 1e-3))
        }
        other => bail!("optimizer {other:?} is not implemented (adam_keras, sgd_keras, adam_torch and sgd are)"),
    })
}
