//! Exact weight mappings between Keras `MultiHeadAttention`, torch `nn.MultiheadAttention` and the
//! projected model `Linear(in, E) + MHA(E, h) + Linear(E, out)`.
//!
//! Keras flattens a kernel `(D, h, k)` row-major, so head `n`, feature `j` is column `n*k + j` of
//! the `[D, h*k]` matrix, which is torch's head order. torch stores Linear weights `[out, in]`.
//!
//! | direction | condition | mapping |
//! |---|---|---|
//! | Keras -> torch | `Dq = h*k`, `v = k`, `O = h*k` | reshape and transpose; bit-exact both ways |
//! | Keras -> projected | `Dq = Dk = Dv = D`, `h*max(k,v) >= D` | `proj = [I; 0]`, heads zero-padded to `m = max(k,v)`, query scaled by `sqrt(m/k)`, `out_proj = I`, `final = Wo^T` |
//! | projected -> Keras | always | `kernel^T = W' P`, `bias = W' p + b'`, `Wo = (F Wo')^T`, `bo = F bo' + f` (float64, rounded once) |
//!
//! A conversion whose condition fails is an error that says which condition and why.

use crate::error::{ModelError, Result};
use crate::keras_mha::KerasMhaConfig;
use crate::projected::ProjectedConfig;
use crate::torch_mha::TorchMhaConfig;
use crate::weights::{HostTensor, WeightMap};

/// A converted weight set and the config of the layer that holds it.
#[derive(Debug, Clone)]
pub struct Converted<C> {
    pub config: C,
    pub weights: WeightMap,
}

/// Why a Keras layer has no counterpart in torch's `nn.MultiheadAttention`, if it has none: its
/// arguments that torch's layer cannot hold.
fn keras_only_arguments(config: &KerasMhaConfig) -> Option<String> {
    if config.use_gate {
        return Some("use_gate multiplies the attention output by a learned sigmoid gate, which torch's nn.MultiheadAttention has no place for".into());
    }
    if let Some(window) = config.sliding_window {
        return Some(format!(
            "sliding_window = {window} is part of the Keras layer; torch's layer holds no mask (pass the band as attn_mask at each call)"
        ));
    }
    match crate::keras_mha::resolve_attention_axes(config.attention_axes.as_deref(), 3) {
        Ok(axes) if axes == [1] => None,
        _ => Some(format!(
            "attention_axes = {:?} attends jointly over axes of an N-D input; torch's layer attends over one sequence axis (flatten the attention axes into it and the others into the batch, as KerasMha::forward_nd does, and call it on that)",
            config.attention_axes.as_deref().unwrap_or_default()
        )),
    }
}

/// Keras `MultiHeadAttention` -> torch `nn.MultiheadAttention` (pure reshape and transpose).
pub fn keras_to_torch(config: &KerasMhaConfig, keras: &WeightMap) -> Result<Converted<TorchMhaConfig>> {
    let d = config.dims()?;
    let fail = |reason: String| Err(ModelError::Conversion { direction: "keras -> torch", reason });
    if let Some(reason) = keras_only_arguments(config) {
        return fail(reason);
    }
    let e = d.num_heads * d.key_dim;
    if d.query_dim != e {
        return fail(format!(
            "torch's query width is embed_dim = num_heads * key_dim = {e}, but the Keras query width is {} (use the projected model)",
            d.query_dim
        ));
    }
    if d.value_dim != d.key_dim {
        return fail(format!(
            "torch heads have one size; value_dim = {} differs from key_dim = {} (use the projected model)",
            d.value_dim, d.key_dim
        ));
    }
    if d.output_dim != e {
        return fail(format!(
            "torch's output width is embed_dim = {e}, but output_shape is {} (add a final Linear: use the projected model)",
            d.output_dim
        ));
    }
    // Dropout is part of the layer a user trains: the port drops the same probabilities.
    let torch_config = TorchMhaConfig::new(e, d.num_heads)
        .with_kdim(Some(d.key_input_dim))
        .with_vdim(Some(d.value_input_dim))
        .with_bias(config.use_bias)
        .with_dropout(config.dropout);
    let shapes = d.kernel_shapes();
    let matrix = |name: &str, shape: [usize; 3], rows: usize| -> Result<HostTensor> {
        let kernel = keras.expect(name, &shape)?;
        let cols = kernel.data.len() / rows;
        Ok(kernel.reshaped(vec![rows, cols]).transposed())
    };
    let wq = matrix("query.kernel", shapes[0], d.query_dim)?;
    let wk = matrix("key.kernel", shapes[1], d.key_input_dim)?;
    let wv = matrix("value.kernel", shapes[2], d.value_input_dim)?;
    let wo = matrix("attention_output.kernel", shapes[3], e)?;

    let mut torch = WeightMap::new();
    if d.key_input_dim == e && d.value_input_dim == e {
        torch.insert("in_proj_weight", HostTensor::new(vec![3 * e, e], [wq.data, wk.data, wv.data].concat()));
    } else {
        torch.insert("q_proj_weight", wq);
        torch.insert("k_proj_weight", wk);
        torch.insert("v_proj_weight", wv);
    }
    torch.insert("out_proj.weight", wo);
    if config.use_bias {
        let hk = [d.num_heads, d.key_dim];
        let bias = [keras.expect("query.bias", &hk)?, keras.expect("key.bias", &hk)?, keras.expect("value.bias", &hk)?];
        torch.insert("in_proj_bias", HostTensor::new(vec![3 * e], bias.map(|b| b.data.clone()).concat()));
        torch.insert("out_proj.bias", keras.expect("attention_output.bias", &[e])?.clone());
    }
    Ok(Converted { config: torch_config, weights: torch })
}

