//! Keras' `attention_axes`: attention over several axes of an input of any rank.
//!
//! For a query `[B, a_1, ..., a_m, Dq]` Keras projects the last axis as for `[B, T, Dq]`
//! (`Q [B, a_1, ..., a_m, h, k]`) and attends over the axes `A` (`attention_axes`, default every
//! `a_i`); the others and the heads are batch axes. Its einsum puts the scores in the layout
//!
//! ```text
//! scores [batch axes..., h, query's A axes..., key's A axes...]     softmax over the key's A axes, jointly
//! ```
//!
//! A softmax over several axes jointly is a softmax over them flattened, and batch axes never
//! mix, so the call is the `[B', T', D]` call with `B'` = the batch axes' product and `T'` (`S'`)
//! = the query's (key's) attention axes' product, in `A`'s order:
//!
//! ```text
//! x [B, a_1, ..., a_m, D] --permute (batch axes, A, D)--> --reshape--> [B', T', D]
//! y [B', T', O] --reshape (batch axes, A, O)--> --inverse permute--> [B, a_1, ..., a_m, O]
//! ```
//!
//! and it runs on the same fused kernel. Keras' masks keep its own rules ([`NdMask`]): the
//! implicit masks are expanded at `-1` (query) and `-2` (value, key), the causal and sliding-window
//! masks are `[1, T, S]` over axis 1 of the query and value, all are ANDed with numpy broadcasting
//! and then expanded at axis `-2|A| - 1` (before the attention axes) to the scores' rank. An
//! input of rank other than 3 always takes Keras' einsum path, whose fully masked rows are zero
//! ([`FullyMaskedRows::Zero`]); rank 3 keeps [`KerasMha::forward`]'s rule.

use burn::tensor::{Bool, Tensor, TensorData};

use crate::attention::FullyMaskedRows;
use crate::error::{ModelError, Result};
use crate::keras_mha::{KerasMha, KerasMhaInput, resolve_attention_axes};
use crate::nd_mask::NdMask;

/// The arguments of one call on inputs of rank `D` (at least 3), named as Keras names them.
/// Masks are host arrays ([`NdMask`]) because their rank is not the inputs'.
#[derive(Debug, Clone)]
pub struct KerasMhaNdInput<const D: usize> {
    /// `[B, a_1, ..., Dq]`
    pub query: Tensor<D>,
    /// `[B, b_1, ..., Dv]`: the same sizes as the query's on every batch axis.
    pub value: Tensor<D>,
    /// `[B, b_1, ..., Dk]`; `None` = `value`.
    pub key: Option<Tensor<D>>,
    /// Any shape that broadcasts, after Keras' expansion, to the scores without the heads.
    pub attention_mask: Option<NdMask>,
    /// The query tensor's Keras mask: the query's shape without the features.
    pub query_mask: Option<NdMask>,
    pub value_mask: Option<NdMask>,
    pub key_mask: Option<NdMask>,
    pub use_causal_mask: bool,
    pub training: bool,
    pub return_attention_scores: bool,
}

impl<const D: usize> KerasMhaNdInput<D> {
    /// `layer(query, value)`.
    pub fn new(query: Tensor<D>, value: Tensor<D>) -> Self {
        Self {
            query,
            value,
            key: None,
            attention_mask: None,
            query_mask: None,
            value_mask: None,
            key_mask: None,
            use_causal_mask: false,
            training: false,
            return_attention_scores: false,
        }
    }
}

/// The result of an N-D call.
#[derive(Debug, Clone)]
pub struct KerasMhaNdOutput<const D: usize> {
    /// `[B, a_1, ..., O]`, the query's layout.
    pub output: Tensor<D>,
    /// `[B', h, T', S']`, when requested: Keras' scores with the batch and attention axes each
    /// flattened; `attention_scores_shape` is Keras' layout of the same numbers (row-major).
    pub attention_scores: Option<Tensor<4>>,
    pub attention_scores_shape: Vec<usize>,
}

/// How the axes of a rank-`D` input map onto the flattened `[B', T', D]` call.
struct AxisLayout<const D: usize> {
    /// The attention axes, in `attention_axes`' order.
    attention: Vec<usize>,
    /// The other non-feature axes, ascending (axis 0 first).
    batch: Vec<usize>,
    /// `batch ++ attention ++ [D - 1]`.
    permutation: [usize; D],
}

