"""Keras models to exact PyTorch and Burn: the Python front end of this project's converter.

`flatten` re-traces a Keras model's custom layers into built-in layers and operation nodes, so
that `cargo xtask convert` and `predict` can read it (`python -m keras2torch.flatten --help`).
"""

from .flatten import FlattenReport, flatten, flatten_file

__all__ = ["FlattenReport", "flatten", "flatten_file"]
