//! Fused scaled dot-product attention on host memory: forward and backward, one (batch, head)
//! pair at a time, never materialising the `[B, h, T, S]` score tensor.
//!
//! For one pair, with `q̃ = scale · q` (the query is scaled before the product, as Keras and
//! torch do), query row `t` of the forward pass is
//!
//! ```text
//! s_j = q̃_t · k_j        m_t = max_j s_j        l_t = Σ_j exp(s_j - m_t)
//! p_j = exp(s_j - m_t) / l_t                      o_t = Σ_j p_j v_j
//! ```
//!
//! and the backward pass recomputes `p_j` from the saved `m_t` and `1 / l_t`, then
//!
//! ```text
//! dp_j = dO_t · v_j       D_t = dO_t · o_t       ds_j = p_j (dp_j - D_t)
//! dv_j = Σ_t p_j dO_t     dk_j = Σ_t ds_j q̃_t    dq_t = scale · Σ_j ds_j k_j
//! ```
//!
//! FlashAttention-2's algorithm, vectorised for a CPU: [`LANES`] rows share one vector register.
//! The forward pass and `dq` put 16 query rows in the lanes and walk the keys; `dk` and `dv` put
//! 16 keys in the lanes and walk the queries. Every sum then runs inside a lane and no step needs
//! a horizontal reduction. Feature widths are zero-padded to one of [`WIDTHS`] so that the
//! per-feature loops have a compile-time length and their accumulators stay in registers.
//!
//! Tensors come and go in the projections' own layout, `[B, L, h, d]` (heads last), so that no
//! transpose to `[B, h, L, d]` is materialised around the kernel. Pairs run in parallel on rayon's pool. The kernels are compiled for AVX-512, AVX2 + FMA and
//! the baseline, and the best one the CPU has is picked at run time.

use rayon::prelude::*;

use super::exp::{exp_nonpositive, madd};

/// Rows per vector: 16 float32 fill one AVX-512 register (two AVX2 registers).
pub const LANES: usize = 16;

/// The feature widths the kernel is compiled for; `key_dim` and `value_dim` are zero-padded to
/// the smallest one that holds both.
pub const WIDTHS: [usize; 6] = [4, 8, 16, 32, 64, 128];

type Lanes = [f32; LANES];

/// An instruction set the kernels are compiled for. Only [`Isa::available`] makes values other
/// than `Baseline`, so holding one means the CPU runs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// Whatever the build targets (SSE2 on x86-64), no FMA.
    Baseline,
    #[cfg(target_arch = "x86_64")]
    Avx2Fma,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    /// The instruction sets this CPU runs, widest first.
    pub fn available() -> Vec<Isa> {
        let mut found = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx512f") && has!("avx2") && has!("fma") {
                found.push(Isa::Avx512);
            }
            if has!("avx2") && has!("fma") {
                found.push(Isa::Avx2Fma);
            }
        }
        found.push(Isa::Baseline);
        found
    }

    /// The widest instruction set this CPU runs (detected once).
    pub fn best() -> Isa {
        static BEST: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *BEST.get_or_init(|| Isa::available()[0])
    }
}