/// torch `nn.MultiheadAttention` -> Keras `MultiHeadAttention(h, E/h)` (the inverse reshape).
pub fn torch_to_keras(config: &TorchMhaConfig, torch: &WeightMap) -> Result<Converted<KerasMhaConfig>> {
    for (set, reason) in [
        (
            config.add_zero_attn,
            "add_zero_attn appends a zero key and value after the projections, which Keras' layer has no place for",
        ),
        (
            config.add_bias_kv,
            "add_bias_kv appends learned key and value rows (bias_k, bias_v), which Keras' layer has no place for",
        ),
    ] {
        if set {
            return Err(ModelError::Conversion { direction: "torch -> keras", reason: reason.into() });
        }
    }
    let (e, h) = (config.embed_dim, config.num_heads);
    if h == 0 || e % h != 0 {
        return Err(ModelError::config("num_heads", h, format!("must divide embed_dim = {e}")));
    }
    let (kdim, vdim) = (config.kdim.unwrap_or(e), config.vdim.unwrap_or(e));
    let hd = e / h;
    let (wq, wk, wv) = if torch.contains("in_proj_weight") {
        let packed = torch.expect("in_proj_weight", &[3 * e, e])?;
        let block = |i: usize| HostTensor::new(vec![e, e], packed.data[i * e * e..(i + 1) * e * e].to_vec());
        (block(0), block(1), block(2))
    } else {
        (
            torch.expect("q_proj_weight", &[e, e])?.clone(),
            torch.expect("k_proj_weight", &[e, kdim])?.clone(),
            torch.expect("v_proj_weight", &[e, vdim])?.clone(),
        )
    };
    let mut keras = WeightMap::new();
    for (name, w, d_in) in [("query", wq, e), ("key", wk, kdim), ("value", wv, vdim)] {
        keras.insert(format!("{name}.kernel"), w.transposed().reshaped(vec![d_in, h, hd]));
    }
    keras.insert(
        "attention_output.kernel",
        torch.expect("out_proj.weight", &[e, e])?.transposed().reshaped(vec![h, hd, e]),
    );
    if config.bias {
        let packed = torch.expect("in_proj_bias", &[3 * e])?;
        for (i, name) in ["query.bias", "key.bias", "value.bias"].into_iter().enumerate() {
            keras.insert(name, HostTensor::new(vec![h, hd], packed.data[i * e..(i + 1) * e].to_vec()));
        }
        keras.insert("attention_output.bias", torch.expect("out_proj.bias", &[e])?.clone());
    }
    let keras_config = KerasMhaConfig::new(h, hd, e)
        .with_key_input_dim(Some(kdim))
        .with_value_input_dim(Some(vdim))
        .with_output_shape(Some(e))
        .with_use_bias(config.bias)
        .with_dropout(config.dropout);
    Ok(Converted { config: keras_config, weights: keras })
}

