"""model.keras: the file training resumes from, written beside a Keras 3 model's SavedModel.

It comes with the SavedModel export (--export savedmodel), as Keras 3 writes
it (`model.save`); tf-keras models have none. Not a serving artifact: its
check is a reload and a run on the validation rows, without the batch sizes
a server sends (Keras's own eager and predict paths fail on an empty batch
of a 16-bit model under oneDNN), and `verify` checks its bytes only.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mpconvert.data.signature import Signature
from mpconvert.export.artifacts import parity
from mpconvert.export.formats.base import Format, Writes
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.convert import ExportOptions
from mpconvert.report.sections import Artifact
from mpconvert.report.sections.details import KerasDetails
from mpconvert.runners.keras import KerasRunner

RUNTIME_KERAS = "keras"


class KerasFile(Format[None, KerasDetails]):
    name = ArtifactKind.KERAS
    filename = "model.keras"
    details = KerasDetails
    runtime = "keras"
    serves = False

    def wanted(self, kinds: Sequence[str]) -> bool:
        return ArtifactKind.SAVEDMODEL in kinds

    def write(self, writes: Writes, path: Path, options: ExportOptions) -> None:
        writes.keras(path)

    def recorded(self, written: None) -> KerasDetails:
        return KerasDetails()

    def open(
        self,
        path: Path,
        details: KerasDetails,
        signature: Signature,
        providers: Sequence[str] = (),
        device: str | None = None,
    ) -> KerasRunner:
        """The file loaded by Keras 3 (in the model's kind's scope, for its custom objects)."""
        import keras

        return KerasRunner(keras.models.load_model(str(path), compile=False), signature, runtime=RUNTIME_KERAS)

    def check(
        self, written: None, path: Path, rows: list[np.ndarray], expected: list[np.ndarray], signature: Signature
    ) -> Artifact:
        run = self.open(path, KerasDetails(), signature).run(rows)
        return parity(self.name, path, expected, run.outputs, run.checked_with, KerasDetails(), signature)


KERAS = KerasFile()
