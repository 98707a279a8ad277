//! Whole Keras 3 models: a `.keras` archive's functional graph run in Burn, every layer with
//! Keras' own semantics and masks.
//!
//! ```text
//! config.json ──graph──► Graph (calls in running order, nested models expanded)
//! model.weights.h5 ──saved──► each layer's variables ──layers──► Layer (Burn modules)
//!                                   KerasModel::forward: the calls in order, masks carried along
//! ```
//!
//! `value` holds tensors of any rank ([`value::DynTensor`]); `config` reads and refuses
//! arguments; `activation` and `ops` are Keras' functions and operation nodes.

pub mod activation;
pub mod config;
pub mod graph;
pub mod layers;
pub mod model;
pub mod ops;
pub mod saved;
pub mod torch;
pub mod value;

pub use graph::{Graph, InputSpec};
pub use model::{KerasModel, ModelOutputs};
pub use value::{DType, DynTensor, Value};
