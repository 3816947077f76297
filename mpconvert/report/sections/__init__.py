"""The report's sections as typed, frozen values: what the stages return and what the gate judges.

JSON appears only where a report is written or read back: each section's
`to_json()` is its part of report.json (JSON-native types only: Enums as
their strings, tuples as lists, nothing that is not finite), and
`from_json(stored)` reads it back from a report of any version, a field
written before it existed being absent (`base.known`). The report itself
(report.py) is made of these.
"""

from mpconvert.report.sections.artifacts import Artifact, ArtifactOutput
from mpconvert.report.sections.base import JSONValue, Section, known, member, native
from mpconvert.report.sections.machine import Gpu, Hardware
from mpconvert.report.sections.provenance import DataRecord, Golden, InputFile, Provenance
from mpconvert.report.sections.run import Fidelity, Layer, Skipped, Source, Timings, Versions, versions
from mpconvert.report.sections.speed import (
    ActivationMemory,
    KernelProbe,
    PaddingCost,
    PathSpeed,
    SlowKernel,
    Speed,
    SpeedNotes,
    SpeedReport,
)
from mpconvert.report.sections.stages import (
    AutoKeep,
    Finding,
    Finetune,
    FinetuneKept,
    Lint,
    PaddingReport,
    Ranked,
    SearchOutcome,
    SearchReport,
    Trial,
)
from mpconvert.report.sections.validation import OutputValidation, TokenScores, Validation

__all__ = [
    "ActivationMemory",
    "Artifact",
    "ArtifactOutput",
    "AutoKeep",
    "DataRecord",
    "Fidelity",
    "Finding",
    "Finetune",
    "FinetuneKept",
    "Golden",
    "Gpu",
    "Hardware",
    "InputFile",
    "JSONValue",
    "KernelProbe",
    "Layer",
    "Lint",
    "OutputValidation",
    "PaddingCost",
    "PaddingReport",
    "PathSpeed",
    "Provenance",
    "Ranked",
    "SearchOutcome",
    "SearchReport",
    "Section",
    "Skipped",
    "SlowKernel",
    "Source",
    "Speed",
    "SpeedNotes",
    "SpeedReport",
    "Timings",
    "TokenScores",
    "Trial",
    "Validation",
    "Versions",
    "known",
    "member",
    "native",
    "versions",
]
