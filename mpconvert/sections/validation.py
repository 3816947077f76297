"""The report's validation: the converted model against the float32 original, per output and in total.

Measurements only: the verdict on them is the gate's (gate.py), and the
budget is the thresholds'.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..data import DataSource, Overlap
from ..options import Metric
from .base import Section, known, member


@dataclass(frozen=True)
class OutputValidation(Section):
    """One output's measurements: its metric with labels, its agreement and harm for a classifier, its drift."""

    name: str
    metric: Metric | None  # None without labels: compared with the original, not scored
    reference: float | None
    converted: float | None
    drop: float | None  # how much worse; None when a metric is not finite or not measured
    max_abs_diff: float | None  # None when a value is not finite
    rows: int
    nonfinite_outputs: int = 0
    agreement: float | None = None  # over the decisive rows (not near-ties); None for regression
    agreement_rows: int | None = None  # rows decisive enough to count for agreement
    # With labels (classifiers), over the same decisive rows: what the gate
    # judges. None without labels, where agreement is judged instead.
    harmed: int | None = None  # the float32 model got right, the converted model gets wrong
    fixed: int | None = None  # the float32 model got wrong, the converted model gets right
    kept_correct: float | None = None  # share of the kept_correct_rows still right; None when there are none
    kept_correct_rows: int | None = None  # decisive rows the float32 model got right
    note: str | None = None

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> OutputValidation:
        found = known(cls, stored)
        return cls(**{**found, "metric": _metric(found["metric"])})


@dataclass(frozen=True)
class Validation(Section):
    """Every output on the validation split; the top-level fields are the primary output's (the first with labels)."""

    metric: Metric | None
    reference: float | None
    converted: float | None
    drop: float | None
    agreement: float | None  # over the decisive rows (not near-ties)
    max_abs_diff: float | None  # over every output
    data: DataSource
    rows: int
    nonfinite_outputs: int = 0  # over every output
    nonfinite_by_output: dict[str, int] | None = None  # output name -> NaN/inf values, where any
    note: str | None = None
    agreement_rows: int | None = None
    harmed: int | None = None
    fixed: int | None = None
    kept_correct: float | None = None
    kept_correct_rows: int | None = None
    # A model with several outputs: each output's measurements. None for one output.
    outputs: tuple[OutputValidation, ...] | None = None
    # Validation rows that also appear in the training split; None without one.
    overlap: Overlap | None = None
    # The data file's keys that are neither inputs nor labels of this model (not read); None when none.
    unread_keys: tuple[str, ...] | None = None

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> Validation:
        """A stored validation, of any version: the harm fields and the per-output ones may be missing."""
        found = known(cls, stored)
        outputs = found["outputs"]
        overlap = found["overlap"]
        unread = found["unread_keys"]
        return cls(
            **{
                **found,
                "metric": _metric(found["metric"]),
                "data": member(DataSource, found["data"]),
                "outputs": None if outputs is None else tuple(OutputValidation.from_json(o) for o in outputs),
                "overlap": None if overlap is None else Overlap.from_json(overlap),
                "unread_keys": None if unread is None else tuple(unread),
            }
        )

    # The name tests and callers of earlier versions use.
    as_dict = Section.to_json


def _metric(value: Any) -> Metric | None:
    return None if value is None else member(Metric, value)
