"""What the gate judges against: the thresholds, stored as report.json's gate.thresholds, and a baseline's numbers."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace

from mpconvert.options.artifact_kinds import ARTIFACT_KINDS
from mpconvert.options.gate import (
    DEFAULT_ATOL,
    DEFAULT_MAX_DROP,
    DEFAULT_MAX_OVERLAP,
    DEFAULT_MAX_REGRESSION,
    DEFAULT_MIN_AGREEMENT,
    GateOptions,
)
from mpconvert.options.precision import Precision
from mpconvert.report.compare import Tolerance


@dataclass(frozen=True)
class Baseline:
    """The numbers of an earlier run that this one must not fall behind."""

    path: str
    metric: str
    converted: float
    policy: str
    model: str
    # Several outputs: {output name: {"metric", "converted"}} of each measured output.
    outputs: dict | None = None


@dataclass(frozen=True)
class Thresholds:
    """Everything the checks compare against; stored as report.json's gate.thresholds."""

    max_drop: float
    min_agreement: float
    atol: dict[str, float]  # by artifact kind
    rtol: dict[str, float]
    max_regression: float
    baseline: Baseline | None = None
    # Smallest accepted float32 time / converted time; None (the default,
    # and every report from before it existed) judges no speed.
    min_speedup: float | None = None
    # A model with several outputs: a budget for one output, over max_drop.
    max_drop_by_output: dict[str, float] = field(default_factory=dict)
    max_overlap: float = DEFAULT_MAX_OVERLAP

    def drop_for(self, output: str | None) -> float:
        return self.max_drop_by_output.get(output, self.max_drop) if output else self.max_drop

    @classmethod
    def defaults(cls, policy: str | Precision, max_drop: float = DEFAULT_MAX_DROP) -> Thresholds:
        return cls(
            max_drop=max_drop,
            min_agreement=DEFAULT_MIN_AGREEMENT,
            atol=dict.fromkeys(ARTIFACT_KINDS, DEFAULT_ATOL),
            rtol=dict(Precision.of(policy).parity_rtol),
            max_regression=DEFAULT_MAX_REGRESSION,
        )

    @classmethod
    def from_dict(cls, stored: dict) -> Thresholds:
        baseline = stored.get("baseline")
        return cls(**{**stored, "baseline": Baseline(**baseline) if baseline else None})

    def as_dict(self) -> dict:
        return asdict(self)

    def overridden(self, options: GateOptions, baseline: Baseline | None = None) -> Thresholds:
        """These thresholds with the ones given on the command line.

        `baseline` is `options.baseline` read back (stored.load_baseline,
        which checks it measured what this run measures); None keeps this
        one's.
        """
        numbers = {
            name: getattr(options, name)
            for name in ("min_agreement", "max_regression", "min_speedup", "max_overlap")
            if getattr(options, name) is not None
        }
        max_drop, by_output = self.max_drop, dict(self.max_drop_by_output)
        for output, value in options.max_drop:  # later entries win; a plain value sets every output
            if output is None:
                max_drop, by_output = value, {}
            else:
                by_output[output] = value
        return replace(
            self,
            atol=_per_kind(self.atol, options.atol),
            rtol=_per_kind(self.rtol, options.rtol),
            baseline=baseline or self.baseline,
            max_drop=max_drop,
            max_drop_by_output=by_output,
            **numbers,
        )

    def tolerance(self, kind: str) -> Tolerance | None:
        """An artifact kind's parity tolerance (atol + rtol x its largest |output|); None for an unknown kind."""
        if kind not in self.atol or kind not in self.rtol:
            return None
        return Tolerance(self.atol[kind], self.rtol[kind])


def _per_kind(base: dict[str, float], given: tuple[tuple[str | None, float], ...]) -> dict[str, float]:
    table = dict(base)
    for kind, value in given:
        table.update({kind: value} if kind else dict.fromkeys(table, value))
    return table