/// Calls `$f::<$W, FMA>(args)` with `$W` the padded width, compiled for `$isa`.
macro_rules! dispatch {
    ($isa:expr, $width:expr, $f:ident($($arg:expr),*)) => {
        match $width {
            4 => dispatch!(@isa $isa, 4, $f($($arg),*)),
            8 => dispatch!(@isa $isa, 8, $f($($arg),*)),
            16 => dispatch!(@isa $isa, 16, $f($($arg),*)),
            32 => dispatch!(@isa $isa, 32, $f($($arg),*)),
            64 => dispatch!(@isa $isa, 64, $f($($arg),*)),
            128 => dispatch!(@isa $isa, 128, $f($($arg),*)),
            width => unreachable!("width {width} is not one of {WIDTHS:?}"),
        }
    };
    (@isa $isa:expr, $w:literal, $f:ident($($arg:expr),*)) => {
        match $isa {
            Isa::Baseline => $f::<$w, false>($($arg),*),
            // SAFETY: an `Isa` other than `Baseline` comes from `Isa::available`, so the CPU
            // supports the features the function is compiled for.
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2Fma => unsafe { simd::avx2::$f::<$w>($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => unsafe { simd::avx512::$f::<$w>($($arg),*) },
        }
    };
}

/// The kernels compiled with wider instruction sets enabled.
#[cfg(target_arch = "x86_64")]
mod simd {
    macro_rules! variant {
        ($name:ident, $features:literal) => {
            pub mod $name {
                use super::super::*;

                #[target_feature(enable = $features)]
                pub unsafe fn forward_pair<const W: usize>(pair: &mut PairForward, out: PairOutputs) {
                    super::super::forward_pair::<W, true>(pair, out)
                }

                #[target_feature(enable = $features)]
                pub unsafe fn key_value_grads<const W: usize>(pair: &PairBackward, key: &mut [f32], value: &mut [f32]) {
                    super::super::key_value_grads::<W, true>(pair, key, value)
                }

                #[target_feature(enable = $features)]
                pub unsafe fn query_grads<const W: usize>(pair: &PairBackward, query: &mut [f32]) {
                    super::super::query_grads::<W, true>(pair, query)
                }
            }
        };
    }
    variant!(avx512, "avx512f,avx2,fma");
    variant!(avx2, "avx2,fma");
}

/// The sizes of one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dims {
    pub batch: usize,
    pub heads: usize,
    pub query_len: usize,
    pub source_len: usize,
    pub key_dim: usize,
    pub value_dim: usize,
}

impl Dims {
    /// The padded feature width, `None` when a width exceeds the largest of [`WIDTHS`].
    pub fn width(&self) -> Option<usize> {
        WIDTHS.into_iter().find(|&w| w >= self.key_dim.max(self.value_dim))
    }

    /// `[B, T, h, dk]`, `[B, S, h, dk]` and `[B, S, h, dv]`: the query, key and value shapes.
    pub fn shapes(&self) -> [[usize; 4]; 3] {
        let Dims { batch, heads, query_len, source_len, key_dim, value_dim } = *self;
        [[batch, query_len, heads, key_dim], [batch, source_len, heads, key_dim], [batch, source_len, heads, value_dim]]
    }

    /// No pair, no query row or no key: nothing for the kernel to compute.
    fn is_empty(&self) -> bool {
        self.pairs() == 0 || self.query_len == 0 || self.source_len == 0
    }

    /// (batch, head) pairs: the unit of work.
    fn pairs(&self) -> usize {
        self.batch * self.heads
    }

    fn padded_query_len(&self) -> usize {
        self.query_len.next_multiple_of(LANES)
    }

    fn padded_source_len(&self) -> usize {
        self.source_len.next_multiple_of(LANES)
    }
}

/// What the forward pass leaves for the backward pass: its inputs and per-row statistics.
#[derive(Debug, Clone)]
pub struct Forward {
    pub dims: Dims,
    pub scale: f32,
    /// `[B, T, h, dk]`, the query already multiplied by `scale`.
    scaled_query: Vec<f32>,
    /// `[B, S, h, dk]`
    key: Vec<f32>,
    /// `[B, S, h, dv]`
    value: Vec<f32>,
    /// `[pairs, T, dv]`: the attention output, pair by pair.
    output_by_pair: Vec<f32>,
    /// `[pairs, T']`: `m_t`, the row maximum of the scores.
    row_max: Vec<f32>,
    /// `[pairs, T']`: `1 / l_t`, the inverse softmax denominator.
    inv_row_sum: Vec<f32>,
}

/// Gradients with respect to the (unscaled) query, the key and the value.
#[derive(Debug, Clone)]
pub struct Gradients {
    /// `[B, T, h, dk]`
    pub query: Vec<f32>,
    /// `[B, S, h, dk]`
    pub key: Vec<f32>,
    /// `[B, S, h, dv]`
    pub value: Vec<f32>,
}

/// `softmax(scale · q kᵀ) v` per (batch, head) pair. `query`: `[B, T, h, dk]`, `key`:
/// `[B, S, h, dk]`, `value`: `[B, S, h, dv]`; `dims.width()` must not be `None`. Returns the
/// output `[B, T, h, dv]` and what the backward pass needs (the inputs are kept, not copied).
pub fn forward(query: Vec<f32>, key: Vec<f32>, value: Vec<f32>, dims: Dims, scale: f32) -> (Vec<f32>, Forward) {
    forward_with(Isa::best(), query, key, value, dims, scale)
}

fn forward_with(isa: Isa, query: Vec<f32>, key: Vec<f32>, value: Vec<f32>, dims: Dims, scale: f32) -> (Vec<f32>, Forward) {
    let Dims { query_len, source_len, key_dim, value_dim, .. } = dims;
    let pairs = dims.pairs();
    assert_eq!(query.len(), pairs * query_len * key_dim, "query length");
    assert_eq!(key.len(), pairs * source_len * key_dim, "key length");
    assert_eq!(value.len(), pairs * source_len * value_dim, "value length");
    let width = dims.width().expect("feature widths within the kernel's largest width");

    let mut scaled_query = query; // [B, T, h, dk]
    scaled_query.iter_mut().for_each(|x| *x *= scale);
    let padded_query_len = dims.padded_query_len();
    let mut output_by_pair = vec![0.0; pairs * query_len * value_dim]; // [pairs, T, dv]
    let mut row_max = vec![0.0; pairs * padded_query_len]; // [pairs, T']
    let mut inv_row_sum = vec![0.0; pairs * padded_query_len]; // [pairs, T']
    if dims.is_empty() {
        // Nothing to attend with or to: an empty output, or zeros for rows without keys.
        let output = output_by_pair.clone();
        return (output, Forward { dims, scale, scaled_query, key, value, output_by_pair, row_max, inv_row_sum });
    }

    output_by_pair
        .par_chunks_mut(query_len * value_dim)
        .zip(row_max.par_chunks_mut(padded_query_len))
        .zip(inv_row_sum.par_chunks_mut(padded_query_len))
        .enumerate()
        .for_each_init(
            || PairForward::scratch(dims, width),
            |pair, (index, ((output, row_max), inv_row_sum))| {
                pair.pack(&scaled_query, &key, &value, index);
                dispatch!(isa, width, forward_pair(pair, PairOutputs { output, row_max, inv_row_sum }));
            },
        );
    let output = heads_last(&output_by_pair, dims, query_len, value_dim); // [B, T, h, dv]
    (output, Forward { dims, scale, scaled_query, key, value, output_by_pair, row_max, inv_row_sum })
}

/// The gradients of `Σ output · output_grad` with respect to the forward pass's query, key and
/// value. `output_grad`: `[B, T, h, dv]`.
pub fn backward(saved: &Forward, output_grad: &[f32]) -> Gradients {
    backward_with(Isa::best(), saved, output_grad)
}

fn backward_with(isa: Isa, saved: &Forward, output_grad: &[f32]) -> Gradients {
    let dims = saved.dims;
    let Dims { query_len, source_len, key_dim, value_dim, .. } = dims;
    let pairs = dims.pairs();
    assert_eq!(output_grad.len(), saved.output_by_pair.len(), "output gradient length");
    let width = dims.width().expect("checked by forward");

    let mut query = vec![0.0; pairs * query_len * key_dim]; // [pairs, T, dk]
    let mut key = vec![0.0; pairs * source_len * key_dim]; // [pairs, S, dk]
    let mut value = vec![0.0; pairs * source_len * value_dim]; // [pairs, S, dv]
    if dims.is_empty() {
        return Gradients { query, key, value }; // the forward output was constant
    }
    query
        .par_chunks_mut(query_len * key_dim)
        .zip(key.par_chunks_mut(source_len * key_dim))
        .zip(value.par_chunks_mut(source_len * value_dim))
        .enumerate()
        .for_each_init(
            || PairBackward::scratch(dims, width),
            |pair, (index, ((query, key), value))| {
                pair.pack(saved, output_grad, index);
                dispatch!(isa, width, key_value_grads(pair, key, value));
                dispatch!(isa, width, query_grads(pair, query));
                query.iter_mut().for_each(|dq| *dq *= saved.scale); // d(q̃)/dq = scale
            },
        );
    Gradients {
        query: heads_last(&query, dims, query_len, key_dim),
        key: heads_last(&key, dims, source_len, key_dim),
        value: heads_last(&value, dims, source_len, value_dim),
    }
}

/// One pair's forward inputs in the kernel's layouts (per-thread buffers, reused across pairs).
struct PairForward {
    dims: Dims,
    width: usize,
    /// `[W, T']`: query rows in lanes.
    query_t: Vec<f32>,
    /// `[S, W]`
    key_rows: Vec<f32>,
    /// `[S, W]`
    value_rows: Vec<f32>,
    /// `[S]` x 16 rows: one block's scores, kept between the two passes.
    scores: Vec<Lanes>,
}

/// One pair's slices of the forward results.
struct PairOutputs<'a> {
    /// `[T, dv]`
    output: &'a mut [f32],
    /// `[T']`
    row_max: &'a mut [f32],
    /// `[T']`
    inv_row_sum: &'a mut [f32],
}

