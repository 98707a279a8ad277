//! Which (query, key) pairs the fused kernel may attend, without a `[B, h, T, S]` tensor.
//!
//! A call's rule is the AND of up to three parts, all in Keras' polarity (`true` = may attend):
//!
//! * the causal rule, top-left aligned as Keras' `use_causal_mask` and torch's `is_causal`
//!   build it: query `t` may attend key `s` iff `s <= t` (computed, never stored);
//! * an explicit boolean mask `[Bm, Hm, Tm, S]`, broadcast over batch (`Bm = 1`), heads (`Hm = 1`)
//!   and queries (`Tm = 1`, a key-padding mask), packed into bits;
//! * the key bound: padded keys `s >= S` are never attended.
//!
//! The kernel reads the bits in two orientations, 16 query rows of one key in a `u16` (the forward
//! pass and `dq`) and 16 keys of one query row (`dk`, `dv`), and skips whole tiles that the rule
//! blocks: the keys past the diagonal of a causal call, the padded tail of a key-padding mask.
//!
//! What a query row with no allowed key gets is part of the rule ([`FullyMaskedRows`]).

use rayon::prelude::*;

use crate::buffer::Buffer;
use crate::dims::{Dims, FullyMaskedRows};

use crate::bias::{BiasLanes, FloatBias};
use crate::dropout::KeepMask;
use crate::simd::{LANES, Lanes};

/// Every lane allowed.
pub const FULL: u16 = u16::MAX;

/// An explicit boolean mask on the host: `allowed[((b * Hm + h) * Tm + t) * S + s]`, `true` = query
/// `t` may attend key `s`, with `dims = [Bm, Hm, Tm, S]` and each of `Bm`, `Hm`, `Tm` either 1
/// (broadcast) or the call's size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BoolMask {
    pub dims: [usize; 4],
    pub allowed: Vec<bool>,
}

/// Which pairs the `true` entries of a boolean mask mark: Keras' masks mark the pairs a query may
/// attend, torch's the pairs it may not. A mask is read in its own polarity, not negated first:
/// at `[4096, 4096]` the negation took 1.4 ms a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marks {
    Allowed,
    Blocked,
}

impl BoolMask {
    /// Drops what the mask does not need: `None` when it allows every pair, the causal rule
    /// (`(true, None)`) when every slice is the causal pattern (torch users pass causality as a
    /// boolean `attn_mask`), and a key-padding mask (`Tm = 1`) when every query row of each slice
    /// is the same (Keras users pass padding as a full `[B, T, S]` mask).
    pub fn compact(self) -> (bool, Option<BoolMask>) {
        // SAFETY: a `bool` is one byte, 0 or 1.
        let bytes = |mask: &BoolMask| unsafe {
            std::slice::from_raw_parts(mask.allowed.as_ptr().cast::<u8>(), mask.allowed.len())
        };
        match Found::of(self.dims, bytes(&self), Marks::Allowed) {
            Found::Full => (false, Some(self)),
            found => found.compacted(self.dims, bytes(&self), Marks::Allowed),
        }
    }

    /// [`BoolMask::compact`] of a mask given as bytes `[Bm, Hm, Tm, S]` (0 = false) whose `true`
    /// entries mark `marks`: what compacts away is never copied.
    pub fn compact_bytes(dims: [usize; 4], bytes: &[u8], marks: Marks) -> (bool, Option<BoolMask>) {
        assert_eq!(bytes.len(), dims.iter().product::<usize>(), "mask bytes for {dims:?}");
        Found::of(dims, bytes, marks).compacted(dims, bytes, marks)
    }
}

/// What [`BoolMask::compact`] finds a mask to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// Every pair allowed.
    All,
    /// The causal pattern in every slice.
    Causal,
    /// Every query row of a slice the same.
    KeyMask,
    /// None of these.
    Full,
}

/// Bytes a fold takes at once: folds without an early exit per element vectorise, and an exit
/// per chunk still stops early (a 4096 x 4096 mask is checked in well under a millisecond).
const CHUNK: usize = 4096;

