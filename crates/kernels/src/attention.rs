//! Fused scaled dot-product attention on host memory: forward and backward, never
//! materialising the `[B, h, T, S]` score tensor, for any head width and any boolean mask.
//!
//! For one (batch, head) pair, with `q̃ = scale · q` (the query is scaled before the product, as
//! Keras and torch do) and `A_t` the keys query row `t` may attend ([`Mask`]), the forward pass is
//!
//! ```text
//! s_j = q̃_t · k_j  (j ∈ A_t)     m_t = max_j s_j     l_t = Σ_j exp(s_j - m_t)
//! p_j = exp(s_j - m_t) / l_t     (0 for j ∉ A_t)      o_t = Σ_j p_j v_j
//! ```
//!
//! computed tile by tile with FlashAttention-2's online softmax (a running `m_t`, and `l_t` and
//! `o_t` rescaled whenever it grows), or, at heads of 4 features whose logits a bound keeps
//! small, against that bound in place of `m_t` (`bounded_shifts`: softmax is the same for any
//! shift, and no maximum needs taking). The backward pass recomputes `p_j` from the saved `m_t`
//! and `1 / l_t`, then
//!
//! ```text
//! dp_j = dO_t · v_j       D_t = dO_t · o_t       ds_j = p_j (dp_j - D_t)
//! dv_j = Σ_t p_j dO_t     dk_j = Σ_t ds_j q̃_t    dq_t = scale · Σ_j ds_j k_j
//! ```
//!
//! A row with no allowed key has `p = 0` (its output is zero, [`FullyMaskedRows::Zero`]), or,
//! with [`FullyMaskedRows::Uniform`], attends every key with weight `1 / S` and passes no gradient
//! to `q` or `k` (its logits are one constant, as in Keras).
//!
//! The layout puts 16 rows in the lanes of one vector ([`tile`]): query rows for the forward pass
//! and `dq`, keys for `dk` and `dv`. Every sum then runs inside a lane, no step needs a horizontal
//! reduction, and the two register-blocked products of [`tile`] run at the FMA units' rate for
//! any feature width. The work is split into tiles of 16 rows (or keys) over every (batch, head)
//! pair, walked one at a time or two together ([`Tiles`], measured per class of calls), and run
//! on rayon's pool; tiles the mask blocks entirely are skipped (half of a causal
//! call). Tensors come and go in the projections' own layout, `[B, L, h, d]` (heads last), so no
//! transpose is materialised around the kernel; self-attention's query, key and value may also
//! come side by side in the rows of one packed projection ([`forward_packed`], [`Layout`]). The kernels are compiled for AVX-512, AVX2 + FMA
//! and the baseline, and the best one the CPU has is picked at run time.

use std::mem::MaybeUninit;

use rayon::prelude::*;

use crate::buffer::Buffer;
use crate::dims::{Dims, FullyMaskedRows, Layout};
use crate::mask::{FULL, KeyBlock, Mask, RowBlock};
use crate::on_pool;
use crate::profile::Phase;
use crate::simd::{Isa, LANES, Lanes, Level, Portable, Vector, WeightedRows, exp_nonpositive, lanes, masked_exp};
use crate::tile::{lane_accumulate, lane_dots, lane_max};
use crate::tuning::{self, Pass, Tiles, Tuning};

/// Calls `$f::<V, NR>(args)` compiled for `$isa`: its vectors `V` and `NR` accumulator vectors
/// (as many as its registers hold beside the operands). The tiles' form, `$f::<T>(args)`, calls
/// `$f::<V, NR, NP, T>` for `T` tiles walked together, with `NP` rows (or features) a group
/// when they are two.
macro_rules! dispatch {
    ($isa:expr, $f:ident::<$tiles:literal>($($arg:expr),*)) => {
        match Isa::level($isa) {
            Level::Portable => $f::<Portable, 2, 2, $tiles>($($arg),*),
            // SAFETY: as below.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { compiled::avx2::$f::<$tiles>($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { compiled::avx512::$f::<$tiles>($($arg),*) },
        }
    };
    ($isa:expr, $f:ident($($arg:expr),*)) => {
        match Isa::level($isa) {
            Level::Portable => $f::<Portable, 2>($($arg),*),
            // SAFETY: every `Isa` is made by a constructor that checked the CPU for its
            // instruction set, which the function is compiled for.
            #[cfg(target_arch = "x86_64")]
            Level::Avx2 => unsafe { compiled::avx2::$f($($arg),*) },
            #[cfg(target_arch = "x86_64")]
            Level::Avx512 => unsafe { compiled::avx512::$f($($arg),*) },
        }
    };
}

/// `$body` with `$masked` and `$dropout` as the constants it names `$m` and `$d`: the per-key
/// loops then hold no branch on either.
macro_rules! with_flags {
    ($masked:expr, $dropout:expr, |$m:ident, $d:ident| $body:expr) => {
        match ($masked, $dropout) {
            (false, false) => {
                const $m: bool = false;
                const $d: bool = false;
                $body
            }
            (true, false) => {
                const $m: bool = true;
                const $d: bool = false;
                $body
            }
            (false, true) => {
                const $m: bool = false;
                const $d: bool = true;
                $body
            }
            (true, true) => {
                const $m: bool = true;
                const $d: bool = true;
                $body
            }
        }
    };
}

/// The tile functions compiled with wider instruction sets enabled.
#[cfg(target_arch = "x86_64")]
mod compiled {
    macro_rules! variant {
        ($name:ident, $features:literal, $vector:ident, $nr:literal, $np:literal) => {
            pub mod $name {
                use super::super::*;
                use crate::simd::$vector;

                #[target_feature(enable = $features)]
                pub unsafe fn forward_tile<const T: usize>(job: ForwardTile<T>, scratch: &mut Scratch) {
                    super::super::forward_tile::<$vector, $nr, $np, T>(job, scratch)
                }

                #[target_feature(enable = $features)]
                pub unsafe fn key_value_tile<const T: usize>(job: KeyValueTile<T>, scratch: &mut Scratch) {
                    super::super::key_value_tile::<$vector, $nr, $np, T>(job, scratch)
                }

                #[target_feature(enable = $features)]
                pub unsafe fn query_tile<const T: usize>(job: QueryTile<T>, scratch: &mut Scratch) {
                    super::super::query_tile::<$vector, $nr, $np, T>(job, scratch)
                }

                #[target_feature(enable = $features)]
                pub unsafe fn lane_block(x: &[f32], stride: usize, rows: usize, scale: f32, out: &mut [Lanes]) {
                    super::super::lane_block::<$vector, $nr>(x, stride, rows, scale, out)
                }

                #[target_feature(enable = $features)]
                pub unsafe fn row_block(tile: &[Lanes], rows: &mut [f32]) {
                    super::super::row_block::<$vector, $nr>(tile, rows)
                }

                /// The tile products alone, GFLOP/s on one thread ([`tile_product_rates`]).
                #[target_feature(enable = $features)]
                pub unsafe fn tile_product_rates(width: usize, rows: usize) -> ProductRates {
                    super::super::tile_product_rates::<$vector, $nr, $np>(width, rows)
                }

                /// Seconds per multiply-add of `NR` chains and of `NR / 2` ([`split_sums`]): the
                /// best of three interleaved rounds of about 0.1 ms each.
                #[target_feature(enable = $features)]
                pub unsafe fn multiply_add_times() -> (f64, f64) {
                    use crate::tile::multiply_add_time;
                    let mut best = (f64::INFINITY, f64::INFINITY);
                    for _ in 0..3 {
                        best.0 = best.0.min(multiply_add_time::<$vector, $nr>(50_000));
                        best.1 = best.1.min(multiply_add_time::<$vector, { $nr / 2 }>(50_000));
                    }
                    best
                }
            }
        };
    }
    // Two tiles of AVX-512 keep 2 x 8 sums in its 32 registers. AVX2's 16 registers hold 2 x 2
    // sums of two halves: an AVX2 vector already feeds each broadcast to two multiply-adds, so
    // two tiles save it no loads, and its measurement runs one tile only (`tiles_to_measure`).
    variant!(avx512, "avx512f,avx512dq,avx2,fma", Avx512, 8, 8);
    variant!(avx2, "avx2,fma", Avx2, 6, 2);
}

/// What the forward pass leaves for the backward pass: its inputs in the kernel's layouts and
/// per-row statistics.
#[derive(Debug, Clone)]
pub struct Forward {
    pub dims: Dims,
    pub scale: f32,
    mask: Mask,
    /// `[pairs, Tb, Wk]` lanes: the scaled query, 16 rows to a vector.
    query_t: Buffer<Lanes>,
    /// `[pairs, S', Wk]`
    key_rows: Buffer<f32>,
    /// `[pairs, S', Wv]`
    value_rows: Buffer<f32>,
    /// `[pairs, T', Wv]`: the attention output.
    output: Buffer<f32>,
    /// `[pairs, T']`: `m_t` (0 for a row without keys).
    row_max: Buffer<f32>,
    /// `[pairs, T']`: `1 / l_t` (0 for a row without keys).
    inv_row_sum: Buffer<f32>,
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

/// `softmax(scale · q kᵀ, mask) v` per (batch, head) pair. `query`: `[B, T, h, dk]`, `key`:
/// `[B, S, h, dk]`, `value`: `[B, S, h, dv]`. Returns the output `[B, T, h, dv]` and what the
/// backward pass needs.
pub fn forward(query: &[f32], key: &[f32], value: &[f32], dims: Dims, scale: f32, mask: Mask) -> (Vec<f32>, Forward) {
    forward_operands(Operand::heads_last([query, key, value], dims), dims, scale, mask)
}

/// [`forward`] of self-attention (`S = T`) whose query, key and value are the parts of one
/// packed projection `[B, T, h·(dk + dk + dv)]` ([`Layout::packed`]), read in place.
pub fn forward_packed(qkv: &[f32], dims: Dims, scale: f32, mask: Mask) -> (Vec<f32>, Forward) {
    assert_eq!(dims.query_len, dims.source_len, "a packed projection is self-attention");
    assert_eq!(qkv.len(), dims.batch * dims.query_len * Layout::packed_width(&dims), "packed projection length");
    forward_operands(Layout::packed(&dims).map(|layout| Operand { values: qkv, layout }), dims, scale, mask)
}

fn forward_operands(operands: [Operand; 3], dims: Dims, scale: f32, mask: Mask) -> (Vec<f32>, Forward) {
    let isa = Isa::best();
    let (output, saved, _) = on_pool(Phase::AttentionForward, || {
        tuning::with_tiles(Pass::Forward, isa, dims, mask.causal, |tiles| {
            forward_with(isa, tiles, Tasks::of(dims), operands, dims, scale, mask, false)
        })
    });
    (output, saved)
}

/// One input of a call, `[B, len, h, w]` as `layout` places it in `values`.
#[derive(Clone, Copy)]
struct Operand<'a> {
    values: &'a [f32],
    layout: Layout,
}

