//! `keras2torch._native`: the converter's compiled core for Python, the same code as `cargo xtask
//! convert` (the `keras` crate), built without burn's GPU backend. The Python API around it is
//! `python/keras2torch/` (`convert`, `flatten`, the `keras2torch` command).

use std::path::PathBuf;

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

/// The layer classes the converter reads, as one line.
#[pyfunction]
fn supported_classes() -> String {
    keras::layers::supported_classes()
}

#[pymodule]
fn _native(module: &Bound<'_, PyModule>) -> PyResult<()> {
    module.add_function(wrap_pyfunction!(convert_file, module)?)?;
    module.add_function(wrap_pyfunction!(supported_classes, module)?)?;
    module.add("ConversionError", module.py().get_type::<ConversionError>())?;
    Ok(())
}