impl Found {
    fn of([_, _, tm, s]: [usize; 4], bytes: &[u8], marks: Marks) -> Self {
        // Whether every pair of `bytes` is allowed (`allowed = true`), or every one blocked.
        let every = |bytes: &[u8], allowed: bool| {
            let marked = allowed == (marks == Marks::Allowed); // the byte's truth for that
            bytes.chunks(CHUNK).all(|c| c.iter().fold(true, |all, &b| all & ((b != 0) == marked)))
        };
        if every(bytes, true) {
            return Found::All;
        }
        if tm <= 1 || s == 0 {
            return Found::Full;
        }
        let slices = bytes.chunks_exact(tm * s);
        let causal_row = |(t, row): (usize, &[u8])| {
            let (attended, future) = row.split_at((t + 1).min(row.len()));
            every(attended, true) && every(future, false)
        };
        if slices.clone().all(|slice| slice.chunks_exact(s).enumerate().all(causal_row)) {
            return Found::Causal;
        }
        let same = |a: &[u8], b: &[u8]| a.iter().zip(b).fold(true, |same, (&a, &b)| same & ((a != 0) == (b != 0)));
        match slices.clone().all(|slice| slice.chunks_exact(s).all(|row| same(row, &slice[..s]))) {
            true => Found::KeyMask,
            false => Found::Full,
        }
    }

    /// The causal flag and the mask left, the entries read with `marks`.
    fn compacted(self, [bm, hm, tm, s]: [usize; 4], bytes: &[u8], marks: Marks) -> (bool, Option<BoolMask>) {
        let want = marks == Marks::Allowed;
        let read = move |&b: &u8| (b != 0) == want;
        match self {
            Found::All => (false, None),
            Found::Causal => (true, None),
            Found::KeyMask => {
                let allowed = bytes.chunks_exact(tm * s).flat_map(|slice| slice[..s].iter().map(read)).collect();
                (false, Some(BoolMask { dims: [bm, hm, 1, s], allowed }))
            }
            Found::Full => (false, Some(BoolMask { dims: [bm, hm, tm, s], allowed: bytes.iter().map(read).collect() })),
        }
    }
}

/// The masking rule of one call, ready for the kernel.
#[derive(Debug, Clone)]
pub struct Mask {
    pub causal: bool,
    pub rows: FullyMaskedRows,
    bits: Option<MaskBits>,
    /// Dropout on the probabilities: which allowed pairs are kept ([`Mask::with_dropout`]).
    pub dropout: Option<KeepMask>,
    /// A float mask added to the logits ([`Mask::with_bias`]).
    bias: Option<BiasLanes>,
}

/// An explicit mask packed into bits, in both orientations, with the extent of each tile.
#[derive(Debug, Clone)]
struct MaskBits {
    /// `[Bm, Hm]`: the slices, broadcast where 1.
    slices: [usize; 2],
    /// `Tm == T`: a mask per query row (else one row for all, a key-padding mask).
    per_row: bool,
    /// `[slices][Tb][S']`: bit `i` = row `tb * 16 + i` may attend key `s`. `Tb = 1` when not `per_row`.
    row_bits: Buffer<u16>,
    /// `[slices][Sb][Tk]`: bit `i` = key `sb * 16 + i` may be attended by row `t`. `Tk = 1` when not `per_row`.
    key_bits: Buffer<u16>,
    /// `[slices][Tb]`: the keys `[lo, hi)` some row of the block may attend.
    row_extents: Vec<(usize, usize)>,
    /// `[slices][Sb]`: the queries `[lo, hi)` that may attend some key of the block.
    key_extents: Vec<(usize, usize)>,
    /// `[slices]`: for a key-padding mask whose allowed keys are a prefix `[0, n)` of the keys in
    /// every slice, each slice's `n`; `None` otherwise.
    prefix_lens: Option<Vec<usize>>,
}

impl Mask {
    /// No explicit mask: only the causal rule (if any) and the key bound.
    pub fn new(causal: bool, rows: FullyMaskedRows) -> Self {
        Self { causal, rows, bits: None, dropout: None, bias: None }
    }