impl PairForward {
    fn scratch(dims: Dims, width: usize) -> Self {
        Self {
            dims,
            width,
            query_t: vec![0.0; width * dims.padded_query_len()],
            key_rows: vec![0.0; dims.source_len * width],
            value_rows: vec![0.0; dims.source_len * width],
            scores: vec![[0.0; LANES]; dims.source_len],
        }
    }

    fn pack(&mut self, scaled_query: &[f32], key: &[f32], value: &[f32], pair: usize) {
        let d = self.dims;
        pack_transposed(pair_rows(scaled_query, d, pair, d.query_len, d.key_dim), d.padded_query_len(), &mut self.query_t);
        pack_rows(pair_rows(key, d, pair, d.source_len, d.key_dim), self.width, &mut self.key_rows);
        pack_rows(pair_rows(value, d, pair, d.source_len, d.value_dim), self.width, &mut self.value_rows);
    }
}

/// One pair's backward inputs in the kernel's layouts (per-thread buffers, reused across pairs).
struct PairBackward {
    dims: Dims,
    width: usize,
    forward: PairForward,
    /// `[T, W]`
    query_rows: Vec<f32>,
    /// `[T, W]`
    output_grad_rows: Vec<f32>,
    /// `[W, T']`
    output_grad_t: Vec<f32>,
    /// `[W, S']`: keys in lanes.
    key_t: Vec<f32>,
    /// `[W, S']`
    value_t: Vec<f32>,
    /// `[T']`: `m_t`, `1 / l_t` and `D_t = dO_t · o_t`.
    row_max: Vec<f32>,
    inv_row_sum: Vec<f32>,
    row_dot: Vec<f32>,
}