impl<const D: usize> AxisLayout<D> {
    fn new(attention: Vec<usize>) -> Self {
        let batch: Vec<usize> = (0..D - 1).filter(|a| !attention.contains(a)).collect();
        let mut permutation = [D - 1; D];
        for (slot, &axis) in permutation.iter_mut().zip(batch.iter().chain(&attention)) {
            *slot = axis;
        }
        Self { attention, batch, permutation }
    }

    fn product(dims: &[usize; D], axes: &[usize]) -> usize {
        axes.iter().map(|&a| dims[a]).product()
    }

    /// `[B, ..., F] -> [B', T', F]`.
    fn flatten(&self, x: Tensor<D>) -> Tensor<3> {
        let dims = x.dims();
        let shape = [Self::product(&dims, &self.batch), Self::product(&dims, &self.attention), dims[D - 1]];
        x.permute(self.permutation).reshape(shape)
    }

    /// `[B', T', F] -> [B, ..., F]` in the layout of `like` (the query's dims), features `F`.
    fn unflatten(&self, y: Tensor<3>, like: &[usize; D]) -> Tensor<D> {
        let mut permuted = [0; D];
        for (slot, &axis) in permuted.iter_mut().zip(&self.permutation[..D - 1]) {
            *slot = like[axis];
        }
        permuted[D - 1] = y.dims()[2];
        let mut inverse = [0; D];
        for (position, &axis) in self.permutation.iter().enumerate() {
            inverse[axis] = position;
        }
        y.reshape(permuted).permute(inverse)
    }
}

impl KerasMha {
    /// The call `layer(query, value, key, ...)` on inputs of rank `D`, attending over the layer's
    /// `attention_axes` (see the module docs): the same kernel as [`KerasMha::forward`], on the
    /// flattened axes.
    pub fn forward_nd<const D: usize>(&self, input: KerasMhaNdInput<D>) -> Result<KerasMhaNdOutput<D>> {
        if D < 3 {
            return Err(ModelError::InputShape {
                input: "query",
                expected: "rank 3 or more: [B, ..., D]".into(),
                found: input.query.dims().to_vec(),
            });
        }
        self.check_flash(input.return_attention_scores)?;
        let layout = AxisLayout::<D>::new(resolve_attention_axes(self.attention_axes.as_deref(), D)?);
        let query_dims = input.query.dims();
        let value_dims = input.value.dims();
        for &axis in &layout.batch {
            if value_dims[axis] != query_dims[axis] {
                return Err(ModelError::InputShape {
                    input: "value",
                    expected: format!("size {} on batch axis {axis} (the query's)", query_dims[axis]),
                    found: value_dims.to_vec(),
                });
            }
        }
        if let Some(key) = &input.key
            && key.dims()[..D - 1] != value_dims[..D - 1]
        {
            return Err(ModelError::InputShape {
                input: "key",
                expected: format!("the value's sizes but the last: {:?}", &value_dims[..D - 1]),
                found: key.dims().to_vec(),
            });
        }
        let mask = self.nd_attention_mask(&input, &layout, query_dims, value_dims)?;
        let rows = if D == 3 { self.fully_masked_rows(input.return_attention_scores) } else { FullyMaskedRows::Zero };

        let device = input.query.device();
        let flat = KerasMhaInput {
            query: layout.flatten(input.query),            // [B', T', Dq]
            value: layout.flatten(input.value),            // [B', S', Dv]
            key: input.key.map(|key| layout.flatten(key)), // [B', S', Dk]
            attention_mask: mask
                .map(|(mask, shape)| Tensor::<3, Bool>::from_data(TensorData::new(mask.into_data(), shape), &device)), // [B', T', S']
            query_mask: None,
            value_mask: None,
            key_mask: None,
            use_causal_mask: false, // folded into the mask: Keras' causal mask is over axis 1 only
            training: input.training,
            return_attention_scores: input.return_attention_scores,
            self_attention: false,
        };
        let result = self.forward_folded(flat, rows, None)?;
        let batch_sizes = layout.batch.iter().map(|&a| query_dims[a]);
        let attention_scores_shape = batch_sizes
            .chain([self.num_heads])
            .chain(layout.attention.iter().map(|&a| query_dims[a]))
            .chain(layout.attention.iter().map(|&a| value_dims[a]))
            .collect();
        Ok(KerasMhaNdOutput {
            output: layout.unflatten(result.output, &query_dims), // [B, a_1, ..., O]
            attention_scores: result.attention_scores,            // [B', h, T', S']
            attention_scores_shape,
        })
    }

