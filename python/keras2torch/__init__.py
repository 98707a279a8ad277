"""Keras 3 models to exact, readable PyTorch modules (and Burn), checked against Keras.

    import keras2torch
    module = keras2torch.convert(keras_model)            # a torch.nn.Module, checked at 1e-5
    module = keras2torch.convert("model.keras", out="port")  # also writes port.py, port.safetensors

`convert` is the compiled converter (the same code as `cargo xtask convert`); `flatten`
re-traces a model's custom layers into built-in layers and operation nodes first, so that the
converter can read them (`python -m keras2torch.flatten --help`). The command `keras2torch
MODEL.keras -o OUT` does the same from a shell.
"""

from .flatten import FlattenReport, flatten, flatten_file

try:
    from ._native import ConversionError, supported_classes
    from .conversion import convert, convert_layer
except ImportError as _missing:  # the source tree, without the compiled core
    _reason = str(_missing)

    class ConversionError(Exception):
        """A Keras file the converter cannot read or convert."""

    def convert(*args, **kwargs):
        """Needs the compiled core: install the wheel (`maturin build --release`, then pip install)."""
        raise ImportError(f"keras2torch.convert needs the compiled core, which this copy lacks: {_reason}")

    convert_layer = convert

    def supported_classes():
        """Needs the compiled core."""
        raise ImportError(f"keras2torch needs the compiled core, which this copy lacks: {_reason}")


__all__ = ["ConversionError", "FlattenReport", "convert", "convert_layer", "flatten", "flatten_file", "supported_classes"]