    /// Whether each row's allowed keys are a prefix of the keys, with nothing added to their
    /// logits: no float mask, and no explicit mask but a key-padding mask whose allowed keys are
    /// a prefix in every slice (as Keras' masks built from sequence lengths and torch's
    /// `key_padding_mask` are); the causal rule and dropout may be there.
    pub fn allows_prefixes(&self) -> bool {
        self.bias.is_none() && self.bits.as_ref().is_none_or(|bits| bits.prefix_lens.is_some())
    }

    /// The rule for `dims` with an explicit mask, which must broadcast to `[B, h, T, S]`,
    /// compacted first ([`BoolMask::compact`]).
    pub fn with_mask(causal: bool, rows: FullyMaskedRows, mask: Option<BoolMask>, dims: Dims) -> Self {
        let (mask_is_causal, mask) = mask.map_or((false, None), BoolMask::compact);
        Self::with_compacted(causal || mask_is_causal, rows, mask, dims)
    }

    /// [`Mask::with_mask`] of a mask compacted already (as [`BoolMask::read`] leaves it), packed
    /// into bits as it is: a second compaction would scan it again (most of a causal mask with
    /// padding, say, before its first row that breaks the causal pattern).
    pub fn with_compacted(causal: bool, rows: FullyMaskedRows, mask: Option<BoolMask>, dims: Dims) -> Self {
        let bits = mask.map(|mask| MaskBits::pack(&mask, dims));
        Self { causal, rows, bits, dropout: None, bias: None }
    }

    /// The same rule with dropout on the probabilities.
    pub fn with_dropout(self, dropout: Option<KeepMask>) -> Self {
        Self { dropout, ..self }
    }

    /// The same rule with a float mask added to the logits (which must broadcast to `[B, h, T, S]`).
    pub fn with_bias(self, bias: Option<FloatBias>, dims: Dims) -> Self {
        Self { bias: bias.map(|bias| BiasLanes::pack(&bias, dims)), ..self }
    }

    /// Whether some (query, key) pair of a non-empty call may be blocked.
    pub fn is_trivial(&self) -> bool {
        !self.causal && self.bits.is_none()
    }

    /// The rule as seen by 16 query rows `block * 16 ..` of (batch, head) pair `pair`.
    #[inline]
    pub fn row_block(&self, dims: &Dims, pair: usize, block: usize) -> RowBlock<'_> {
        let first_row = block * LANES;
        let mut keys = (0, dims.source_len);
        let mut allowed_prefix = Some(dims.source_len);
        let bits = self.bits.as_ref().map(|m| {
            let slice = dims.broadcast_slice(m.slices, pair);
            let tb = if m.per_row { dims.row_blocks() } else { 1 };
            let tile = if m.per_row { block } else { 0 };
            keys = m.row_extents[slice * tb + tile];
            allowed_prefix = m.prefix_lens.as_ref().map(|lens| lens[slice]);
            &m.row_bits[(slice * tb + tile) * dims.padded_source_len()..][..dims.padded_source_len()]
        });
        if self.causal {
            keys.1 = keys.1.min(first_row + LANES); // the block's last row attends keys up to itself
        }
        let keep = self.dropout.map(|mask| (mask, std::array::from_fn(|i| mask.row(pair, first_row + i))));
        let bias = self.bias.as_ref().map(|bias| bias.row_block(dims, pair, block));
        RowBlock {
            first_row,
            source_len: dims.source_len,
            causal: self.causal,
            bits,
            allowed_prefix,
            keep,
            bias,
            keys: aligned(keys, dims.padded_source_len()),
            key_end: if keys.0 < keys.1 { keys.1.min(dims.source_len) } else { 0 },
        }
    }

    /// The rule as seen by 16 keys `block * 16 ..` of pair `pair`.
    #[inline]
    pub fn key_block(&self, dims: &Dims, pair: usize, block: usize) -> KeyBlock<'_> {
        let first_key = block * LANES;
        let mut queries = (0, dims.query_len);
        let mut per_row = true;
        let bits = self.bits.as_ref().map(|m| {
            let slice = dims.broadcast_slice(m.slices, pair);
            let sb = dims.key_blocks();
            let tk = if m.per_row { dims.query_len } else { 1 };
            per_row = m.per_row;
            queries = m.key_extents[slice * sb + block];
            &m.key_bits[(slice * sb + block) * tk..][..tk]
        });
        if self.causal {
            queries.0 = queries.0.max(first_key); // rows before the block's first key attend none of it
        }
        let valid_keys = dims.source_len.saturating_sub(first_key).min(LANES);
        KeyBlock {
            first_key,
            key_bound: low_bits(valid_keys),
            query_len: dims.query_len,
            causal: self.causal,
            bits,
            per_row,
            keep: self.dropout.map(|mask| (mask, pair)),
            bias: self.bias.as_ref().map(|bias| bias.key_block(dims, pair, block)),
            queries: aligned(queries, dims.padded_query_len()),
        }
    }
}

