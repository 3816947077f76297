"""The report's artifacts: each written file, re-loaded and re-run, with what it takes to re-check its parity."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..options import ArtifactKind
from .base import Section, known, member


@dataclass(frozen=True)
class ArtifactOutput(Section):
    """One output of an artifact: judged on its own scale."""

    max_abs_diff: float | None  # None when a value is not finite
    max_abs_ref: float | None = None  # None in reports from before it existed: the atol alone applies

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> ArtifactOutput:
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
    details: dict
    failed: bool = False  # writing or re-checking it raised an MpconvertError
    reason: str | None = None  # why it failed, with the fix
    # Several outputs: each judged on its own scale, by name.
    outputs: dict[str, ArtifactOutput] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", member(ArtifactKind, self.kind))

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Artifact:
        found = known(cls, stored)
        outputs = found["outputs"]
        return cls(
            **{
                **found,
                "details": found["details"] or {},
                "outputs": None if outputs is None else {n: ArtifactOutput.from_json(o) for n, o in outputs.items()},
            }
        )
