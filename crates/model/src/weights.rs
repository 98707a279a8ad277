//! Host-side named tensors and safetensors I/O.
//!
//! Weight conversion between vocabularies (Keras, torch, Burn) is plain array surgery, so it is
//! done here on the host, on row-major `f32` arrays, and only the result is moved to a device.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use burn::tensor::{Bool, Device, Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};

use crate::error::{ModelError, Result};

/// Element type a tensor had in its file; masks are stored as `u8` and kept so on write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoredDtype {
    F32,
    U8,
}

/// A row-major host tensor. Masks are held as 0.0 / 1.0.
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
    pub dtype: StoredDtype,
}

impl HostTensor {
    pub fn new(shape: Vec<usize>, data: Vec<f32>) -> Self {
        debug_assert_eq!(shape.iter().product::<usize>(), data.len());
        Self { shape, data, dtype: StoredDtype::F32 }
    }

    pub fn zeros(shape: Vec<usize>) -> Self {
        let n = shape.iter().product();
        Self::new(shape, vec![0.0; n])
    }

    /// The same numbers under another shape with the same element count.
    pub fn reshaped(&self, shape: Vec<usize>) -> Self {
        assert_eq!(shape.iter().product::<usize>(), self.data.len(), "reshape must keep the element count");
        Self { shape, data: self.data.clone(), dtype: self.dtype }
    }

    /// Reads a float tensor back from a device.
    pub fn from_tensor<const D: usize>(tensor: Tensor<D>) -> Self {
        let shape = tensor.dims().to_vec();
        let data = tensor.into_data().convert::<f32>().try_into_vec::<f32>().expect("converted to f32 above");
        Self::new(shape, data)
    }

    pub fn to_tensor<const D: usize>(&self, name: &str, device: &Device) -> Result<Tensor<D>> {
        self.check_rank(name, D)?;
        Ok(Tensor::from_data(TensorData::new(self.data.clone(), self.shape.clone()), device))
    }

    /// A boolean tensor, true where the stored value is non-zero.
    pub fn to_bool_tensor<const D: usize>(&self, name: &str, device: &Device) -> Result<Tensor<D, Bool>> {
        self.check_rank(name, D)?;
        let values: Vec<bool> = self.data.iter().map(|v| *v != 0.0).collect();
        Ok(Tensor::from_data(TensorData::new(values, self.shape.clone()), device))
    }

    fn check_rank(&self, name: &str, rank: usize) -> Result<()> {
        if self.shape.len() == rank {
            return Ok(());
        }
        Err(ModelError::TensorRank { name: name.to_string(), expected: rank, found: self.shape.clone() })
    }

    /// Entry `index` along the first axis: `[N, ...] -> [...]`.
    pub fn index_first(&self, index: usize) -> Self {
        let inner: Vec<usize> = self.shape[1..].to_vec();
        let size: usize = inner.iter().product();
        let data = self.data[index * size..(index + 1) * size].to_vec();
        Self { shape: inner, data, dtype: self.dtype }
    }

    /// 2-D transpose `[r, c] -> [c, r]`.
    pub fn transposed(&self) -> Self {
        let [r, c] = self.shape[..] else { panic!("transposed() needs a 2-D tensor, got {:?}", self.shape) };
        let mut out = vec![0.0; r * c];
        for i in 0..r {
            for j in 0..c {
                out[j * r + i] = self.data[i * c + j];
            }
        }
        Self::new(vec![c, r], out)
    }
}

/// Named host tensors, ordered by name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct WeightMap {
    tensors: BTreeMap<String, HostTensor>,
}

impl WeightMap {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn insert(&mut self, name: impl Into<String>, tensor: HostTensor) {
        self.tensors.insert(name.into(), tensor);
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &HostTensor)> {
        self.tensors.iter().map(|(k, v)| (k.as_str(), v))
    }

    pub fn get(&self, name: &str) -> Result<&HostTensor> {
        self.tensors.get(name).ok_or_else(|| ModelError::MissingTensor { name: name.to_string(), hint: None })
    }