/// `[lo, hi)` widened to whole lane blocks, empty when `lo >= hi`.
fn aligned((lo, hi): (usize, usize), padded_len: usize) -> (usize, usize) {
    if lo >= hi { (0, 0) } else { (lo / LANES * LANES, hi.next_multiple_of(LANES).min(padded_len)) }
}

/// The `n` lowest of 16 bits.
#[inline(always)]
fn low_bits(n: usize) -> u16 {
    if n >= LANES { FULL } else { ((1u32 << n) - 1) as u16 }
}

/// Rows `first_row + i` that may attend key `key` under the causal rule: those with `t >= key`.
#[inline(always)]
fn causal_rows(first_row: usize, key: usize) -> u16 {
    match key.checked_sub(first_row) {
        None => FULL,
        Some(shift) if shift >= LANES => 0,
        Some(shift) => FULL << shift,
    }
}

/// The rule for one block of 16 query rows.
#[derive(Debug, Clone, Copy)]
pub struct RowBlock<'a> {
    first_row: usize,
    source_len: usize,
    causal: bool,
    /// `[S']` for this block.
    bits: Option<&'a [u16]>,
    /// The end of the keys the explicit mask allows where those are a prefix `[0, n)` for every
    /// row (`S` without one); `None` where they are not.
    allowed_prefix: Option<usize>,
    /// The dropout mask and the hashes of the block's 16 rows.
    keep: Option<(KeepMask, [u32; LANES])>,
    /// `[S']`: what the float mask adds to each key's logits of the block's rows.
    pub bias: Option<&'a [Lanes]>,
    /// The keys to visit, `[lo, hi)` in whole lane blocks.
    pub keys: (usize, usize),
    /// The end of the keys some row may attend (at most `S`): a walk that needs no whole blocks
    /// stops there.
    pub key_end: usize,
}

impl RowBlock<'_> {
    /// The block's rows (bit `i` = row `first_row + i`) that may attend `key`.
    #[inline(always)]
    pub fn bits(&self, key: usize) -> u16 {
        let mut bits = if key < self.source_len { FULL } else { 0 };
        if let Some(mask) = self.bits {
            bits &= mask[key];
        }
        if self.causal {
            bits &= causal_rows(self.first_row, key);
        }
        bits
    }

    /// For each of the block's rows, the end of the keys it may attend where those are a prefix
    /// `[0, end)` of the keys: all of them without a mask or up to a key-padding mask's length,
    /// and no further than the row's own with the causal rule. `None` with an explicit mask whose
    /// allowed keys are not a prefix.
    #[inline(always)]
    pub fn prefix_ends(&self) -> Option<[usize; LANES]> {
        let allowed = self.allowed_prefix?;
        let end = |i: usize| if self.causal { (self.first_row + i + 1).min(allowed) } else { allowed };
        Some(std::array::from_fn(end))
    }

    /// Whether every row may attend every key of `[start, hi)`, so that no lane needs masking.
    /// An explicit mask's bits are read: a padding mask's allowed keys need no masking either.
    #[inline(always)]
    pub fn all_allowed(&self, start: usize, hi: usize) -> bool {
        hi <= self.source_len
            && (!self.causal || hi <= self.first_row + 1)
            && self.bits.is_none_or(|bits| bits[start..hi].iter().fold(true, |all, &b| all & (b == FULL)))
    }

    /// With dropout: fills `keep[j]` with the block's rows that keep key `start + j` (bit `i` =
    /// row `first_row + i`) and returns true; without, returns false. Once per step of keys, so
    /// that the per-key loop holds no call (a call there spills the vectors it works on).
    #[inline(always)]
    pub fn keep_bits(&self, start: usize, keep: &mut [u16]) -> bool {
        let Some((mask, rows)) = &self.keep else {
            return false;
        };
        keep.iter_mut().enumerate().for_each(|(j, bits)| *bits = mask.row_bits(rows, start + j));
        true
    }

    /// What kept probabilities are scaled by: `1 / (1 - rate)` with dropout, else 1.
    #[inline(always)]
    pub fn dropout_scale(&self) -> f32 {
        self.keep.as_ref().map_or(1.0, |(mask, _)| mask.scale)
    }
}

