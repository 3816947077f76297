"""The report: one object that owns the verdict and its JSON form (display is render.py's).

The verdict is the gate's (gate.py), evaluated on the report's JSON form, so a
report rebuilt from report.json (`mpconvert check`) is judged exactly like
the run that wrote it. Exit codes live here so that every caller (CLI,
tests, batch runs) agrees on them.
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass, field, fields
from importlib import metadata
from pathlib import Path
from typing import Any

from .gate import GateResult, evaluate
from .schema import SCHEMA_VERSION
from .thresholds import Thresholds
from .writing import write_text

EXIT_OK = 0
EXIT_FAILED = 1  # the input or the conversion failed; nothing written
EXIT_USAGE = 2
EXIT_GATE = 3  # converted (or re-checked), but a gate check failed
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report 128 + SIGINT; SIGTERM gives 143

REPORT_NAME = "report.json"
_DISTRIBUTIONS = {
    "tensorflow": ("tensorflow", "tensorflow-cpu"),
    "keras": ("keras",),
    "tf_keras": ("tf-keras", "tf_keras"),
    "tf2onnx": ("tf2onnx",),
    "onnx": ("onnx",),
    "onnxruntime": ("onnxruntime-gpu", "onnxruntime"),
}


def mpconvert_version() -> str:
    """This mpconvert's version ("0+unknown" in a source tree that was never installed)."""
    try:
        return metadata.version("mpconvert")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def versions() -> dict[str, str | None]:
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
class Report:
    policy: str
    source: dict
    layers: list[dict]
    validation: dict
    thresholds: Thresholds  # what the gate judges against
    # The float32 rebuild of the plan against the original (rows, max_abs_diff, limit).
    fidelity: dict | None = None
    finetune: dict | None = None
    padding: dict | None = None  # the padding stage's result; None when it did not run
    auto_keep: dict | None = None  # what the lint and the search kept float32, and why
    speed: dict | None = None  # the speed (and activation memory) the conversion bought here
    slow_kernel: dict | None = None  # a broken 16-bit kernel found right after the rewrite, and what was done
    # Stages the options would run that the model's kind cannot do: [{stage, reason}] (omitted when none).
    skipped: list[dict] = field(default_factory=list)
    artifacts: list[dict] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    versions: dict = field(default_factory=versions)

    @classmethod
    def from_dict(cls, stored: dict, thresholds: Thresholds) -> Report:
        """A report read back from report.json; `passed` and `gate` are recomputed."""
        known = {f.name for f in fields(cls)} - {"thresholds"}
        return cls(**{k: v for k, v in stored.items() if k in known}, thresholds=thresholds)

    @property
    def gate(self) -> GateResult:
        return evaluate(self._body(), self.thresholds)

    @property
    def passed(self) -> bool:
        return self.gate.passed

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.passed else EXIT_GATE

    def _body(self) -> dict:
        # Judged and written in the same JSON-safe form, so `mpconvert check`
        # on report.json gives the verdict the run gave.
        return json_safe(
            {
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
                "versions": self.versions,
                "timings": {k: round(v, 3) for k, v in self.timings.items()},
            }
        )

    def as_dict(self) -> dict:
        gate = self.gate
        return {"schema_version": SCHEMA_VERSION, "passed": gate.passed, **self._body(), "gate": gate.as_dict()}

    def write_json(self, path: Path, stored: dict | None = None) -> Path:
        """report.json at `path` (`stored`: this report's `as_dict()`, when the caller has it already)."""
        # allow_nan=False: a NaN in the report would make it invalid JSON for
        # every strict parser a CI system uses; `json_safe` made them null.
        text = json.dumps(stored or self.as_dict(), indent=2, allow_nan=False) + "\n"
        write_text(path, text, "the report")
        return path


def json_safe(value: Any) -> Any:
    """`value` with every NaN/inf float replaced by None (JSON null).

    Stages store None for what is not finite and say so in a note (the
    validation names the output and the count); this is the net under
    them, so that a NaN can fail a check but never the report itself.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value
