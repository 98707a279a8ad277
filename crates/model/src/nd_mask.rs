//! Boolean masks of any rank on the host, with numpy's `expand_dims` and broadcasting `&`: what
//! Keras does to the masks of attention over several axes before they reach the softmax.
//!
//! Burn's tensors carry their rank in the type; the masks of an N-D Keras call do not have one
//! rank (an `attention_mask` may be given at any rank that broadcasts, Keras' causal mask is
//! `[1, T, S]`, an implicit mask is the input's shape without features), so they are combined
//! here and only the result, flattened to `[B', T', S']`, goes to a device.

use burn::tensor::{Bool, Tensor};

/// A row-major boolean array, `true` = may attend (Keras' polarity).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NdMask {
    shape: Vec<usize>,
    data: Vec<bool>,
}

impl NdMask {
    /// `None` when `data` does not hold `shape`'s element count.
    pub fn new(shape: Vec<usize>, data: Vec<bool>) -> Option<Self> {
        (shape.iter().product::<usize>() == data.len()).then_some(Self { shape, data })
    }

    /// `shape` filled by `allowed(index)`, the index being one entry per axis.
    pub fn from_fn(shape: Vec<usize>, allowed: impl Fn(&[usize]) -> bool) -> Self {
        let mut index = vec![0; shape.len()];
        let data = (0..shape.iter().product::<usize>())
            .map(|flat| {
                unravel(flat, &shape, &mut index);
                allowed(&index)
            })
            .collect();
        Self { shape, data }
    }

    /// Reads a device mask back to the host.
    pub fn from_tensor<const D: usize>(mask: Tensor<D, Bool>) -> Self {
        let shape = mask.dims().to_vec();
        let data = mask.into_data().convert::<bool>().try_into_vec::<bool>().expect("converted to bool above");
        Self { shape, data }
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    pub fn data(&self) -> &[bool] {
        &self.data
    }

    pub fn into_data(self) -> Vec<bool> {
        self.data
    }

    /// `numpy.expand_dims(mask, axis)`: a size-1 axis at `axis` of the result (negative counts
    /// from the result's end, as numpy does).
    pub fn expand_dims(mut self, axis: isize) -> Self {
        let rank = self.shape.len() as isize + 1;
        let at = if axis < 0 { rank + axis } else { axis };
        self.shape.insert(at.clamp(0, rank - 1) as usize, 1);
        self
    }

    /// `a & b` with numpy broadcasting; `None` when the shapes do not broadcast.
    pub fn and(&self, other: &NdMask) -> Option<NdMask> {
        let shape = broadcast_shape(&self.shape, &other.shape)?;
        let (a, b) = (self.broadcast_to(&shape)?, other.broadcast_to(&shape)?);
        let data = a.data.iter().zip(&b.data).map(|(x, y)| *x && *y).collect();
        Some(NdMask { shape, data })
    }

    /// The mask repeated along its size-1 axes (leading axes added) to `shape`; `None` when it
    /// does not broadcast to it.
    pub fn broadcast_to(&self, shape: &[usize]) -> Option<NdMask> {
        if shape.len() < self.shape.len() {
            return None;
        }
        let offset = shape.len() - self.shape.len();
        let mut strides = vec![0; shape.len()]; // 0 along a broadcast axis
        let mut stride = 1;
        for (axis, &size) in self.shape.iter().enumerate().rev() {
            match (size, shape[offset + axis]) {
                (1, _) => {}
                (a, b) if a == b => strides[offset + axis] = stride,
                _ => return None,
            }
            stride *= size;
        }
        if self.shape == shape {
            return Some(self.clone());
        }
        let mut index = vec![0; shape.len()];
        let data = (0..shape.iter().product::<usize>())
            .map(|flat| {
                unravel(flat, shape, &mut index);
                self.data[index.iter().zip(&strides).map(|(i, s)| i * s).sum::<usize>()]
            })
            .collect();
        Some(NdMask { shape: shape.to_vec(), data })
    }
}

/// numpy's broadcast shape of two shapes (aligned at their ends); `None` when they clash.
pub fn broadcast_shape(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| if i + s.len() >= rank { s[i + s.len() - rank] } else { 1 };
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y || y == 1 => Some(x),
            (1, y) => Some(y),
            _ => None,
        })
        .collect()
}

/// Writes the per-axis index of row-major position `flat` in `shape` into `index`.
fn unravel(mut flat: usize, shape: &[usize], index: &mut [usize]) {
    for (slot, &size) in index.iter_mut().zip(shape).rev() {
        *slot = flat % size;
        flat /= size;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_dims_counts_negative_axes_from_the_result() {
        let mask = NdMask::from_fn(vec![2, 3, 4], |_| true);
        assert_eq!(mask.clone().expand_dims(-1).shape(), [2, 3, 4, 1]);
        assert_eq!(mask.clone().expand_dims(-2).shape(), [2, 3, 1, 4]);
        assert_eq!(mask.clone().expand_dims(-4).shape(), [1, 2, 3, 4]);
        assert_eq!(mask.expand_dims(1).shape(), [2, 1, 3, 4]);
    }

    #[test]
    fn and_broadcasts_as_numpy() {
        // [2, 1] & [1, 3] -> [2, 3]: rows from the first, columns from the second.
        let rows = NdMask::new(vec![2, 1], vec![true, false]).unwrap();
        let cols = NdMask::new(vec![3], vec![true, false, true]).unwrap();
        let both = rows.and(&cols).unwrap();
        assert_eq!(both.shape(), [2, 3]);
        assert_eq!(both.data(), [true, false, true, false, false, false]);
        assert!(rows.and(&NdMask::from_fn(vec![3, 3], |_| true)).is_none(), "2 against 3 does not broadcast");
        assert_eq!(broadcast_shape(&[1, 6, 6], &[2, 3, 6, 1]), Some(vec![2, 3, 6, 6]));
        assert_eq!(broadcast_shape(&[4], &[3]), None);
    }

    #[test]
    fn broadcast_to_repeats_size_one_axes() {
        let tril = NdMask::from_fn(vec![1, 2, 2], |i| i[2] <= i[1]);
        let out = tril.broadcast_to(&[2, 2, 2]).unwrap();
        assert_eq!(out.data(), [true, false, true, true, true, false, true, true]);
        assert!(tril.broadcast_to(&[2, 2]).is_none(), "cannot drop axes");
    }
}
