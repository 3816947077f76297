"""The artifact formats, one module each, registered in FORMATS: the one table of what a conversion writes.

Each format (base.Format) has its report name and file name, `write`
(through what the model's kind knows: `Writes`), `open` (the runner that
serves the written file: the export's re-check, `verify` and --bench-onnx
all open it this way) and its typed details (report/sections/details.py).
The export stage writes every format --export asks for, in FORMATS' order,
each re-opened and re-run against the converted model (`export_all`).

Adding a format (OpenVINO, say) touches one new module and its
registration here, plus its name in the core. The module: `export/formats/openvino.py` with a
`Format` subclass and its one instance, as onnx.py has. Its `write` makes
the file through the kind's `Writes`, converting from the SavedModel or
the ONNX file the kind writes into a temporary folder (no new method on
the kinds: every kind's `Writes.kinds` holds every format but model.keras
where it has none); `open` returns a runner (a new runtime is one more
class in runners/); `check` runs the file through `open` and returns
`parity(...)` with `serving_batches(...)`. Here: its import and its entry
in FORMATS. In the core, which reads and judges report.json without any
framework: a member of options/artifact_kinds.ArtifactKind (and of
EXPORT_KINDS for --export), its parity rtol per policy (options/precision.py),
its `Details` class with its line in report/sections/details.DETAILS, and
its name in the schema's artifact kinds.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from mpconvert.data.signature import Signature
from mpconvert.export.artifacts import write_checked
from mpconvert.export.formats.base import Format, LiteRTFile, OnnxFile, Writes
from mpconvert.export.formats.keras import KERAS
from mpconvert.export.formats.litert import LITERT
from mpconvert.export.formats.onnx import ONNX
from mpconvert.export.formats.openvino import OPENVINO
from mpconvert.export.formats.savedmodel import SAVEDMODEL
from mpconvert.options.convert import ExportOptions
from mpconvert.report.sections import Artifact

# In the order they are written and listed in the report.
FORMATS: dict[str, Format[Any, Any]] = {f.name: f for f in (SAVEDMODEL, KERAS, ONNX, LITERT, OPENVINO)}


@dataclass
class SavedModelOnce:
    """A kind's `Writes` whose SavedModel is traced once per export.

    A format converted from a SavedModel (the OpenVINO IR) copies the
    savedmodel/ artifact written before it, where that one was asked for and
    passed its check, instead of tracing the model again: a tf-keras LSTM's
    SavedModel takes 27 s to write on 2 cores.
    """

    writes: Writes
    first: tuple[Path, str] | None = None  # the folder the SavedModel was written to, its signature's name

    @property
    def signature(self) -> Signature:
        return self.writes.signature

    @property
    def kinds(self) -> frozenset[str]:
        return self.writes.kinds

    def savedmodel(self, path: Path) -> str:
        if self.first is not None and self.first[0].is_dir():
            shutil.copytree(self.first[0], path)
            return self.first[1]
        name = self.writes.savedmodel(path)
        self.first = (path, name)
        return name

    def keras(self, path: Path) -> None:
        self.writes.keras(path)

    def onnx(self, path: Path, options: ExportOptions) -> OnnxFile:
        return self.writes.onnx(path, options)

    def litert(self, path: Path) -> LiteRTFile:
        return self.writes.litert(path)


def export_all(
    writes: Writes, rows: list[np.ndarray], expected: list[np.ndarray], out: Path, options: ExportOptions, needed: int
) -> list[Artifact]:
    """Every format `options` ask for that the kind writes, under `out`, each re-checked on `rows`."""
    writes = SavedModelOnce(writes)
    return write_checked(
        [
            (f.name, out / f.filename, partial(f.export, writes, options=options, rows=rows, expected=expected))
            for f in FORMATS.values()
            if f.wanted(options.kinds) and f.name in writes.kinds
        ],
        expected,
        needed,
    )