    /// Every mask of the call combined as Keras combines them, in the scores' layout without the
    /// heads, flattened to `[B', T', S']`; `None` when the call has no mask.
    fn nd_attention_mask<const D: usize>(
        &self,
        input: &KerasMhaNdInput<D>,
        layout: &AxisLayout<D>,
        query_dims: [usize; D],
        value_dims: [usize; D],
    ) -> Result<Option<(NdMask, [usize; 3])>> {
        let (query_len, source_len) = (query_dims[1], value_dims[1]);
        let mut parts: Vec<(&'static str, NdMask)> = Vec::new();
        parts.extend(input.query_mask.clone().map(|m| ("query_mask", m.expand_dims(-1))));
        parts.extend(input.value_mask.clone().map(|m| ("value_mask", m.expand_dims(-2))));
        parts.extend(input.key_mask.clone().map(|m| ("key_mask", m.expand_dims(-2))));
        if input.use_causal_mask {
            parts.push(("the causal mask", NdMask::from_fn(vec![1, query_len, source_len], |i| i[2] <= i[1])));
        }
        if let Some(window) = self.sliding_window {
            parts.push((
                "the sliding window",
                NdMask::from_fn(vec![1, query_len, source_len], |i| i[1].abs_diff(i[2]) < window),
            ));
        }
        parts.extend(input.attention_mask.clone().map(|m| ("attention_mask", m)));
        let mut parts = parts.into_iter();
        let Some((mut name, mut mask)) = parts.next() else { return Ok(None) };
        for (next, part) in parts {
            mask = mask.and(&part).ok_or_else(|| ModelError::InputShape {
                input: next,
                expected: format!("a shape that broadcasts with {name}'s {:?}", mask.shape()),
                found: part.shape().to_vec(),
            })?;
            name = next;
        }

        // Keras expands the mask at the heads' position until it has the scores' rank.
        let heads_axis = layout.batch.len();
        let n = layout.attention.len();
        let scores_rank = heads_axis + 1 + 2 * n;
        if mask.shape().len() > scores_rank {
            return Err(ModelError::InputShape {
                input: "attention_mask",
                expected: format!("rank at most {scores_rank} (the scores')"),
                found: mask.shape().to_vec(),
            });
        }
        while mask.shape().len() < scores_rank {
            mask = mask.expand_dims(-2 * n as isize - 1);
        }
        if mask.shape()[heads_axis] != 1 {
            return Err(ModelError::InputShape {
                input: "attention_mask",
                expected: "size 1 on the heads axis (per-head masks are not supported)".into(),
                found: mask.shape().to_vec(),
            });
        }
        let batch = layout.batch.iter().map(|&a| query_dims[a]);
        let shape: Vec<usize> = batch
            .chain([1])
            .chain(layout.attention.iter().map(|&a| query_dims[a]))
            .chain(layout.attention.iter().map(|&a| value_dims[a]))
            .collect();
        let found = mask.shape().to_vec();
        let mask = mask.broadcast_to(&shape).ok_or_else(|| ModelError::InputShape {
            input: "attention_mask",
            expected: format!(
                "a mask that broadcasts to the scores without the heads {shape:?} (after Keras' expansion)"
            ),
            found,
        })?;
        let flat = [
            AxisLayout::<D>::product(&query_dims, &layout.batch),
            AxisLayout::<D>::product(&query_dims, &layout.attention),
            AxisLayout::<D>::product(&value_dims, &layout.attention),
        ];
        Ok(Some((mask, flat)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layout_round_trips() {
        let device = burn::tensor::Device::default();
        let layout = AxisLayout::<5>::new(vec![3, 1]);
        assert_eq!(layout.batch, [0, 2]);
        assert_eq!(layout.permutation, [0, 2, 3, 1, 4]);
        let x = Tensor::<5>::from_data(
            TensorData::new((0..720).map(|v| v as f32).collect::<Vec<_>>(), [2, 3, 4, 5, 6]),
            &device,
        );
        let flat = layout.flatten(x.clone());
        assert_eq!(flat.dims(), [8, 15, 6]);
        let back = layout.unflatten(flat, &x.dims());
        assert_eq!(back.into_data(), x.into_data());
    }
}