/// The rule for one block of 16 keys.
#[derive(Debug, Clone, Copy)]
pub struct KeyBlock<'a> {
    first_key: usize,
    /// The lanes that hold real keys (`s < S`).
    key_bound: u16,
    query_len: usize,
    causal: bool,
    /// `[T]` (or `[1]` for a key-padding mask) for this block.
    bits: Option<&'a [u16]>,
    per_row: bool,
    /// The dropout mask and the (batch, head) pair.
    keep: Option<(KeepMask, usize)>,
    /// `[T']`: what the float mask adds to each row's logits of the block's keys.
    pub bias: Option<&'a [Lanes]>,
    /// The query rows to visit, `[lo, hi)` in whole lane blocks.
    pub queries: (usize, usize),
}

impl KeyBlock<'_> {
    /// The block's keys (bit `i` = key `first_key + i`) that query row `t` may attend.
    #[inline(always)]
    pub fn bits(&self, t: usize) -> u16 {
        if t >= self.query_len {
            return 0;
        }
        let mut bits = self.key_bound;
        if let Some(mask) = self.bits {
            bits &= mask[if self.per_row { t } else { 0 }];
        }
        if self.causal {
            bits &= low_bits((t + 1).saturating_sub(self.first_key));
        }
        bits
    }

    /// How many of the rows `t .. t + n` are real (`< T`): the rest pad the last block of rows.
    #[inline(always)]
    pub fn real_rows(&self, t: usize, n: usize) -> usize {
        n.min(self.query_len.saturating_sub(t))
    }

    /// Whether row `t .. t + n` may attend every key of the block.
    #[inline(always)]
    pub fn all_allowed(&self, t: usize, n: usize) -> bool {
        let rows = if self.per_row { t..t + n } else { 0..1 };
        t + n <= self.query_len
            && self.key_bound == FULL
            && (!self.causal || t >= self.first_key + LANES - 1)
            && self.bits.is_none_or(|bits| bits[rows].iter().fold(true, |all, &b| all & (b == FULL)))
    }

    /// With dropout: fills `keep[r]` with the block's keys that row `start + r` keeps (bit `i` =
    /// key `first_key + i`) and returns true; without, returns false. Once per step of rows.
    #[inline(always)]
    pub fn keep_bits(&self, start: usize, keep: &mut [u16]) -> bool {
        let Some((mask, pair)) = self.keep else {
            return false;
        };
        keep.iter_mut()
            .enumerate()
            .for_each(|(r, bits)| *bits = mask.key_bits(mask.row(pair, start + r), self.first_key));
        true
    }

    /// What kept probabilities are scaled by: `1 / (1 - rate)` with dropout, else 1.
    #[inline(always)]
    pub fn dropout_scale(&self) -> f32 {
        self.keep.map_or(1.0, |(mask, _)| mask.scale)
    }
}