/// Keras `MultiHeadAttention` (self-attention) -> projected model with a final head.
///
/// Each head is zero-padded to `m = max(key_dim, value_dim)` features so that torch's single head
/// size can hold both, and the query is scaled by `sqrt(m / key_dim)` to turn torch's
/// `1/sqrt(m)` into Keras' `1/sqrt(key_dim)`. `proj = [I; 0]` copies the input into the first
/// `D` of `E = h*m` features, so the in-projection is the Keras kernel padded with zero columns;
/// `out_proj = I` and `final = Wo^T` carry Keras' output projection.
pub fn keras_to_projected(config: &KerasMhaConfig, keras: &WeightMap) -> Result<Converted<ProjectedConfig>> {
    let d = config.dims()?;
    let fail = |reason: String| Err(ModelError::Conversion { direction: "keras -> projected", reason });
    if let Some(reason) = keras_only_arguments(config) {
        return fail(reason);
    }
    if d.key_input_dim != d.query_dim || d.value_input_dim != d.query_dim {
        return fail(format!(
            "the projected model is self-attention on one input, but the Keras query/key/value widths are {}/{}/{}",
            d.query_dim, d.key_input_dim, d.value_input_dim
        ));
    }
    let (h, k, v, dq) = (d.num_heads, d.key_dim, d.value_dim, d.query_dim);
    let m = k.max(v);
    let e = h * m;
    if e < dq {
        return fail(format!(
            "proj: Linear({dq}, {e}) must be injective, but num_heads * max(key_dim, value_dim) = {e} < input width {dq}"
        ));
    }
    let q_scale = (m as f64 / k as f64).sqrt();
    let shapes = d.kernel_shapes();

    // One in-projection block [E, E]: row n*m + j holds Keras' column (n, j) for j < head width.
    let block = |kernel: &HostTensor, head: usize, scale: f64| {
        let mut w = vec![0.0f32; e * e];
        for n in 0..h {
            for j in 0..head {
                for i in 0..dq {
                    w[(n * m + j) * e + i] = (kernel.data[(i * h + n) * head + j] as f64 * scale) as f32;
                }
            }
        }
        w
    };
    let bias_block = |bias: &HostTensor, head: usize, scale: f64| {
        let mut b = vec![0.0f32; e];
        for n in 0..h {
            for j in 0..head {
                b[n * m + j] = (bias.data[n * head + j] as f64 * scale) as f32;
            }
        }
        b
    };
    let wq = keras.expect("query.kernel", &shapes[0])?;
    let wk = keras.expect("key.kernel", &shapes[1])?;
    let wv = keras.expect("value.kernel", &shapes[2])?;
    let wo = keras.expect("attention_output.kernel", &shapes[3])?;
    let o = d.output_dim;

    let mut out = WeightMap::new();
    let mut proj = vec![0.0f32; e * dq];
    (0..dq).for_each(|i| proj[i * dq + i] = 1.0);
    out.insert("proj.weight", HostTensor::new(vec![e, dq], proj));
    let packed = [block(wq, k, q_scale), block(wk, k, 1.0), block(wv, v, 1.0)].concat();
    out.insert("in_proj_weight", HostTensor::new(vec![3 * e, e], packed));
    out.insert("out_proj.weight", HostTensor::new(vec![e, e], identity(e)));
    // final.weight [O, E]: column n*m + j = Wo[n, j, :].
    let mut head = vec![0.0f32; o * e];
    for n in 0..h {
        for j in 0..v {
            for r in 0..o {
                head[r * e + n * m + j] = wo.data[(n * v + j) * o + r];
            }
        }
    }
    out.insert("final.weight", HostTensor::new(vec![o, e], head));
    if config.use_bias {
        let bq = keras.expect("query.bias", &[h, k])?;
        let bk = keras.expect("key.bias", &[h, k])?;
        let bv = keras.expect("value.bias", &[h, v])?;
        out.insert("proj.bias", HostTensor::zeros(vec![e]));
        out.insert(
            "in_proj_bias",
            HostTensor::new(
                vec![3 * e],
                [bias_block(bq, k, q_scale), bias_block(bk, k, 1.0), bias_block(bv, v, 1.0)].concat(),
            ),
        );
        out.insert("out_proj.bias", HostTensor::zeros(vec![e]));
        out.insert("final.bias", keras.expect("attention_output.bias", &[o])?.clone());
    }
    // Keras' dropout on the probabilities [B, h, T, S] is torch's on the (padded heads') weights.
    let projected =
        ProjectedConfig::new(dq, e, h).with_output_dim(Some(o)).with_bias(config.use_bias).with_dropout(config.dropout);
    Ok(Converted { config: projected, weights: out })
}