    pub fn take(&mut self, name: &str) -> Option<HostTensor> {
        self.tensors.remove(name)
    }

    /// The tensor `name`, which must have exactly `shape`.
    pub fn expect(&self, name: &str, shape: &[usize]) -> Result<&HostTensor> {
        let tensor = self.get(name)?;
        if tensor.shape != shape {
            return Err(ModelError::TensorShape {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: tensor.shape.clone(),
            });
        }
        Ok(tensor)
    }

    /// The tensors whose names start with `prefix`, with the prefix removed.
    pub fn with_prefix_stripped(&self, prefix: &str) -> Self {
        let tensors = self
            .tensors
            .iter()
            .filter_map(|(k, v)| k.strip_prefix(prefix).map(|rest| (rest.to_string(), v.clone())))
            .collect();
        Self { tensors }
    }

    /// Adds every tensor of `other` (later names win).
    pub fn extend(&mut self, other: WeightMap) {
        self.tensors.extend(other.tensors);
    }

    /// Fails when the map holds names outside `known`: a weight file for another layout must not load
    /// silently.
    pub fn reject_unknown(&self, known: &[&str]) -> Result<()> {
        let names: Vec<String> = self.names().filter(|n| !known.contains(n)).map(str::to_string).collect();
        if names.is_empty() { Ok(()) } else { Err(ModelError::UnexpectedTensors { names }) }
    }
}

/// A safetensors file: its tensors and its `__metadata__` strings.
#[derive(Debug, Clone, Default)]
pub struct TensorFile {
    pub tensors: WeightMap,
    pub metadata: BTreeMap<String, String>,
}

impl TensorFile {
    /// Reads every `f32` and `u8` tensor of a safetensors file.
    pub fn read(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| ModelError::file(path, e))?;
        let file = SafeTensors::deserialize(&bytes)
            .map_err(|e| ModelError::file(path, format!("not a safetensors file: {e}")))?;
        let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| ModelError::file(path, e))?;
        let metadata = header.metadata().clone().unwrap_or_default().into_iter().collect();
        let mut tensors = WeightMap::new();
        for (name, view) in file.tensors() {
            let shape = view.shape().to_vec();
            let raw = view.data();
            let tensor = match view.dtype() {
                Dtype::F32 => HostTensor::new(shape, f32s_from_le_bytes(raw)),
                // Token ids: exact in float32 below 2^24, as the models store every dtype.
                Dtype::I32 => HostTensor::new(
                    shape,
                    raw.chunks_exact(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f32).collect(),
                ),
                Dtype::I64 => HostTensor::new(
                    shape,
                    raw.chunks_exact(8).map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")) as f32).collect(),
                ),
                Dtype::U8 | Dtype::BOOL => {
                    HostTensor { shape, data: raw.iter().map(|&b| b as f32).collect(), dtype: StoredDtype::U8 }
                }
                other => {
                    return Err(ModelError::file(
                        path,
                        format!("tensor `{name}` has dtype {other:?}; only F32, I32, I64 and U8 are supported"),
                    ));
                }
            };
            tensors.insert(name, tensor);
        }
        Ok(Self { tensors, metadata })
    }

    /// Writes the file atomically: to a temporary name beside it, then renamed into place, so an
    /// interrupted write never leaves a truncated file under the final name.
    pub fn write(&self, path: &Path) -> Result<()> {
        let buffers: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = self
            .tensors
            .iter()
            .map(|(name, t)| {
                let (dtype, bytes) = match t.dtype {
                    StoredDtype::F32 => (Dtype::F32, t.data.iter().flat_map(|v| v.to_le_bytes()).collect()),
                    StoredDtype::U8 => (Dtype::U8, t.data.iter().map(|v| *v as u8).collect()),
                };
                (name.to_string(), dtype, t.shape.clone(), bytes)
            })
            .collect();
        let views = buffers
            .iter()
            .map(|(name, dtype, shape, bytes)| {
                safetensors::tensor::TensorView::new(*dtype, shape.clone(), bytes).map(|v| (name.clone(), v))
            })
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| ModelError::file(path, e))?;
        let metadata: HashMap<String, String> = self.metadata.clone().into_iter().collect();
        let bytes = if views.is_empty() {
            // safetensors 0.x writes `{},"__metadata__":{}}` for a file without tensors, which
            // no reader accepts (a model without weights has an empty state dict): the header
            // by hand, padded to 8 bytes with spaces as the format asks.
            let mut header = serde_json::json!({});
            if !metadata.is_empty() {
                header["__metadata__"] = serde_json::json!(metadata);
            }
            let mut header = header.to_string().into_bytes();
            header.resize(header.len().div_ceil(8) * 8, b' ');
            [(header.len() as u64).to_le_bytes().to_vec(), header].concat()
        } else {
            safetensors::serialize(views, Some(metadata)).map_err(|e| ModelError::file(path, e))?
        };
        write_atomic(path, &bytes)
    }
}