impl<'a> Operand<'a> {
    /// The query `[B, T, h, dk]`, key `[B, S, h, dk]` and value `[B, S, h, dv]`, each heads last.
    fn heads_last([query, key, value]: [&'a [f32]; 3], dims: Dims) -> [Self; 3] {
        [(query, dims.key_dim), (key, dims.key_dim), (value, dims.value_dim)]
            .map(|(values, width)| Operand { values, layout: Layout::heads_last(&dims, width) })
    }
}

/// [`forward`] that also returns the probabilities `[B, h, T, S]` (before dropout): each tile
/// walks its keys a second time with its final `m_t` and `1 / l_t` and writes `p` row by row.
pub fn forward_with_probs(
    query: &[f32],
    key: &[f32],
    value: &[f32],
    dims: Dims,
    scale: f32,
    mask: Mask,
) -> (Vec<f32>, Vec<f32>) {
    let isa = Isa::best();
    let operands = Operand::heads_last([query, key, value], dims);
    let (output, _, probs) = on_pool(Phase::AttentionForward, || {
        tuning::with_tiles(Pass::ForwardWithProbs, isa, dims, mask.causal, |tiles| {
            forward_with(isa, tiles, Tasks::of(dims), operands, dims, scale, mask, true)
        })
    });
    (output, probs.expect("asked for"))
}

#[allow(clippy::too_many_arguments)]
fn forward_with(
    isa: Isa,
    tiles: Tiles,
    tasks: Tasks,
    [query, key, value]: [Operand; 3],
    dims: Dims,
    scale: f32,
    mask: Mask,
    with_probs: bool,
) -> (Vec<f32>, Forward, Option<Vec<f32>>) {
    let Dims { query_len, source_len, key_dim, value_dim, .. } = dims;
    let pairs = dims.pairs();
    for (name, operand, len, width) in [
        ("query", query, query_len, key_dim),
        ("key", key, source_len, key_dim),
        ("value", value, source_len, value_dim),
    ] {
        let span = operand.layout.span(&dims, len, width);
        assert!(operand.values.len() >= span, "{name} length {} below its span {span}", operand.values.len());
    }
    let (wk, wv, row_blocks) = (dims.key_width(), dims.value_width(), dims.row_blocks());
    let (padded_t, padded_s) = (dims.padded_query_len(), dims.padded_source_len());

    // Every element of these is written below (padding too), so none is zeroed first.
    let mut query_t = Buffer::overwritten(pairs * row_blocks * wk);
    let mut key_rows = Buffer::overwritten(pairs * padded_s * wk);
    let mut value_rows = Buffer::overwritten(pairs * padded_s * wv);
    // Per pair and key, each feature's largest magnitude up to it, for the bounded shifts: at
    // keys of 4 features where each row's allowed keys are a prefix only (empty otherwise), and
    // at the last key only where every row attends every key (no causal rule, no padding mask:
    // the others are not read). Not where the probabilities are returned: from the running
    // maximum a row with one allowed key has a probability of exactly 1 (`exp(0) / 1`), from a
    // bound `p (1 / p)`, 1 - 2^-24.
    let bounded = key_dim == FUSED_WIDTH && wk == FUSED_WIDTH && mask.allows_prefixes() && !with_probs;
    let mut key_prefix_max = Buffer::<KeyMax>::overwritten(if bounded { pairs * source_len } else { 0 });
    let every_key = !mask.is_trivial();

    let mut output = Buffer::overwritten(pairs * padded_t * wv);
    let mut row_max = Buffer::overwritten(pairs * padded_t);
    let mut inv_row_sum = Buffer::overwritten(pairs * padded_t);
    // `[pairs, T, S]`, split into the rows of each tile (the last tile of a pair may hold fewer).
    let mut probs = with_probs.then(|| vec![0.0; pairs * query_len * source_len]);
    let mut probs_tiles: Vec<Option<&mut [f32]>> = match probs.as_mut() {
        Some(probs) if !dims.is_empty() => probs
            .chunks_mut(query_len * source_len)
            .flat_map(|pair| pair.chunks_mut(LANES * source_len))
            .map(Some)
            .collect(),
        _ => (0..pairs * row_blocks).map(|_| None).collect(),
    };
    // Per pair, its tiles of 16 rows in groups of `tiles.count()` walked together.
    let group = tiles.count();
    let result = if tasks == Tasks::ByBatch && !dims.is_empty() {
        // One task per batch element: its pairs' layout changes, their tiles and its output rows
        // in one parallel region (four otherwise), each pair's keys and values still in cache
        // for its tiles.
        let layout = Layout::heads_last(&dims, value_dim);
        let heads = dims.heads;
        let mut prefix_chunks: Vec<&mut [KeyMax]> = match bounded {
            true => key_prefix_max.chunks_mut(heads * source_len).collect(),
            false => (0..dims.batch).map(|_| <&mut [KeyMax]>::default()).collect(),
        };
        let per_batch = (
            query_t.par_chunks_mut(heads * row_blocks * wk),
            key_rows.par_chunks_mut(heads * padded_s * wk),
            value_rows.par_chunks_mut(heads * padded_s * wv),
            output.par_chunks_mut(heads * padded_t * wv),
            row_max.par_chunks_mut(heads * padded_t),
            inv_row_sum.par_chunks_mut(heads * padded_t),
            probs_tiles.par_chunks_mut(heads * row_blocks),
            prefix_chunks.par_iter_mut(),
        );
        // SAFETY: `scatter_batch` writes every element of its batch's rows, and the batches'
        // rows cover the heads-last `[B, T, h, dv]`.
        unsafe {
            written(pairs * query_len * value_dim, |result| {
                let per_batch = (result.par_chunks_mut(query_len * layout.row_stride), per_batch).into_par_iter();
                per_batch.enumerate().for_each_init(
                    || Scratch::new(dims, isa),
                    |scratch,
                     (
                        batch,
                        (result, (query_t, key_rows, value_rows, output, row_max, inv_row_sum, probs, prefix)),
                    )| {
                        let pairs = query_t
                            .chunks_mut(row_blocks * wk)
                            .zip(key_rows.chunks_mut(padded_s * wk))
                            .zip(value_rows.chunks_mut(padded_s * wv))
                            .zip(output.chunks_mut(padded_t * wv))
                            .zip(row_max.chunks_mut(padded_t))
                            .zip(inv_row_sum.chunks_mut(padded_t))
                            .zip(probs.chunks_mut(row_blocks));
                        for (head, ((((((query_t, key_rows), value_rows), output), row_max), inv_row_sum), probs)) in
                            pairs.enumerate()
                        {
                            let pair = batch * heads + head;
                            let key_prefix_max =
                                prefix.get_mut(head * source_len..(head + 1) * source_len).unwrap_or_default();
                            pair_lanes(isa, query, dims, pair, query_len, key_dim, query_t, scale);
                            let prefix_max = (&mut *key_prefix_max, every_key);
                            pair_rows_packed(key, dims, pair, source_len, key_dim, wk, key_rows, prefix_max);
                            pair_rows_packed(
                                value,
                                dims,
                                pair,
                                source_len,
                                value_dim,
                                wv,
                                value_rows,
                                (&mut [], false),
                            );
                            let key_prefix_max = &*key_prefix_max;
                            let inputs = ForwardInputs {
                                dims,
                                query_t,
                                key_rows,
                                value_rows,
                                key_prefix_max,
                                mask: &mask,
                                pair,
                            };
                            for (first_block, outputs) in pair_groups((output, row_max, inv_row_sum, probs), group, wv)
                            {
                                inputs.run(isa, first_block, outputs, scratch);
                            }
                        }
                        scatter_batch(output, dims, query_len, wv, value_dim, layout, result);
                    },
                );
            })
        }
    } else {
        pack_lanes(isa, query, dims, query_len, key_dim, wk, &mut query_t, scale);
        pack_rows(key, dims, source_len, key_dim, padded_s, wk, &mut key_rows, (&mut key_prefix_max, every_key));
        pack_rows(value, dims, source_len, value_dim, padded_s, wv, &mut value_rows, (&mut [], false));
        let mut groups = Vec::with_capacity(pairs * row_blocks.div_ceil(group));
        if dims.is_empty() {
            // No key (or no row): every output and statistic is 0.
            [&mut output, &mut row_max, &mut inv_row_sum].into_iter().for_each(|buffer| buffer.fill(0.0));
        } else {
            let per_pair = output
                .chunks_mut(padded_t * wv)
                .zip(row_max.chunks_mut(padded_t))
                .zip(inv_row_sum.chunks_mut(padded_t))
                .zip(probs_tiles.chunks_mut(row_blocks));
            for (pair, (((output, row_max), inv_row_sum), probs)) in per_pair.enumerate() {
                let outputs = (output, row_max, inv_row_sum, probs);
                groups.extend(pair_groups(outputs, group, wv).map(|(first, outputs)| (pair, first, outputs)));
            }
        }
        groups.into_par_iter().with_min_len(TILES_PER_TASK / group).for_each_init(
            || Scratch::new(dims, isa),
            |scratch, (pair, first_block, outputs)| {
                let inputs = ForwardInputs {
                    dims,
                    query_t: &query_t[pair * row_blocks * wk..][..row_blocks * wk],
                    key_rows: &key_rows[pair * padded_s * wk..][..padded_s * wk],
                    value_rows: &value_rows[pair * padded_s * wv..][..padded_s * wv],
                    key_prefix_max: key_prefix_max.get(pair * source_len..(pair + 1) * source_len).unwrap_or_default(),
                    mask: &mask,
                    pair,
                };
                inputs.run(isa, first_block, outputs, scratch);
            },
        );
        heads_last(&output, dims, query_len, padded_t, wv, value_dim) // [B, T, h, dv]
    };
    drop(probs_tiles);
    (result, Forward { dims, scale, mask, query_t, key_rows, value_rows, output, row_max, inv_row_sum }, probs)
}

/// How a forward call splits its work into tasks ([`forward_with`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tasks {
    /// One per batch element: its pairs' layout changes, their tiles and its output rows, all in
    /// one parallel region, each pair's keys and values still in cache for its tiles.
    ByBatch,
    /// The layout changes first, then the tiles in groups, then the output rows: four parallel
    /// regions, but work for every thread at any batch size.
    ByGroup,
}

impl Tasks {
    /// [`Tasks::ByBatch`] where the batch gives every thread at least 8 batch elements, enough
    /// for the threads to finish together: between four regions the seed's forward pass (32
    /// batch elements, 2 threads) spent 5% of its time waking and parking threads.
    fn of(dims: Dims) -> Tasks {
        if dims.batch >= 8 * rayon::current_num_threads() { Tasks::ByBatch } else { Tasks::ByGroup }
    }
}

/// The gradients of `Σ output · output_grad` with respect to the forward pass's query, key and
/// value. `output_grad`: `[B, T, h, dv]`.
pub fn backward(saved: &Forward, output_grad: &[f32]) -> Gradients {
    backward_as(saved, output_grad, |padded| Gradients::heads_last(padded, saved.dims))
}

/// [`backward`] of [`forward_packed`]: the gradients of the query, key and value side by side in
/// one packed `[B, T, h·(dk + dk + dv)]`, as the projection that made them takes them.
pub fn backward_packed(saved: &Forward, output_grad: &[f32]) -> Vec<f32> {
    backward_as(saved, output_grad, |padded| packed_grads(padded, saved.dims))
}

impl Gradients {
    /// `[B, L, h, d]` each from the padded gradients by pair ([`backward_with`]).
    fn heads_last([query, key, value]: [Buffer<f32>; 3], dims: Dims) -> Self {
        let Dims { query_len, source_len, key_dim, value_dim, .. } = dims;
        Self {
            query: heads_last(&query, dims, query_len, dims.padded_query_len(), dims.key_width(), key_dim),
            key: heads_last(&key, dims, source_len, dims.padded_source_len(), key_dim, key_dim),
            value: heads_last(&value, dims, source_len, dims.padded_source_len(), value_dim, value_dim),
        }
    }
}

/// The padded gradients by pair ([`backward_with`]) in one packed `[B, T, h·(dk + dk + dv)]`.
fn packed_grads([query, key, value]: [Buffer<f32>; 3], dims: Dims) -> Vec<f32> {
    let Dims { query_len, key_dim, value_dim, .. } = dims;
    let [query_at, key_at, value_at] = Layout::packed(&dims);
    let padded = dims.padded_query_len();
    // SAFETY: the three parts, `h·dk`, `h·dk` and `h·dv` wide from the row's start
    // (`Layout::packed`), cover every row of the packed width, each written for every row and head.
    unsafe {
        written(dims.batch * query_len * Layout::packed_width(&dims), |out| {
            scatter_rows(&query, dims, query_len, padded, dims.key_width(), key_dim, query_at, out);
            scatter_rows(&key, dims, query_len, padded, key_dim, key_dim, key_at, out);
            scatter_rows(&value, dims, query_len, padded, value_dim, value_dim, value_at, out);
        })
    }
}

/// The backward pass on the pool, its padded gradients by pair ([`backward_with`]) laid out by
/// `layout` there too.
fn backward_as<R: Send>(saved: &Forward, output_grad: &[f32], layout: impl FnOnce([Buffer<f32>; 3]) -> R + Send) -> R {
    let (isa, dims) = (Isa::best(), saved.dims);
    on_pool(Phase::AttentionBackward, || {
        let padded = tuning::with_tiles(Pass::Backward, isa, dims, saved.mask.causal, |tiles| {
            backward_with(isa, tiles, saved, output_grad, fuse_query_grads(dims))
        });
        layout(padded)
    })
}

/// The gradients by pair, padded: `dq [pairs, T', Wk]`, `dk [pairs, S', dk]`, `dv [pairs, S',
/// dv]`. With `fused_dq`, `dq` is accumulated during the key-block walk ([`fuse_query_grads`]),
/// else by a pass of its own.
fn backward_with(isa: Isa, tiles: Tiles, saved: &Forward, output_grad: &[f32], fused_dq: bool) -> [Buffer<f32>; 3] {
    let dims = saved.dims;
    let Dims { query_len, key_dim, value_dim, .. } = dims;
    let pairs = dims.pairs();
    assert_eq!(output_grad.len(), pairs * query_len * value_dim, "output gradient length");
    let (wk, wv) = (dims.key_width(), dims.value_width());
    let (row_blocks, key_blocks) = (dims.row_blocks(), dims.key_blocks());
    let (padded_t, padded_s) = (dims.padded_query_len(), dims.padded_source_len());
    // Only `dq` in lanes is summed into; the tiles and layout changes write every element of
    // the others (padding too), so they are not zeroed first.
    let mut query_grad = Buffer::overwritten(pairs * padded_t * wk); // [pairs, T', Wk]
    let mut query_grad_t = Buffer::zeroed(if fused_dq { pairs * row_blocks * wk } else { 0 }); // [pairs, Tb, Wk] lanes
    let mut key_grad = Buffer::overwritten(pairs * padded_s * key_dim); // [pairs, S', dk]
    let mut value_grad = Buffer::overwritten(pairs * padded_s * value_dim); // [pairs, S', dv]

    if !dims.is_empty() {
        // The other orientation of each operand, and the output gradient in both.
        let mut grad_rows = Buffer::overwritten(pairs * padded_t * wv); // [pairs, T', Wv]
        let output_grad = Operand { values: output_grad, layout: Layout::heads_last(&dims, value_dim) };
        pack_rows(output_grad, dims, query_len, value_dim, padded_t, wv, &mut grad_rows, (&mut [], false));
        let mut query_rows = Buffer::overwritten(pairs * padded_t * wk); // [pairs, T', Wk]
        rows_from_lanes(isa, &saved.query_t, wk, &mut query_rows);
        let mut key_t = Buffer::overwritten(pairs * key_blocks * wk); // [pairs, Sb, Wk] lanes
        lanes_from_rows(isa, &saved.key_rows, wk, &mut key_t);
        let mut value_t = Buffer::overwritten(pairs * key_blocks * wv); // [pairs, Sb, Wv] lanes
        lanes_from_rows(isa, &saved.value_rows, wv, &mut value_t);
        let mut row_dot = Buffer::overwritten(pairs * padded_t); // [pairs, T']: D_t = dO_t · o_t
        row_dot
            .par_iter_mut()
            .zip(grad_rows.par_chunks(wv).zip(saved.output.par_chunks(wv)))
            .for_each(|(dot, (g, o))| *dot = g.iter().zip(o).map(|(g, o)| g * o).sum());
        let uniform_grad = uniform_value_grads(saved, &grad_rows); // [pairs, Wv]

        let inputs = KeyValueInputs {
            dims,
            key_t: &key_t,
            value_t: &value_t,
            key_rows: &saved.key_rows,
            query_rows: &query_rows,
            grad_rows: &grad_rows,
            row_max: &saved.row_max,
            inv_row_sum: &saved.inv_row_sum,
            row_dot: &row_dot,
            uniform_grad: uniform_grad.as_deref(),
            mask: &saved.mask,
        };
        // Per pair, its tiles of 16 keys (or query rows) in groups of `tiles.count()`.
        let group = tiles.count();
        if fused_dq {
            // One task per pair walks its key blocks in order, adding each group's dq.
            key_grad
                .par_chunks_mut(padded_s * key_dim)
                .zip(value_grad.par_chunks_mut(padded_s * value_dim))
                .zip(query_grad_t.par_chunks_mut(row_blocks * wk))
                .enumerate()
                .for_each_init(
                    || Scratch::new(dims, isa),
                    |scratch, (pair, ((key_grad, value_grad), query_grad))| {
                        let groups = key_grad
                            .chunks_mut(group * LANES * key_dim)
                            .zip(value_grad.chunks_mut(group * LANES * value_dim));
                        for (g, (key_grad, value_grad)) in groups.enumerate() {
                            let outputs = (key_grad, value_grad, Some(&mut *query_grad));
                            inputs.run(isa, pair, g * group, outputs, scratch);
                        }
                        // d(q̃)/dq = scale.
                        query_grad.iter_mut().for_each(|dq| *dq = lanes(|i| dq[i] * saved.scale));
                    },
                );
            rows_from_lanes(isa, &query_grad_t, wk, &mut query_grad);
        } else {
            let mut groups = Vec::with_capacity(pairs * key_blocks.div_ceil(group));
            let per_pair = key_grad.chunks_mut(padded_s * key_dim).zip(value_grad.chunks_mut(padded_s * value_dim));
            for (pair, (key_grad, value_grad)) in per_pair.enumerate() {
                let per_group =
                    key_grad.chunks_mut(group * LANES * key_dim).zip(value_grad.chunks_mut(group * LANES * value_dim));
                groups.extend(per_group.enumerate().map(|(g, grads)| (pair, g * group, grads)));
            }
            groups.into_par_iter().with_min_len(TILES_PER_TASK / group).for_each_init(
                || Scratch::new(dims, isa),
                |scratch, (pair, first_block, (key_grad, value_grad))| {
                    inputs.run(isa, pair, first_block, (key_grad, value_grad, None), scratch);
                },
            );
            // dq by a pass of its own, 16 query rows at a time.
            let mut grad_t = Buffer::overwritten(pairs * row_blocks * wv); // [pairs, Tb, Wv] lanes
            lanes_from_rows(isa, &grad_rows, wv, &mut grad_t);
            let query_inputs = QueryInputs { saved, grad_t: &grad_t, row_dot: &row_dot };
            let mut groups = Vec::with_capacity(pairs * row_blocks.div_ceil(group));
            for (pair, query_grad) in query_grad.chunks_mut(padded_t * wk).enumerate() {
                let per_group = query_grad.chunks_mut(group * LANES * wk).enumerate();
                groups.extend(per_group.map(|(g, dq)| (pair, g * group, dq)));
            }
            groups.into_par_iter().with_min_len(TILES_PER_TASK / group).for_each_init(
                || Scratch::new(dims, isa),
                |scratch, (pair, first_block, query_grad)| {
                    if query_grad.len() == 2 * LANES * wk {
                        dispatch!(isa, query_tile::<2>(query_inputs.job(pair, first_block, query_grad), scratch));
                    } else {
                        dispatch!(isa, query_tile::<1>(query_inputs.job(pair, first_block, query_grad), scratch));
                    }
                },
            );
        }
    } else {
        [&mut query_grad, &mut key_grad, &mut value_grad].into_iter().for_each(|buffer| buffer.fill(0.0));
    }
    [query_grad, key_grad, value_grad]
}

