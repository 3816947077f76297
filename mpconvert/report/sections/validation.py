"""The report's validation: the converted model against the float32 original, per output and in total.

Measurements only: the verdict on them is the gate's (gate.py), and the
budget is the thresholds'. Some fields are raw figures (the metric before
and after, row counts); the others are derived from them, by `derived()`
and the functions here, which the validation stage itself builds its
figures with. A report read back is judged on figures derived again the
same way, so a stored drop cannot say something its own metric does not
(consistency.py names any that does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from mpconvert.data.rows import DataSource, Overlap
from mpconvert.data.tokens import perplexity
from mpconvert.options.validate import Metric
from mpconvert.report.sections.base import Section, known, member


def worse_by(metric: str, before: float, after: float) -> float:
    """How much worse `after` is than `before`: accuracy falls, mse and cross-entropy rise."""
    # A baseline's metric is the string its report.json holds (one this version does not know: lower is better).
    known = member(Metric, metric)
    return before - after if isinstance(known, Metric) and known.higher_is_better else after - before


def drop_of(metric: str | None, reference: float | None, converted: float | None) -> float | None:
    """The drop: how much worse the converted model scores; None when either metric is unmeasured or not finite."""
    if metric is None or reference is None or converted is None:
        return None
    return worse_by(metric, reference, converted)


def share_of(count: int | None, rows: int | None) -> float | None:
    """`count` of `rows` as a share; None when there is no row to share (or no count)."""
    if count is None or not rows:
        return None
    return count / rows


def kept_share(harmed: int | None, kept_correct_rows: int | None) -> float | None:
    """`kept_correct`: the share of the rows the float32 model got right that the converted model still gets right."""
    if harmed is None or kept_correct_rows is None:
        return None
    return share_of(kept_correct_rows - harmed, kept_correct_rows)


def _shares(m: Measured) -> dict[str, Any]:
    """One output's derived figures (drop, agreement, kept_correct) from its raw ones.

    A report written before `agreed` was stored keeps its agreement as
    written: there is no count to derive it from.
    """
    derived = {
        "drop": drop_of(m.metric, m.reference, m.converted),
        "kept_correct": kept_share(m.harmed, m.kept_correct_rows),
        "tokens": m.tokens.derived() if m.tokens else None,
    }
    if m.agreed is not None and m.agreement_rows is not None:
        derived["agreement"] = share_of(m.agreed, m.agreement_rows)
    return derived


@dataclass(frozen=True)
class TokenScores(Section):
    """A sequence output's tokens: how many were scored and left out as padding, and both models' cross-entropy.

    The agreement and harm counts of such an output (agreement_rows,
    agreed, harmed, fixed, kept_correct_rows) count tokens, not rows.
    """

    scored: int  # positions with a label: the tokens every figure counts
    padding: int  # positions left out: marked by `padding_from`, or all-zero one-hot rows
    padding_from: str | None  # the input that marks padding; None when the model has none
    reference_cross_entropy: float | None  # nats per token; None when not finite
    converted_cross_entropy: float | None
    reference_perplexity: float | None = None  # derived: exp(cross-entropy)
    converted_perplexity: float | None = None

    def derived(self) -> TokenScores:
        return replace(
            self,
            reference_perplexity=perplexity(self.reference_cross_entropy),
            converted_perplexity=perplexity(self.converted_cross_entropy),
        )

    @classmethod
    def from_json(cls, stored: Mapping[str, Any] | None) -> TokenScores | None:
        return None if stored is None else cls(**known(cls, stored))


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
    agreed: int | None = None  # of those, rows whose prediction the conversion left unchanged
    # With labels (classifiers), over the same decisive rows: what the gate
    # judges. None without labels, where agreement is judged instead.
    harmed: int | None = None  # the float32 model got right, the converted model gets wrong
    fixed: int | None = None  # the float32 model got wrong, the converted model gets right
    kept_correct: float | None = None  # share of the kept_correct_rows still right; None when there are none
    kept_correct_rows: int | None = None  # decisive rows the float32 model got right
    note: str | None = None
    tokens: TokenScores | None = None  # a sequence output's: the counts above are tokens

    def derived(self) -> OutputValidation:
        """This output with its derived figures computed from its raw ones (the stage makes it so)."""
        return replace(self, **_shares(self))

    @classmethod
    def from_json(cls, stored: Mapping[str, Any]) -> OutputValidation:
        found = known(cls, stored)
        return cls(**{**found, "metric": _metric(found["metric"]), "tokens": TokenScores.from_json(found["tokens"])})


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
    agreed: int | None = None
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
    tokens: TokenScores | None = None  # the primary output's, when it is a sequence output

    @classmethod
    def of(cls, outputs: Sequence[OutputValidation], **rest: Any) -> Validation:
        """Every output's measurements put together; `rest` are the fields that are not the outputs' (data, rows,
        note, overlap). The top-level figures are the primary output's and the totals over all of them."""
        return cls(
            **_primary(outputs), **_totals(outputs), outputs=tuple(outputs) if len(outputs) > 1 else None, **rest
        )

    def derived(self, output_names: Sequence[str] = ()) -> Validation:
        """This validation with every derived figure computed again from the raw ones, as `of` computes them.

        `output_names` are the model's outputs (the report's source): a
        single-output validation names its NaN/inf count by the output's name.
        """
        overlap = self.overlap.derived() if self.overlap else None
        if self.outputs:
            outputs = tuple(o.derived() for o in self.outputs)
            return replace(self, **_primary(outputs), **_totals(outputs), outputs=outputs, overlap=overlap)
        by_output = self.nonfinite_by_output
        if len(output_names) == 1:
            by_output = {output_names[0]: self.nonfinite_outputs} if self.nonfinite_outputs else None
        return replace(self, **_shares(self), nonfinite_by_output=by_output, overlap=overlap)

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
                "tokens": TokenScores.from_json(found["tokens"]),
            }
        )

    # The name tests and callers of earlier versions use.
    as_dict = Section.to_json


# What the metric and agreement checks read: the primary output's figures, or one output's.
Measured = Validation | OutputValidation

# The top-level fields that are the primary output's (the first with labels, else the first).
PRIMARY_FIELDS = (
    "metric",
    "reference",
    "converted",
    "drop",
    "agreement",
    "agreement_rows",
    "agreed",
    "harmed",
    "fixed",
    "kept_correct",
    "kept_correct_rows",
    "tokens",
)


def primary_index(metrics: Sequence[Any]) -> int:
    """Which output the top-level fields describe, by each output's metric: the first with labels, else the first."""
    return next((i for i, metric in enumerate(metrics) if metric is not None), 0)


def _primary(outputs: Sequence[OutputValidation]) -> dict[str, Any]:
    primary = outputs[primary_index([o.metric for o in outputs])]
    return {name: getattr(primary, name) for name in PRIMARY_FIELDS}


def _totals(outputs: Sequence[OutputValidation]) -> dict[str, Any]:
    """NaN/inf counts and the largest difference over every output (None when any is not finite)."""
    diffs = [o.max_abs_diff for o in outputs if o.max_abs_diff is not None]
    by_output = {o.name: o.nonfinite_outputs for o in outputs if o.nonfinite_outputs}
    return {
        "nonfinite_outputs": sum(o.nonfinite_outputs for o in outputs),
        "nonfinite_by_output": by_output or None,
        "max_abs_diff": max(diffs, default=0.0) if len(diffs) == len(outputs) else None,
    }


def _metric(value: Any) -> Metric | None:
    return None if value is None else member(Metric, value)
