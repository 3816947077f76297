"""The report's sections the conversion stages fill: fine-tune, padding, and automatic float32 (lint, search)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any

from mpconvert.options.rewrite import AutoKeepMode
from mpconvert.options.tolerance import Tolerance
from mpconvert.options.validate import Metric
from mpconvert.report.sections.base import JSONValue, Section, known, member, native


class FinetuneKept(StrEnum):
    """Which weights a fine-tune left in the model: never worse than before it (no harm)."""

    FINETUNED = "finetuned"
    REWRITTEN = "rewritten"  # the weights from before the fine-tune: stopped, or no output got better


@dataclass(frozen=True)
class LossScale(Section):
    """The dynamic loss scale over a float16 fine-tune: where it started, ended and how low it went."""

    initial: float
    final: float
    min: float

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> LossScale:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class LossRange(Section):
    """The fine-tune's loss at its first finite step and its last step (None where not finite)."""

    first: float | None
    last: float | None

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> LossRange:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class StepTime(Section):
    """One training step's median time, float32 against the converted model."""

    float32_ms: float
    converted_ms: float

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> StepTime:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class OutputTuning(Section):
    """One labelled output of a model with several: its metric before and after the fine-tune."""

    metric: Metric
    before: float | None
    after: float | None  # None when stopped by a health check

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> OutputTuning:
        found = known(cls, stored)
        return cls(**{**found, "metric": member(Metric, found["metric"])})


@dataclass(frozen=True)
class History(Section):
    """The loss (and loss scale) over the steps, for report.html's chart: at most HISTORY_POINTS steps."""

    step: tuple[int, ...]
    loss: tuple[float | None, ...]
    loss_scale: tuple[float, ...] | None  # None without loss scaling (bfloat16)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> History:
        scale = stored.get("loss_scale")
        return cls(
            tuple(stored.get("step") or ()), tuple(stored.get("loss") or ()), None if scale is None else tuple(scale)
        )


@dataclass(frozen=True)
class Finetune(Section):
    steps: int  # steps run (fewer than requested when a health check stopped it)
    requested_steps: int
    skipped_steps: int
    loss_scale: LossScale | None  # None without loss scaling (bfloat16)
    loss: LossRange
    metric: Metric
    metric_before: float | None  # None when no output has validation labels
    metric_after: float | None  # None when stopped by a health check
    kept: FinetuneKept
    seconds: float
    step_time: StepTime
    step_time_ratio: float | None  # converted / float32; below 1 is faster
    healthy: bool
    problem: str | None  # what went wrong, in plain words
    advice: str | None  # what to try
    loss_function: str
    learning_rate: float
    batch_size: int
    seed: int
    # Several outputs: each labelled one's metric before and after, by name (the fields above are the first's);
    # None for one output.
    outputs: Mapping[str, OutputTuning] | None = None
    history: History | None = None  # the loss (and loss scale) over the steps, for report.html's chart

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Finetune:
        found = known(cls, stored)
        metric, scale, outputs, history = found["metric"], found["loss_scale"], found["outputs"], found["history"]
        return cls(
            **{
                **found,
                "kept": member(FinetuneKept, found["kept"]),
                "metric": None if metric is None else member(Metric, metric),
                "loss_scale": None if scale is None else LossScale.from_json(scale),
                "loss": LossRange.from_json(found["loss"] or {}),
                "step_time": StepTime.from_json(found["step_time"] or {}),
                "outputs": None if outputs is None else {n: OutputTuning.from_json(o) for n, o in outputs.items()},
                "history": None if history is None else History.from_json(history),
            }
        )


def padding_failures(
    float32_diff: float | None, diff: float | None, tolerance: Mapping[str, float], policy: str, max_abs_ref: float
) -> list[str]:
    """Why a padded model is not the unpadded one (none: the proof holds).

    The tolerances are relative to the outputs' scale (their largest
    |value|, at least 1): float32 must agree to rounding, the policy to its
    16-bit kernels' rounding.
    """
    failures = []
    for what, found in (("float32", float32_diff), (policy, diff)):
        rule = Tolerance(rtol=tolerance[what], floor=1.0)
        if not rule.admits(found, max_abs_ref):
            failures.append(f"{what} outputs differ by {found} (> {rule.limit(max_abs_ref):g})")
    return failures


@dataclass(frozen=True)
class PaddedDim:
    """A producer's channel dimension the padding widened."""

    layer: str
    dim: str  # which of its dimensions ("units", "filters", ...)
    width: int  # its width before (report.json's "from")
    to: int

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "dim": self.dim, "from": self.width, "to": self.to}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> PaddedDim:
        return cls(stored["layer"], stored["dim"], stored["from"], stored["to"])


@dataclass(frozen=True)
class SkippedDim:
    """A producer's channel dimension the padding left as it is, and why."""

    layer: str
    dim: str
    width: int  # report.json's "from"
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "dim": self.dim, "from": self.width, "reason": self.reason}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> SkippedDim:
        return cls(stored["layer"], stored["dim"], stored["from"], stored["reason"])


PADDED, UNPADDED = "padded", "unpadded"
NOTHING_TO_PAD = "nothing to pad"  # how the stage's reason begins when it padded nothing (and proved nothing)
NOT_TRIED = "padding not tried"  # ... when it did not plan or prove anything (a model too large to copy twice)


