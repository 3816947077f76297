"""One check of the gate, and the names the checks go by (each a JUnit test case, a line of the verdict)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from mpconvert.report.sections.base import native

POLICY_REWRITE = "policy rewrite"
FINETUNE_HEALTH = "fine-tune health"
ACCURACY = "accuracy gate"
AGREEMENT = "agreement"
PADDING = "padding proof"
PARITY = "artifact parity"  # one per artifact: "artifact parity: onnx"
BASELINE = "baseline regression"
SPEED = "speed"
DRIFT = "drift"  # one per unlabelled output of a multi-output model: "drift: boxes"
OVERLAP = "validation independent of training"
# The speed check judges the SavedModel serving path when it was timed (what
# a deployment runs), else the Keras call.
SPEED_PATHS_JUDGED = ("savedmodel", "keras")


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    message: str  # one line with the numbers, e.g. "accuracy 0.9620 -> 0.9480, drop 0.0140 > max 0.0050"
    values: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """Its entry in report.json's gate.checks (Enums among its values as their strings, NaN as null)."""
        return native(asdict(self))
