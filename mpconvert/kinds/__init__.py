"""The kinds of model mpconvert converts, behind one interface (base.ModelKind).

`open_model` is the one place that decides which kind a model is: a SavedModel
folder without Keras metadata is a frozen graph (frozen.py), anything else a
Keras model (keras.py). Nothing outside this package asks which kind it has.
"""

from __future__ import annotations

from ..formats import ModelFormat
from ..load import detect_format, load_model
from ..options import LoadOptions
from ..usercode import import_module
from .base import Candidate, Capability, ModelKind, Plan

__all__ = ["Candidate", "Capability", "ModelKind", "Plan", "open_model"]


def open_model(options: LoadOptions) -> ModelKind:
    """The model `options` name, loaded (no code from it runs unless allowed), as its kind."""
    if options.path is not None and detect_format(options.path) is ModelFormat.GRAPH:
        from ..frozen.freeze import load_frozen
        from .frozen import FrozenKind

        for name in options.imports:
            import_module(name, f"--import {name}")
        return FrozenKind(load_frozen(options.path, options.signature), options.path)
    from .keras import KerasKind

    return KerasKind(load_model(options))
