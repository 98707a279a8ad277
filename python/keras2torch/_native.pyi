"""Type hints of the compiled core (crates/python/src/lib.rs)."""

import os

class ConversionError(Exception):
    """A Keras file the converter cannot read or convert: the message names the file, the layer
    and its class."""

def convert_file(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> str:
    """Converts the whole Keras model in `path` to PyTorch: writes OUT.py, OUT.safetensors and
    OUT.probe.safetensors; returns the report `cargo xtask convert` prints."""

def supported_classes() -> str:
    """The layer classes the converter reads, as one line."""