impl PairBackward {
    fn scratch(dims: Dims, width: usize) -> Self {
        let (padded_query_len, padded_source_len) = (dims.padded_query_len(), dims.padded_source_len());
        Self {
            dims,
            width,
            forward: PairForward::scratch(dims, width),
            query_rows: vec![0.0; dims.query_len * width],
            output_grad_rows: vec![0.0; dims.query_len * width],
            output_grad_t: vec![0.0; width * padded_query_len],
            key_t: vec![0.0; width * padded_source_len],
            value_t: vec![0.0; width * padded_source_len],
            row_max: vec![0.0; padded_query_len],
            inv_row_sum: vec![0.0; padded_query_len],
            row_dot: vec![0.0; padded_query_len],
        }
    }

    fn pack(&mut self, saved: &Forward, output_grad: &[f32], pair: usize) {
        let d = self.dims;
        let (padded_query_len, padded_source_len) = (d.padded_query_len(), d.padded_source_len());
        self.forward.pack(&saved.scaled_query, &saved.key, &saved.value, pair);
        let output_grad = pair_rows(output_grad, d, pair, d.query_len, d.value_dim);
        pack_rows(pair_rows(&saved.scaled_query, d, pair, d.query_len, d.key_dim), self.width, &mut self.query_rows);
        pack_rows(output_grad.clone(), self.width, &mut self.output_grad_rows);
        pack_transposed(output_grad.clone(), padded_query_len, &mut self.output_grad_t);
        pack_transposed(pair_rows(&saved.key, d, pair, d.source_len, d.key_dim), padded_source_len, &mut self.key_t);
        pack_transposed(pair_rows(&saved.value, d, pair, d.source_len, d.value_dim), padded_source_len, &mut self.value_t);
        self.row_max.copy_from_slice(&saved.row_max[pair * padded_query_len..][..padded_query_len]);
        self.inv_row_sum.copy_from_slice(&saved.inv_row_sum[pair * padded_query_len..][..padded_query_len]);
        let output = saved.output_by_pair[pair * d.query_len * d.value_dim..].chunks_exact(d.value_dim);
        for ((row_dot, g), o) in self.row_dot.iter_mut().zip(output_grad).zip(output) {
            *row_dot = g.iter().zip(o).map(|(g, o)| g * o).sum(); // D_t
        }
    }
}