/// `[pairs, Wv]`: `Σ_t dO_t / S` over the rows of each pair that attend uniformly (no allowed key,
/// [`FullyMaskedRows::Uniform`]), the gradient each value row gets from them; `None` if no pair
/// has such a row.
fn uniform_value_grads(saved: &Forward, grad_rows: &[f32]) -> Option<Vec<f32>> {
    let dims = saved.dims;
    if saved.mask.rows != FullyMaskedRows::Uniform || saved.mask.is_trivial() {
        return None;
    }
    let (padded_t, wv) = (dims.padded_query_len(), dims.value_width());
    let uniform = |pair: usize, t: usize| saved.inv_row_sum[pair * padded_t + t] == 0.0;
    let mut sums = vec![0.0; dims.pairs() * wv];
    let mut any = false;
    for (pair, sum) in sums.chunks_exact_mut(wv).enumerate() {
        for t in (0..dims.query_len).filter(|&t| uniform(pair, t)) {
            any = true;
            let grad = &grad_rows[(pair * padded_t + t) * wv..][..wv];
            sum.iter_mut().zip(grad).for_each(|(s, g)| *s += g / dims.source_len as f32);
        }
    }
    any.then_some(sums)
}

/// Whether the tiles' weighted sums split narrow groups of features ([`lane_accumulate`]) on
/// the instruction set in use ([`Isa::best`]), for reports: measured on first use.
pub fn splits_narrow_sums() -> bool {
    split_sums(Isa::best())
}

/// Whether the tiles' weighted sums split narrow groups of features on `isa`
/// ([`lane_accumulate`]): measured on first use per instruction set; on the baseline (no FMA
/// to keep busy) only when [`tuning::SPLIT_VARIABLE`] asks for it.
fn split_sums(isa: Isa) -> bool {
    tuning::split_narrow_sums(isa.level(), || match isa.level() {
        Level::Portable => (1.0, 1.0),
        // SAFETY: every `Isa` is made by a constructor that checked the CPU for its
        // instruction set, which the function is compiled for.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { compiled::avx2::multiply_add_times() },
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => unsafe { compiled::avx512::multiply_add_times() },
    })
}

/// Per-task buffers, reused across the tiles a task runs.
/// The most tiles a task walks together ([`Tiles`]).
const MAX_TILES: usize = 2;

/// The fewest tiles of 16 rows one of rayon's tasks runs: a tile of a narrow head is a few
/// microseconds of work, and each task sets up a [`Scratch`] of its own. The groups of tiles
/// of all pairs are one flat list for the same reason: a parallel loop per pair nested in one
/// over pairs split the seed's forward pass into hundreds of tasks (1.52 ms against 1.22 ms for
/// the kernel alone, two tiles, 2 threads of an Intel Xeon).
const TILES_PER_TASK: usize = 4;

/// The tile products' rates on one thread, in GFLOP/s, with their operands in L1: the dot
/// products (`q kᵀ`) and the weighted sums (`P v`) of one tile and of two walked together, and
/// the FMA units' own rate (16 independent chains), for comparing the loops with the
/// processor's peak and with a model of it. Not part of the API (the `tile_rates` example).
#[doc(hidden)]
#[derive(Debug, Clone, Copy)]
pub struct ProductRates {
    pub dots: [f64; MAX_TILES],
    pub sums: [f64; MAX_TILES],
    pub fma_peak: f64,
}

/// [`ProductRates`] on `isa` for tiles of `width` features against `rows` rows: the best of
/// seven rounds of about a millisecond each.
#[doc(hidden)]
pub fn product_rates(isa: Isa, width: usize, rows: usize) -> ProductRates {
    match isa.level() {
        Level::Portable => tile_product_rates::<Portable, 2, 2>(width, rows),
        // SAFETY: every `Isa` is made by a constructor that checked the CPU for its
        // instruction set, which the function is compiled for.
        #[cfg(target_arch = "x86_64")]
        Level::Avx2 => unsafe { compiled::avx2::tile_product_rates(width, rows) },
        #[cfg(target_arch = "x86_64")]
        Level::Avx512 => unsafe { compiled::avx512::tile_product_rates(width, rows) },
    }
}

/// The best of seven rounds of about a millisecond of `$call`, in seconds per call. A macro, not
/// a closure: a closure does not inherit its caller's target features, and the products in one
/// would run without their instruction set.
macro_rules! best_seconds {
    ($call:expr) => {{
        let mut best = f64::INFINITY;
        for _ in 0..7 {
            let start = std::time::Instant::now();
            let mut calls = 0;
            while calls < 4 || start.elapsed().as_secs_f64() < 1e-3 {
                $call;
                calls += 1;
            }
            best = best.min(start.elapsed().as_secs_f64() / calls as f64);
        }
        best
    }};
}

#[inline(always)]
fn tile_product_rates<V: Vector, const NR: usize, const NP: usize>(width: usize, rows: usize) -> ProductRates {
    let tiles: [Vec<Lanes>; MAX_TILES] =
        std::array::from_fn(|t| (0..width).map(|d| lanes(|i| ((d + i + t) % 7) as f32 * 0.1)).collect());
    let data: Vec<f32> = (0..rows * width).map(|x| (x % 5) as f32 * 0.2).collect(); // [rows, width]
    let [mut first, mut second] = [vec![[0.0; LANES]; rows], vec![[0.0; LANES]; rows]]; // [rows] lanes
    let [mut sum_first, mut sum_second] = [vec![[0.0; LANES]; width], vec![[0.0; LANES]; width]]; // [width] lanes
    let flops = (2 * rows * width * LANES) as f64;
    let dots_1 = best_seconds!(dots::<V, NR, NP, 1>([&tiles[0]], &data, width, &mut [&mut first[..]]));
    let dots_2 = best_seconds!(dots::<V, NR, NP, 2>(
        [&tiles[0], &tiles[1]],
        &data,
        width,
        &mut [&mut first[..], &mut second[..]]
    ));
    let sums_1 = best_seconds!(accumulate::<V, NR, NP, 1>([&first], &data, width, &mut [&mut sum_first[..]], false));
    let sums_2 = best_seconds!(accumulate::<V, NR, NP, 2>(
        [&first, &second],
        &data,
        width,
        &mut [&mut sum_first[..], &mut sum_second[..]],
        false
    ));
    std::hint::black_box((&first, &second, &sum_first, &sum_second));
    let mut chain = f64::INFINITY;
    for _ in 0..3 {
        chain = chain.min(crate::tile::multiply_add_time::<V, 16>(2_000_000));
    }
    // A `Vector` is 16 lanes whatever its registers: 32 FLOPs a multiply-add.
    let vector_flops = (2 * LANES) as f64;
    ProductRates {
        dots: [flops / dots_1 / 1e9, 2.0 * flops / dots_2 / 1e9],
        sums: [flops / sums_1 / 1e9, 2.0 * flops / sums_2 / 1e9],
        fma_peak: vector_flops / chain / 1e9,
    }
}

/// Per-task buffers, reused across the tiles a task runs: [`MAX_TILES`] equal parts each, one
/// for each tile walked together ([`per_tile`]).
pub struct Scratch {
    /// Keys (or query rows) per step of one tile's walk ([`Tuning::step`]).
    step: usize,
    /// Whether [`lane_accumulate`] splits narrow groups of features ([`split_sums`]).
    split_sums: bool,
    /// `[step]` each: one step's scores (then probabilities, or their gradients).
    scores: Vec<Lanes>,
    /// `[step]` each: one step's `dp` (then `ds`).
    grads: Vec<Lanes>,
    /// `[step]` each: one step's mask bits, and its dropout keep bits.
    bits: Vec<u16>,
    keep: Vec<u16>,
    /// `[max(Wk, Wv)]` each, twice: accumulators of the tiles' outputs.
    first: Vec<Lanes>,
    second: Vec<Lanes>,
}

impl Scratch {
    fn new(dims: Dims, isa: Isa) -> Self {
        let width = dims.key_width().max(dims.value_width());
        let step = Tuning::get().step;
        Self {
            step,
            split_sums: split_sums(isa),
            scores: vec![[0.0; LANES]; MAX_TILES * step],
            grads: vec![[0.0; LANES]; MAX_TILES * step],
            bits: vec![FULL; MAX_TILES * step],
            keep: vec![FULL; MAX_TILES * step],
            first: vec![[0.0; LANES]; MAX_TILES * width],
            second: vec![[0.0; LANES]; MAX_TILES * width],
        }
    }

    /// The step of `tiles` tiles walked together: one tile's share of the L1 budget each (a
    /// multiple of 16, at most [`Scratch::step`]).
    fn step_of(&self, tiles: usize) -> usize {
        (self.step / tiles).next_multiple_of(LANES)
    }
}

/// What the forward tiles of one pair read.
struct ForwardInputs<'a> {
    dims: Dims,
    /// `[T'/16, Wk]` lanes: the pair's query tiles.
    query_t: &'a [Lanes],
    /// `[S', Wk]`, `[S', Wv]`: the pair's keys and values.
    key_rows: &'a [f32],
    value_rows: &'a [f32],
    /// `[S]` or empty: the keys' prefix maxima ([`bounded_shifts`]).
    key_prefix_max: &'a [KeyMax],
    mask: &'a Mask,
    pair: usize,
}

/// A group's outputs: `[blocks * 16, Wv]`, `[blocks * 16]` twice, and each tile's probabilities
/// (borrowed for `'p`, which the tiles take).
type ForwardOutputs<'a, 'b, 'p> = (&'a mut [f32], &'a mut [f32], &'a mut [f32], &'b mut [Option<&'p mut [f32]>]);

impl<'a> ForwardInputs<'a> {
    /// The group of tiles `first_block ..` whose outputs `outputs` holds (one or two), walked
    /// together.
    fn run(&self, isa: Isa, first_block: usize, outputs: ForwardOutputs<'_, '_, '_>, scratch: &mut Scratch) {
        if outputs.3.len() == 2 {
            dispatch!(isa, forward_tile::<2>(self.job(first_block, outputs), scratch));
        } else {
            dispatch!(isa, forward_tile::<1>(self.job(first_block, outputs), scratch));
        }
    }

    /// Tiles `first_block .. + T`, walked together.
    fn job<'b, 'p: 'b, const T: usize>(
        &self,
        first_block: usize,
        (output, row_max, inv_row_sum, probs): ForwardOutputs<'b, '_, 'p>,
    ) -> ForwardTile<'b, T>
    where
        'a: 'b,
    {
        let wk = self.dims.key_width();
        let wv = self.dims.value_width();
        let (mut output, mut row_max) = (output.chunks_exact_mut(LANES * wv), row_max.chunks_exact_mut(LANES));
        let mut inv_row_sum = inv_row_sum.chunks_exact_mut(LANES);
        let mut probs = probs.iter_mut();
        ForwardTile {
            query_t: std::array::from_fn(|t| &self.query_t[(first_block + t) * wk..][..wk]),
            key_rows: self.key_rows,
            value_rows: self.value_rows,
            key_prefix_max: self.key_prefix_max,
            mask: std::array::from_fn(|t| self.mask.row_block(&self.dims, self.pair, first_block + t)),
            rows: self.mask.rows,
            source_len: self.dims.source_len,
            output: std::array::from_fn(|_| output.next().expect("a tile's output")),
            row_max: std::array::from_fn(|_| row_max.next().expect("a tile's maxima")),
            inv_row_sum: std::array::from_fn(|_| inv_row_sum.next().expect("a tile's sums")),
            probs: std::array::from_fn(|_| probs.next().and_then(Option::take)),
        }
    }
}

/// One pair's outputs (`[T', Wv]`, `[T']` twice, each tile's probabilities) as groups of `group`
/// tiles: the first tile of each, and its outputs.
fn pair_groups<'a, 'b, 'p>(
    (output, row_max, inv_row_sum, probs): ForwardOutputs<'a, 'b, 'p>,
    group: usize,
    wv: usize,
) -> impl Iterator<Item = (usize, ForwardOutputs<'a, 'b, 'p>)> {
    let per_group = output
        .chunks_mut(group * LANES * wv)
        .zip(row_max.chunks_mut(group * LANES))
        .zip(inv_row_sum.chunks_mut(group * LANES))
        .zip(probs.chunks_mut(group));
    per_group
        .enumerate()
        .map(move |(g, (((output, row_max), inv_row_sum), probs))| (g * group, (output, row_max, inv_row_sum, probs)))
}

