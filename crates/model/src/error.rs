//! Errors a user can cause: bad configs, wrong shapes, missing or misshapen weights, bad files,
//! and conversions that cannot be exact.

use std::path::PathBuf;

/// Everything that can go wrong when building, calling, loading or converting a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A configuration value is out of range or not supported.
    #[error("invalid config: {field} = {value}: {reason}")]
    InvalidConfig { field: &'static str, value: String, reason: String },

    /// A forward input has the wrong shape.
    #[error("input `{input}`: expected shape {expected}, found {found:?}")]
    InputShape { input: &'static str, expected: String, found: Vec<usize> },

    /// A weight the layout needs is not in the weight set.
    #[error("missing tensor `{name}`{}", hint.as_ref().map(|h| format!(" ({h})")).unwrap_or_default())]
    MissingTensor { name: String, hint: Option<String> },

    /// A weight exists but has the wrong shape.
    #[error("tensor `{name}`: expected shape {expected:?}, found {found:?}")]
    TensorShape { name: String, expected: Vec<usize>, found: Vec<usize> },

    /// A tensor has the wrong number of dimensions.
    #[error("tensor `{name}`: expected {expected} dimensions, found shape {found:?}")]
    TensorRank { name: String, expected: usize, found: Vec<usize> },

    /// A weight set holds tensors the layout does not know (a typo, or the wrong vocabulary).
    #[error("unexpected tensors {names:?}: not part of this layout")]
    UnexpectedTensors { names: Vec<String> },

    /// A conversion between vocabularies cannot be exact.
    #[error("conversion {direction} cannot be exact: {reason}")]
    Conversion { direction: &'static str, reason: String },

    /// A file could not be read or written.
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
}

impl ModelError {
    pub fn config(field: &'static str, value: impl std::fmt::Display, reason: impl Into<String>) -> Self {
        Self::InvalidConfig { field, value: value.to_string(), reason: reason.into() }
    }

    pub fn file(path: impl Into<PathBuf>, message: impl std::fmt::Display) -> Self {
        Self::File { path: path.into(), message: message.to_string() }
    }
}

pub type Result<T, E = ModelError> = std::result::Result<T, E>;