/// Forward pass of one pair, 16 query rows at a time: a pass over the keys for the scores and
/// their row maxima, then one for the exponentials, their sums and the weighted values.
#[inline(always)]
fn forward_pair<const W: usize, const FMA: bool>(pair: &mut PairForward, out: PairOutputs) {
    let Dims { query_len, source_len, value_dim, .. } = pair.dims;
    let padded_query_len = pair.dims.padded_query_len();
    for block in 0..padded_query_len / LANES {
        let query: [Lanes; W] = load_columns(&pair.query_t, padded_query_len, block); // [W] x 16 rows
        let mut max = [f32::NEG_INFINITY; LANES];
        for (key, scores) in pair.key_rows.chunks_exact(W).zip(pair.scores.iter_mut()).take(source_len) {
            let score = row_scores::<W, FMA>(&query, key);
            max = lanes(|i| if score[i] > max[i] { score[i] } else { max[i] });
            *scores = score;
        }
        let mut sum = [0.0; LANES];
        let mut context = [[0.0; LANES]; W];
        for (score, value) in pair.scores.iter().zip(pair.value_rows.chunks_exact(W)).take(source_len) {
            let weight = lanes(|i| exp_nonpositive::<FMA>(score[i] - max[i]));
            sum = lanes(|i| sum[i] + weight[i]);
            for d in 0..W {
                context[d] = lanes(|i| madd::<FMA>(weight[i], value[d], context[d][i]));
            }
        }
        let inv_sum = lanes(|i| 1.0 / sum[i]);
        out.row_max[block * LANES..][..LANES].copy_from_slice(&max);
        out.inv_row_sum[block * LANES..][..LANES].copy_from_slice(&inv_sum);
        for i in 0..LANES.min(query_len - block * LANES) {
            let row = &mut out.output[(block * LANES + i) * value_dim..][..value_dim];
            for (d, o) in row.iter_mut().enumerate() {
                *o = context[d][i] * inv_sum[i];
            }
        }
    }
}

