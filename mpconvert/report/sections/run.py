"""The report's sections about the model and the run: source, layers, fidelity, skipped stages, versions, timings."""

from __future__ import annotations

import platform
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from mpconvert.data.formats import ModelFormat
from mpconvert.data.signature import Signature, TensorSpec
from mpconvert.report.sections.base import Section, known, member


@dataclass(frozen=True)
class Source(Section):
    """Where the model came from, what read it, its inputs and outputs."""

    path: str | None  # None for an in-memory model
    name: str
    parameters: int | None  # None for a graph, whose weights are constants
    format: ModelFormat
    loader: str  # "keras", "tf_keras", or what read a graph ("tensorflow (signature ...)")
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()

    @classmethod
    def of(
        cls,
        path: Path | None,
        name: str,
        parameters: int | None,
        format: ModelFormat,
        loader: str,
        signature: Signature,
    ) -> Source:
        return cls(str(path) if path else None, name, parameters, format, loader, signature.inputs, signature.outputs)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Source:
        found = known(cls, stored)
        specs = {key: tuple(TensorSpec.from_json(s) for s in found[key] or ()) for key in ("inputs", "outputs")}
        return cls(**{**found, "format": member(ModelFormat, found["format"]), **specs})


@dataclass(frozen=True)
class Layer(Section):
    """One unit's policy as the report lists it: a Keras layer, or a graph's compute node."""

    name: str
    class_name: str  # a layer's class, a node's op type
    policy: str | None  # None for plain operations, which have no policy
    pinned: str | None  # why it stays float32, None when converted
    # A sublayer that a layer's own code builds (a keras-hub backbone's, MultiHeadAttention's): the path of
    # that layer, whose config lists no sublayers; its policy is what the sublayer computes in, not a decision
    # of the conversion's. None for the layers a config lists (nested Functional and Sequential models too).
    inside: str | None = None

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Layer:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class Fidelity(Section):
    """The float32 rebuild against the original: the same function, to float32 rounding."""

    rows: int
    max_abs_diff: float
    limit: float

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Fidelity:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class Skipped(Section):
    """A stage the options would run that the model's kind cannot do, and why."""

    stage: str
    reason: str

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Skipped:
        return cls(**known(cls, stored))


_DISTRIBUTIONS = {
    "mpconvert": ("mpconvert",),
    "tensorflow": ("tensorflow", "tensorflow-cpu"),
    "keras": ("keras",),
    "tf_keras": ("tf-keras", "tf_keras"),
    "tf2onnx": ("tf2onnx",),
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime-gpu", "onnxruntime"),
}


def versions() -> dict[str, str | None]:
    """Python's and each framework's installed version (None where it is not installed)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for key, names in _DISTRIBUTIONS.items():
        found[key] = None
        for name in names:
            try:
                found[key] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    return found


@dataclass(frozen=True)
class Versions:
    """What ran the conversion: (package, version) in the order the report lists them.

    Pairs, not fields: a report keeps the packages of the mpconvert that
    wrote it, whichever those were.
    """

    packages: tuple[tuple[str, str | None], ...] = ()

    @classmethod
    def installed(cls) -> Versions:
        return cls.from_json(versions())

    def to_json(self) -> dict[str, str | None]:
        return dict(self.packages)

    @classmethod
    def from_json(cls, stored: Mapping[str, str | None]) -> Versions:
        return cls(tuple(stored.items()))


@dataclass(frozen=True)
class Timings:
    """Seconds per stage, in the order the stages first ran, to the millisecond.

    Rounded when made, not when written, so that a report read back from
    report.json is the report that wrote it.
    """

    stages: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of(cls, seconds: Mapping[str, float]) -> Timings:
        return cls(tuple((name, round(s, 3)) for name, s in seconds.items()))

    def seconds(self) -> dict[str, float]:
        return dict(self.stages)

    def to_json(self) -> dict[str, float]:
        return self.seconds()

    @classmethod
    def from_json(cls, stored: Mapping[str, float]) -> Timings:
        return cls.of(stored)