/// `T` forward tiles of one pair walked together: 16 query rows each against all the keys
/// they may attend.
pub struct ForwardTile<'a, const T: usize> {
    /// `[Wk]` lanes each
    query_t: [&'a [Lanes]; T],
    /// `[S', Wk]`
    key_rows: &'a [f32],
    /// `[S', Wv]`
    value_rows: &'a [f32],
    /// `[S]` or empty: each key feature's largest magnitude over the keys up to each
    /// ([`bounded_shifts`]).
    key_prefix_max: &'a [KeyMax],
    mask: [RowBlock<'a>; T],
    rows: FullyMaskedRows,
    source_len: usize,
    /// `[16, Wv]` each
    output: [&'a mut [f32]; T],
    /// `[16]` each
    row_max: [&'a mut [f32]; T],
    inv_row_sum: [&'a mut [f32]; T],
    /// `[rows, S]` (up to 16 rows, zeros): the probabilities, when asked for.
    probs: [Option<&'a mut [f32]>; T],
}

/// `max_j |k_jd|` for each of [`FUSED_WIDTH`] key features, over some of a pair's keys.
type KeyMax = [f32; FUSED_WIDTH];

/// The value width whose forward steps take their exponentials and weighted sum in one pass
/// ([`Vector::exp_weighted_rows`]): heads of 4 features, the question's.
const FUSED_WIDTH: usize = 4;

/// The forward pass of `T` tiles, `step` keys at a time ([`steps`]): the keys and values stream
/// past once for all of them, each element broadcast once for the `T` tiles.
#[inline(always)]
fn forward_tile<V: Vector, const NR: usize, const NP: usize, const T: usize>(
    mut job: ForwardTile<T>,
    scratch: &mut Scratch,
) {
    let wv = job.output[0].len() / LANES;
    // The contexts leave the scratch for the walk, which borrows the rest of it.
    let mut context_buffer = std::mem::take(&mut scratch.first);
    let mut contexts: [&mut [Lanes]; T] = per_tile(&mut context_buffer, wv);
    contexts.iter_mut().for_each(|context| context.fill([0.0; LANES]));
    // The keys past the last one a row may attend (padding, or the padded length) need no score:
    // stopping there spares the last step its masking (the seed's 136 keys are one step of 136,
    // not of 144 with 8 masked: 10-12% of its forward pass on one thread of an Intel Xeon).
    let (lo, hi) = joint_range(job.mask.map(|mask| mask.keys));
    let keys = (lo, hi.min(job.mask.iter().map(|mask| mask.key_end).max().unwrap_or(0)));
    // Per tile, each row's maximum (-inf for a row that saw no allowed key) and sum.
    let (max, sum) = match bounded_shifts::<V, T>(&job) {
        Some(shifts) => steps::<V, NR, NP, T, true>(&job, keys, shifts, scratch, &mut contexts),
        None => steps::<V, NR, NP, T, false>(&job, keys, [[0.0; LANES]; T], scratch, &mut contexts),
    };
    // A row that saw no allowed key keeps max = -inf: zero attention, or uniform.
    let mut uniform_value: Option<Vec<f32>> = None;
    for t in 0..T {
        for i in 0..LANES {
            let row = &mut job.output[t][i * wv..][..wv];
            if max[t][i] == f32::NEG_INFINITY {
                job.row_max[t][i] = 0.0;
                job.inv_row_sum[t][i] = 0.0;
                match job.rows {
                    FullyMaskedRows::Zero => row.fill(0.0),
                    FullyMaskedRows::Uniform => {
                        let mean = uniform_value.get_or_insert_with(|| mean_row(job.value_rows, wv, job.source_len));
                        row.copy_from_slice(mean);
                    }
                }
            } else {
                let inv = 1.0 / sum[t][i];
                job.row_max[t][i] = max[t][i];
                job.inv_row_sum[t][i] = inv;
                let scaled = inv * job.mask[t].dropout_scale();
                row.iter_mut().zip(contexts[t].iter()).for_each(|(o, c)| *o = c[i] * scaled);
            }
        }
    }
    for t in 0..T {
        if let Some(probs) = job.probs[t].take() {
            let (max, inv) = (lanes(|i| job.row_max[t][i]), lanes(|i| job.inv_row_sum[t][i]));
            let tile = (job.query_t[t], &job.mask[t]);
            write_probs::<V, NR>(tile, job.key_rows, job.rows, job.source_len, max, inv, scratch, probs);
        }
    }
    scratch.first = context_buffer;
}

/// The steps of `T` tiles: per step the logits, the shift each row's exponentials are taken
/// against, the exponentials and their weighted sum. Without `BOUNDED` the shift is the running
/// maximum of FlashAttention-2's online softmax (what the rows summed so far rescaled where it
/// grew); with it, `shifts` from [`bounded_shifts`], fixed, so no maximum is taken and the
/// exponentials need no clamp. Returns each row's shift (-inf for a row that saw no allowed key)
/// and sum.
#[inline(always)]
fn steps<V: Vector, const NR: usize, const NP: usize, const T: usize, const BOUNDED: bool>(
    job: &ForwardTile<T>,
    (lo, hi): (usize, usize),
    shifts: [Lanes; T],
    scratch: &mut Scratch,
    contexts: &mut [&mut [Lanes]; T],
) -> ([Lanes; T], [Lanes; T]) {
    let step = scratch.step_of(T);
    let (wk, wv) = (job.query_t[0].len(), job.output[0].len() / LANES);
    let mut max = [[f32::NEG_INFINITY; LANES]; T];
    let mut sum = [[0.0; LANES]; T];
    for start in (lo..hi).step_by(step) {
        let n = step.min(hi - start);
        let mut scores: [&mut [Lanes]; T] = per_tile(&mut scratch.scores, n);
        let bias = job.mask.map(|mask| mask.bias);
        step_scores::<V, NR, NP, T>(job.query_t, &job.key_rows[start * wk..], bias, start, &mut scores);
        let bits: [&mut [u16]; T] = per_tile(&mut scratch.bits, n);
        let keep: [&mut [u16]; T] = per_tile(&mut scratch.keep, n);
        for t in 0..T {
            let (mask, scores, bits) = (&job.mask[t], &mut *scores[t], &mut *bits[t]);
            let masked = !mask.all_allowed(start, start + n);
            if masked {
                mask_scores::<V>(scores, bits, |j| mask.bits(start + j));
            }
            if BOUNDED {
                // The rows with an allowed key in the step take their shift.
                let seen = if masked { bits.iter().fold(0, |seen, &b| seen | b) } else { FULL };
                max[t] = lanes(|i| if seen >> i & 1 == 1 { shifts[t][i] } else { max[t][i] });
            } else {
                let new_max = lane_max::<V>(scores, max[t]);
                if new_max != max[t] {
                    // Rows whose maximum grew rescale what they have summed so far.
                    let mut alpha = [0.0; LANES];
                    exp_nonpositive(V::load(&lanes(|i| max[t][i] - reference(new_max[i])))).store(&mut alpha);
                    sum[t] = lanes(|i| sum[t][i] * alpha[i]);
                    contexts[t].iter_mut().for_each(|c| *c = lanes(|i| c[i] * alpha[i]));
                    max[t] = new_max;
                }
            }
            let shift = V::load(&lanes(|i| reference(max[t][i])));
            let dropout = mask.keep_bits(start, keep[t]);
            // Heads of `FUSED_WIDTH` features add the step to their context here.
            let fused = (wv == FUSED_WIDTH).then(|| (&job.value_rows[start * wv..], &mut *contexts[t]));
            let step_sum = with_flags!(masked, dropout, |MASKED, DROPOUT| {
                step_exponentials::<V, MASKED, DROPOUT, BOUNDED>(scores, shift, bits, keep[t], fused)
            });
            V::load(&sum[t]).add(step_sum).store(&mut sum[t]);
        }
        if wv != FUSED_WIDTH {
            let weights = scores.each_ref().map(|scores| &scores[..]);
            accumulate::<V, NR, NP, T>(weights, &job.value_rows[start * wv..], wv, contexts, scratch.split_sums);
        }
    }
    (max, sum)
}

/// The farthest below 0 a logit minus its bounded shift may lie ([`bounded_shifts`]): the
/// exponentials then stay above `exp(-16)` (about 1e-7), far from the clamp and from denormal
/// products, and a logit's rounding against the shift costs at most 16 ulp of 1.
pub(crate) const BOUNDED_GAP: f32 = 16.0;

/// Shifts that bound the logits of `T` tiles from above, where the tiles allow them: queries and
/// keys of [`FUSED_WIDTH`] features, no float mask, each row's allowed keys a prefix of the keys
/// (no mask, the causal rule, a key-padding mask: [`RowBlock::prefix_ends`]), and every logit within
/// [`BOUNDED_GAP`] of its shift. Softmax is the same for any shift; the running maximum is only
/// one that keeps every exponential at most 1. By Hölder's inequality `|q̃_t · k_j| <= Σ_d |q̃_td|
/// M_td` with `M_td = max_j |k_jd|` over the keys row `t` may attend (a prefix maximum,
/// [`ForwardTile::key_prefix_max`]); with that sum (a little above it, for rounding, and up to
/// 0.087 more where the instruction set's exponential folds the shift in,
/// [`Vector::bounded_shift`]) as row `t`'s shift, every logit minus its shift lies in
/// `[-BOUNDED_GAP - 0.087, 0]`, and its exponential above `exp(-16.1)`: all normal floats,
/// normalised by their sum as before. Only keys a
/// row attends enter its shift, so a masked key changes no bit of the row's output, as with the
/// running maximum.
#[inline(always)]
fn bounded_shifts<V: Vector, const T: usize>(job: &ForwardTile<T>) -> Option<[Lanes; T]> {
    // `forward_with` packs the prefix maxima only for calls that may take the bound: keys of
    // `FUSED_WIDTH` features, no float mask, no explicit mask but one of prefixes, no
    // probabilities returned.
    if job.key_prefix_max.is_empty() {
        return None;
    }
    let mut shifts = [[0.0; LANES]; T];
    for ((shift, query), mask) in shifts.iter_mut().zip(job.query_t).zip(&job.mask) {
        let ends = mask.prefix_ends()?;
        // Each row's key maxima (none for a row without keys); one for all rows without the
        // causal rule (gathered lane by lane for every tile, they cost the seed 3%).
        let maxima_at = |end: usize| end.checked_sub(1).map_or([0.0; FUSED_WIDTH], |last| job.key_prefix_max[last]);
        let maxima: [Lanes; FUSED_WIDTH] = if ends.iter().all(|&end| end == ends[0]) {
            maxima_at(ends[0]).map(|m| [m; LANES])
        } else if let Some(rows) = consecutive(&ends).and_then(|first| job.key_prefix_max.get(first - 1..first + 15)) {
            // The causal rule's rows end one key apart: 16 prefix maxima in a row.
            std::array::from_fn(|d| lanes(|i| rows[i][d]))
        } else {
            std::array::from_fn(|d| lanes(|i| maxima_at(ends[i])[d]))
        };
        *shift = tile_shift::<V>(query, &maxima)?;
    }
    Some(shifts)
}

/// `ends[0]` where the ends rise by one lane by lane from at least 1 (and the 16 prefix maxima
/// they read follow one another).
#[inline(always)]
fn consecutive(ends: &[usize; LANES]) -> Option<usize> {
    let first = ends[0];
    (first >= 1 && ends.iter().enumerate().all(|(i, &end)| end == first + i)).then_some(first)
}

/// One tile's shifts for [`bounded_shifts`]: `Σ_d |q̃_td| M_td` per row (`maxima[d]` holding
/// `M_td` in row `t`'s lane), if every row's is within half of [`BOUNDED_GAP`].
#[inline(always)]
fn tile_shift<V: Vector>(query: &[Lanes], maxima: &[Lanes; FUSED_WIDTH]) -> Option<Lanes> {
    let mut bound = V::zero();
    for (q, m) in query.iter().zip(maxima) {
        let q = V::load(q);
        bound = q.max(V::zero().sub(q)).mul_add(V::load(m), bound);
    }
    // Rounding moves a logit and the bound by a few ulp of the bound: 2^-12 covers both.
    let bound = bound.mul(V::splat(1.0 + 1.0 / 4096.0));
    let (mut bounds, mut shift) = ([0.0; LANES], [0.0; LANES]);
    bound.store(&mut bounds);
    // The shift this instruction set's exponential takes best, at most 0.087 above the bound.
    V::bounded_shift(bound).store(&mut shift);
    // (False for NaN and infinities too: those take the online softmax.)
    bounds.iter().all(|&bound| 2.0 * bound <= BOUNDED_GAP).then_some(shift)
}

/// One tile's exponentials of a step ([`exponentials`]), or with `fused` (the step's value rows
/// and the tile's context, for heads of [`FUSED_WIDTH`] features) the exponentials and their
/// weighted sum in one pass ([`Vector::exp_weighted_rows`]): there a pass of its own would be
/// `FUSED_WIDTH` chains of multiply-adds, too few to keep two FMA ports busy. Returns the sum.
#[inline(always)]
fn step_exponentials<V: Vector, const MASKED: bool, const DROPOUT: bool, const BOUNDED: bool>(
    scores: &mut [Lanes],
    shift: V,
    bits: &[u16],
    keep: &[u16],
    fused: Option<(&[f32], &mut [Lanes])>,
) -> V {
    match fused {
        Some((values, context)) => {
            let rows = WeightedRows { scores, bits, keep, values, stride: FUSED_WIDTH };
            V::exp_weighted_rows::<FUSED_WIDTH, MASKED, DROPOUT, BOUNDED>(rows, shift, context)
        }
        None => exponentials::<V, MASKED, DROPOUT>(scores, shift, bits, keep),
    }
}

/// `scores[j] = exp(scores[j] - shift)`, zero where `MASKED` and `bits[j]` blocks a lane, also
/// where `DROPOUT` and `keep[j]` drops it (after the sum: dropped entries still count in the
/// normalising sum); returns the sum. Two running sums: an add waits 4 cycles for the one
/// before, about as long as the two FMA ports take for a row's other instructions. The flags are
/// constants so that the loop holds no branch (a branch takes an FMA port's slot on Intel).
#[inline(always)]
fn exponentials<V: Vector, const MASKED: bool, const DROPOUT: bool>(
    scores: &mut [Lanes],
    shift: V,
    bits: &[u16],
    keep: &[u16],
) -> V {
    let (bits, keep) = (&bits[..scores.len()], &keep[..scores.len()]);
    let mut sums = [V::zero(); 2];
    let whole = scores.len() / 2 * 2;
    for (pair, two) in scores[..whole].chunks_exact_mut(2).enumerate() {
        let [first, second] = two else { unreachable!("chunks of 2") };
        let j = 2 * pair;
        sums[0] = sums[0].add(exponential::<V, MASKED, DROPOUT>(first, shift, bits[j], keep[j]));
        sums[1] = sums[1].add(exponential::<V, MASKED, DROPOUT>(second, shift, bits[j + 1], keep[j + 1]));
    }
    if let Some(s) = scores.get_mut(whole) {
        sums[0] = sums[0].add(exponential::<V, MASKED, DROPOUT>(s, shift, bits[whole], keep[whole]));
    }
    sums[0].add(sums[1])
}

/// One row of [`exponentials`]: stores the probability kept after dropout and returns the one
/// the sum counts. (A function, not a closure: a closure does not inherit the caller's target
/// features, `tile.rs`.)
#[inline(always)]
fn exponential<V: Vector, const MASKED: bool, const DROPOUT: bool>(s: &mut Lanes, shift: V, bits: u16, keep: u16) -> V {
    let (counted, kept) = masked_exp::<V, MASKED, DROPOUT>(s, shift, bits, keep);
    kept.store(s);
    counted
}

/// The first `len` elements of each of the first `T` parts of `buffer`, which holds
/// [`MAX_TILES`] equal parts: one tile's share of a scratch buffer each.
#[inline(always)]
fn per_tile<X, const T: usize>(buffer: &mut [X], len: usize) -> [&mut [X]; T] {
    let mut parts = buffer.chunks_exact_mut(buffer.len() / MAX_TILES);
    std::array::from_fn(|_| &mut parts.next().expect("scratch for every tile")[..len])
}

/// The range `[lo, hi)` (rows or keys) that covers every tile's non-empty range: the tiles walk
/// it together, and each masks what lies outside its own.
#[inline(always)]
fn joint_range<const T: usize>(ranges: [(usize, usize); T]) -> (usize, usize) {
    ranges.into_iter().filter(|(lo, hi)| lo < hi).fold((usize::MAX, 0), |(lo, hi), (l, h)| (lo.min(l), hi.max(h)))
}

/// The probabilities of one tile's rows, `p = exp(s - m_t) / l_t` from the final row statistics:
/// the scores of every key the rows may attend again, 16 keys at a time transposed into rows.
/// Rows without an allowed key (`1 / l_t = 0`) are zero, or `1 / S` with [`FullyMaskedRows::Uniform`].
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn write_probs<V: Vector, const NR: usize>(
    (query_t, mask): (&[Lanes], &RowBlock),
    key_rows: &[f32],
    rows: FullyMaskedRows,
    source_len: usize,
    max: Lanes,
    inv: Lanes,
    scratch: &mut Scratch,
    probs: &mut [f32], // [rows, S], zeros
) {
    let step = scratch.step;
    let (shift, scale) = (V::load(&max), V::load(&inv));
    let (lo, hi) = mask.keys;
    for start in (lo..hi).step_by(step) {
        let n = step.min(hi - start);
        let mut scores: [&mut [Lanes]; 1] = per_tile(&mut scratch.scores, n);
        step_scores::<V, NR, NR, 1>([query_t], &key_rows[start * query_t.len()..], [mask.bias], start, &mut scores);
        let [scores] = scores;
        let masked = !mask.all_allowed(start, start + n);
        for (j, s) in scores.iter_mut().enumerate() {
            let mut p = V::load(s).sub(shift).exp_nonpositive().mul(scale);
            if masked {
                p = p.keep(mask.bits(start + j));
            }
            p.store(s);
        }
        for (block, keys) in scores.chunks_exact(LANES).enumerate() {
            let first = start + block * LANES;
            let width = LANES.min(source_len.saturating_sub(first));
            let by_row = V::transpose(keys.try_into().expect("16 keys")); // [16 rows] lanes of 16 keys
            for (row, p) in probs.chunks_exact_mut(source_len).zip(&by_row) {
                row[first..first + width].copy_from_slice(&p[..width]);
            }
        }
    }
    if rows == FullyMaskedRows::Uniform {
        for (row, _) in probs.chunks_exact_mut(source_len).zip(inv).filter(|(_, inv)| *inv == 0.0) {
            row.fill(1.0 / source_len as f32);
        }
    }
}

/// The logits of one step for `T` tiles: `scores[t][j] = tiles[t] · rows[j]` (tiles of 16
/// lanes against `scores[t].len()` rows of their width), plus the float mask's `bias[t][start +
/// j]` where there is one.
#[inline(always)]
fn step_scores<V: Vector, const NR: usize, const NP: usize, const T: usize>(
    tiles: [&[Lanes]; T],
    rows: &[f32],
    bias: [Option<&[Lanes]>; T],
    start: usize,
    scores: &mut [&mut [Lanes]; T],
) {
    dots::<V, NR, NP, T>(tiles, rows, tiles[0].len(), scores);
    for (scores, bias) in scores.iter_mut().zip(bias) {
        if let Some(bias) = bias {
            for (s, b) in scores.iter_mut().zip(&bias[start..]) {
                V::load(s).add(V::load(b)).store(s);
            }
        }
    }
}

/// [`lane_dots`] of `T` tiles against contiguous rows of `width`, `NR` rows a group for one
/// tile and `NP` for two.
#[inline(always)]
fn dots<V: Vector, const NR: usize, const NP: usize, const T: usize>(
    tiles: [&[Lanes]; T],
    rows: &[f32],
    width: usize,
    out: &mut [&mut [Lanes]; T],
) {
    let out = out.each_mut().map(|out| &mut **out);
    if T == 1 {
        lane_dots::<V, NR, T>(tiles, rows, width, 1, out);
    } else {
        lane_dots::<V, NP, T>(tiles, rows, width, 1, out);
    }
}

/// [`lane_accumulate`] of `T` tiles, `NR` features a group for one tile and `NP` for two.
#[inline(always)]
fn accumulate<V: Vector, const NR: usize, const NP: usize, const T: usize>(
    weights: [&[Lanes]; T],
    rows: &[f32],
    stride: usize,
    acc: &mut [&mut [Lanes]; T],
    split: bool,
) {
    let acc = acc.each_mut().map(|acc| &mut **acc);
    if T == 1 {
        lane_accumulate::<V, NR, T>(weights, rows, stride, acc, split);
    } else {
        lane_accumulate::<V, NP, T>(weights, rows, stride, acc, split);
    }
}

/// The row maximum the exponentials are taken against: 0 while a row has seen no allowed key.
#[inline(always)]
fn reference(max: f32) -> f32 {
    if max == f32::NEG_INFINITY { 0.0 } else { max }
}

/// Sets blocked lanes to `-inf` and records each row's bits, in vectors: the allowed lanes kept,
/// plus `-inf` in the others (lane by lane, the seed's masked forward pass took 2-7% longer).
#[inline(always)]
fn mask_scores<V: Vector>(scores: &mut [Lanes], bits: &mut [u16], bits_of: impl Fn(usize) -> u16) {
    let blocked = V::splat(f32::NEG_INFINITY);
    for (j, (s, b)) in scores.iter_mut().zip(bits.iter_mut()).enumerate() {
        *b = bits_of(j);
        if *b != FULL {
            V::load(s).keep(*b).add(blocked.keep(!*b)).store(s);
        }
    }
}

/// The mean of the first `len` rows of `[len', width]`.
fn mean_row(rows: &[f32], width: usize, len: usize) -> Vec<f32> {
    let mut mean = vec![0.0; width];
    for row in rows.chunks_exact(width).take(len) {
        mean.iter_mut().zip(row).for_each(|(m, x)| *m += x);
    }
    mean.iter_mut().for_each(|m| *m /= len as f32);
    mean
}

/// `T` `dk`/`dv` tiles of one pair walked together: 16 keys each against all the query rows
/// that may attend them.
pub struct KeyValueTile<'a, const T: usize> {
    /// `[Wk]` and `[Wv]` lanes each
    key_t: [&'a [Lanes]; T],
    value_t: [&'a [Lanes]; T],
    /// `[T', Wk]`, `[T', Wv]`
    query_rows: &'a [f32],
    grad_rows: &'a [f32],
    /// `[T']`
    row_max: &'a [f32],
    inv_row_sum: &'a [f32],
    row_dot: &'a [f32],
    /// `[Wv]`: the gradient every value row gets from uniformly attending rows.
    uniform_grad: Option<&'a [f32]>,
    mask: [KeyBlock<'a>; T],
    key_dim: usize,
    value_dim: usize,
    /// `[16 T, Wk]`: the tiles' keys, for `dq`.
    key_rows: &'a [f32],
    /// `[16, dk]`, `[16, dv]` each
    key_grad: [&'a mut [f32]; T],
    value_grad: [&'a mut [f32]; T],
    /// `[Tb, Wk]` lanes: the pair's `dq̃`, accumulated here when [`fuse_query_grads`].
    query_grad: Option<&'a mut [Lanes]>,
}

/// What every `dk`/`dv` tile reads, for all pairs.
struct KeyValueInputs<'a> {
    dims: Dims,
    key_t: &'a [Lanes],
    value_t: &'a [Lanes],
    key_rows: &'a [f32],
    query_rows: &'a [f32],
    grad_rows: &'a [f32],
    row_max: &'a [f32],
    inv_row_sum: &'a [f32],
    row_dot: &'a [f32],
    uniform_grad: Option<&'a [f32]>,
    mask: &'a Mask,
}

/// A group's gradients: `[blocks * 16, dk]`, `[blocks * 16, dv]`, and the pair's `dq̃` lanes
/// when [`fuse_query_grads`].
type KeyValueOutputs<'b> = (&'b mut [f32], &'b mut [f32], Option<&'b mut [Lanes]>);

impl<'a> KeyValueInputs<'a> {
    /// The key blocks `first_block ..` of pair `pair` that `outputs` holds (one or two), walked
    /// together, writing into `outputs`.
    fn run(&self, isa: Isa, pair: usize, first_block: usize, outputs: KeyValueOutputs, scratch: &mut Scratch) {
        if outputs.0.len() == 2 * LANES * self.dims.key_dim {
            dispatch!(isa, key_value_tile::<2>(self.job(pair, first_block, outputs), scratch));
        } else {
            dispatch!(isa, key_value_tile::<1>(self.job(pair, first_block, outputs), scratch));
        }
    }

    /// Key blocks `first_block .. + T` of pair `pair`, writing into the given gradients.
    fn job<'b, const T: usize>(
        &'b self,
        pair: usize,
        first_block: usize,
        (key_grad, value_grad, query_grad): KeyValueOutputs<'b>,
    ) -> KeyValueTile<'b, T> {
        let d = self.dims;
        let (wk, wv, key_blocks) = (d.key_width(), d.value_width(), d.key_blocks());
        let (padded_t, padded_s) = (d.padded_query_len(), d.padded_source_len());
        let tile = pair * key_blocks + first_block;
        let (mut key_grad, mut value_grad) =
            (key_grad.chunks_exact_mut(LANES * d.key_dim), value_grad.chunks_exact_mut(LANES * d.value_dim));
        KeyValueTile {
            key_t: std::array::from_fn(|t| &self.key_t[(tile + t) * wk..][..wk]),
            value_t: std::array::from_fn(|t| &self.value_t[(tile + t) * wv..][..wv]),
            key_rows: &self.key_rows[(pair * padded_s + first_block * LANES) * wk..][..T * LANES * wk],
            query_rows: &self.query_rows[pair * padded_t * wk..][..padded_t * wk],
            grad_rows: &self.grad_rows[pair * padded_t * wv..][..padded_t * wv],
            row_max: &self.row_max[pair * padded_t..][..padded_t],
            inv_row_sum: &self.inv_row_sum[pair * padded_t..][..padded_t],
            row_dot: &self.row_dot[pair * padded_t..][..padded_t],
            uniform_grad: self.uniform_grad.map(|u| &u[pair * wv..][..wv]),
            mask: std::array::from_fn(|t| self.mask.key_block(&d, pair, first_block + t)),
            key_dim: d.key_dim,
            value_dim: d.value_dim,
            key_grad: std::array::from_fn(|_| key_grad.next().expect("a tile's dk")),
            value_grad: std::array::from_fn(|_| value_grad.next().expect("a tile's dv")),
            query_grad,
        }
    }
}

/// `dk` and `dv` of `T` tiles, `step` query rows at a time: the query rows and the output
/// gradient stream past once for all of them, each element broadcast once for the `T` tiles.
#[inline(always)]
fn key_value_tile<V: Vector, const NR: usize, const NP: usize, const T: usize>(
    mut job: KeyValueTile<T>,
    scratch: &mut Scratch,
) {
    let step = scratch.step_of(T);
    let (wk, wv) = (job.key_t[0].len(), job.value_t[0].len());
    let mut key_acc: [&mut [Lanes]; T] = per_tile(&mut scratch.first, wk);
    let mut value_acc: [&mut [Lanes]; T] = per_tile(&mut scratch.second, wv);
    key_acc.iter_mut().chain(value_acc.iter_mut()).for_each(|acc| acc.fill([0.0; LANES]));
    let (lo, hi) = joint_range(job.mask.map(|mask| mask.queries));
    for start in (lo..hi).step_by(step) {
        let n = step.min(hi - start);
        let mut probs: [&mut [Lanes]; T] = per_tile(&mut scratch.scores, n);
        let mut grads: [&mut [Lanes]; T] = per_tile(&mut scratch.grads, n);
        let keep: [&mut [u16]; T] = per_tile(&mut scratch.keep, n);
        let bias = job.mask.map(|mask| mask.bias);
        step_scores::<V, NR, NP, T>(job.key_t, &job.query_rows[start * wk..], bias, start, &mut probs); // s_j
        dots::<V, NR, NP, T>(job.value_t, &job.grad_rows[start * wv..], wv, &mut grads); // dp_j
        for t in 0..T {
            let mask = &job.mask[t];
            // The rows past T (the last block of rows' padding) attend nothing: their p and ds
            // are 0, so that the real rows of the step can take the unmasked path.
            let real = mask.real_rows(start, n);
            let (probs, padding) = probs[t].split_at_mut(real);
            let (grads, grad_padding) = grads[t].split_at_mut(real);
            padding.iter_mut().chain(grad_padding).for_each(|x| *x = [0.0; LANES]);
            let masked = !mask.all_allowed(start, real);
            let dropout = mask.keep_bits(start, keep[t]);
            let rows = StepRows { start, row_max: job.row_max, inv_row_sum: job.inv_row_sum, row_dot: job.row_dot };
            with_flags!(masked, dropout, |MASKED, DROPOUT| {
                probability_grads::<V, MASKED, DROPOUT>(rows, mask, probs, grads, keep[t])
            });
        }
        let split = scratch.split_sums;
        let kept = probs.each_ref().map(|probs| &probs[..]);
        accumulate::<V, NR, NP, T>(kept, &job.grad_rows[start * wv..], wv, &mut value_acc, split);
        let ds = grads.each_ref().map(|grads| &grads[..]);
        accumulate::<V, NR, NP, T>(ds, &job.query_rows[start * wk..], wk, &mut key_acc, split);
        if let Some(query_grad) = job.query_grad.as_deref_mut() {
            // dq̃_t += Σ_i ds_ti k_i over the tiles' 16 T keys, 16 rows at a time: ds with the
            // rows in the lanes.
            let mut ds_t = [[0.0; LANES]; MAX_TILES * LANES]; // [16 T keys] lanes of 16 rows
            for block in 0..n / LANES {
                for t in 0..T {
                    let ds = grads[t][block * LANES..][..LANES].try_into().expect("16 rows");
                    ds_t[t * LANES..][..LANES].copy_from_slice(&V::transpose(ds));
                }
                let rows = (start / LANES + block) * wk;
                let dq = &mut query_grad[rows..][..wk];
                lane_accumulate::<V, NR, 1>([&ds_t[..T * LANES]], job.key_rows, wk, [dq], split);
            }
        }
    }
    for t in 0..T {
        if let Some(uniform) = job.uniform_grad {
            value_acc[t].iter_mut().zip(uniform).for_each(|(v, u)| *v = lanes(|i| v[i] + u));
        }
        store_rows(key_acc[t], job.key_dim, job.key_grad[t]);
        store_rows(value_acc[t], job.value_dim, job.value_grad[t]);
    }
}

/// The row statistics of one step of a key tile's walk, from row `start` on.
#[derive(Clone, Copy)]
struct StepRows<'a> {
    start: usize,
    /// `[T']` each: `m_t`, `1 / l_t` and `D_t`.
    row_max: &'a [f32],
    inv_row_sum: &'a [f32],
    row_dot: &'a [f32],
}

/// One step of rows against a block of 16 keys: from the scores `probs[r] = s` and `grads[r] =
/// dp`, `ds = p (dp - D)` into `grads` and the kept probabilities (after dropout, which `dv`
/// takes) into `probs`. The flags are constants so that the loop holds no branch, as in
/// [`exponentials`].
#[inline(always)]
fn probability_grads<V: Vector, const MASKED: bool, const DROPOUT: bool>(
    rows: StepRows,
    mask: &KeyBlock,
    probs: &mut [Lanes],
    grads: &mut [Lanes],
    keep: &[u16],
) {
    let scale = V::splat(mask.dropout_scale());
    for (r, ((p, g), &keep)) in probs.iter_mut().zip(grads).zip(keep).enumerate() {
        let row = rows.start + r;
        let (max, inv) = (V::splat(rows.row_max[row]), V::splat(rows.inv_row_sum[row]));
        let dot = V::splat(rows.row_dot[row]);
        let mut prob = V::load(p).sub(max).exp_nonpositive().mul(inv);
        if MASKED {
            prob = prob.keep(mask.bits(row));
        }
        let (mut dp, mut kept) = (V::load(g), prob);
        if DROPOUT {
            // dv takes the dropped probabilities, and dp of a dropped entry is 0.
            dp = dp.keep(keep).mul(scale);
            kept = prob.keep(keep).mul(scale);
        }
        prob.mul(dp.sub(dot)).store(g); // ds_j
        kept.store(p);
    }
}

/// Whether `dq` is accumulated during the key-block walk (`ds` transposed, times the block's 16
/// keys) instead of by a pass of its own, which recomputes the scores and `dp`: with enough
/// (batch, head) pairs to keep every thread busy, since each pair is then one task.
fn fuse_query_grads(dims: Dims) -> bool {
    dims.pairs() >= 2 * rayon::current_num_threads()
}

/// What every `dq` tile of the pass of its own reads, for all pairs.
struct QueryInputs<'a> {
    saved: &'a Forward,
    /// `[pairs, Tb, Wv]` lanes: the output gradient.
    grad_t: &'a [Lanes],
    /// `[pairs, T']`: `D_t`.
    row_dot: &'a [f32],
}

impl<'a> QueryInputs<'a> {
    /// Query blocks `first_block .. + T` of pair `pair`, writing into `query_grad` (`[16 T, Wk]`).
    fn job<'b, const T: usize>(
        &'b self,
        pair: usize,
        first_block: usize,
        query_grad: &'b mut [f32],
    ) -> QueryTile<'b, T> {
        let (saved, dims) = (self.saved, self.saved.dims);
        let (wk, wv, row_blocks) = (dims.key_width(), dims.value_width(), dims.row_blocks());
        let (padded_t, padded_s) = (dims.padded_query_len(), dims.padded_source_len());
        let tile = pair * row_blocks + first_block;
        let rows = |t: usize| pair * padded_t + (first_block + t) * LANES;
        let sixteen = |x: &[f32], t: usize| -> Lanes { x[rows(t)..][..LANES].try_into().expect("16 rows") };
        QueryTile {
            query_t: std::array::from_fn(|t| &saved.query_t[(tile + t) * wk..][..wk]),
            grad_t: std::array::from_fn(|t| &self.grad_t[(tile + t) * wv..][..wv]),
            key_rows: &saved.key_rows[pair * padded_s * wk..][..padded_s * wk],
            value_rows: &saved.value_rows[pair * padded_s * wv..][..padded_s * wv],
            row_max: std::array::from_fn(|t| sixteen(&saved.row_max, t)),
            inv_row_sum: std::array::from_fn(|t| sixteen(&saved.inv_row_sum, t)),
            row_dot: std::array::from_fn(|t| sixteen(self.row_dot, t)),
            mask: std::array::from_fn(|t| saved.mask.row_block(&dims, pair, first_block + t)),
            scale: saved.scale,
            query_grad,
        }
    }
}

/// `T` `dq` tiles of one pair walked together: 16 query rows each against all the keys they may
/// attend.
pub struct QueryTile<'a, const T: usize> {
    /// `[Wk]`, `[Wv]` lanes each
    query_t: [&'a [Lanes]; T],
    grad_t: [&'a [Lanes]; T],
    /// `[S', Wk]`, `[S', Wv]`
    key_rows: &'a [f32],
    value_rows: &'a [f32],
    row_max: [Lanes; T],
    inv_row_sum: [Lanes; T],
    row_dot: [Lanes; T],
    mask: [RowBlock<'a>; T],
    scale: f32,
    /// `[16 T, Wk]`
    query_grad: &'a mut [f32],
}

/// `dq` of `T` tiles, `step` keys at a time.
#[inline(always)]
fn query_tile<V: Vector, const NR: usize, const NP: usize, const T: usize>(job: QueryTile<T>, scratch: &mut Scratch) {
    let step = scratch.step_of(T);
    let (wk, wv) = (job.query_t[0].len(), job.grad_t[0].len());
    let mut query_acc: [&mut [Lanes]; T] = per_tile(&mut scratch.first, wk);
    query_acc.iter_mut().for_each(|acc| acc.fill([0.0; LANES]));
    let (lo, hi) = joint_range(job.mask.map(|mask| mask.keys));
    for start in (lo..hi).step_by(step) {
        let n = step.min(hi - start);
        let mut scores: [&mut [Lanes]; T] = per_tile(&mut scratch.scores, n);
        let mut grads: [&mut [Lanes]; T] = per_tile(&mut scratch.grads, n);
        let keep: [&mut [u16]; T] = per_tile(&mut scratch.keep, n);
        let bias = job.mask.map(|mask| mask.bias);
        step_scores::<V, NR, NP, T>(job.query_t, &job.key_rows[start * wk..], bias, start, &mut scores);
        dots::<V, NR, NP, T>(job.grad_t, &job.value_rows[start * wv..], wv, &mut grads); // dp_j
        for t in 0..T {
            let mask = &job.mask[t];
            let (max, inv, dot) = (V::load(&job.row_max[t]), V::load(&job.inv_row_sum[t]), V::load(&job.row_dot[t]));
            let scale = V::splat(mask.dropout_scale());
            let masked = !mask.all_allowed(start, start + n);
            let dropout = mask.keep_bits(start, keep[t]);
            for (j, (s, g)) in scores[t].iter().zip(grads[t].iter_mut()).enumerate() {
                let mut prob = V::load(s).sub(max).exp_nonpositive().mul(inv);
                if masked {
                    prob = prob.keep(mask.bits(start + j));
                }
                let mut dp = V::load(g);
                if dropout {
                    dp = dp.keep(keep[t][j]).mul(scale); // dp of the dropped probabilities
                }
                prob.mul(dp.sub(dot)).store(g); // ds_j
            }
        }
        let ds = grads.each_ref().map(|grads| &grads[..]);
        accumulate::<V, NR, NP, T>(ds, &job.key_rows[start * wk..], wk, &mut query_acc, scratch.split_sums);
    }
    for (t, query_acc) in query_acc.into_iter().enumerate() {
        // d(q̃)/dq = scale.
        query_acc.iter_mut().for_each(|q| *q = lanes(|i| q[i] * job.scale));
        store_rows(query_acc, wk, &mut job.query_grad[t * LANES * wk..][..LANES * wk]);
    }
}

/// Writes a tile (features x 16 lanes) as the rows `[n, width]` that `out` holds (`n <= 16`),
/// dropping padded features.
fn store_rows(tile: &[Lanes], width: usize, out: &mut [f32]) {
    for (i, row) in out.chunks_exact_mut(width).enumerate() {
        for (d, x) in row.iter_mut().enumerate() {
            *x = tile[d][i];
        }
    }
}

/// The `len` rows of one (batch, head) pair of an operand `[B, len, h, width]`.
fn pair_rows(x: Operand<'_>, dims: Dims, pair: usize, len: usize, width: usize) -> impl Iterator<Item = &[f32]> {
    let first = x.layout.row(&dims, pair, len, width, 0);
    x.values[first..].chunks(x.layout.row_stride).take(len).map(move |row| &row[..width])
}

/// `[B, len, h, w] -> [pairs, len', W]`, zero-padded rows and features (every element written).
/// With `prefix_max` (`[pairs, len]`, where `w = W =` [`FUSED_WIDTH`], and whether every row's
/// is asked), also the [`KeyMax`] over the rows up to each row (or up to the last), found as the
/// rows are copied.
#[allow(clippy::too_many_arguments)]
fn pack_rows(
    x: Operand,
    dims: Dims,
    len: usize,
    width: usize,
    padded_len: usize,
    padded_width: usize,
    out: &mut [f32],
    (prefix_max, every_row): (&mut [KeyMax], bool),
) {
    if padded_len == 0 || padded_width == 0 {
        return;
    }
    let per_pair = out.par_chunks_mut(padded_len * padded_width).enumerate();
    if prefix_max.is_empty() {
        let no_maxima = |(pair, out)| pair_rows_packed(x, dims, pair, len, width, padded_width, out, (&mut [], false));
        per_pair.for_each(no_maxima);
    } else {
        let per_pair = per_pair.zip(prefix_max.par_chunks_mut(len));
        per_pair.for_each(|((pair, out), prefix)| {
            pair_rows_packed(x, dims, pair, len, width, padded_width, out, (prefix, every_row))
        });
    }
}

/// [`pack_rows`] of one pair into its `[len', W]` (and its `[len]` prefix maxima, unless empty).
#[allow(clippy::too_many_arguments)]
fn pair_rows_packed(
    x: Operand,
    dims: Dims,
    pair: usize,
    len: usize,
    width: usize,
    padded_width: usize,
    out: &mut [f32],
    (prefix_max, every_row): (&mut [KeyMax], bool),
) {
    let (rows, padding) = out.split_at_mut(len * padded_width);
    let first = x.layout.row(&dims, pair, len, width, 0);
    padding.fill(0.0);
    match (width, padded_width, prefix_max.is_empty()) {
        (FUSED_WIDTH, FUSED_WIDTH, true) => copy_rows::<FUSED_WIDTH>(&x.values[first..], x.layout.row_stride, rows),
        (FUSED_WIDTH, FUSED_WIDTH, false) => match every_row {
            true => copy_rows_with_max::<true>(&x.values[first..], x.layout.row_stride, rows, prefix_max),
            false => copy_rows_with_max::<false>(&x.values[first..], x.layout.row_stride, rows, prefix_max),
        },
        _ => {
            assert!(prefix_max.is_empty(), "prefix maxima of rows of {FUSED_WIDTH} only");
            for (row, out) in pair_rows(x, dims, pair, len, width).zip(rows.chunks_exact_mut(padded_width)) {
                copy_row(&mut out[..width], row);
                out[width..].fill(0.0);
            }
        }
    }
}

/// The rows of `W` features `stride` apart in `src` into `out`, one after another, each moved as
/// one array. At heads of 4 features the general loop (an iterator of rows, a loop of elements
/// and a padding fill per row) took 136 µs of the seed's 2.1 ms forward pass to pack its keys
/// and values (one thread, AVX2, an Intel Xeon), this 63; at 8 and 16 features the two measured
/// the same.
#[inline(always)]
fn copy_rows<const W: usize>(src: &[f32], stride: usize, out: &mut [f32]) {
    for (r, out) in out.chunks_exact_mut(W).enumerate() {
        let row: &[f32; W] = src[r * stride..][..W].try_into().expect("a row of W");
        let out: &mut [f32; W] = out.try_into().expect("a row of W");
        *out = *row;
    }
}

/// [`copy_rows`] of key rows of [`FUSED_WIDTH`] features, with `prefix_max[r]` each feature's
/// largest magnitude over rows `0..=r`, for every row `r` where `EVERY_ROW`, else for the last
/// (a store a row cost the seed's forward pass 2-5%).
#[inline(always)]
fn copy_rows_with_max<const EVERY_ROW: bool>(src: &[f32], stride: usize, out: &mut [f32], prefix_max: &mut [KeyMax]) {
    let mut max = [0.0f32; FUSED_WIDTH];
    for (r, (out, prefix_max)) in out.chunks_exact_mut(FUSED_WIDTH).zip(prefix_max.iter_mut()).enumerate() {
        let row: &KeyMax = src[r * stride..][..FUSED_WIDTH].try_into().expect("a row of 4");
        let out: &mut KeyMax = out.try_into().expect("a row of 4");
        *out = *row;
        for (max, x) in max.iter_mut().zip(row) {
            // A comparison, not `f32::max`, whose NaN rule keeps it from vectorising.
            *max = if x.abs() > *max { x.abs() } else { *max };
        }
        if EVERY_ROW {
            *prefix_max = max;
        }
    }
    if let Some(last) = prefix_max.last_mut() {
        *last = max;
    }
}

/// `[B, len, h, w] -> [pairs, len'/16, W]` lanes (16 rows to a vector), times `scale`; padded
/// rows and features are 0 (every element written).
#[allow(clippy::too_many_arguments)]
fn pack_lanes(
    isa: Isa,
    x: Operand,
    dims: Dims,
    len: usize,
    width: usize,
    padded_width: usize,
    out: &mut [Lanes],
    scale: f32,
) {
    if len == 0 || padded_width == 0 {
        return;
    }
    let blocks = len.div_ceil(LANES);
    out.par_chunks_mut(blocks * padded_width).enumerate().for_each(|(pair, out)| {
        pair_lanes(isa, x, dims, pair, len, width, out, scale);
    });
}

/// [`pack_lanes`] of one pair into its `[len'/16, W]` lanes.
#[allow(clippy::too_many_arguments)]
fn pair_lanes(isa: Isa, x: Operand, dims: Dims, pair: usize, len: usize, width: usize, out: &mut [Lanes], scale: f32) {
    let (blocks, stride) = (len.div_ceil(LANES), x.layout.row_stride);
    let first = x.layout.row(&dims, pair, len, width, 0);
    for (block, out) in out.chunks_exact_mut(out.len() / blocks).enumerate() {
        let rows = LANES.min(len - block * LANES);
        let (features, padding) = out.split_at_mut(width);
        dispatch!(isa, lane_block(&x.values[first + block * LANES * stride..], stride, rows, scale, features));
        padding.fill([0.0; LANES]);
    }
}

/// `[pairs, len', W]` rows -> `[pairs, len'/16, W]` lanes.
fn lanes_from_rows(isa: Isa, rows: &[f32], width: usize, out: &mut [Lanes]) {
    out.par_chunks_mut(width).enumerate().for_each(|(tile, out)| {
        dispatch!(isa, lane_block(&rows[tile * LANES * width..], width, LANES, 1.0, out));
    });
}

/// `[pairs, len'/16, W]` lanes -> `[pairs, len', W]` rows.
fn rows_from_lanes(isa: Isa, tiles: &[Lanes], width: usize, out: &mut [f32]) {
    out.par_chunks_mut(LANES * width).zip(tiles.par_chunks(width)).for_each(|(rows, tile)| {
        dispatch!(isa, row_block(tile, rows));
    });
}

/// Below this many features, [`lane_block`] and [`row_block`] move elements one by one: a
/// 16 x 16 transpose of a block that is mostly padding costs more.
const NARROW: usize = 8;

/// `out[d][i] = scale · x[i * stride + d]` for the first `rows` (at most 16) rows and the
/// `out.len()` features; lanes past `rows` are 0. 16 x 16 blocks through [`Vector::transpose`].
#[inline(always)]
fn lane_block<V: Vector, const NR: usize>(x: &[f32], stride: usize, rows: usize, scale: f32, out: &mut [Lanes]) {
    if out.len() == 4 {
        // Heads of 4 features, the question's: each row moved whole, then the lanes of each
        // feature taken out of the block (one bounds test a row, none an element). The seed's
        // query packing took 75 -> 49 µs of a forward pass this way (one thread, AVX2).
        let mut block = [[0.0f32; 4]; LANES];
        for (i, row) in block.iter_mut().take(rows).enumerate() {
            *row = x[i * stride..][..4].try_into().expect("a row of 4");
        }
        for (d, out) in out.iter_mut().enumerate() {
            V::load(&lanes(|i| block[i][d])).mul(V::splat(scale)).store(out);
        }
        return;
    }
    if out.len() < NARROW {
        for (d, out) in out.iter_mut().enumerate() {
            *out = [0.0; LANES];
            for (i, lane) in out.iter_mut().take(rows).enumerate() {
                *lane = scale * x[i * stride + d];
            }
        }
        return;
    }
    let mut block = [[0.0; LANES]; LANES];
    for first in (0..out.len()).step_by(LANES) {
        let cols = LANES.min(out.len() - first);
        for (i, lanes) in block.iter_mut().take(rows).enumerate() {
            copy_row(&mut lanes[..cols], &x[i * stride + first..][..cols]);
        }
        let columns = V::transpose(&block);
        for (out, column) in out[first..first + cols].iter_mut().zip(&columns) {
            V::load(column).mul(V::splat(scale)).store(out);
        }
    }
}

/// `rows[i * W + d] = tile[d][i]` for 16 rows of `W = tile.len()` features: [`lane_block`]'s
/// inverse.
#[inline(always)]
fn row_block<V: Vector, const NR: usize>(tile: &[Lanes], rows: &mut [f32]) {
    let width = tile.len();
    if (1..NARROW).contains(&width) {
        let rows = &mut rows[..LANES * width]; // 16 rows, as the transposing path writes
        for (i, row) in rows.chunks_exact_mut(width).enumerate() {
            for (x, column) in row.iter_mut().zip(tile) {
                *x = column[i];
            }
        }
        return;
    }
    let mut block = [[0.0; LANES]; LANES];
    for first in (0..width).step_by(LANES) {
        let cols = LANES.min(width - first);
        copy_row(&mut block[..cols], &tile[first..first + cols]);
        let transposed = V::transpose(&block);
        for (i, lanes) in transposed.iter().enumerate() {
            copy_row(&mut rows[i * width + first..][..cols], &lanes[..cols]);
        }
    }
}

/// `dst.copy_from_slice(src)` as a loop the compiler inlines. The rows of narrow heads are a few
/// floats, and a call to `memmove` for each cost more than the copy: 9% of the seed's forward
/// pass (4 features a head) went to it.
#[inline(always)]
fn copy_row<T: Copy>(dst: &mut [T], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "copy_row");
    for (d, s) in dst.iter_mut().zip(src) {
        *d = *s;
    }
}

/// [`copy_row`] into memory that may not hold values yet.
#[inline(always)]
fn write_row<T: Copy>(dst: &mut [MaybeUninit<T>], src: &[T]) {
    assert_eq!(dst.len(), src.len(), "write_row");
    for (d, s) in dst.iter_mut().zip(src) {
        d.write(*s);
    }
}

/// [`copy_rows`]' inverse into memory that may not hold values yet: the rows of `W` features of
/// `rows`, one after another, to rows `stride` apart in `out`.
#[inline(always)]
fn write_rows<T: Copy, const W: usize>(rows: &[T], out: &mut [MaybeUninit<T>], stride: usize) {
    for (r, row) in rows.chunks_exact(W).enumerate() {
        let out: &mut [MaybeUninit<T>; W] = (&mut out[r * stride..][..W]).try_into().expect("a row of W");
        for (d, &x) in out.iter_mut().zip(row) {
            d.write(x);
        }
    }
}

/// `[pairs, len', W] -> [B, len, h, width]`: real rows and features, heads last.
fn heads_last<T: Copy + Send + Sync>(
    by_pair: &[T],
    dims: Dims,
    len: usize,
    padded_len: usize,
    padded_width: usize,
    width: usize,
) -> Vec<T> {
    let layout = Layout::heads_last(&dims, width);
    // SAFETY: `scatter_rows` writes every element of the heads-last `[B, len, h, width]` (its
    // rows have nothing between them).
    unsafe {
        written(dims.pairs() * len * width, |out| {
            scatter_rows(by_pair, dims, len, padded_len, padded_width, width, layout, out)
        })
    }
}

/// A `Vec` of `len` elements, all of them written by `write` into fresh memory: no caller zeroes
/// megabytes first only to overwrite them (at 8,512,256,8x32 the output and the three gradients
/// are 17 MB a training step, which glibc's heap hands back uncleared).
///
/// # Safety
/// `write` must write every element of the slice it is given. (If it panics, the `Vec` is
/// dropped empty.)
unsafe fn written<T>(len: usize, write: impl FnOnce(&mut [MaybeUninit<T>])) -> Vec<T> {
    let mut out = Vec::with_capacity(len);
    write(&mut out.spare_capacity_mut()[..len]);
    // SAFETY: the caller's contract: every element below `len` is initialised.
    unsafe { out.set_len(len) };
    out
}

/// `[pairs, len', W]` -> the real rows and features of an operand `[B, len, h, width]` where
/// `layout` places it in `out` (which may hold other operands between its rows). Written, not
/// read: `out` may be fresh memory ([`written`]).
#[allow(clippy::too_many_arguments)]
fn scatter_rows<T: Copy + Send + Sync>(
    by_pair: &[T],
    dims: Dims,
    len: usize,
    padded_len: usize,
    padded_width: usize,
    width: usize,
    layout: Layout,
    out: &mut [MaybeUninit<T>],
) {
    if dims.pairs() * len * width == 0 {
        return;
    }
    assert!(out.len() >= layout.span(&dims, len, width), "scatter_rows: output too short");
    // A batch's rows are contiguous in every layout: one task each.
    let per_batch =
        out.par_chunks_mut(len * layout.row_stride).zip(by_pair.par_chunks(dims.heads * padded_len * padded_width));
    per_batch.for_each(|(out, by_pair)| scatter_batch(by_pair, dims, len, padded_width, width, layout, out));
}

/// [`scatter_rows`] of one batch element: its pairs `[h, len', W]` into its rows.
fn scatter_batch<T: Copy>(
    by_pair: &[T],
    dims: Dims,
    len: usize,
    padded_width: usize,
    width: usize,
    layout: Layout,
    out: &mut [MaybeUninit<T>],
) {
    for (head, pair) in by_pair.chunks_exact(by_pair.len() / dims.heads).enumerate() {
        let (pair, first) = (&pair[..len * padded_width], layout.first + head * width);
        match (width, padded_width) {
            (4, 4) => write_rows::<T, 4>(pair, &mut out[first..], layout.row_stride),
            _ => {
                for (l, row) in pair.chunks_exact(padded_width).enumerate() {
                    write_row(&mut out[first + l * layout.row_stride..][..width], &row[..width]);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bias::FloatBias;
    use crate::mask::BoolMask;

    /// Test inputs in `[-2, 2)`: the shared values, doubled (exactly).
    fn values(n: usize, seed: u64) -> Vec<f32> {
        crate::testing::values(n, seed).into_iter().map(|x| x * 2.0).collect()
    }

    /// Textbook attention in float64 with explicit probabilities, and its gradients, on
    /// pair-major `[pairs, L, d]` buffers; `allowed(pair, t, s)` is the mask.
    fn reference(
        [q, k, v, g]: [&[f32]; 4],
        dims: Dims,
        scale: f32,
        allowed: &dyn Fn(usize, usize, usize) -> bool,
        bias: &dyn Fn(usize, usize, usize) -> f64,
        rows: FullyMaskedRows,
    ) -> [Vec<f64>; 5] {
        let Dims { query_len: tl, source_len: sl, key_dim: dk, value_dim: dv, .. } = dims;
        let pairs = dims.pairs();
        let (mut out, mut dq, mut dkk, mut dvv) = (
            vec![0.0; pairs * tl * dv],
            vec![0.0; pairs * tl * dk],
            vec![0.0; pairs * sl * dk],
            vec![0.0; pairs * sl * dv],
        );
        let mut all_probs = vec![0.0; pairs * tl * sl]; // [pairs, T, S]
        for p in 0..pairs {
            for t in 0..tl {
                let go: Vec<f64> = (0..dv).map(|d| g[(p * tl + t) * dv + d] as f64).collect();
                if !(0..sl).any(|j| allowed(p, t, j)) {
                    if rows == FullyMaskedRows::Uniform {
                        all_probs[(p * tl + t) * sl..][..sl].fill(1.0 / sl as f64);
                        for j in 0..sl {
                            for d in 0..dv {
                                out[(p * tl + t) * dv + d] += v[(p * sl + j) * dv + d] as f64 / sl as f64;
                                dvv[(p * sl + j) * dv + d] += go[d] / sl as f64;
                            }
                        }
                    }
                    continue;
                }
                let qs: Vec<f64> = (0..dk).map(|d| (q[(p * tl + t) * dk + d] * scale) as f64).collect();
                let s: Vec<f64> = (0..sl)
                    .map(|j| match allowed(p, t, j) {
                        true => (0..dk).map(|d| qs[d] * k[(p * sl + j) * dk + d] as f64).sum::<f64>() + bias(p, t, j),
                        false => f64::NEG_INFINITY,
                    })
                    .collect();
                let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|s| (s - m).exp()).collect();
                let total: f64 = e.iter().sum();
                let probs: Vec<f64> = e.iter().map(|e| e / total).collect();
                all_probs[(p * tl + t) * sl..][..sl].copy_from_slice(&probs);
                let dp: Vec<f64> =
                    (0..sl).map(|j| (0..dv).map(|d| go[d] * v[(p * sl + j) * dv + d] as f64).sum()).collect();
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
        [out, dq, dkk, dvv, all_probs]
    }

    /// The largest error relative to the largest reference magnitude (at least 1).
    fn scaled_error(got: &[f32], want: &[f64]) -> f64 {
        assert_eq!(got.len(), want.len());
        let scale = want.iter().fold(1.0f64, |m, w| m.max(w.abs()));
        got.iter().zip(want).map(|(g, w)| (*g as f64 - w).abs()).fold(0.0, f64::max) / scale
    }

    /// The masks every shape is checked with.
    #[derive(Debug, Clone, Copy)]
    enum Rule {
        None,
        Causal,
        /// Per-batch key lengths, the second batch element with none: fully masked rows.
        Padding,
        /// A pattern per (batch, head, row, key) with some rows fully masked, and causal on top.
        General {
            causal: bool,
        },
    }

    impl Rule {
        fn allowed(self, dims: Dims) -> impl Fn(usize, usize, usize) -> bool {
            let heads = dims.heads;
            let length = move |b: usize| if b == 1 { 0 } else { dims.source_len.div_ceil(3) };
            move |p: usize, t: usize, s: usize| match self {
                Rule::None => true,
                Rule::Causal => s <= t,
                Rule::Padding => s < length(p / heads),
                Rule::General { causal } => {
                    t % 5 != 3 && !(p * 7 + t * 3 + s * 5).is_multiple_of(3) && (!causal || s <= t)
                }
            }
        }

        fn mask(self, dims: Dims, rows: FullyMaskedRows) -> Mask {
            let (causal, explicit) = match self {
                Rule::None => (false, None),
                Rule::Causal => (true, None),
                Rule::Padding => {
                    let allowed = self.allowed(dims);
                    let bits = (0..dims.batch).flat_map(|b| (0..dims.source_len).map(move |s| (b, s)));
                    let allowed = bits.map(|(b, s)| allowed(b * dims.heads, 0, s)).collect();
                    (false, Some(BoolMask { dims: [dims.batch, 1, 1, dims.source_len], allowed }))
                }
                Rule::General { causal } => {
                    let pattern = Rule::General { causal: false }.allowed(dims);
                    let (t, s) = (dims.query_len, dims.source_len);
                    let allowed = (0..dims.pairs() * t * s).map(|i| pattern(i / (t * s), i / s % t, i % s)).collect();
                    (causal, Some(BoolMask { dims: [dims.batch, dims.heads, t, s], allowed }))
                }
            };
            Mask::with_mask(causal, rows, explicit, dims)
        }
    }

    /// The kernel against float64 attention: output and all three gradients.
    fn check(dims: Dims, rule: Rule, rows: FullyMaskedRows, isas: &[Isa]) {
        check_scaled(dims, rule, rows, isas, None, 1.0);
    }

    /// [`check`] with a float mask `bias` on the logits.
    fn check_with_bias(dims: Dims, rule: Rule, rows: FullyMaskedRows, isas: &[Isa], bias: Option<FloatBias>) {
        check_scaled(dims, rule, rows, isas, bias, 1.0);
    }

    /// [`check_with_bias`] with the query, key and value in `[-2 magnitude, 2 magnitude)`.
    fn check_scaled(
        dims: Dims,
        rule: Rule,
        rows: FullyMaskedRows,
        isas: &[Isa],
        bias: Option<FloatBias>,
        magnitude: f32,
    ) {
        let Dims { query_len, source_len, key_dim, value_dim, .. } = dims;
        let pairs = dims.pairs();
        let scaled = |n: usize, seed: u64| values(n, seed).into_iter().map(|x| x * magnitude).collect::<Vec<_>>();
        // Pair-major inputs for the reference, heads-last for the kernel.
        let q = scaled(pairs * query_len * key_dim, 1);
        let k = scaled(pairs * source_len * key_dim, 2);
        let v = scaled(pairs * source_len * value_dim, 3);
        let g = values(pairs * query_len * value_dim, 4);
        let scale = 1.0 / (key_dim as f32).sqrt();
        let last = |x: &[f32], len: usize, width: usize| heads_last(x, dims, len, len, width, width);
        let last64 = |x: &[f64], len: usize, width: usize| heads_last(x, dims, len, len, width, width);
        let bias_of = |p: usize, t: usize, s: usize| match &bias {
            Some(FloatBias { dims: [bm, hm, _, _], values }) => {
                values[(dims.broadcast_slice([*bm, *hm], p) * query_len + t) * source_len + s] as f64
            }
            None => 0.0,
        };
        let [out, dq, dk, dv, probs] = reference([&q, &k, &v, &g], dims, scale, &rule.allowed(dims), &bias_of, rows);
        let (out, dq) = (last64(&out, query_len, value_dim), last64(&dq, query_len, key_dim));
        let (dk, dv) = (last64(&dk, source_len, key_dim), last64(&dv, source_len, value_dim));
        let (q, k, v) = (last(&q, query_len, key_dim), last(&k, source_len, key_dim), last(&v, source_len, value_dim));
        let parts = [(&q[..], key_dim), (&k[..], key_dim), (&v[..], value_dim)];
        let mut layouts = vec![Operand::heads_last([&q, &k, &v], dims)];
        // Self-attention's lengths: the three side by side in one packed projection too.
        let qkv = (query_len == source_len).then(|| side_by_side(&parts, dims.batch * query_len, dims.heads));
        layouts.extend(qkv.as_deref().map(|qkv| Layout::packed(&dims).map(|layout| Operand { values: qkv, layout })));
        // Every instruction set and layout, with one tile and with two walked together.
        let runs = isas.iter().flat_map(|&isa| Tiles::ALL.map(|tiles| (isa, tiles)));
        for ((isa, tiles), operands) in runs.flat_map(|run| layouts.iter().map(move |operands| (run, *operands))) {
            let packed = operands[0].layout != Layout::heads_last(&dims, key_dim);
            let mask = rule.mask(dims, rows).with_bias(bias.clone(), dims);
            // Both task splits, in turns: each instruction set and each tile count gets both.
            let tasks = [Tasks::ByBatch, Tasks::ByGroup][(isa.vector_bits() / 128 + tiles.count()) % 2];
            // The output alone (bounded shifts where they apply), and with the probabilities.
            let (output, saved, _) = forward_with(isa, tiles, tasks, operands, dims, scale, mask.clone(), false);
            let (with_probs, _, got_probs) = forward_with(isa, tiles, tasks, operands, dims, scale, mask, true);
            let case = format!("{isa:?} {tiles:?} {tasks:?} {rule:?} {rows:?} packed {packed}");
            for output in [&output, &with_probs] {
                let error = scaled_error(output, &out);
                assert!(error < 4e-6, "{case}: output at {dims:?}: error {error}");
            }
            let error = scaled_error(&got_probs.expect("asked for"), &probs);
            assert!(error < 4e-6, "{case}: probabilities at {dims:?}: error {error}");
            // Both ways of computing dq.
            for fused_dq in [false, true] {
                let padded = backward_with(isa, tiles, &saved, &last(&g, query_len, value_dim), fused_dq);
                let grads = match packed {
                    false => Gradients::heads_last(padded, dims),
                    true => {
                        let [query, key, value] =
                            apart(&packed_grads(padded, dims), [key_dim, key_dim, value_dim], dims.heads);
                        Gradients { query, key, value }
                    }
                };
                for (name, got, want) in [("dq", &grads.query, &dq), ("dk", &grads.key, &dk), ("dv", &grads.value, &dv)]
                {
                    let error = scaled_error(got, want);
                    assert!(error < 4e-6, "{case} fused dq {fused_dq}: {name} at {dims:?}: error {error}");
                }
            }
        }
    }

    /// `rows` rows of each `[rows, h, width]` part side by side: `[rows, h·Σ width]`.
    fn side_by_side(parts: &[(&[f32], usize); 3], rows: usize, heads: usize) -> Vec<f32> {
        (0..rows)
            .flat_map(|r| parts.iter().flat_map(move |(x, width)| &x[r * heads * width..][..heads * width]))
            .copied()
            .collect()
    }

    /// The parts of [`side_by_side`] again.
    fn apart(packed: &[f32], widths: [usize; 3], heads: usize) -> [Vec<f32>; 3] {
        let row = heads * widths.iter().sum::<usize>();
        let mut offset = 0;
        widths.map(|width| {
            let part = packed.chunks_exact(row).flat_map(|r| &r[offset..][..heads * width]).copied().collect();
            offset += heads * width;
            part
        })
    }

    #[test]
    fn forward_and_backward_match_float64_attention_on_every_instruction_set() {
        // Lengths below, at and above a lane multiple and a step; unequal query/key lengths;
        // widths off the multiple of 4; the seed's shape.
        for (source_len, query_len, key_dim, value_dim) in [
            (7, 5, 4, 4),
            (16, 16, 2, 3),
            (37, 19, 5, 2),
            (20, 33, 3, 9),
            (9, 17, 16, 12),
            (136, 136, 4, 4),
            (300, 150, 6, 5),
        ] {
            let dims = Dims { batch: 2, heads: 3, query_len, source_len, key_dim, value_dim };
            check(dims, Rule::None, FullyMaskedRows::Zero, &Isa::available());
        }
    }

    #[test]
    fn every_mask_and_both_fully_masked_row_conventions() {
        // Value rows of 3 features take the fused narrow step (`FUSED_WIDTH`), of 7 the two passes.
        for (source_len, query_len, value_dim) in [(37, 19, 7), (20, 33, 7), (150, 140, 7), (150, 140, 3)] {
            let dims = Dims { batch: 2, heads: 3, query_len, source_len, key_dim: 5, value_dim };
            for rule in [Rule::Causal, Rule::Padding, Rule::General { causal: false }, Rule::General { causal: true }] {
                for rows in [FullyMaskedRows::Zero, FullyMaskedRows::Uniform] {
                    check(dims, rule, rows, &Isa::available());
                }
            }
        }
    }

    /// Heads of 4 features whose logits stay small take [`bounded_shifts`] (inputs within 1/4:
    /// every shift under 1/2); larger ones the online softmax (within 4: most rows' shifts near
    /// 16, above `BOUNDED_GAP / 2`). Both, with masks and value widths fused or not, as the
    /// reference.
    #[test]
    fn narrow_heads_with_small_and_large_logits() {
        for magnitude in [0.125, 2.0] {
            for (source_len, query_len, value_dim) in [(150, 140, 4), (37, 19, 7)] {
                let dims = Dims { batch: 2, heads: 3, query_len, source_len, key_dim: 4, value_dim };
                for rule in [Rule::None, Rule::Padding, Rule::General { causal: true }] {
                    check_scaled(dims, rule, FullyMaskedRows::Uniform, &Isa::available(), None, magnitude);
                }
            }
        }
    }

    /// A tile's bounded shifts hold every logit `q̃ · k` of the keys each row's maxima cover in
    /// `[-shift, shift]`, the corners of the maxima's box included; logits that may reach beyond
    /// half of `BOUNDED_GAP`, and maxima that are not finite, give none.
    #[test]
    fn tile_shifts_bound_every_logit_or_refuse() {
        let tile = |magnitude: f32| -> Vec<Lanes> {
            let v = values(LANES * FUSED_WIDTH, 7);
            (0..FUSED_WIDTH).map(|d| lanes(|i| v[d * LANES + i] * magnitude)).collect()
        };
        let keys: Vec<KeyMax> =
            values(64 * FUSED_WIDTH, 8).chunks_exact(FUSED_WIDTH).map(|k| k.try_into().unwrap()).collect();
        // Row `i` attends the keys up to `4 i + 3`: its maxima are those of that prefix.
        let prefix = |i: usize| &keys[..4 * i + 4];
        let maxima_of =
            |i: usize| -> KeyMax { std::array::from_fn(|d| prefix(i).iter().fold(0.0f32, |m, k| m.max(k[d].abs()))) };
        let maxima: [Lanes; FUSED_WIDTH] = std::array::from_fn(|d| lanes(|i| maxima_of(i)[d]));
        let query = tile(0.5);
        let shift = tile_shift::<Portable>(&query, &maxima).expect("small logits are bounded");
        for i in 0..LANES {
            let bound = maxima_of(i);
            let corners = (0..1 << FUSED_WIDTH).map(|signs: usize| -> KeyMax {
                std::array::from_fn(|d| if signs >> d & 1 == 1 { bound[d] } else { -bound[d] })
            });
            for key in prefix(i).iter().copied().chain(corners) {
                let logit: f32 = (0..FUSED_WIDTH).map(|d| query[d][i] * key[d]).sum();
                assert!(logit.abs() <= shift[i], "row {i}: logit {logit} beyond its shift {}", shift[i]);
            }
        }
        assert!(tile_shift::<Portable>(&tile(8.0), &maxima).is_none(), "logits up to 32 take no bound");
        for infinite in [f32::INFINITY, f32::NAN] {
            let mut maxima = maxima;
            maxima[1][3] = infinite;
            assert!(tile_shift::<Portable>(&query, &maxima).is_none(), "a key maximum of {infinite}");
        }
    }

    /// Keys a row may not attend change no bit of its output: the causal rule with every key
    /// from row 20 on changed, at heads of 4 features (bounded shifts) and of 5 (the running
    /// maximum), on every instruction set and both task splits.
    #[test]
    fn keys_a_row_may_not_attend_change_no_bit_of_its_output() {
        for key_dim in [4, 5] {
            let dims = Dims { batch: 2, heads: 3, query_len: 40, source_len: 40, key_dim, value_dim: 4 };
            let small = |n: usize, seed: u64| values(n, seed).into_iter().map(|x| x / 8.0).collect::<Vec<_>>();
            let q = small(dims.pairs() * 40 * key_dim, 1);
            let [k, v] = [(key_dim, 2), (4, 3)].map(|(width, seed)| small(dims.pairs() * 40 * width, seed));
            // `[B, S, h, w]`: rows 20.. of every pair replaced.
            let future = |x: &[f32], width: usize, seed: u64| {
                let other = small(x.len(), seed);
                let row = dims.heads * width;
                x.chunks(row)
                    .zip(other.chunks(row))
                    .enumerate()
                    .flat_map(|(r, (x, o))| if r % 40 >= 20 { o } else { x })
                    .copied()
                    .collect::<Vec<_>>()
            };
            let (k2, v2) = (future(&k, key_dim, 4), future(&v, 4, 5));
            let scale = 1.0 / (key_dim as f32).sqrt();
            // Key-padding masks of lengths 20 and 33: the first batch element's rows attend
            // none of the replaced keys, the second's some.
            let lengths = [20, 33];
            let padding =
                BoolMask { dims: [2, 1, 1, 40], allowed: (0..80).map(|i| i % 40 < lengths[i / 40]).collect() };
            for (causal, padding) in [(true, None), (false, Some(&padding)), (true, Some(&padding))] {
                // Whether output row `t` of batch element `b` may read a replaced key (`s >= 20`).
                let reads_replaced = |b: usize, t: usize| {
                    let end = if causal { t + 1 } else { 40 };
                    end.min(padding.map_or(40, |_| lengths[b])) > 20
                };
                for (isa, tasks) in
                    Isa::available().into_iter().flat_map(|isa| [Tasks::ByBatch, Tasks::ByGroup].map(|t| (isa, t)))
                {
                    let run = |k: &[f32], v: &[f32]| {
                        let operands = Operand::heads_last([&q, k, v], dims);
                        let mask = Mask::with_mask(causal, FullyMaskedRows::Zero, padding.cloned(), dims);
                        assert!(mask.allows_prefixes(), "a padding mask of lengths is one of prefixes");
                        forward_with(isa, Tiles::One, tasks, operands, dims, scale, mask, false).0 // [B, T, h, 4]
                    };
                    let (before, after) = (run(&k, &v), run(&k2, &v2));
                    let row = dims.heads * 4;
                    for (r, (before, after)) in before.chunks(row).zip(after.chunks(row)).enumerate() {
                        let same = before.iter().zip(after).all(|(a, b)| a.to_bits() == b.to_bits());
                        let context = format!("{isa:?} {tasks:?} key width {key_dim} causal {causal}");
                        let padded = padding.is_some();
                        assert_eq!(same, !reads_replaced(r / 40, r % 40), "{context} padding {padded}: row {r}");
                    }
                }
            }
        }
    }

    #[test]
    fn wide_heads_with_and_without_masks() {
        for (key_dim, value_dim) in [(32, 32), (64, 48), (37, 130), (256, 256), (16, 8)] {
            let dims = Dims { batch: 2, heads: 2, query_len: 40, source_len: 150, key_dim, value_dim };
            for rule in [Rule::None, Rule::Causal, Rule::Padding, Rule::General { causal: true }] {
                check(dims, rule, FullyMaskedRows::Uniform, &[Isa::best(), Isa::PORTABLE]);
            }
        }
    }

    #[test]
    fn float_masks_add_to_the_logits_per_pair_or_broadcast() {
        for (source_len, query_len, key_dim, value_dim) in [(37, 19, 5, 7), (150, 140, 16, 7), (150, 140, 16, 4)] {
            let dims = Dims { batch: 2, heads: 3, query_len, source_len, key_dim, value_dim };
            for slices in [[1, 1], [2, 3]] {
                let values =
                    values(slices[0] * slices[1] * query_len * source_len, 5).iter().map(|v| v * 1.5).collect();
                let bias = FloatBias { dims: [slices[0], slices[1], query_len, source_len], values };
                for rule in [Rule::None, Rule::Causal, Rule::General { causal: false }] {
                    check_with_bias(dims, rule, FullyMaskedRows::Zero, &Isa::available(), Some(bias.clone()));
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
            let (output, saved) = forward(&q, &k, &v, dims, 0.5, Mask::new(true, FullyMaskedRows::Zero));
            assert_eq!(output, vec![0.0; batch * 2 * query_len * 3], "{dims:?}");
            let grads = backward(&saved, &output);
            assert_eq!((grads.query.len(), grads.key.len(), grads.value.len()), (q.len(), k.len(), v.len()));
            assert!(grads.query.iter().chain(&grads.key).chain(&grads.value).all(|&g| g == 0.0));
        }
    }
}