/// `dk` and `dv` of one pair, 16 keys at a time, walking the query rows.
#[inline(always)]
fn key_value_grads<const W: usize, const FMA: bool>(pair: &PairBackward, key_grad: &mut [f32], value_grad: &mut [f32]) {
    let Dims { query_len, source_len, key_dim, value_dim, .. } = pair.dims;
    let padded_source_len = pair.dims.padded_source_len();
    for block in 0..padded_source_len / LANES {
        let key: [Lanes; W] = load_columns(&pair.key_t, padded_source_len, block); // [W] x 16 keys
        let value: [Lanes; W] = load_columns(&pair.value_t, padded_source_len, block);
        let mut dk = [[0.0; LANES]; W];
        let mut dv = [[0.0; LANES]; W];
        let rows = pair.query_rows.chunks_exact(W).zip(pair.output_grad_rows.chunks_exact(W));
        for (t, (query, output_grad)) in rows.enumerate().take(query_len) {
            let score = row_scores::<W, FMA>(&key, query);
            let (max, inv_sum, row_dot) = (pair.row_max[t], pair.inv_row_sum[t], pair.row_dot[t]);
            // Padded keys get garbage here; their lanes are never written out.
            let prob = lanes(|i| exp_nonpositive::<FMA>(score[i] - max) * inv_sum);
            let prob_grad = row_scores::<W, FMA>(&value, output_grad); // dp_j
            let score_grad = lanes(|i| prob[i] * (prob_grad[i] - row_dot)); // ds_j
            for d in 0..W {
                dv[d] = lanes(|i| madd::<FMA>(prob[i], output_grad[d], dv[d][i]));
                dk[d] = lanes(|i| madd::<FMA>(score_grad[i], query[d], dk[d][i]));
            }
        }
        store_columns(&dk, block, source_len, key_dim, key_grad);
        store_columns(&dv, block, source_len, value_dim, value_grad);
    }
}

/// `dq̃` of one pair, 16 query rows at a time, walking the keys.
#[inline(always)]
fn query_grads<const W: usize, const FMA: bool>(pair: &PairBackward, query_grad: &mut [f32]) {
    let Dims { query_len, source_len, key_dim, .. } = pair.dims;
    let padded_query_len = pair.dims.padded_query_len();
    for block in 0..padded_query_len / LANES {
        let query: [Lanes; W] = load_columns(&pair.forward.query_t, padded_query_len, block);
        let output_grad: [Lanes; W] = load_columns(&pair.output_grad_t, padded_query_len, block);
        let at = |x: &[f32]| -> Lanes { x[block * LANES..][..LANES].try_into().expect("16 lanes") };
        let (max, inv_sum, row_dot) = (at(&pair.row_max), at(&pair.inv_row_sum), at(&pair.row_dot));
        let mut dq = [[0.0; LANES]; W];
        let keys = pair.forward.key_rows.chunks_exact(W).zip(pair.forward.value_rows.chunks_exact(W));
        for (key, value) in keys.take(source_len) {
            let score = row_scores::<W, FMA>(&query, key);
            let prob = lanes(|i| exp_nonpositive::<FMA>(score[i] - max[i]) * inv_sum[i]);
            let prob_grad = row_scores::<W, FMA>(&output_grad, value); // dp_j
            let score_grad = lanes(|i| prob[i] * (prob_grad[i] - row_dot[i])); // ds_j
            for d in 0..W {
                dq[d] = lanes(|i| madd::<FMA>(score_grad[i], key[d], dq[d][i]));
            }
        }
        store_columns(&dq, block, query_len, key_dim, query_grad);
    }
}

/// `Σ_d columns[d] · row[d]` per lane: 16 dot products against one broadcast row.
#[inline(always)]
fn row_scores<const W: usize, const FMA: bool>(columns: &[Lanes; W], row: &[f32]) -> Lanes {
    let mut score = [0.0; LANES];
    for d in 0..W {
        score = lanes(|i| madd::<FMA>(columns[d][i], row[d], score[i]));
    }
    score
}

/// A lane-wise expression as a vector.
#[inline(always)]
fn lanes(f: impl Fn(usize) -> f32) -> Lanes {
    std::array::from_fn(f)
}

/// Block `block` of each of the `W` rows of a `[W, len']` matrix.
#[inline(always)]
fn load_columns<const W: usize>(matrix: &[f32], padded_len: usize, block: usize) -> [Lanes; W] {
    std::array::from_fn(|d| matrix[d * padded_len + block * LANES..][..LANES].try_into().expect("16 lanes"))
}

/// Writes lanes `block * 16 ..` of `columns` (features x rows) as rows `[len, width]`, dropping
/// padded rows and features.
#[inline(always)]
fn store_columns<const W: usize>(columns: &[Lanes; W], block: usize, len: usize, width: usize, out: &mut [f32]) {
    for i in 0..LANES.min(len.saturating_sub(block * LANES)) {
        let row = &mut out[(block * LANES + i) * width..][..width];
        for (d, x) in row.iter_mut().enumerate() {
            *x = columns[d][i];
        }
    }
}

