//! `keras2torch._native`: the converter's compiled core for Python, the same code as `cargo xtask
//! convert` (the `keras` crate), built without burn's GPU backend. The Python API around it is
//! `python/keras2torch/` (`convert`, `flatten`, the `keras2torch` command).

use std::path::PathBuf;

use keras::layer_convert::{self, Target};
use pyo3::create_exception;
use pyo3::exceptions::PyException;
use pyo3::prelude::*;

create_exception!(
    _native,
    ConversionError,
    PyException,
    "A Keras file the converter cannot read or convert: the message names the file, the layer and its class."
);

/// Converts the whole Keras model in `path` (a `.keras` file) to PyTorch: writes `OUT.py` (the
/// model as one `nn.Module`), `OUT.safetensors` (its state dict) and `OUT.probe.safetensors` (the
/// probe's inputs and Burn's output of every node), `OUT` being `out` without its extension.
/// Returns the report `cargo xtask convert` prints; raises `ConversionError` with the
/// converter's message (file, layer, class) on a file it cannot convert.
#[pyfunction]
fn convert_file(py: Python<'_>, path: PathBuf, out: PathBuf) -> PyResult<String> {
    py.detach(|| keras::convert::convert_model_to_torch(&path, Some(out)))
        .map_err(|error| ConversionError::new_err(format!("{error:#}")))
}

/// Converts one `MultiHeadAttention` layer of a model file (`.keras`, `.weights.h5`, `.pt` /
/// `.pth`) to `to`: "projected" (torch's `Linear + nn.MultiheadAttention + Linear`, where exact),
/// "torch" (a bare `nn.MultiheadAttention`, where Keras' sizes allow one), "keras" or "burn",
/// as `cargo xtask convert FILE --layer NAME --to TO` does, and checks what it wrote against the
/// source layer. A torch export gets `OUT.py` beside it. Returns the report, the largest
/// difference from the source layer on the probe, and the files written; raises
/// `ConversionError` with the reason where the target cannot express the layer.
#[pyfunction]
#[pyo3(signature = (path, to, layer=None, num_heads=None, out=None))]
fn convert_layer_file(
    py: Python<'_>,
    path: PathBuf,
    to: &str,
    layer: Option<String>,
    num_heads: Option<usize>,
    out: Option<PathBuf>,
) -> PyResult<(String, f32, Vec<PathBuf>)> {
    let error = |error: anyhow::Error| ConversionError::new_err(format!("{error:#}"));
    let target: Target = to.parse().map_err(error)?;
    let report =
        py.detach(|| layer_convert::convert(&path, target, layer.as_deref(), num_heads, out)).map_err(error)?;
    Ok((report.to_string(), report.max_abs_difference, report.written.clone()))
}

/// The attention layers of a model file, one line each (their paths and arguments).
#[pyfunction]
#[pyo3(signature = (path, num_heads=None))]
fn list_layers(py: Python<'_>, path: PathBuf, num_heads: Option<usize>) -> PyResult<String> {
    py.detach(|| layer_convert::list_layers(&path, num_heads))
        .map_err(|error| ConversionError::new_err(format!("{error:#}")))
}

/// The layer classes the converter reads, as one line.
#[pyfunction]
fn supported_classes() -> String {
    keras::layers::supported_classes()
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(convert_file, module)?)?;
    module.add_function(wrap_pyfunction!(convert_layer_file, module)?)?;
    module.add_function(wrap_pyfunction!(list_layers, module)?)?;
    module.add_function(wrap_pyfunction!(supported_classes, module)?)?;
    module.add("ConversionError", module.py().get_type::<ConversionError>())?;
    Ok(())
}
