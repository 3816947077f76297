"""The report: one object that owns the verdict and its JSON form (display is render.py's).

Its sections are typed values (sections/) that the stages build; the
verdict is the gate's (gate.py), evaluated on those sections. JSON appears
only where a report is written (`to_json`, report.json) or read back
(`from_json`: `mpconvert check`, `--baseline`), and a report read back is
the report that was written, so a re-check judges exactly like the run.
A re-check (`read_back`) judges the raw figures, every derived one computed
again, and fails a report whose stored figures contradict them
(consistency.py). Exit codes live here so that every caller (CLI, tests,
batch runs) agrees on them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from mpconvert.options.gate import Thresholds
from mpconvert.report.consistency import Consistency, consistency
from mpconvert.report.gate import GateResult, evaluate
from mpconvert.report.read import stored_thresholds
from mpconvert.report.schema import SCHEMA_VERSION
from mpconvert.report.sections import (
    Artifact,
    AutoKeep,
    Fidelity,
    Finetune,
    Golden,
    Layer,
    PaddingReport,
    Provenance,
    Skipped,
    SlowKernel,
    Source,
    SpeedReport,
    Timings,
    Validation,
    Versions,
    native,
    versions,
)
from mpconvert.system.writing import write_text

__all__ = [
    "EXIT_FAILED",
    "EXIT_GATE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_USAGE",
    "REPORT_NAME",
    "Report",
    "json_safe",
    "mpconvert_version",
    "versions",
]

EXIT_OK = 0
EXIT_FAILED = 1  # the input or the conversion failed; nothing written
EXIT_USAGE = 2
EXIT_GATE = 3  # converted (or re-checked), but a gate check failed
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report 128 + SIGINT; SIGTERM gives 143

REPORT_NAME = "report.json"

# The JSON form of any value (NaN/inf as null); the name callers of earlier versions use.
json_safe = native


def mpconvert_version() -> str:
    """This mpconvert's version ("0+unknown" in a source tree that was never installed)."""
    try:
        return metadata.version("mpconvert")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@dataclass(frozen=True)
class Report:
    policy: str
    source: Source
    layers: tuple[Layer, ...]
    validation: Validation
    thresholds: Thresholds  # what the gate judges against
    # The float32 rebuild of the plan against the original.
    fidelity: Fidelity | None = None
    finetune: Finetune | None = None
    padding: PaddingReport | None = None  # the padding stage's result; None when it did not run
    auto_keep: AutoKeep | None = None  # what the lint and the search kept float32, and why
    speed: SpeedReport | None = None  # the speed (and activation memory) the conversion bought here
    slow_kernel: SlowKernel | None = None  # a broken 16-bit kernel found right after the rewrite, and what was done
    # Stages the options would run that the model's kind cannot do (omitted from the JSON when none).
    skipped: tuple[Skipped, ...] = ()
    artifacts: tuple[Artifact, ...] = ()
    golden: Golden | None = None  # golden.npz, written with the artifacts
    timings: Timings = Timings()
    versions: Versions = field(default_factory=Versions.installed)
    # What went in (model, data, options, command) and where it ran; None in reports from before it existed.
    provenance: Provenance | None = None
    # A report read back to be judged again (`read_back`): what its stored figures contradict. None for a
    # report a conversion just made, and for one read back as it was (`from_json`).
    consistency: Consistency | None = None

    @property
    def gate(self) -> GateResult:
        return evaluate(self, self.thresholds)

    @property
    def passed(self) -> bool:
        return self.gate.passed

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_GATE

    @property
    def measured(self) -> dict[str, str]:
        """What this report measured: each scored output's metric by name ({} without labels)."""
        v = self.validation
        if v.outputs:
            return {o.name: o.metric for o in v.outputs if o.metric is not None}
        if v.metric is None:
            return {}
        return {self.source.outputs[0].name if self.source.outputs else "output": v.metric}

    def to_json(self) -> dict:
        """report.json's content: the sections in their JSON form, with the gate's verdict."""
        gate = self.gate
        body = {
            "policy": self.policy,
            "source": self.source,
            "layers": self.layers,
            "fidelity": self.fidelity,
            "finetune": self.finetune,
            "validation": self.validation,
            "padding": self.padding,
            "auto_keep": self.auto_keep,
            "speed": self.speed,
            "slow_kernel": self.slow_kernel,
            **({"skipped": self.skipped} if self.skipped else {}),
            "artifacts": self.artifacts,
            "golden": self.golden,
            "versions": self.versions,
            "provenance": self.provenance,
            "timings": self.timings,
        }
        return {"schema_version": SCHEMA_VERSION, "passed": gate.passed, **native(body), "gate": gate.as_dict()}

    # The name callers of earlier versions use.
    as_dict = to_json

    @classmethod
    def from_json(cls, stored: Mapping[str, Any], thresholds: Thresholds | None = None) -> Report:
        """A report read back from report.json (of any version this mpconvert reads); `passed` and `gate`
        are recomputed, by `thresholds` or else the ones the report was judged by."""

        def optional(section: Any, key: str) -> Any:
            value = stored.get(key)
            return None if value is None else section.from_json(value)

        return cls(
            policy=stored["policy"],
            source=Source.from_json(stored["source"]),
            layers=tuple(Layer.from_json(layer) for layer in stored["layers"]),
            validation=Validation.from_json(stored["validation"]),
            thresholds=stored_thresholds(stored) if thresholds is None else thresholds,
            fidelity=optional(Fidelity, "fidelity"),
            finetune=optional(Finetune, "finetune"),
            padding=optional(PaddingReport, "padding"),
            auto_keep=optional(AutoKeep, "auto_keep"),
            speed=optional(SpeedReport, "speed"),
            slow_kernel=optional(SlowKernel, "slow_kernel"),
            skipped=tuple(Skipped.from_json(s) for s in stored.get("skipped") or ()),
            artifacts=tuple(Artifact.from_json(a) for a in stored["artifacts"]),
            golden=optional(Golden, "golden"),
            timings=Timings.from_json(stored.get("timings") or {}),
            # A report from before the versions were stored: this mpconvert's, as before.
            versions=Versions.from_json(stored["versions"]) if "versions" in stored else Versions.installed(),
            provenance=optional(Provenance, "provenance"),
        )

    def derived(self) -> Report:
        """This report with every derived figure computed again from the raw ones, by the functions that
        computed them when it was made (a report a conversion just made is its own `derived()`)."""
        return replace(
            self,
            validation=self.validation.derived(tuple(o.name for o in self.source.outputs)),
            padding=self.padding.derived(self.policy) if self.padding else None,
            speed=self.speed.derived() if self.speed else None,
            slow_kernel=self.slow_kernel.derived() if self.slow_kernel else None,
            artifacts=tuple(a.derived() for a in self.artifacts),
        )

    @classmethod
    def read_back(cls, stored: Mapping[str, Any]) -> Report:
        """A stored report to judge again: judged on its raw figures, with what its derived ones contradict
        (the gate's report consistency check)."""
        derived = cls.from_json(stored).derived()
        return replace(derived, consistency=consistency(stored, derived.to_json()))

    def write_json(self, path: Path, stored: dict | None = None) -> Path:
        """report.json at `path` (`stored`: this report's `to_json()`, when the caller has it already)."""
        # allow_nan=False: a NaN in the report would make it invalid JSON for
        # every strict parser a CI system uses; `native` made them null.
        text = json.dumps(stored or self.to_json(), indent=2, allow_nan=False) + "\n"
        write_text(path, text, "the report")
        return path