/// The `len` rows of one (batch, head) pair in a `[B, len, h, width]` buffer.
fn pair_rows(x: &[f32], dims: Dims, pair: usize, len: usize, width: usize) -> impl Iterator<Item = &[f32]> + Clone {
    let (batch, head) = (pair / dims.heads, pair % dims.heads);
    let first = (batch * len * dims.heads + head) * width;
    x[first..].chunks(dims.heads * width).take(len).map(move |row| &row[..width])
}

/// `[pairs, len, width] -> [B, len, h, width]`.
fn heads_last<T: Copy + Default + Send + Sync>(by_pair: &[T], dims: Dims, len: usize, width: usize) -> Vec<T> {
    let mut out = vec![T::default(); by_pair.len()];
    out.par_chunks_mut(len * dims.heads * width).enumerate().for_each(|(batch, out)| {
        for head in 0..dims.heads {
            let pair = &by_pair[(batch * dims.heads + head) * len * width..][..len * width];
            for (l, row) in pair.chunks_exact(width).enumerate() {
                out[(l * dims.heads + head) * width..][..width].copy_from_slice(row);
            }
        }
    });
    out
}

/// Rows of width `w` -> `[len, W]`, features zero-padded.
fn pack_rows<'a>(rows: impl Iterator<Item = &'a [f32]>, padded_width: usize, out: &mut [f32]) {
    for (row, out) in rows.zip(out.chunks_exact_mut(padded_width)) {
        out[..row.len()].copy_from_slice(row);
        out[row.len()..].fill(0.0);
    }
}

