"""The ONNX file (model.onnx, its weights in model.onnx.data beside it over --onnx-external-data).

A Keras model is converted by tf2onnx from its traced call, a frozen graph
from its GraphDef (onnx/export.py); both come back checked by
onnx.checker, with their graph inputs' and outputs' names in the
signature's order, which the report records so that `verify` feeds and
reads the file by them. Every run of a new file here is a first run on ONNX
Runtime, which can abort the process: the check runs it in a child
(`Isolated`), where a crash is this artifact's failure, named.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from mpconvert.data.signature import Signature
from mpconvert.export.artifacts import parity, serving_batches
from mpconvert.export.formats.base import Format, OnnxFile, Writes
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.convert import ExportOptions
from mpconvert.report.sections import Artifact
from mpconvert.report.sections.details import Edges, OnnxDetails
from mpconvert.runners.isolated import Isolated
from mpconvert.runners.onnx import OnnxRunner, session_providers


class Onnx(Format[OnnxFile, OnnxDetails]):
    name = ArtifactKind.ONNX
    filename = "model.onnx"
    details = OnnxDetails
    runtime = "onnxruntime"
    isolated = True

    def write(self, writes: Writes, path: Path, options: ExportOptions) -> OnnxFile:
        return writes.onnx(path, options)

    def recorded(self, written: OnnxFile) -> OnnxDetails:
        export = written.export
        return OnnxDetails(
            opset=export.opset,
            io=export.io,
            edges=Edges.from_json(export.edges),
            initializer_dtypes=dict(export.initializer_dtypes),
            repairs=tuple(export.repairs),
            input_names=written.inputs,
            output_names=written.outputs,
        )

    def open(
        self,
        path: Path,
        details: OnnxDetails,
        signature: Signature,
        providers: Sequence[str] = (),
        device: str | None = None,
    ) -> OnnxRunner:
        # Reports from before the names were recorded: a Keras model's ONNX file is named by its signature.
        inputs = details.input_names or tuple(s.name for s in signature.inputs)
        outputs = details.output_names or tuple(s.name for s in signature.outputs)
        return OnnxRunner(path, inputs, outputs, providers=tuple(providers))

    def check(
        self, written: OnnxFile, path: Path, rows: list[np.ndarray], expected: list[np.ndarray], signature: Signature
    ) -> Artifact:
        recorded = self.recorded(written)
        with Isolated(self.open(path, recorded, signature, session_providers())) as runner:
            run = runner.run(rows)
            batches = serving_batches(runner, rows, expected)
        # ONNX Runtime's CPU provider lacks most bfloat16 kernels: these op types were run in float32 with
        # rounding back to 16 bits after each, on a copy: the file as written did not run here.
        details = dataclasses.replace(recorded, emulated_16bit_ops=tuple(run.promoted_ops), ran_as_written=run.native)
        data_files = [path.parent / name for name in written.export.external_data]
        return parity(
            self.name, path, expected, run.outputs, run.checked_with, details, signature, None, batches, data_files
        )


ONNX = Onnx()
