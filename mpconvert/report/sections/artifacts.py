"""The report's artifacts: each written file, re-loaded and re-run, with what it takes to re-check its parity."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.report.sections.base import Section, known, member
from mpconvert.report.sections.details import Details, read_details


@dataclass(frozen=True)
class ArtifactOutput(Section):
    """One output of an artifact: judged on its own scale."""

    max_abs_diff: float | None  # None when a value is not finite
    max_abs_ref: float | None = None  # None in reports from before it existed: the atol alone applies

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> ArtifactOutput:
        return cls(**known(cls, stored))


def overall(outputs: Iterable[ArtifactOutput]) -> ArtifactOutput:
    """Every output of an artifact at once: the largest difference (None when any is not finite) and |output|."""
    found = list(outputs)
    diffs = [o.max_abs_diff for o in found if o.max_abs_diff is not None]
    refs = [o.max_abs_ref for o in found if o.max_abs_ref is not None]
    finite = len(diffs) == len(found)
    return ArtifactOutput(max(diffs, default=0.0) if finite else None, max(refs, default=None))


@dataclass(frozen=True)
class ServedBatch(Section):
    """An artifact run on a batch a server may send (no rows, one, a large one), against the converted model."""

    rows: int
    error: str | None  # why it could not serve this many rows, in one line; None when it did
    max_abs_diff: float | None  # against the converted model on the same rows; None after an error or when not finite
    note: str | None = None  # it served with a runtime setting a server must use too (ORT_ENABLE_EXTENDED)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> ServedBatch:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class DataFile(Section):
    """A file an artifact cannot be read without (an ONNX file's external data), with its own sha256."""

    path: str  # relative to the output folder
    bytes: int
    sha256: str

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> DataFile:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class Artifact(Section):
    kind: ArtifactKind | str  # a str: read back, a kind this version does not know (its parity check fails)
    path: str | None  # relative to the output folder; None when it failed
    bytes: int
    max_abs_diff: float | None
    # Largest |output| of the converted model on the same rows: the scale
    # the gate's relative tolerance applies to, stored so that parity can be
    # re-checked from report.json alone. None in reports from before it existed.
    max_abs_ref: float | None
    runtime: str | None  # what re-ran it
    details: Details  # what its format records about the file (report/sections/details.py)
    failed: bool = False  # writing or re-checking it raised an MpconvertError
    reason: str | None = None  # why it failed, with the fix
    # False: the format cannot express the model (an ONNX file of a Hashing layer); refused, not failed.
    exportable: bool = True
    # Several outputs: each judged on its own scale, by name.
    outputs: dict[str, ArtifactOutput] | None = None
    # The file's sha256, or a folder's digest over its files (digests.py), as written; None when it failed
    # and in reports from before it existed. `mpconvert verify` checks a copy against it.
    sha256: str | None = None
    # The batch sizes it was also run at (0, 1 and a large one); None in reports from before they were.
    batches: tuple[ServedBatch, ...] | None = None
    # The rows it was re-run on and compared with the converted model; None in reports from before it was recorded.
    rows: int | None = None
    # The files it reads beside it (an ONNX file's external data), each hash-checked by `verify`; `bytes`
    # counts them. None: it has none, or a report from before they were recorded.
    external_data: tuple[DataFile, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", member(ArtifactKind, self.kind))

    def derived(self) -> Artifact:
        """With several outputs, the artifact's own figures are those of all its outputs together (`overall`)."""
        if not self.outputs:
            return self
        whole = overall(self.outputs.values())
        return replace(self, max_abs_diff=whole.max_abs_diff, max_abs_ref=whole.max_abs_ref)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Artifact:
        found = known(cls, stored)
        outputs, batches, data = found["outputs"], found["batches"], found["external_data"]
        return cls(
            **{
                **found,
                "details": read_details(found["kind"], bool(found["failed"]), found["details"]),
                "outputs": None if outputs is None else {n: ArtifactOutput.from_json(o) for n, o in outputs.items()},
                "batches": None if batches is None else tuple(ServedBatch.from_json(b) for b in batches),
                "external_data": None if data is None else tuple(DataFile.from_json(d) for d in data),
            }
        )
