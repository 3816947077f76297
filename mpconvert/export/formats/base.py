"""What every artifact format is: a name, a file name, how it is written, how it is opened, what it records.

A `Format` writes its file through what the model's kind knows (`Writes`:
a Keras model and a frozen graph write a SavedModel, an ONNX file and the
float32 copy a .tflite is converted from each their own way), re-opens the
written file with `open` (the one way the export's check, `verify` and
--bench-onnx run it), re-runs it against the converted model's outputs,
and records what it found as its typed details.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from mpconvert.data.signature import Signature
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.convert import ExportOptions
from mpconvert.report.sections import Artifact
from mpconvert.report.sections.details import Details
from mpconvert.runners.base import Runner


@dataclass(frozen=True)
class OnnxFile:
    """A written, checked ONNX file, with its graph inputs' and outputs' names in the signature's order."""

    export: Any  # onnx.export.OnnxExport
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class LiteRTFile:
    """A written .tflite file: the element type its weights are stored in, and the tables it rewrote."""

    path: Path
    weights: str
    tables: tuple[str, ...] = ()


class Writes(Protocol):
    """What only a model's kind knows about writing one model in each format (`ModelKind.writes`).

    A format that can be made from another's file (a converter that reads a
    SavedModel or an ONNX file) writes that file through these into a
    temporary folder: a new format needs no new method here.
    """

    @property
    def signature(self) -> Signature:
        """The model's inputs and outputs, as the written files serve them."""
        ...

    @property
    def kinds(self) -> frozenset[str]:
        """The formats this kind can write (a tf-keras model has no model.keras)."""
        ...

    def savedmodel(self, path: Path) -> str:
        """Write the SavedModel; returns the name of its serving signature."""
        ...

    def keras(self, path: Path) -> None:
        """Write model.keras, the file training resumes from."""
        ...

    def onnx(self, path: Path, options: ExportOptions) -> OnnxFile:
        """Write the ONNX file, checked by onnx.checker."""
        ...

    def litert(self, path: Path) -> LiteRTFile:
        """Write the .tflite file, from the model's float32-computing copy."""
        ...


W = TypeVar("W")  # what `write` returns: what its check needs of the written file
D = TypeVar("D", bound=Details)


class Format(ABC, Generic[W, D]):
    """One artifact format: one module under export/formats/, one line in FORMATS."""

    name: ArtifactKind  # the report's name for it, and --export's
    filename: str  # under the output folder
    details: type[D]  # what it records about the file
    runtime: str  # the library its runner loads: `verify` imports it before measuring memory
    # A file a server runs: checked at the batch sizes a server sends, and run by `verify`. model.keras is
    # the file training resumes from, hash-checked only.
    serves: bool = True
    # Run in a child process wherever it is run (the export's check, `verify`): a file may be foreign or
    # damaged, and a runtime can abort its process on one (ONNX Runtime's std::terminate in its LSTM kernel)
    # with no exception to catch.
    isolated: bool = False

    def wanted(self, kinds: Sequence[str]) -> bool:
        """Whether --export's `kinds` ask for this format."""
        return self.name in kinds

    @abstractmethod
    def write(self, writes: Writes, path: Path, options: ExportOptions) -> W:
        """Write the file at `path` (through the kind's `writes`)."""

    @abstractmethod
    def recorded(self, written: W) -> D:
        """What the written file records before it is run (what `open` needs)."""

    @abstractmethod
    def open(
        self, path: Path, details: D, signature: Signature, providers: Sequence[str] = (), device: str | None = None
    ) -> Runner:
        """A runner of the written file at `path`, as `details` record it; `providers`: ONNX Runtime's, best
        first; `device`: the device a runtime that compiles for one runs it on (OpenVINO's; None: its default)."""

    @abstractmethod
    def check(
        self, written: W, path: Path, rows: list[np.ndarray], expected: list[np.ndarray], signature: Signature
    ) -> Artifact:
        """The written file re-opened and re-run on `rows` against `expected` (the converted model's outputs)."""

    def export(
        self,
        writes: Writes,
        path: Path,
        options: ExportOptions,
        rows: list[np.ndarray],
        expected: list[np.ndarray],
    ) -> Artifact:
        """Write the file, then re-check it."""
        return self.check(self.write(writes, path, options), path, rows, expected, writes.signature)
