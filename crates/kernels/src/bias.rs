//! An additive float mask on the logits (torch's float `attn_mask`), in the kernel's two
//! orientations: 16 query rows of one key in a vector (the forward pass, `dq` and the returned
//! probabilities) and 16 keys of one query row (`dk`, `dv`).
//!
//! Its `-inf` entries are not here: they block their pairs, so they belong to the boolean mask
//! ([`super::mask`]), which also skips the tiles they cover; here they are 0.

use rayon::prelude::*;

use crate::buffer::Buffer;
use crate::dims::Dims;
use crate::simd::LANES;
use crate::simd::Lanes;

/// A float mask on the host: `values[((b * Hm + h) * T + t) * S + s]` is added to the scaled logit
/// of query `t` and key `s`, with `dims = [Bm, Hm, T, S]` and each of `Bm`, `Hm` either 1
/// (broadcast) or the call's size.
#[derive(Debug, Clone, PartialEq)]
pub struct FloatBias {
    pub dims: [usize; 4],
    pub values: Vec<f32>,
}

/// A [`FloatBias`] packed for the kernel, zero-padded to whole lane blocks.
#[derive(Debug, Clone)]
pub(crate) struct BiasLanes {
    /// `[Bm, Hm]`: the slices, broadcast where 1.
    slices: [usize; 2],
    /// `[slices][Tb][S']` lanes: lane `i` of entry `s` is row `tb * 16 + i`.
    by_rows: Buffer<Lanes>,
    /// `[slices][Sb][T']` lanes: lane `i` of entry `t` is key `sb * 16 + i`.
    by_keys: Buffer<Lanes>,
}

impl BiasLanes {
    pub(crate) fn pack(bias: &FloatBias, dims: Dims) -> Self {
        let [bm, hm, t, s] = bias.dims;
        assert!(bm == 1 || bm == dims.batch, "bias batch {bm} vs {}", dims.batch);
        assert!(hm == 1 || hm == dims.heads, "bias heads {hm} vs {}", dims.heads);
        assert_eq!((t, s), (dims.query_len, dims.source_len), "bias rows and keys");
        let (row_blocks, key_blocks) = (dims.row_blocks(), dims.key_blocks());
        let (padded_t, padded_s) = (dims.padded_query_len(), dims.padded_source_len());
        let slice_of = |slice: usize| &bias.values[slice * t * s..][..t * s];
        let mut by_rows = Buffer::<Lanes>::zeroed(bm * hm * row_blocks * padded_s);
        by_rows.par_chunks_mut(row_blocks * padded_s).enumerate().for_each(|(slice, out)| {
            for (row, values) in slice_of(slice).chunks_exact(s.max(1)).enumerate().take(t) {
                let tile = &mut out[row / LANES * padded_s..][..s];
                tile.iter_mut().zip(values).for_each(|(lanes, &v)| lanes[row % LANES] = v);
            }
        });
        let mut by_keys = Buffer::<Lanes>::zeroed(bm * hm * key_blocks * padded_t);
        by_keys.par_chunks_mut(key_blocks * padded_t).enumerate().for_each(|(slice, out)| {
            for (row, values) in slice_of(slice).chunks_exact(s.max(1)).enumerate().take(t) {
                for (key, &v) in values.iter().enumerate() {
                    out[key / LANES * padded_t + row][key % LANES] = v;
                }
            }
        });
        Self { slices: [bm, hm], by_rows, by_keys }
    }

    /// `[S']`: what 16 query rows `block * 16 ..` of pair `pair` add to each key's logits.
    pub(crate) fn row_block(&self, dims: &Dims, pair: usize, block: usize) -> &[Lanes] {
        let padded_s = dims.padded_source_len();
        &self.by_rows[(dims.broadcast_slice(self.slices, pair) * dims.row_blocks() + block) * padded_s..][..padded_s]
    }

    /// `[T']`: what each query row adds to the logits of 16 keys `block * 16 ..` of pair `pair`.
    pub(crate) fn key_block(&self, dims: &Dims, pair: usize, block: usize) -> &[Lanes] {
        let padded_t = dims.padded_query_len();
        &self.by_keys[(dims.broadcast_slice(self.slices, pair) * dims.key_blocks() + block) * padded_t..][..padded_t]
    }
}