@dataclass(frozen=True)
class PaddingReport(Section):
    """What the padding stage padded, skipped and proved; `exported` says which model the artifacts hold."""

    multiple: int
    max_overhead: float | None = None
    padded: tuple[PaddedDim, ...] = ()  # the plan's
    skipped: tuple[SkippedDim, ...] = ()
    flops_overhead: float | None = None
    max_abs_diff: float | None = None  # padded against unpadded in the policy; None when not finite or not run
    float32_max_abs_diff: float | None = None  # the same in float32, where the padding logic must be exact
    tolerance: Mapping[str, float] | None = None  # {"float32": ..., policy: ...}
    passed: bool = True
    exported: str | None = None  # "padded" or "unpadded"
    reason: str | None = None  # why nothing was padded, or why the proof failed
    # The unpadded model's largest |output|: the scale of the tolerances, stored so that the proof's
    # verdict can be derived again from report.json. None when nothing was padded, and in older reports.
    max_abs_ref: float | None = None

    @property
    def compared(self) -> bool:
        """Whether a padded model was built and compared: not when the stage had nothing to pad."""
        return not (self.passed and self.exported != PADDED)

    def derived(self, policy: str) -> PaddingReport:
        """The proof's verdict and the model exported, derived from the differences (`padding_failures`).

        Nothing padded: nothing to compare, the unpadded model exported. A
        report written before `max_abs_ref` keeps its verdict as written.
        """
        if not self.padded:
            return replace(self, passed=True, exported=UNPADDED)
        passed = self.passed
        tolerance = self.tolerance or {}
        if self.max_abs_ref is not None and "float32" in tolerance and policy in tolerance:
            passed = not padding_failures(
                self.float32_max_abs_diff, self.max_abs_diff, tolerance, policy, self.max_abs_ref
            )
        return replace(self, passed=passed, exported=PADDED if passed else UNPADDED)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> PaddingReport:
        found = known(cls, stored)
        padded = tuple(PaddedDim.from_json(d) for d in found["padded"] or ())
        return cls(
            **{**found, "padded": padded, "skipped": tuple(SkippedDim.from_json(d) for d in found["skipped"] or ())}
        )


@dataclass(frozen=True)
class Finding(Section):
    layer: str
    kind: str  # "overflow", "input overflow", "weights", "constant", "epsilon", "information loss", "input information loss"
    message: str  # with the numbers: "output max 3.1e5 > float16 max 65504"
    # The figures behind it, by name (max, value, source, ...: each kind of finding its own few).
    values: Mapping[str, JSONValue] = field(default_factory=dict)

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Finding:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class Lint:
    """The numeric lint's findings on the float32 model, on `rows` calibration rows."""

    rows: int
    findings: tuple[Finding, ...]

    @property
    def keep(self) -> dict[str, str]:
        """Layer -> why it stays float32 (its first finding)."""
        keep: dict[str, str] = {}
        for finding in self.findings:
            keep.setdefault(finding.layer, f"numeric lint: {finding.message}")
        return keep

    def to_json(self) -> dict:
        return {"rows": self.rows, "findings": native(self.findings), "kept": sorted(self.keep)}

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Lint:
        rows: Any = stored.get("rows")
        return cls(rows, tuple(Finding.from_json(f) for f in stored.get("findings") or ()))


class SearchOutcome(StrEnum):
    PASSED = "passed"  # the smallest set found keeps the gate's checks passing
    BUDGET = "budget"  # time ran out with a passing set that may not be the smallest
    SHARE = "share"  # even MAX_SEARCH_SHARE of the units kept float32 does not pass


@dataclass(frozen=True)
class Ranked(Section):
    layer: str  # a layer path, or a graph node
    sensitivity: float | None  # None when its 16-bit output is not finite

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Ranked:
        return cls(**known(cls, stored))


@dataclass(frozen=True)
class Trial(Section):
    """One set of units kept float32 that the search tried, with the figures its validation gave."""

    kept: tuple[str, ...]  # sorted
    drop: float | None
    agreement: float | None
    passed: bool

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Trial:
        found = known(cls, stored)
        return cls(**{**found, "kept": tuple(found["kept"] or ())})


@dataclass(frozen=True)
class SearchReport(Section):
    """What the accuracy-driven search found: the fewest units to keep float32, and how."""

    outcome: SearchOutcome
    trials: int
    seconds: float
    kept: tuple[str, ...]  # plan names kept float32 (linear names for split heads)
    ranking: tuple[Ranked, ...]  # the most sensitive units, at most 10
    drop: tuple[Trial, ...]  # every trial, in the order it ran

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> SearchReport:
        found = known(cls, stored)
        return cls(
            outcome=member(SearchOutcome, found["outcome"]),
            trials=found["trials"],
            seconds=found["seconds"],
            kept=tuple(found["kept"] or ()),
            ranking=tuple(Ranked.from_json(r) for r in found["ranking"] or ()),
            drop=tuple(Trial.from_json(t) for t in found["drop"] or ()),
        )


@dataclass(frozen=True)
class AutoKeep:
    """What the lint and the search kept float32, and why."""

    mode: AutoKeepMode
    lint: Lint | None = None
    search: SearchReport | None = None
    note: str | None = None  # what the lint and the search work on, where they are not Keras layers

    def to_json(self) -> dict:
        found = {"mode": native(self.mode), "lint": native(self.lint), "search": native(self.search)}
        return {**found, "note": self.note} if self.note else found

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> AutoKeep:
        lint, search = stored.get("lint"), stored.get("search")
        return cls(
            member(AutoKeepMode, stored.get("mode")),
            None if lint is None else Lint.from_json(lint),
            None if search is None else SearchReport.from_json(search),
            stored.get("note"),
        )
