"""What each artifact format records about its file: report.json's `artifacts[].details`, typed per format.

The formats themselves (how a file is written and opened) are export/formats/,
above the frameworks; what they record is plain data that every reader of
report.json needs without them (`verify` opens an ONNX file by the
`input_names` recorded here, the gate re-judges a report without
TensorFlow), so it lives in the core.

Each class keeps the JSON form it had as a dict: the same keys, in the same
order. A field that is None was not recorded (a report from before it
existed, or a LiteRT file without rewritten tables) and is left out, so a
report read back writes the same details it was read from.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.report.sections.base import Section, known, native


class Details(Section):
    """One format's record of its file; fields left None are not written."""

    def to_json(self) -> dict[str, Any]:
        values = ((f.name, getattr(self, f.name)) for f in fields(self))  # type: ignore[arg-type]
        return {name: native(value) for name, value in values if value is not None}


def _strings(stored: Any) -> tuple[str, ...] | None:
    return None if stored is None else tuple(stored)


@dataclass(frozen=True)
class SavedModelDetails(Details):
    inputs: dict[str, str] | None = None  # the serving signature's input dtypes, by name
    outputs: dict[str, str] | None = None
    signature: str | None = None  # the signature checked, which `verify` calls (None: serving_default)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> SavedModelDetails:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class KerasDetails(Details):
    """model.keras records nothing beyond what every artifact does."""

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> KerasDetails:
        return cls()


@dataclass(frozen=True)
class InputEdge(Section):
    type: str
    cast_to: tuple[str, ...]  # the types it is cast to where it enters; empty: used as it is


@dataclass(frozen=True)
class OutputEdge(Section):
    type: str
    cast_from: str | None  # the type a Cast producing it read; None: no Cast there


@dataclass(frozen=True)
class Edges(Section):
    """An ONNX file's graph inputs and outputs: their element types and the Casts at them (onnx/edges.py)."""

    inputs: dict[str, InputEdge]
    outputs: dict[str, OutputEdge]

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Edges:
        return cls(
            {name: InputEdge(e["type"], tuple(e["cast_to"])) for name, e in (stored.get("inputs") or {}).items()},
            {name: OutputEdge(e["type"], e["cast_from"]) for name, e in (stored.get("outputs") or {}).items()},
        )


@dataclass(frozen=True)
class OnnxDetails(Details):
    opset: int | None = None
    io: str | None = None  # the element type of its float inputs and outputs (--onnx-io)
    edges: Edges | None = None
    initializer_dtypes: dict[str, int] | None = None  # ONNX dtype name -> number of initializers
    repairs: tuple[str, ...] | None = None  # what mpconvert changed in tf2onnx's graph, and why
    # Op types ONNX Runtime had no 16-bit kernel for here: the check ran a copy computing them in float32,
    # rounding back to 16 bits after each; the file as written did not run here.
    emulated_16bit_ops: tuple[str, ...] | None = None
    ran_as_written: bool | None = None
    # The graph's inputs and outputs in the signature's order, for `verify` to feed and read them by (None:
    # a report from before they were recorded, whose file is named by the signature).
    input_names: tuple[str, ...] | None = None
    output_names: tuple[str, ...] | None = None

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> OnnxDetails:
        found = known(cls, stored)
        edges = found["edges"]
        return cls(
            **{
                **found,
                "edges": None if edges is None else Edges.from_json(edges),
                **{name: _strings(found[name]) for name in ("repairs", "emulated_16bit_ops")},
                **{name: _strings(found[name]) for name in ("input_names", "output_names")},
            }
        )


@dataclass(frozen=True)
class LiteRTDetails(Details):
    weights: str | None = None  # the element type the weights are stored in
    what: str | None = None  # what the file is and how runtimes compute with it, in words
    tables: tuple[str, ...] | None = None  # lookup tables rewritten into LiteRT's builtin ones (None: none)
    tensor_dtypes: dict[str, int] | None = None  # how many of its tensors hold each dtype

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> LiteRTDetails:
        found = known(cls, stored)
        return cls(**{**found, "tables": _strings(found["tables"])})


@dataclass(frozen=True)
class OpenVinoDetails(Details):
    """An OpenVINO IR folder: what it asks a device to compute in, and what the check's compile really ran."""

    weights: str | None = None  # the element type the weights are stored in (float16: compress_to_fp16)
    compute: str | None = None  # the 16-bit type the converted model computed in ("bf16", "f16"; "f32": none)
    # The INFERENCE_PRECISION_HINT recorded in the IR's runtime_options for the device it was checked on, and
    # why it is not `compute` where it is not (that device lacks the units): the fallback, named.
    precision: str | None = None
    fallback: str | None = None
    device: str | None = None  # the device the check compiled for
    # What that compile said it runs (its INFERENCE_PRECISION_HINT and EXECUTION_DEVICES): a file that asks
    # bf16 and ran f32 shows here.
    ran_precision: str | None = None
    execution_devices: tuple[str, ...] | None = None
    source: str | None = None  # what the IR was converted from, and how
    # The IR's inputs and outputs in the signature's order, for `verify` to feed and read them by.
    input_names: tuple[str, ...] | None = None
    output_names: tuple[str, ...] | None = None

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> OpenVinoDetails:
        found = known(cls, stored)
        names = ("execution_devices", "input_names", "output_names")
        return cls(**{**found, **{name: _strings(found[name]) for name in names}})


@dataclass(frozen=True)
class FailedDetails(Details):
    """An artifact that could not be written or re-checked: why, with the fix."""

    error: str | None = None

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> FailedDetails:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class UnknownDetails(Details):
    """A format this version does not know (a newer report's): its record kept as it was, for `verify` to name."""

    stored: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dict(self.stored)


# Each format's record, by the name the report gives it.
DETAILS: dict[str, type[SavedModelDetails | KerasDetails | OnnxDetails | LiteRTDetails | OpenVinoDetails]] = {
    ArtifactKind.SAVEDMODEL: SavedModelDetails,
    ArtifactKind.KERAS: KerasDetails,
    ArtifactKind.ONNX: OnnxDetails,
    ArtifactKind.LITERT: LiteRTDetails,
    ArtifactKind.OPENVINO: OpenVinoDetails,
}


def read_details(kind: str, failed: bool, stored: Mapping[str, Any] | None) -> Details:
    """An artifact's details as report.json stored them (None and {} alike: nothing recorded)."""
    stored = stored or {}
    if failed:
        return FailedDetails.from_json(stored)
    reader = DETAILS.get(kind)
    return UnknownDetails(dict(stored)) if reader is None else reader.from_json(stored)
