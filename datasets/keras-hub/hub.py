"""The module `cargo xtask flatten MODEL.keras --import hub.py` imports for KerasHub's models:
keras_hub registers its classes with Keras when imported."""

import keras_hub  # noqa: F401
