"""The files a conversion writes, by the names the report, --export and the tolerances use."""

from __future__ import annotations

from enum import StrEnum


class ArtifactKind(StrEnum):
    """What the report lists: a Keras 3 model's savedmodel export also writes model.keras."""

    SAVEDMODEL = "savedmodel"
    KERAS = "keras"
    ONNX = "onnx"
    LITERT = "litert"
    OPENVINO = "openvino"


EXPORT_KINDS = (
    ArtifactKind.SAVEDMODEL.value,
    ArtifactKind.ONNX.value,
    ArtifactKind.LITERT.value,
    ArtifactKind.OPENVINO.value,
)
# What --export writes unless told: the LiteRT file is for mobile and edge teams, who ask for it; the OpenVINO
# IR needs the optional openvino package (mpconvert[openvino]).
DEFAULT_EXPORT = (ArtifactKind.SAVEDMODEL.value, ArtifactKind.ONNX.value)
ARTIFACT_KINDS = tuple(kind.value for kind in ArtifactKind)