/// Bit `i` set where `row[i]` (at most 16 entries). Whole rows of 16 eight at a time: the
/// product of eight 0-or-1 bytes with `0x0102_0408_1020_4080` gathers byte `i` into bit `56 + i`,
/// its other terms landing on distinct bits below 56 or past 63, so that nothing carries.
#[inline(always)]
fn lane_bits(row: &[bool]) -> u16 {
    const GATHER: u64 = 0x0102_0408_1020_4080;
    let eight = |bools: &[bool]| {
        let bytes: [u8; 8] = std::array::from_fn(|i| u8::from(bools[i]));
        (u64::from_le_bytes(bytes).wrapping_mul(GATHER) >> 56) as u16
    };
    if row.len() == LANES {
        eight(&row[..8]) | eight(&row[8..]) << 8
    } else {
        row.iter().enumerate().fold(0, |bits, (i, &a)| bits | (u16::from(a) << i))
    }
}

impl MaskBits {
    fn pack(mask: &BoolMask, dims: Dims) -> Self {
        let [bm, hm, tm, s] = mask.dims;
        assert!(bm == 1 || bm == dims.batch, "mask batch {bm} vs {}", dims.batch);
        assert!(hm == 1 || hm == dims.heads, "mask heads {hm} vs {}", dims.heads);
        assert!(tm == 1 || tm == dims.query_len, "mask rows {tm} vs {}", dims.query_len);
        assert_eq!(s, dims.source_len, "mask keys");
        let per_row = tm > 1 || dims.query_len == 1;
        let slices = bm * hm;
        let (padded_s, key_blocks) = (dims.padded_source_len(), dims.key_blocks());
        let row_tiles = if per_row { dims.row_blocks() } else { 1 };
        let key_rows = if per_row { dims.query_len } else { 1 };
        let rows_of = |slice: usize| &mask.allowed[slice * tm * s..][..tm * s];

        let mut row_bits = Buffer::zeroed(slices * row_tiles * padded_s);
        row_bits.par_chunks_mut(row_tiles * padded_s).enumerate().for_each(|(slice, out)| {
            let allowed = rows_of(slice);
            for (t, row) in allowed.chunks_exact(s.max(1)).enumerate().take(tm) {
                // Loops without a branch, which the compiler vectorises over the keys.
                if per_row {
                    let (tile, lane) = (t / LANES, t % LANES);
                    let out = &mut out[tile * padded_s..][..s];
                    out.iter_mut().zip(row).for_each(|(bits, &a)| *bits |= u16::from(a) << lane);
                } else {
                    // A key-padding row stands for every query row: all lanes or none.
                    out[..s].iter_mut().zip(row).for_each(|(bits, &a)| *bits |= u16::from(a).wrapping_neg());
                }
            }
        });
        let mut key_bits = Buffer::zeroed(slices * key_blocks * key_rows);
        key_bits.par_chunks_mut(key_blocks * key_rows).enumerate().for_each(|(slice, out)| {
            let allowed = rows_of(slice);
            for (block, out) in out.chunks_exact_mut(key_rows).enumerate() {
                for (t, bits) in out.iter_mut().enumerate() {
                    *bits = lane_bits(&allowed[t * s..][block * LANES..s.min((block + 1) * LANES)]);
                }
            }
        });
        // Extents: the first and last non-empty entry of each tile's bits.
        let extent = |bits: &[u16]| match (bits.iter().position(|&b| b != 0), bits.iter().rposition(|&b| b != 0)) {
            (Some(lo), Some(hi)) => (lo, hi + 1),
            _ => (0, 0),
        };
        let row_extents: Vec<(usize, usize)> = row_bits.chunks_exact(padded_s).map(|tile| extent(&tile[..s])).collect();
        // A key-padding mask's allowed keys, where they are a prefix in every slice: its bits
        // all set up to the extent's end (and the extent empty, or starting at 0).
        let prefix_len = |(tile, &(lo, hi)): (&[u16], &(usize, usize))| {
            (hi == 0 || (lo == 0 && tile[..hi].iter().all(|&bits| bits == FULL))).then_some(hi)
        };
        let prefix_lens = match per_row {
            true => None,
            false => row_bits.chunks_exact(padded_s).zip(&row_extents).map(prefix_len).collect(),
        };
        let key_extents = key_bits
            .chunks_exact(key_rows)
            .map(|tile| match per_row {
                true => extent(tile),
                false => {
                    if tile[0] != 0 {
                        (0, dims.query_len)
                    } else {
                        (0, 0)
                    }
                }
            })
            .collect();
        Self { slices: [bm, hm], per_row, row_bits, key_bits, row_extents, key_extents, prefix_lens }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(query_len: usize, source_len: usize) -> Dims {
        Dims { batch: 2, heads: 3, query_len, source_len, key_dim: 4, value_dim: 4 }
    }

    /// Every pattern of a full row's 16 lanes, and rows of 1 to 15, against the bits one by one.
    #[test]
    fn lane_bits_packs_every_pattern() {
        for pattern in 0..=u16::MAX {
            let row: Vec<bool> = (0..LANES).map(|i| pattern >> i & 1 == 1).collect();
            assert_eq!(lane_bits(&row), pattern, "{row:?}");
            let len = usize::from(pattern) % LANES;
            assert_eq!(lane_bits(&row[..len]), pattern & ((1u32 << len) - 1) as u16, "{:?}", &row[..len]);
        }
    }

    /// Every (pair, t, s) of both orientations against the rule written out.
    fn check(mask: &Mask, d: Dims, allowed: impl Fn(usize, usize, usize) -> bool) {
        for pair in 0..d.batch * d.heads {
            for t in 0..d.query_len {
                let rows = mask.row_block(&d, pair, t / LANES);
                for s in 0..d.padded_source_len() {
                    let want = s < d.source_len && allowed(pair, t, s);
                    assert_eq!(rows.bits(s) >> (t % LANES) & 1 == 1, want, "rows: pair {pair} t {t} s {s}");
                    let keys = mask.key_block(&d, pair, s / LANES);
                    assert_eq!(keys.bits(t) >> (s % LANES) & 1 == 1, want, "keys: pair {pair} t {t} s {s}");
                    if want {
                        assert!(rows.keys.0 <= s && s < rows.keys.1, "row extent {:?} misses {s}", rows.keys);
                        assert!(keys.queries.0 <= t && t < keys.queries.1, "key extent {:?} misses {t}", keys.queries);
                    }
                }
            }
        }
    }

    #[test]
    fn causal_rule_is_top_left_aligned() {
        for (t, s) in [(5, 9), (37, 20), (16, 16), (1, 40)] {
            check(&Mask::new(true, FullyMaskedRows::Zero), dims(t, s), |_, t, s| s <= t);
        }
    }

    #[test]
    fn explicit_masks_of_every_broadcast_with_the_causal_rule() {
        let d = dims(19, 37);
        let pattern = |b: usize, h: usize, t: usize, s: usize| !(b * 7 + h * 5 + t * 3 + s).is_multiple_of(4);
        for [bm, hm, tm] in [[2, 1, 19], [1, 1, 19], [2, 3, 19], [2, 1, 1], [1, 3, 1]] {
            let mut allowed = Vec::new();
            for b in 0..bm {
                for h in 0..hm {
                    for t in 0..tm {
                        allowed.extend((0..37).map(|s| pattern(b, h, t, s)));
                    }
                }
            }
            let mask = BoolMask { dims: [bm, hm, tm, 37], allowed };
            for causal in [false, true] {
                let rule = Mask::with_mask(causal, FullyMaskedRows::Zero, Some(mask.clone()), d);
                check(&rule, d, |pair, t, s| {
                    let (b, h) = (pair / 3, pair % 3);
                    let at = |n: usize, i: usize| if n == 1 { 0 } else { i };
                    pattern(at(bm, b), at(hm, h), at(tm, t), s) && (!causal || s <= t)
                });
            }
        }
    }

    #[test]
    fn padding_given_as_a_full_mask_becomes_a_key_mask() {
        let lengths = [5usize, 37];
        let allowed = lengths.iter().flat_map(|&n| (0..19).flat_map(move |_| (0..37).map(move |s| s < n))).collect();
        let mask = BoolMask { dims: [2, 1, 19, 37], allowed }.compact().1.unwrap();
        assert_eq!(mask.dims, [2, 1, 1, 37]);
        let d = dims(19, 37);
        let rule = Mask::with_mask(false, FullyMaskedRows::Zero, Some(mask.clone()), d);
        check(&rule, d, |pair, _, s| s < lengths[pair / 3]);
        assert_eq!(rule.row_block(&d, 0, 0).keys, (0, 16), "keys past the length are skipped");
        // Its allowed keys are prefixes: each row's end is its slice's length (and its own row
        // under the causal rule).
        assert!(rule.allows_prefixes());
        assert_eq!(rule.row_block(&d, 3, 0).prefix_ends(), Some([37; LANES]));
        assert_eq!(rule.row_block(&d, 0, 1).prefix_ends(), Some([5; LANES]));
        let causal = Mask::with_mask(true, FullyMaskedRows::Zero, Some(mask), d);
        assert_eq!(causal.row_block(&d, 0, 0).prefix_ends(), Some(std::array::from_fn(|t| (t + 1).min(5))));
        // Keys allowed with a gap, or not from the first, are no prefix.
        for allowed in [[true, false, true], [false, true, true]] {
            let mask = BoolMask { dims: [1, 1, 1, 3], allowed: allowed.to_vec() };
            let rule = Mask::with_mask(false, FullyMaskedRows::Zero, Some(mask), dims(2, 3));
            assert!(!rule.allows_prefixes(), "{allowed:?}");
            assert_eq!(rule.row_block(&dims(2, 3), 0, 0).prefix_ends(), None, "{allowed:?}");
        }
        assert_eq!(BoolMask { dims: [1, 1, 2, 3], allowed: vec![true; 6] }.compact(), (false, None));
        // torch's causal attn_mask, as a boolean mask, is the causal rule.
        let causal: Vec<bool> = (0..5 * 7).map(|i| i % 7 <= i / 7).collect();
        assert_eq!(BoolMask { dims: [1, 1, 5, 7], allowed: causal.clone() }.compact(), (true, None));
        let mut almost = causal;
        almost[3] = true;
        assert!(BoolMask { dims: [1, 1, 5, 7], allowed: almost }.compact().1.is_some(), "one pair off is not causal");
    }

    /// Masks as bytes (0 = false, any other = true) in either polarity compact as the same masks
    /// of `bool`s do, across the chunks the folds take (rows of 5000 keys).
    #[test]
    fn bytes_in_either_polarity_compact_as_the_masks_they_mark() {
        let (t, s) = (3, 5000);
        let as_bytes = |allowed: &dyn Fn(usize, usize) -> bool, marks: Marks| -> Vec<u8> {
            let byte = |a: bool| if a == (marks == Marks::Allowed) { 7 } else { 0 };
            (0..t * s).map(|i| byte(allowed(i / s, i % s))).collect()
        };
        for marks in [Marks::Allowed, Marks::Blocked] {
            let compact = |allowed: &dyn Fn(usize, usize) -> bool| {
                BoolMask::compact_bytes([1, 1, t, s], &as_bytes(allowed, marks), marks)
            };
            assert_eq!(compact(&|_, _| true), (false, None), "{marks:?}: all allowed");
            assert_eq!(compact(&|row, key| key <= row), (true, None), "{marks:?}: causal");
            let padding = compact(&|_, key| key < 4500);
            let expected: Vec<bool> = (0..s).map(|key| key < 4500).collect();
            assert_eq!(padding, (false, Some(BoolMask { dims: [1, 1, 1, s], allowed: expected })), "{marks:?}");
            // One pair off the causal pattern, past the first chunk of its row.
            let (rule, left) = compact(&|row, key| key <= row || (row, key) == (1, 4200));
            assert!(!rule, "{marks:?}: one pair off is not causal");
            let left = left.expect("a full mask");
            assert_eq!((left.dims, left.allowed[s + 4200], left.allowed[s + 4199]), ([1, 1, t, s], true, false));
        }
    }
}
