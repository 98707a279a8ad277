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

def convert_layer_file(
    path: str | os.PathLike[str],
    to: str,
    layer: str | None = None,
    num_heads: int | None = None,
    out: str | os.PathLike[str] | None = None,
) -> tuple[str, float, list[str]]:
    """Converts one MultiHeadAttention of a model file to "projected", "torch", "keras" or "burn";
    returns the report, the largest difference from the source layer and the files written."""

def list_layers(path: str | os.PathLike[str], num_heads: int | None = None) -> str:
    """The attention layers of a model file, one line each."""
