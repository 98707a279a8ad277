//! The training loss, as both libraries compute it.

use burn::tensor::Tensor;

/// `mean((output - target)^2)` over all `B * T * O` elements: Keras' `ops.mean(ops.square(out - y))`
/// and torch's `F.mse_loss(out, y, reduction="mean")`. Padded positions are not excluded.
pub fn mse(output: Tensor<3>, target: Tensor<3>) -> Tensor<1> {
    (output - target).square().mean() // [1]
}
