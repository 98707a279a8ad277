//! Keras-exact and PyTorch-style multi-head attention as Burn modules, with exact weight conversion.
//!
//! * [`KerasMha`]: `keras.layers.MultiHeadAttention` with all its sizes (`num_heads`, `key_dim`,
//!   `value_dim`, `output_shape`), biases, dropout, attention and causal masks and returned scores,
//!   attention over several axes of N-D inputs ([`keras_nd`]).
//! * [`TorchMha`]: `torch.nn.MultiheadAttention` (`embed_dim`, `num_heads`, `kdim`, `vdim`, `bias`,
//!   `batch_first`), with torch's mask polarity and head-averaged weights.
//! * [`ProjectedModel`]: the popular port `Linear(in, E)` + `nn.MultiheadAttention(E, h)`, with the
//!   optional final `Linear(E, out)` that makes it comparable with Keras' output width.
//! * [`convert`]: exact weight mappings between the three, and [`weights`]: safetensors I/O.

pub mod attention;
pub mod backend;
pub mod convert;
pub mod dense;
pub mod error;
pub mod fixture;
pub mod initializer;
pub mod keras_file;
pub mod keras_mha;
pub mod keras_nd;
pub mod nd_mask;
pub mod projected;
pub mod rng;
pub mod torch_file;
pub mod torch_mha;
pub mod weights;

pub use backend::{Backend, WgpuKind};
pub use error::{ModelError, Result};
pub use keras_mha::{KerasMha, KerasMhaConfig, KerasMhaInput, KerasMhaOutput};
pub use keras_nd::{KerasMhaNdInput, KerasMhaNdOutput};
pub use nd_mask::NdMask;
pub use projected::{ProjectedConfig, ProjectedModel};
pub use torch_mha::{TorchMha, TorchMhaConfig, TorchMhaInput, TorchMhaOutput};
pub use weights::{HostTensor, TensorFile, WeightMap};
