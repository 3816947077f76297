"""The kinds of model file mpconvert reads, and what each calls its units.

A closed set, so an Enum: the report's `source.format` holds its value.
A Keras model's units are layers; a SavedModel without Keras metadata is
converted as a frozen graph, whose units are its compute nodes. Every
message that counts units (the summary, the gate, report.html) reads the
word from here rather than testing the format.
"""

from __future__ import annotations

from enum import StrEnum

# Why an input layer has no 16-bit policy (the report's `pinned`): it computes
# nothing, so the counts of converted and kept layers leave it out.
INPUT_LAYER = "input layer"


class ModelFormat(StrEnum):
    KERAS = "keras"  # Keras 3 .keras
    H5 = "h5"  # .h5 / .hdf5, Keras 3 or tf-keras
    SAVEDMODEL = "savedmodel"  # a Keras-2 SavedModel folder (keras_metadata.pb), read by tf-keras
    OBJECT = "object"  # a live model from the Python API
    GRAPH = "graph"  # a SavedModel folder without Keras metadata: a frozen serving signature

    @property
    def unit(self) -> str:
        """What the rewrite, the lint and the search work on, singular."""
        return "node" if self is ModelFormat.GRAPH else "layer"

    @property
    def units(self) -> str:
        return self.unit + "s"


def units_of(format_name: str | None) -> str:
    """The unit word (plural) for a report's `source.format`; layers for a format this version does not know."""
    try:
        return ModelFormat(format_name or "").units
    except ValueError:
        return ModelFormat.KERAS.units
