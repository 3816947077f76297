"""The artifact formats, one module each, registered in FORMATS: the one table of what a conversion writes.

Each format (base.Format) has its report name and file name, `write`
(through what the model's kind knows: `Writes`), `open` (the runner that
serves the written file: the export's re-check, `verify` and --bench-onnx
all open it this way) and its typed details (report/sections/details.py).
The export stage writes every format --export asks for, in FORMATS' order,
each re-opened and re-run against the converted model (`export_all`).

Adding a format (OpenVINO, say): write `export/formats/openvino.py` with a
`Format` subclass and its one instance, as onnx.py does: `write` makes the
file, from the kind's SavedModel or ONNX file written into a temporary
folder where the format converts from one of those (no new method on the
kinds); `open` returns a runner (a new runtime is one more class in
runners/); `check` re-runs the written file through `open` and returns
`parity(...)` with `serving_batches(...)`. Then import its instance here
and add it to FORMATS below. The core reads report.json without any framework, so the name and
its record live there: a member of options/artifact_kinds.ArtifactKind,
its parity rtol per policy (options/precision.py), and its `Details` class
with its line in report/sections/details.DETAILS (and the name in the
schema's artifact kinds).
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from mpconvert.export.artifacts import write_checked
from mpconvert.export.formats.base import Format, Writes
from mpconvert.export.formats.keras import KERAS
from mpconvert.export.formats.litert import LITERT
from mpconvert.export.formats.onnx import ONNX
from mpconvert.export.formats.savedmodel import SAVEDMODEL
from mpconvert.options.convert import ExportOptions
from mpconvert.report.sections import Artifact

# In the order they are written and listed in the report.
FORMATS: dict[str, Format[Any, Any]] = {f.name: f for f in (SAVEDMODEL, KERAS, ONNX, LITERT)}


def export_all(
    writes: Writes, rows: list[np.ndarray], expected: list[np.ndarray], out: Path, options: ExportOptions, needed: int
) -> list[Artifact]:
    """Every format `options` ask for that the kind writes, under `out`, each re-checked on `rows`."""
    return write_checked(
        [
            (f.name, out / f.filename, partial(f.export, writes, options=options, rows=rows, expected=expected))
            for f in FORMATS.values()
            if f.wanted(options.kinds) and f.name in writes.kinds
        ],
        expected,
        needed,
    )
