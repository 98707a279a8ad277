//! A model's saved variables (`model.weights.h5`), looked up per layer.
//!
//! Keras keeps a layer's own variables at `<layer path>/vars/0, 1, ...` in the order the layer
//! created them (`Dense`: kernel, bias; `BatchNormalization`: gamma, beta, moving mean, moving
//! variance), each layer's path given by [`super::graph::LayerSpec::h5_path`].

use std::path::{Path, PathBuf};

use model::error::{ModelError, Result};
use model::weights::{HostTensor, WeightMap};

use super::graph::LayerSpec;

/// Where a model's variables come from: the HDF5 file of a `.keras` archive, or the same
/// variables keyed by their HDF5 paths (`layers/dense/vars/0`), as a burnpack export holds them.
pub enum Store {
    H5(hdf5_pure::File),
    Paths(WeightMap),
}

/// A model's saved variables, and the file they came from (for errors).
pub struct SavedWeights {
    pub file: PathBuf,
    pub store: Store,
}

impl SavedWeights {
    pub fn new(file: &Path, store: Store) -> Self {
        Self { file: file.to_path_buf(), store }
    }

    /// An attention layer's four (or five, with `use_gate`) sublayers' variables, named as
    /// [`model::keras_file`] names them (`query.kernel`, ..., `attention_output.bias`).
    pub fn attention_weights(&self, path: &str, name: &str) -> Result<WeightMap> {
        match &self.store {
            Store::H5(h5) => model::keras_file::read_attention_weights(&self.file, h5, path, name),
            Store::Paths(_) => {
                let mut weights = WeightMap::new();
                for (sublayer, ours) in model::keras_file::ATTENTION_SUBLAYERS {
                    let vars_path = format!("{path}/{sublayer}/vars");
                    if sublayer == model::keras_file::ATTENTION_GATE && !self.has(&vars_path) {
                        continue;
                    }
                    for (var, tensor) in ["kernel", "bias"].into_iter().zip(self.vars_at(&vars_path, name)?) {
                        weights.insert(format!("{ours}.{var}"), tensor);
                    }
                }
                Ok(weights)
            }
        }
    }

    fn has(&self, vars_path: &str) -> bool {
        match &self.store {
            Store::H5(h5) => h5.group(vars_path).is_ok(),
            Store::Paths(map) => map.names().any(|n| n.starts_with(&format!("{vars_path}/"))),
        }
    }

    /// The layer's own variables, in creation order.
    pub fn vars(&self, spec: &LayerSpec) -> Result<Vec<HostTensor>> {
        let Some(path) = &spec.h5_path else { return Ok(vec![]) };
        self.vars_at(&format!("{path}/vars"), &spec.name)
    }

    /// The variables in the group `vars_path`, named for errors by the layer `name`.
    pub fn vars_at(&self, vars_path: &str, name: &str) -> Result<Vec<HostTensor>> {
        let error = |what: String| ModelError::file(&self.file, format!("layer {name}: {what}"));
        let h5 = match &self.store {
            Store::H5(h5) => h5,
            Store::Paths(map) => {
                let mut out = Vec::new();
                while let Ok(tensor) = map.get(&format!("{vars_path}/{}", out.len())) {
                    out.push(tensor.clone());
                }
                if out.is_empty() && map.names().any(|n| n.starts_with(&format!("{vars_path}/"))) {
                    return Err(error(format!("{vars_path}: variables not numbered from 0")));
                }
                return Ok(out);
            }
        };
        let Ok(group) = h5.group(vars_path) else {
            return Err(error(format!("no saved variables at {vars_path} in model.weights.h5")));
        };
        let mut names = group.datasets().map_err(|e| error(format!("{vars_path}: {e}")))?;
        names.sort_by_key(|n| n.parse::<usize>().unwrap_or(usize::MAX));
        let mut out = Vec::new();
        for (index, dataset_name) in names.iter().enumerate() {
            if dataset_name != &index.to_string() {
                return Err(error(format!("{vars_path}: variable {dataset_name:?} where {index} was expected")));
            }
            let dataset = group.dataset(dataset_name).map_err(|e| error(format!("{vars_path}/{dataset_name}: {e}")))?;
            let shape: Vec<usize> = dataset
                .shape()
                .map_err(|e| error(format!("{vars_path}/{dataset_name}: {e}")))?
                .into_iter()
                .map(|d| d as usize)
                .collect();
            let data = dataset.read_f32().map_err(|e| error(format!("{vars_path}/{dataset_name}: {e}")))?;
            if data.len() != shape.iter().product::<usize>() {
                return Err(error(format!("{vars_path}/{dataset_name}: {} values for shape {shape:?}", data.len())));
            }
            out.push(HostTensor::new(shape, data));
        }
        Ok(out)
    }
}

/// Takes the saved variables in order, checking each one's shape.
pub struct VarReader {
    what: String,
    vars: std::vec::IntoIter<HostTensor>,
    count: usize,
}

impl VarReader {
    pub fn new(what: &str, vars: Vec<HostTensor>) -> Self {
        let count = vars.len();
        Self { what: what.to_string(), vars: vars.into_iter(), count }
    }

    /// The next variable, which must have `shape` (`None` entries: any size).
    pub fn next(&mut self, name: &str, shape: &[Option<usize>]) -> Result<HostTensor> {
        let tensor = self.next_any(name)?;
        let fits =
            tensor.shape.len() == shape.len() && tensor.shape.iter().zip(shape).all(|(d, s)| s.is_none_or(|s| s == *d));
        if !fits {
            return Err(ModelError::InvalidConfig {
                field: "weights",
                value: self.what.clone(),
                reason: format!(
                    "saved `{name}` has shape {:?}, its config gives {:?}",
                    tensor.shape,
                    shape.iter().map(|s| s.map_or("?".to_string(), |d| d.to_string())).collect::<Vec<_>>()
                ),
            });
        }
        Ok(tensor)
    }

    /// The next variable, of any shape.
    pub fn next_any(&mut self, name: &str) -> Result<HostTensor> {
        self.vars.next().ok_or_else(|| ModelError::InvalidConfig {
            field: "weights",
            value: self.what.clone(),
            reason: format!("its config needs a variable `{name}` beyond the {} saved", self.count),
        })
    }

    /// Every variable was used.
    pub fn finish(mut self) -> Result<()> {
        if self.vars.next().is_some() {
            return Err(ModelError::InvalidConfig {
                field: "weights",
                value: self.what,
                reason: format!("{} variables are saved, more than its config uses", self.count),
            });
        }
        Ok(())
    }
}
