"""One check of the gate, the names the checks go by (each a JUnit test case, a line of the verdict), and the
figures each kind of check used (`values`: report.json's gate.checks[].values).

Each kind of check has its own small value type, so the renderings and
the trackers read named fields; `to_json()` is report.json's `values`
object, key for key as the gate always wrote it (a key a check did not
use is left out, as before).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from mpconvert.data.rows import Overlap
from mpconvert.report.sections.artifacts import ArtifactOutput, ServedBatch
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


def _json(**found: Any) -> dict[str, Any]:
    return {key: native(value) for key, value in found.items()}


@dataclass(frozen=True)
class NoValues:
    """A verdict without figures of its own (verify's checks: their figures are in verify.json's sections)."""

    def to_json(self) -> dict[str, Any]:
        return {}


@dataclass(frozen=True)
class PolicyValues:
    policy: str
    converted: int  # units computing in the policy
    kept_float32: int

    def to_json(self) -> dict[str, Any]:
        return _json(policy=self.policy, converted=self.converted, kept_float32=self.kept_float32)


@dataclass(frozen=True)
class FinetuneValues:
    steps: int
    requested_steps: int
    skipped_steps: int
    healthy: bool
    kept: str  # which weights it kept (sections.FinetuneKept)

    def to_json(self) -> dict[str, Any]:
        return _json(
            steps=self.steps,
            requested_steps=self.requested_steps,
            skipped_steps=self.skipped_steps,
            healthy=self.healthy,
            kept=self.kept,
        )


@dataclass(frozen=True)
class AccuracyValues:
    metric: str | None
    reference: float | None
    converted: float | None
    drop: float | None
    max_drop: float
    nonfinite_outputs: int
    # Where the NaN/inf values were, by output (None: not named); written only when there were any.
    nonfinite_by_output: Mapping[str, int] | None = None

    def to_json(self) -> dict[str, Any]:
        found = _json(
            metric=self.metric,
            reference=self.reference,
            converted=self.converted,
            drop=self.drop,
            max_drop=self.max_drop,
            nonfinite_outputs=self.nonfinite_outputs,
        )
        return {**found, "nonfinite_by_output": native(self.nonfinite_by_output)} if self.nonfinite_outputs else found


@dataclass(frozen=True)
class DriftValues:
    """An output without labels: its largest difference from float32 and its NaN/inf values."""

    max_abs_diff: float | None
    nonfinite_outputs: int

    def to_json(self) -> dict[str, Any]:
        return _json(max_abs_diff=self.max_abs_diff, nonfinite_outputs=self.nonfinite_outputs)


@dataclass(frozen=True)
class AgreementValues:
    """Without labels (or a report from before harm was counted): the share of decisive rows that agree."""

    agreement: float
    min_agreement: float
    rows: int

    def to_json(self) -> dict[str, Any]:
        return _json(agreement=self.agreement, min_agreement=self.min_agreement, rows=self.rows)


@dataclass(frozen=True)
class KeptCorrectValues:
    """With labels: the share of the rows the float32 model got right that the converted model still gets right."""

    kept_correct: float
    min_agreement: float
    rows: int | None  # the rows the float32 model got right
    harmed: int | None
    fixed: int | None
    agreement: float | None

    def to_json(self) -> dict[str, Any]:
        return _json(
            kept_correct=self.kept_correct,
            min_agreement=self.min_agreement,
            rows=self.rows,
            harmed=self.harmed,
            fixed=self.fixed,
            agreement=self.agreement,
        )


@dataclass(frozen=True)
class AgreementNotJudged:
    """Nothing to judge: no decisive row (`by` "agreement"), or too few the float32 model got right ("kept_correct")."""

    by: str = "agreement"  # the figure it would have judged
    harmed: int | None = None  # written only when counted
    fixed: int | None = None  # written only with labels

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {self.by: None, "rows": 0}
        if self.harmed is not None:
            found["harmed"] = self.harmed
        if self.by == "kept_correct":
            found["fixed"] = self.fixed
        return found


@dataclass(frozen=True)
class OverlapValues:
    overlap: Overlap
    max_overlap: float

    def to_json(self) -> dict[str, Any]:
        return {**native(self.overlap.to_json()), "max_overlap": self.max_overlap}


@dataclass(frozen=True)
class ConsistencyValues:
    contradictions: tuple[str, ...]  # each in words
    fields: tuple[str, ...]  # where, as report.json spells it

    def to_json(self) -> dict[str, Any]:
        return {"contradictions": list(self.contradictions), "fields": list(self.fields)}


@dataclass(frozen=True)
class PaddingValues:
    multiple: int
    max_abs_diff: float | None
    flops_overhead: float | None
    exported: str | None

    def to_json(self) -> dict[str, Any]:
        return _json(
            multiple=self.multiple,
            max_abs_diff=self.max_abs_diff,
            flops_overhead=self.flops_overhead,
            exported=self.exported,
        )


@dataclass(frozen=True)
class OutputParity:
    """One output of an artifact against its own limit."""

    output: ArtifactOutput
    limit: float | None
    passed: bool

    def to_json(self) -> dict[str, Any]:
        return {**self.output.to_json(), "limit": native(self.limit), "passed": self.passed}


@dataclass(frozen=True)
class ServedParity:
    """An artifact at one batch size a server may send, judged against the limit."""

    batch: ServedBatch
    passed: bool

    def to_json(self) -> dict[str, Any]:
        return {**self.batch.to_json(), "passed": self.passed}


@dataclass(frozen=True)
class ParityValues:
    max_abs_diff: float | None
    max_abs_ref: float
    atol: float | None
    rtol: float | None
    limit: float | None  # None: no tolerance known for the kind
    rows: int | None
    outputs: Mapping[str, OutputParity] | None = None  # several outputs, each on its own scale
    batches: tuple[ServedParity, ...] | None = None  # the batch sizes it was also run at

    def to_json(self) -> dict[str, Any]:
        found = _json(
            max_abs_diff=self.max_abs_diff,
            max_abs_ref=self.max_abs_ref,
            atol=self.atol,
            rtol=self.rtol,
            limit=self.limit,
            rows=self.rows,
        )
        if self.outputs is not None:
            found["outputs"] = {name: o.to_json() for name, o in self.outputs.items()}
        if self.batches is not None:
            found["batches"] = [b.to_json() for b in self.batches]
        return found


@dataclass(frozen=True)
class BaselineValues:
    metric: str | None
    converted: float | None
    baseline: float
    max_regression: float
    baseline_path: str
    regression: float | None = None  # how much worse; written only when the two are comparable

    def to_json(self) -> dict[str, Any]:
        found = _json(
            metric=self.metric,
            converted=self.converted,
            baseline=self.baseline,
            max_regression=self.max_regression,
            baseline_path=self.baseline_path,
        )
        return found if self.regression is None else {**found, "regression": native(self.regression)}


@dataclass(frozen=True)
class MissingBaselineValues:
    """The baseline has no figure for this output: not comparable."""

    baseline_path: str

    def to_json(self) -> dict[str, Any]:
        return {"baseline_path": self.baseline_path}


@dataclass(frozen=True)
class SpeedValues:
    min_speedup: float
    ratio: float | None  # None: not measured, and the rest is not written
    path: str | None = None
    float32_ms: float | None = None
    converted_ms: float | None = None
    device: str | None = None
    batch: int | None = None

    def to_json(self) -> dict[str, Any]:
        found = _json(min_speedup=self.min_speedup, ratio=self.ratio)
        if self.path is None:
            return found
        return {
            **found,
            **_json(
                path=self.path,
                float32_ms=self.float32_ms,
                converted_ms=self.converted_ms,
                device=self.device,
                batch=self.batch,
            ),
        }


CheckValues = (
    NoValues
    | PolicyValues
    | FinetuneValues
    | AccuracyValues
    | DriftValues
    | AgreementValues
    | KeptCorrectValues
    | AgreementNotJudged
    | OverlapValues
    | ConsistencyValues
    | PaddingValues
    | ParityValues
    | BaselineValues
    | MissingBaselineValues
    | SpeedValues
)


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    message: str  # one line with the numbers, e.g. "accuracy 0.9620 -> 0.9480, drop 0.0140 > max 0.0050"
    values: CheckValues = field(default_factory=NoValues)  # every figure the check used

    def to_json(self) -> dict[str, Any]:
        """Its entry in report.json's gate.checks (Enums among its values as their strings, NaN as null)."""
        return {"name": self.name, "passed": self.passed, "message": self.message, "values": self.values.to_json()}
