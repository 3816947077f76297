"""A gate check's figures: the few numbers a reader needs from its values, the same in every rendering.

A check's `values` hold every number it used (report.json and the JUnit
failure text keep them all); the terminal, the Markdown summary and
report.html show these instead, e.g. for artifact parity the max |diff|,
the limit and the rows compared, then each served batch size with its max
|diff| or its error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from mpconvert.report.checks import (
    AccuracyValues,
    AgreementValues,
    BaselineValues,
    Check,
    ConsistencyValues,
    DriftValues,
    FinetuneValues,
    KeptCorrectValues,
    OverlapValues,
    PaddingValues,
    ParityValues,
    PolicyValues,
    ServedParity,
    SpeedValues,
)


def _known(value: Any) -> Any:
    """A figure as report.json holds it: NaN/inf as None."""
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _g(value: Any) -> str:
    """A figure, short: 0.00031, 1.09e-11, 143, n/a."""
    value = _known(value)
    if value is None:
        return "n/a"
    if isinstance(value, bool) or isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _f4(value: float | None) -> str:
    value = _known(value)
    return "n/a" if value is None else f"{value:.4f}"


def _pct(value: float | None) -> str:
    value = _known(value)
    return "n/a" if value is None else f"{value:.2%}"


def _served(batches: Sequence[ServedParity]) -> str:
    """Each batch size a serving file was run at, with its max |diff| or why it failed: "0: 0, 1: 1.09e-11"."""

    def result(judged: ServedParity) -> str:
        b = judged.batch
        if b.error:
            return f"failed ({b.error})"
        return "not finite" if _known(b.max_abs_diff) is None else _g(b.max_abs_diff)

    return "served rows " + ", ".join(f"{b.batch.rows}: {result(b)}" for b in batches)


def _parity(v: ParityValues) -> str:
    parts = [f"max |diff| {_g(v.max_abs_diff)}", f"limit {_g(v.limit)}"]
    if v.rows is not None:
        parts.append(f"rows {v.rows}")
    text = ", ".join(parts)
    if v.outputs:
        each = ", ".join(f"{name} {_g(o.output.max_abs_diff)} (limit {_g(o.limit)})" for name, o in v.outputs.items())
        text += f"; per output: {each}"
    if v.batches:
        text += f"; {_served(v.batches)}"
    return text


def _accuracy(v: AccuracyValues) -> str:
    metric = v.metric or "metric"
    text = f"{metric} {_f4(v.reference)} -> {_f4(v.converted)}, drop {_f4(v.drop)}"
    text += f", max {_f4(v.max_drop)}"
    return text + (f", NaN/inf {v.nonfinite_outputs}" if v.nonfinite_outputs else "")


def _agreement(v: AgreementValues | KeptCorrectValues) -> str:
    if not v.rows:
        return "not judged: 0 rows"
    which, share = ("kept correct", v.kept_correct) if isinstance(v, KeptCorrectValues) else ("agreement", v.agreement)
    return f"{which} {_pct(share)}, min {_pct(v.min_agreement)}, rows {v.rows}"


def _padding(v: PaddingValues) -> str:
    overhead = _known(v.flops_overhead)
    added = "n/a" if overhead is None else f"+{overhead:.1%}"
    return f"max |diff| {_g(v.max_abs_diff)}, multiple {v.multiple}, {added} multiply-adds, exported {v.exported}"


def _baseline(v: BaselineValues) -> str:
    return (
        f"{v.metric} {_f4(v.converted)} vs baseline {_f4(v.baseline)}, "
        f"regression {_f4(v.regression)}, max {_f4(v.max_regression)}"
    )


def _speed(v: SpeedValues) -> str:
    ratio = _known(v.ratio)
    shown = "not measured" if ratio is None else f"{v.path} {ratio:.2f}x float32"
    return f"{shown}, min {v.min_speedup:.2f}x"


def _overlap(v: OverlapValues) -> str:
    o = v.overlap
    return (
        f"{o.in_train} of {o.validation_rows} validation rows in training ({_pct(o.share)}), max {_pct(v.max_overlap)}"
    )


def _plain(values: Mapping[str, Any]) -> str:
    """A check whose figures have no line of their own (one not judged): its first few plain values."""
    plain = [f"{k} {_g(v)}" for k, v in values.items() if v is None or isinstance(v, (str, int, float))]
    return ", ".join(plain[:4])


def parity_limit(check: Check) -> float | None:
    """The tolerance an artifact parity check applied (None for a kind it knows none for)."""
    return check.values.limit if isinstance(check.values, ParityValues) else None


def check_figures(check: Check) -> str:
    """The few figures of a check, in one line."""
    v = check.values
    if isinstance(v, ParityValues):
        return _parity(v)
    if isinstance(v, AccuracyValues):
        return _accuracy(v)
    if isinstance(v, (AgreementValues, KeptCorrectValues)):
        return _agreement(v)
    if isinstance(v, PaddingValues):
        return _padding(v)
    if isinstance(v, BaselineValues):
        return _baseline(v)
    if isinstance(v, SpeedValues):
        return _speed(v)
    if isinstance(v, OverlapValues):
        return _overlap(v)
    if isinstance(v, PolicyValues):
        return f"{v.converted} converted, {v.kept_float32} kept float32"
    if isinstance(v, FinetuneValues):
        return f"{v.steps} of {v.requested_steps} steps, {v.skipped_steps} skipped"
    if isinstance(v, ConsistencyValues):
        return f"{len(v.contradictions)} contradictions"
    if isinstance(v, DriftValues):
        return f"max |diff| {_g(v.max_abs_diff)}, NaN/inf {v.nonfinite_outputs}"
    return _plain(v.to_json())
