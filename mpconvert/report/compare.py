"""The one comparator: a model's outputs against a reference's, within a tolerance, as Polygraphy compares.

Every place that holds two runs' outputs side by side goes through
`compare`: an artifact's parity against the converted model (and at the
batch sizes a server sends), `verify`'s run of an artifact on the golden
rows and its drift from float32, the rebuild proofs (a Keras rebuild, a
frozen graph, a padded model), and the validation's largest difference.
The gate judges the figures they store by the same rule (`Tolerance.admits`),
so a figure recorded at conversion and re-judged from report.json meets
the same limit.

The limit is `atol + rtol x max(floor, largest finite |reference|)`, and a
difference passes when it is within it (with `options.tolerance.GATE_EPSILON` of slack, so
that a value exactly at its limit passes despite binary rounding). A
difference that is not finite fails, and is given as None (JSON null); so
does an output whose shape is not the reference's. Under the proofs' rule
(`nan_equal`) a NaN where the reference has a NaN, or the same infinity,
counts as equal: a faithful rebuild reproduces them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from mpconvert.options.tolerance import FIGURES, Tolerance


@dataclass(frozen=True)
class OutputComparison:
    """One output against its reference."""

    max_abs_diff: float | None  # None: a difference is not finite, or the shapes differ
    max_abs_ref: float  # the reference's largest finite |value|
    limit: float
    passed: bool
    shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None  # (expected, got) where they differ


@dataclass(frozen=True)
class Comparison:
    """Every output against its reference: each on its own scale, and all together on the largest one's."""

    outputs: tuple[OutputComparison, ...]
    tolerance: Tolerance

    @property
    def max_abs_diff(self) -> float | None:
        diffs = [o.max_abs_diff for o in self.outputs]
        if any(d is None for d in diffs):
            return None
        return max((d for d in diffs if d is not None), default=0.0)

    @property
    def max_abs_ref(self) -> float:
        return max((o.max_abs_ref for o in self.outputs), default=0.0)

    @property
    def limit(self) -> float:
        return self.tolerance.limit(self.max_abs_ref)

    @property
    def passed(self) -> bool:
        """All outputs together within the limit of the largest reference (the proofs' and a one-output rule)."""
        return self.tolerance.admits(self.max_abs_diff, self.max_abs_ref)

    @property
    def shown(self) -> str:
        """The difference for a message: a number, or why there is none."""
        diff = self.max_abs_diff
        if diff is not None:
            return f"{diff:.3g}"
        shapes = next((o.shapes for o in self.outputs if o.shapes), None)
        return "not finite" if shapes is None else f"not comparable (shape {shapes[1]} for {shapes[0]})"


def largest(values: np.ndarray) -> float:
    """The largest finite |value|; 0 for none, and for what is not a number (text)."""
    if values.dtype.kind not in "biufc":
        return 0.0
    return float(np.abs(values[np.isfinite(values)]).max(initial=0.0))


def _difference(expected: np.ndarray, got: np.ndarray, nan_equal: bool) -> float | None:
    a, b = expected.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore"):  # inf - inf is NaN: a difference that is not finite, said as None
        diff = np.abs(a - b)
    if nan_equal:
        diff = np.where((a == b) | (np.isnan(a) & np.isnan(b)), 0.0, diff)
    if not np.isfinite(diff).all():
        return None
    return float(diff.max(initial=0.0))


def compare(expected: Sequence[np.ndarray], got: Sequence[np.ndarray], tolerance: Tolerance = FIGURES) -> Comparison:
    """`got` against `expected`, output by output, in the same order; an output `got` lacks fails."""
    found = []
    for i, e in enumerate(expected):
        e = np.asarray(e)
        ref = largest(e)
        limit = tolerance.limit(ref)
        g = np.asarray(got[i]) if i < len(got) else None
        if g is None or g.shape != e.shape:
            shapes = (tuple(e.shape), tuple(g.shape) if g is not None else ())
            found.append(OutputComparison(None, ref, limit, False, shapes))
            continue
        diff = _difference(e, g, tolerance.nan_equal)
        found.append(OutputComparison(diff, ref, limit, tolerance.admits(diff, ref)))
    return Comparison(tuple(found), tolerance)