/// Rows of width `w` -> `[W, len']`, zero-padded in both directions.
fn pack_transposed<'a>(rows: impl Iterator<Item = &'a [f32]>, padded_len: usize, out: &mut [f32]) {
    out.fill(0.0);
    for (j, row) in rows.enumerate() {
        for (d, &x) in row.iter().enumerate() {
            out[d * padded_len + j] = x;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator, enough for test inputs.
    fn values(n: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((state >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    /// Textbook attention in float64 with explicit probabilities, and its gradients, on
    /// pair-major `[pairs, L, d]` buffers.
    fn reference(q: &[f32], k: &[f32], v: &[f32], g: &[f32], dims: Dims, scale: f32) -> [Vec<f64>; 4] {
        let Dims { query_len: tl, source_len: sl, key_dim: dk, value_dim: dv, .. } = dims;
        let pairs = dims.pairs();
        let (mut out, mut dq, mut dkk, mut dvv) =
            (vec![0.0; pairs * tl * dv], vec![0.0; pairs * tl * dk], vec![0.0; pairs * sl * dk], vec![0.0; pairs * sl * dv]);
        for p in 0..pairs {
            for t in 0..tl {
                let qs: Vec<f64> = (0..dk).map(|d| (q[(p * tl + t) * dk + d] * scale) as f64).collect();
                let s: Vec<f64> = (0..sl).map(|j| (0..dk).map(|d| qs[d] * k[(p * sl + j) * dk + d] as f64).sum()).collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|s| (s - m).exp()).collect();
                let total: f64 = e.iter().sum();
                let probs: Vec<f64> = e.iter().map(|e| e / total).collect();
                let go: Vec<f64> = (0..dv).map(|d| g[(p * tl + t) * dv + d] as f64).collect();
                let dp: Vec<f64> = (0..sl).map(|j| (0..dv).map(|d| go[d] * v[(p * sl + j) * dv + d] as f64).sum()).collect();
                let row_dot: f64 = (0..sl).map(|j| probs[j] * dp[j]).sum();
                for j in 0..sl {
                    let ds = probs[j] * (dp[j] - row_dot);
                    for d in 0..dv {
                        out[(p * tl + t) * dv + d] += probs[j] * v[(p * sl + j) * dv + d] as f64;
                        dvv[(p * sl + j) * dv + d] += probs[j] * go[d];
                    }
                    for d in 0..dk {
                        dq[(p * tl + t) * dk + d] += ds * k[(p * sl + j) * dk + d] as f64 * scale as f64;
                        dkk[(p * sl + j) * dk + d] += ds * qs[d];
                    }
                }
            }
        }
        [out, dq, dkk, dvv]
    }

    fn max_error(got: &[f32], want: &[f64]) -> f64 {
        assert_eq!(got.len(), want.len());
        got.iter().zip(want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max)
    }

    #[test]
    fn forward_and_backward_match_float64_attention_on_every_instruction_set() {
        // Lengths below, at and above a lane multiple; unequal query/key lengths; widths that pad
        // to 4, 8 and 16; the seed's shape.
        for (source_len, query_len, key_dim, value_dim) in
            [(7, 5, 4, 4), (16, 16, 2, 3), (37, 19, 5, 2), (20, 33, 3, 9), (9, 17, 16, 12), (136, 136, 4, 4)]
        {
            let dims = Dims { batch: 2, heads: 3, query_len, source_len, key_dim, value_dim };
            // Pair-major inputs for the reference, heads-last for the kernel.
            let q = values(6 * query_len * key_dim, 1);
            let k = values(6 * source_len * key_dim, 2);
            let v = values(6 * source_len * value_dim, 3);
            let g = values(6 * query_len * value_dim, 4);
            let scale = 1.0 / (key_dim as f32).sqrt();
            let last = |x: &[f32], len: usize, width: usize| heads_last(x, dims, len, width);
            let last64 = |x: &[f64], len: usize, width: usize| heads_last(x, dims, len, width);
            let [out, dq, dk, dv] = reference(&q, &k, &v, &g, dims, scale);
            let (out, dq) = (last64(&out, query_len, value_dim), last64(&dq, query_len, key_dim));
            let (dk, dv) = (last64(&dk, source_len, key_dim), last64(&dv, source_len, value_dim));
            for isa in Isa::available() {
                let (q, k, v) = (last(&q, query_len, key_dim), last(&k, source_len, key_dim), last(&v, source_len, value_dim));
                let (output, saved) = forward_with(isa, q, k, v, dims, scale);
                let grads = backward_with(isa, &saved, &last(&g, query_len, value_dim));
                for (name, got, want) in
                    [("output", &output, &out), ("dq", &grads.query, &dq), ("dk", &grads.key, &dk), ("dv", &grads.value, &dv)]
                {
                    let error = max_error(got, want);
                    assert!(error < 4e-6, "{isa:?}: {name} at {dims:?}: error {error}");
                }
            }
        }
    }

    #[test]
    fn empty_shapes_give_right_sized_zeros() {
        for (batch, query_len, source_len) in [(0, 3, 4), (2, 0, 4), (2, 3, 0)] {
            let dims = Dims { batch, heads: 2, query_len, source_len, key_dim: 4, value_dim: 3 };
            let q = vec![1.0; batch * 2 * query_len * 4];
            let k = vec![1.0; batch * 2 * source_len * 4];
            let v = vec![1.0; batch * 2 * source_len * 3];
            let (output, saved) = forward(q.clone(), k.clone(), v.clone(), dims, 0.5);
            assert_eq!(output, vec![0.0; batch * 2 * query_len * 3], "{dims:?}");
            let grads = backward(&saved, &output);
            assert_eq!((grads.query.len(), grads.key.len(), grads.value.len()), (q.len(), k.len(), v.len()));
            assert!(grads.query.iter().chain(&grads.key).chain(&grads.value).all(|&g| g == 0.0));
        }
    }

    #[test]
    fn widths_beyond_the_largest_are_refused() {
        let dims = Dims { batch: 1, heads: 1, query_len: 1, source_len: 1, key_dim: 129, value_dim: 4 };
        assert_eq!(dims.width(), None);
        assert_eq!(Dims { key_dim: 5, value_dim: 3, ..dims }.width(), Some(8));
    }
}
