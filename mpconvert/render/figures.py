"""A gate check's figures: the few numbers a reader needs from its values, the same in every rendering.

A check's `values` hold every number it used (report.json and the JUnit
failure text keep them all); the terminal, the Markdown summary and
report.html show these instead, e.g. for artifact parity the max |diff|,
the limit and the rows compared, then each served batch size with its max
|diff| or its error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mpconvert.report.checks import Check


def _g(value: Any) -> str:
    """A figure, short: 0.00031, 1.09e-11, 143, n/a."""
    if value is None:
        return "n/a"
    if isinstance(value, bool) or isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.3g}"
    return str(value)


def _f4(value: Any) -> str:
    return "n/a" if value is None else f"{value:.4f}"


def _pct(value: Any) -> str:
    return "n/a" if value is None else f"{value:.2%}"


def _served(batches: list) -> str:
    """Each batch size a serving file was run at, with its max |diff| or why it failed: "0: 0, 1: 1.09e-11"."""

    def result(b: Mapping[str, Any]) -> str:
        if b.get("error"):
            return f"failed ({b['error']})"
        return "not finite" if b.get("max_abs_diff") is None else _g(b["max_abs_diff"])

    return "served rows " + ", ".join(f"{b.get('rows')}: {result(b)}" for b in batches)


def _parity(v: Mapping[str, Any]) -> str:
    parts = [f"max |diff| {_g(v.get('max_abs_diff'))}", f"limit {_g(v.get('limit'))}"]
    if v.get("rows") is not None:
        parts.append(f"rows {v['rows']}")
    text = ", ".join(parts)
    outputs = v.get("outputs") or {}
    if outputs:
        each = ", ".join(
            f"{name} {_g(o.get('max_abs_diff'))} (limit {_g(o.get('limit'))})" for name, o in outputs.items()
        )
        text += f"; per output: {each}"
    if v.get("batches"):
        text += f"; {_served(v['batches'])}"
    return text


def _accuracy(v: Mapping[str, Any]) -> str:
    metric = v.get("metric") or "metric"
    text = f"{metric} {_f4(v.get('reference'))} -> {_f4(v.get('converted'))}, drop {_f4(v.get('drop'))}"
    text += f", max {_f4(v.get('max_drop'))}"
    return text + (f", NaN/inf {v['nonfinite_outputs']}" if v.get("nonfinite_outputs") else "")


def _agreement(v: Mapping[str, Any]) -> str:
    if not v.get("rows"):
        return "not judged: 0 rows"
    which = "kept correct" if "kept_correct" in v else "agreement"
    share = v.get("kept_correct", v.get("agreement"))
    return f"{which} {_pct(share)}, min {_pct(v.get('min_agreement'))}, rows {v['rows']}"


def _padding(v: Mapping[str, Any]) -> str:
    overhead = v.get("flops_overhead")
    added = "n/a" if overhead is None else f"+{overhead:.1%}"
    return (
        f"max |diff| {_g(v.get('max_abs_diff'))}, multiple {v.get('multiple')}, {added} multiply-adds, "
        f"exported {v.get('exported')}"
    )


def _baseline(v: Mapping[str, Any]) -> str:
    return (
        f"{v.get('metric')} {_f4(v.get('converted'))} vs baseline {_f4(v.get('baseline'))}, "
        f"regression {_f4(v.get('regression'))}, max {_f4(v.get('max_regression'))}"
    )


def _speed(v: Mapping[str, Any]) -> str:
    ratio = v.get("ratio")
    shown = "not measured" if ratio is None else f"{v.get('path')} {ratio:.2f}x float32"
    return f"{shown}, min {v.get('min_speedup', 0):.2f}x"


def _overlap(v: Mapping[str, Any]) -> str:
    return (
        f"{v.get('in_train')} of {v.get('validation_rows')} validation rows in training ({_pct(v.get('share'))}), "
        f"max {_pct(v.get('max_overlap'))}"
    )


# Each kind of check by a key only its values hold, in the order tried.
_BY_KEY: tuple[tuple[str, Callable[[Mapping[str, Any]], str]], ...] = (
    ("limit", _parity),
    ("max_drop", _accuracy),
    ("min_agreement", _agreement),
    ("flops_overhead", _padding),
    ("max_regression", _baseline),
    ("min_speedup", _speed),
    ("max_overlap", _overlap),
    ("kept_float32", lambda v: f"{v.get('converted')} converted, {v.get('kept_float32')} kept float32"),
    (
        "requested_steps",
        lambda v: f"{v.get('steps')} of {v.get('requested_steps')} steps, {v.get('skipped_steps')} skipped",
    ),
    ("contradictions", lambda v: f"{len(v.get('contradictions') or [])} contradictions"),
    ("nonfinite_outputs", lambda v: f"max |diff| {_g(v.get('max_abs_diff'))}, NaN/inf {v.get('nonfinite_outputs')}"),
)


def parity_limit(check: Check) -> float | None:
    """The tolerance an artifact parity check applied (None for a kind it knows none for)."""
    return check.values.get("limit")


def check_figures(check: Check) -> str:
    """The few figures of a check, in one line (from its values' JSON form: what report.json shows)."""
    values = check.to_json()["values"] or {}
    for key, shown in _BY_KEY:
        if key in values:
            try:
                return shown(values)
            except (TypeError, ValueError, KeyError):  # a hand-edited or much older report: its plain values
                break
    plain = [f"{k} {_g(v)}" for k, v in values.items() if v is None or isinstance(v, (str, int, float))]
    return ", ".join(plain[:4])
