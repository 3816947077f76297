"""The kinds of model file mpconvert reads, and what each calls its units.

A closed set, so an Enum: the report's `source.format` holds its value.
A Keras model's units are layers; a SavedModel without Keras metadata is
converted as a frozen graph, whose units are its compute nodes. Every
message that counts units (the summary, the gate, report.html) reads the
word from here rather than testing the format, and so do the summary's name
for each format and what its float32 proof compares. `detect_format` reads a
file's format from its name and, for a folder, its files: no framework.
"""

from __future__ import annotations

import zipfile
from enum import StrEnum
from pathlib import Path

from mpconvert.system.errors import MpconvertError

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

    @property
    def description(self) -> str:
        """What the summary calls a model read in this format."""
        return _DESCRIPTIONS[self]

    @property
    def proof(self) -> tuple[str, str]:
        """What the float32 fidelity proof compares: (what was built, what it must reproduce).

        A frozen graph is proven against its own SavedModel's signature; every
        other format's float32 rebuild against the loaded original.
        """
        if self is ModelFormat.GRAPH:
            return ("the frozen graph", "the SavedModel's signature")
        return ("the float32 rebuild", "the original")


_DESCRIPTIONS = {
    ModelFormat.KERAS: ".keras file",
    ModelFormat.H5: ".h5 file",
    ModelFormat.SAVEDMODEL: "Keras SavedModel",
    ModelFormat.OBJECT: "in-memory model",
    ModelFormat.GRAPH: "SavedModel without Keras metadata, as a frozen graph",
}


def known_format(format_name: str | None) -> ModelFormat | None:
    """A report's `source.format` as a ModelFormat; None for a format this version does not know."""
    try:
        return ModelFormat(format_name or "")
    except ValueError:
        return None


def units_of(format_name: str | None) -> str:
    """The unit word (plural) for a report's `source.format`; layers for a format this version does not know."""
    return (known_format(format_name) or ModelFormat.KERAS).units


def detect_format(path: Path) -> ModelFormat:
    if not path.exists():
        raise MpconvertError(
            f"model not found: {path}",
            hint="pass a .keras or .h5 file, or a SavedModel folder (with or without keras_metadata.pb)",
        )
    if path.is_dir():
        if not (path / "saved_model.pb").is_file():
            raise MpconvertError(
                f"{path} is a folder but not a SavedModel (no saved_model.pb inside)",
                hint="pass the SavedModel folder itself, or a .keras / .h5 file",
            )
        if not (path / "keras_metadata.pb").is_file():
            return ModelFormat.GRAPH  # no Keras layers: converted at graph level (graph/kind.py)
        return ModelFormat.SAVEDMODEL
    suffix = path.suffix.lower()
    if suffix == ".keras":
        return ModelFormat.KERAS
    if suffix in (".h5", ".hdf5"):
        if zipfile.is_zipfile(path):
            raise MpconvertError(
                f"{path} is a Keras 3 .keras file (a zip archive), named {suffix}",
                hint=f"rename it to {path.with_suffix('.keras').name}: Keras reads the format from the name",
            )
        return ModelFormat.H5
    raise MpconvertError(
        f"unsupported model file {path.name!r}",
        hint="mpconvert reads .keras and .h5 (.hdf5) files and SavedModel folders, with or without "
        "keras_metadata.pb (without it, the main command converts the model at graph level)",
    )
