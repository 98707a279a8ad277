//! The sizes of one attention call and what its fully masked rows get: the vocabulary every
//! layer above the SIMD layer shares.

use crate::simd::LANES;

/// What a query row with no allowed key attends to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FullyMaskedRows {
    /// Uniform attention over all keys, blocked ones included: Keras 3's default call
    /// (`ops.dot_product_attention`).
    Uniform,
    /// No attention at all (probabilities 0, so the row's output is the output bias): Keras 3's
    /// `return_attention_scores=True` / dropout path, and torch's `need_weights=False` path.
    Zero,
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
    /// The sizes of a call with query `[B, T, h, dk]` and value `[B, S, h, dv]`.
    pub fn of([batch, query_len, heads, key_dim]: [usize; 4], [_, source_len, _, value_dim]: [usize; 4]) -> Self {
        Self { batch, heads, query_len, source_len, key_dim, value_dim }
    }

    /// `[B, T, h, dv]`: the output's shape.
    pub fn output_shape(&self) -> [usize; 4] {
        [self.batch, self.query_len, self.heads, self.value_dim]
    }

    /// `[B, T, h, dk]`, `[B, S, h, dk]` and `[B, S, h, dv]`: the query, key and value shapes.
    pub fn shapes(&self) -> [[usize; 4]; 3] {
        let Dims { batch, heads, query_len, source_len, key_dim, value_dim } = *self;
        [[batch, query_len, heads, key_dim], [batch, source_len, heads, key_dim], [batch, source_len, heads, value_dim]]
    }

    /// No pair, no query row or no key: nothing for the kernel to compute.
    pub(crate) fn is_empty(&self) -> bool {
        self.pairs() == 0 || self.query_len == 0 || self.source_len == 0
    }

    /// (batch, head) pairs.
    pub(crate) fn pairs(&self) -> usize {
        self.batch * self.heads
    }

    /// The slice of a `[Bm, Hm, ..]` tensor (each of `Bm`, `Hm` 1, broadcast, or the call's size)
    /// that (batch, head) pair `pair` reads.
    pub(crate) fn broadcast_slice(&self, [bm, hm]: [usize; 2], pair: usize) -> usize {
        let (batch, head) = (pair / self.heads, pair % self.heads);
        (if bm == 1 { 0 } else { batch }) * hm + if hm == 1 { 0 } else { head }
    }

    /// Tiles of 16 query rows, and of 16 keys.
    pub(crate) fn row_blocks(&self) -> usize {
        self.query_len.div_ceil(LANES)
    }

    pub(crate) fn key_blocks(&self) -> usize {
        self.source_len.div_ceil(LANES)
    }

    pub(crate) fn padded_query_len(&self) -> usize {
        self.row_blocks() * LANES
    }

    pub(crate) fn padded_source_len(&self) -> usize {
        self.key_blocks() * LANES
    }

    /// The query/key and value widths, zero-padded to a multiple of 4 (the products' step).
    pub(crate) fn key_width(&self) -> usize {
        self.key_dim.next_multiple_of(4)
    }

    pub(crate) fn value_width(&self) -> usize {
        self.value_dim.next_multiple_of(4)
    }
}

/// Where an operand of a call, `[B, len, h, w]` (query, key, value or their gradients), keeps
/// element `(b, t, head, d)`: at `first + (b·len + t)·row_stride + head·w + d`. The heads-last
/// layout has nothing between rows ([`Layout::heads_last`]); the packed projection of
/// self-attention, `[B, T, h·(dk + dk + dv)]`, holds the query, key and value side by side in
/// each row, in torch's `in_proj` order ([`Layout::packed`]), so that one product makes all three
/// and the kernel reads them (and writes their gradients) in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub first: usize,
    pub row_stride: usize,
}

impl Layout {
    /// `[B, len, h, width]`, contiguous.
    pub fn heads_last(dims: &Dims, width: usize) -> Self {
        Self { first: 0, row_stride: dims.heads * width }
    }

    /// The query, key and value in one `[B, T, h·(dk + dk + dv)]` (self-attention: `S = T`).
    pub fn packed(dims: &Dims) -> [Self; 3] {
        let (key, value) = (dims.heads * dims.key_dim, dims.heads * dims.value_dim);
        let row_stride = 2 * key + value;
        [0, key, 2 * key].map(|first| Self { first, row_stride })
    }

    /// The width of a packed row, `h·(dk + dk + dv)`.
    pub fn packed_width(dims: &Dims) -> usize {
        dims.heads * (2 * dims.key_dim + dims.value_dim)
    }

    /// Where row `t` of (batch, head) `pair` of an operand of `len` rows of `width` starts.
    pub(crate) fn row(&self, dims: &Dims, pair: usize, len: usize, width: usize, t: usize) -> usize {
        let (batch, head) = (pair / dims.heads, pair % dims.heads);
        self.first + (batch * len + t) * self.row_stride + head * width
    }

    /// The number of elements an operand of `len` rows of `width` spans: the least length of a
    /// slice that holds it.
    pub(crate) fn span(&self, dims: &Dims, len: usize, width: usize) -> usize {
        match dims.batch * len * dims.heads * width {
            0 => 0,
            _ => self.row(dims, dims.pairs() - 1, len, width, len - 1) + width,
        }
    }
}