/// Little-endian float32 bytes as values (safetensors and PyTorch storages are little-endian).
pub fn f32s_from_le_bytes(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename
/// ([`write_atomic_with`]).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |tmp| std::fs::write(tmp, bytes).map_err(|e| ModelError::file(tmp, e)))
}

/// Saves a Burn module as a burnpack at `path`, atomically ([`write_atomic_with`]).
pub fn save_burnpack<M: burn::module::Module>(module: M, path: &Path) -> Result<()> {
    write_atomic_with(path, |tmp| {
        module.save_file(tmp).map_err(|e| ModelError::file(path, format!("cannot write a burnpack: {e:?}")))
    })
}

/// The one way this project writes a result: `write` makes it (a file, or a folder of files)
/// under a temporary name beside `path`, which is then renamed to `path`, so an interrupted
/// write never leaves a partial result under the final name. The folder is created if missing;
/// if `write` fails, what it left is removed. The temporary name is hidden, keeps `path`'s
/// extension (image writers pick the format by it) and matches `.gitignore`'s `*.tmp-*`:
/// `dir/.name.tmp-PID.ext`.
pub fn write_atomic_with<E: From<ModelError>>(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), E> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| ModelError::file(dir, e))?;
    }
    let stem = path.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let extension = path.extension().map(|e| format!(".{}", e.to_string_lossy())).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{stem}.tmp-{}{extension}", std::process::id()));
    if let Err(error) = write(&tmp) {
        match tmp.is_dir() {
            true => std::fs::remove_dir_all(&tmp).ok(),
            false => std::fs::remove_file(&tmp).ok(),
        };
        return Err(error);
    }
    std::fs::rename(&tmp, path).map_err(|e| ModelError::file(path, e).into())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_file_without_tensors_reads_back() {
        let dir = std::env::temp_dir().join(format!("kmha-empty-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for metadata in [BTreeMap::new(), BTreeMap::from([("format".to_string(), "pt".to_string())])] {
            let path = dir.join("empty.safetensors");
            TensorFile { tensors: WeightMap::new(), metadata: metadata.clone() }.write(&path).unwrap();
            let back = TensorFile::read(&path).unwrap();
            assert_eq!(back.tensors.names().count(), 0);
            assert_eq!(back.metadata, metadata);
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    use super::*;

    #[test]
    fn atomic_writes_keep_the_extension_and_leave_nothing_when_they_fail() {
        let dir = std::env::temp_dir().join(format!("model-write-atomic-{}", std::process::id()));
        let path = dir.join("figure.png");
        write_atomic_with(&path, |tmp| -> Result<()> {
            assert_eq!(tmp.extension().unwrap(), "png", "{}", tmp.display());
            assert!(tmp.file_name().unwrap().to_string_lossy().starts_with(".figure.tmp-"));
            std::fs::write(tmp, b"done").map_err(|e| ModelError::file(tmp, e))
        })
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"done");
        let failed = write_atomic_with(&dir.join("folder"), |tmp| {
            std::fs::create_dir_all(tmp.join("inner")).unwrap();
            Err(ModelError::file(tmp, "interrupted"))
        });
        assert!(failed.is_err());
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["figure.png"], "only the finished file");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
