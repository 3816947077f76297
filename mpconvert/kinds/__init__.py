"""The kinds of model mpconvert converts, behind one interface (base.ModelKind).

`open_model` is the one place that decides which kind a model is: a SavedModel
folder without Keras metadata is a frozen graph (graph/kind.py), anything
else a Keras model (keras/kind.py). Nothing outside the kinds asks which kind
it has: the pipeline asks a kind for a capability instead.
"""

from __future__ import annotations

from typing import Any

from mpconvert.data.formats import ModelFormat, detect_format
from mpconvert.keras.load import load_model
from mpconvert.kinds.base import (
    Candidate,
    Capability,
    ModelKind,
    PaddingPlan,
    Plan,
    Unavailable,
    available,
)
from mpconvert.options.load import LoadOptions
from mpconvert.system.usercode import import_module

__all__ = ["Candidate", "Capability", "ModelKind", "PaddingPlan", "Plan", "Unavailable", "available", "open_model"]


def open_model(options: LoadOptions) -> ModelKind[Any, Any]:
    """The model `options` name, loaded (no code from it runs unless allowed), as its kind."""
    if options.path is not None and detect_format(options.path) is ModelFormat.GRAPH:
        from mpconvert.graph.freeze import load_frozen
        from mpconvert.graph.kind import GraphKind

        for name in options.imports:
            import_module(name, f"--import {name}")
        return GraphKind(load_frozen(options.path, options.signature), options.path)
    from mpconvert.keras.kind import KerasKind

    return KerasKind(load_model(options))