/// Projected model -> Keras `MultiHeadAttention(h, E/h, output_shape = out | E)` on the raw input.
///
/// `proj` folds into the input projections (`kernel^T = W' P`, `bias = W' p + b'`) and the final
/// head into the output projection (`Wo = (F Wo')^T`, `bo = F bo' + f`). Computed in float64 and
/// rounded once; always exact up to that rounding.
pub fn projected_to_keras(config: &ProjectedConfig, weights: &WeightMap) -> Result<Converted<KerasMhaConfig>> {
    let (din, e, h) = (config.in_features, config.embed_dim, config.num_heads);
    if h == 0 || e % h != 0 {
        return Err(ModelError::config("num_heads", h, format!("must divide embed_dim = {e}")));
    }
    let hd = e / h;
    let bias = config.bias;
    let p = Mat::from(weights.expect("proj.weight", &[e, din])?); // [E, in]
    let p_bias = bias.then(|| weights.expect("proj.bias", &[e]).map(Mat::column)).transpose()?; // [E, 1]
    let in_w = weights.expect("in_proj_weight", &[3 * e, e])?;
    let in_b = bias.then(|| weights.expect("in_proj_bias", &[3 * e])).transpose()?;

    let mut keras = WeightMap::new();
    for (i, name) in ["query", "key", "value"].into_iter().enumerate() {
        let w_block = Mat::new(e, e, in_w.data[i * e * e..(i + 1) * e * e].iter().map(|&x| x as f64).collect()); // W' [E, E]
        let kernel_t = w_block.matmul(&p); // [E, in]
        keras.insert(format!("{name}.kernel"), kernel_t.transpose().to_host(vec![din, h, hd]));
        if let (Some(in_b), Some(p_bias)) = (in_b, &p_bias) {
            let b_block = Mat::new(e, 1, in_b.data[i * e..(i + 1) * e].iter().map(|&x| x as f64).collect());
            keras.insert(format!("{name}.bias"), w_block.matmul(p_bias).add(&b_block).to_host(vec![h, hd]));
        }
    }
    let wo = Mat::from(weights.expect("out_proj.weight", &[e, e])?); // Wo' [E, E]
    let bo = bias.then(|| weights.expect("out_proj.bias", &[e]).map(Mat::column)).transpose()?; // [E, 1]
    let (wo, bo, o) = match config.output_dim {
        Some(o) => {
            let f = Mat::from(weights.expect("final.weight", &[o, e])?); // F [O, E]
            let fb = bias.then(|| weights.expect("final.bias", &[o]).map(Mat::column)).transpose()?;
            let bo = bo.zip(fb).map(|(bo, fb)| f.matmul(&bo).add(&fb));
            (f.matmul(&wo), bo, o)
        }
        None => (wo, bo, e),
    };
    keras.insert("attention_output.kernel", wo.transpose().to_host(vec![h, hd, o]));
    if let Some(bo) = bo {
        keras.insert("attention_output.bias", bo.to_host(vec![o]));
    }
    let keras_config =
        KerasMhaConfig::new(h, hd, din).with_output_shape(Some(o)).with_use_bias(bias).with_dropout(config.dropout);
    Ok(Converted { config: keras_config, weights: keras })
}

fn identity(n: usize) -> Vec<f32> {
    let mut m = vec![0.0; n * n];
    (0..n).for_each(|i| m[i * n + i] = 1.0);
    m
}

/// A small row-major float64 matrix for the conversions that multiply weights.
struct Mat {
    rows: usize,
    cols: usize,
    data: Vec<f64>,
}

impl Mat {
    fn new(rows: usize, cols: usize, data: Vec<f64>) -> Self {
        debug_assert_eq!(rows * cols, data.len());
        Self { rows, cols, data }
    }

    fn column(t: &HostTensor) -> Self {
        Self::new(t.data.len(), 1, t.data.iter().map(|&x| x as f64).collect())
    }

    fn matmul(&self, other: &Mat) -> Mat {
        assert_eq!(self.cols, other.rows, "inner dimensions must agree");
        let mut out = vec![0.0; self.rows * other.cols];
        for i in 0..self.rows {
            for k in 0..self.cols {
                let a = self.data[i * self.cols + k];
                for j in 0..other.cols {
                    out[i * other.cols + j] += a * other.data[k * other.cols + j];
                }
            }
        }
        Mat::new(self.rows, other.cols, out)
    }

    fn add(&self, other: &Mat) -> Mat {
        Mat::new(self.rows, self.cols, self.data.iter().zip(&other.data).map(|(a, b)| a + b).collect())
    }

    fn transpose(&self) -> Mat {
        let mut out = vec![0.0; self.data.len()];
        for i in 0..self.rows {
            for j in 0..self.cols {
                out[j * self.rows + i] = self.data[i * self.cols + j];
            }
        }
        Mat::new(self.cols, self.rows, out)
    }

    fn to_host(&self, shape: Vec<usize>) -> HostTensor {
        HostTensor::new(shape, self.data.iter().map(|&x| x as f32).collect())
    }
}

impl From<&HostTensor> for Mat {
    fn from(t: &HostTensor) -> Self {
        let [rows, cols] = t.shape[..] else { panic!("a matrix needs a 2-D tensor, got {:?}", t.shape) };
        Mat::new(rows, cols, t.data.iter().map(|&x| x as f64).collect())
    }
}

/// The README's example (this module's API) as a doctest: `cargo test --doc` compiles and runs it.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
