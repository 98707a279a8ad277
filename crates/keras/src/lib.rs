//! Whole Keras 3 models: a `.keras` archive's functional graph run in Burn, every layer with
//! Keras' own semantics and masks, and the same model written out as PyTorch code.
//!
//! ```text
//! config.json ──graph──► Graph (calls in running order, nested models expanded)
//! model.weights.h5 ──saved──► each layer's variables ──layers──► Layer (Burn modules)
//!                                   KerasModel::forward: the calls in order, masks carried along
//! KerasModel ──torch──► OUT.py (one nn.Module) + its state dict; `convert` writes both and a probe
//! ```
//!
//! `value` holds tensors of any rank ([`value::DynTensor`]); `config` reads and refuses
//! arguments; `activation` and `ops` are Keras' functions and operation nodes. The attention
//! layer itself is the `model` crate's [`model::KerasMha`].

pub mod activation;
pub mod config;
pub mod convert;
pub mod executor;
pub mod graph;
pub mod layer_convert;
pub mod layer_fixture;
pub mod layer_torch;
pub mod layers;
pub mod ops;
pub mod saved;
pub mod torch;
pub mod value;

pub use executor::{KerasModel, ModelOutputs};
pub use graph::{Graph, InputSpec};
pub use value::{DType, DynTensor, Value};
