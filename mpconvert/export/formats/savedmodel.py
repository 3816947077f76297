"""The SavedModel (savedmodel/): a serving signature that answers an empty request (export/serving.py).

A Keras model writes it through Keras's export archive (tf-keras through
model.save), a frozen graph through tf.saved_model.save; both keep the
signature's input and output names. It is re-loaded and run through that
signature, whose name is recorded so that `verify` calls the one checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mpconvert.data.signature import Signature
from mpconvert.export.artifacts import parity, serving_batches
from mpconvert.export.formats.base import Format, Writes
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.convert import ExportOptions
from mpconvert.report.sections import Artifact
from mpconvert.report.sections.details import SavedModelDetails
from mpconvert.runners.savedmodel import DEFAULT_SIGNATURE, SavedModelRunner


class SavedModel(Format[str, SavedModelDetails]):
    name = ArtifactKind.SAVEDMODEL
    filename = "savedmodel"
    details = SavedModelDetails
    runtime = "tensorflow"

    def write(self, writes: Writes, path: Path, options: ExportOptions) -> str:
        return writes.savedmodel(path)

    def recorded(self, written: str) -> SavedModelDetails:
        return SavedModelDetails(signature=written)

    def open(
        self,
        path: Path,
        details: SavedModelDetails,
        signature: Signature,
        providers: Sequence[str] = (),
        device: str | None = None,
    ) -> SavedModelRunner:
        return SavedModelRunner(path, signature, details.signature or DEFAULT_SIGNATURE)

    def check(
        self, written: str, path: Path, rows: list[np.ndarray], expected: list[np.ndarray], signature: Signature
    ) -> Artifact:
        runner = self.open(path, self.recorded(written), signature)
        run = runner.run(rows)
        dtypes = runner.dtypes()
        details = SavedModelDetails(dtypes["inputs"], dtypes["outputs"], written)
        batches = serving_batches(runner, rows, expected)
        return parity(self.name, path, expected, run.outputs, run.checked_with, details, signature, batches=batches)


SAVEDMODEL = SavedModel()
