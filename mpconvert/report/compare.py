"""Comparing a model's outputs with a reference's: the largest difference, and the limit rounding allows."""

from __future__ import annotations

import numpy as np

# float32 rounding: 2**-24 = 6e-8 per operation, accumulated over a few
# hundred operations (a Dense softmax split into Dense + Activation rounds
# at other points) stays below this, relative to the outputs' magnitude
# (at least 1).
FLOAT32_ROUNDING = 1e-6


def limit_for(reference: list[np.ndarray]) -> float:
    finite = [np.abs(r[np.isfinite(r)]).max(initial=0.0) for r in reference if np.issubdtype(r.dtype, np.number)]
    return FLOAT32_ROUNDING * max(1.0, float(max(finite, default=0.0)))


def difference(reference: list[np.ndarray], other: list[np.ndarray]) -> float:
    """Largest |reference - other| over all outputs; a NaN/inf where the reference has the same counts as 0."""
    worst = 0.0
    for a, b in zip(reference, other):
        if a.shape != b.shape:
            return float("inf")
        a, b = a.astype(np.float64), b.astype(np.float64)
        same = (a == b) | (np.isnan(a) & np.isnan(b))
        diff = np.where(same, 0.0, np.abs(a - b))
        worst = max(worst, float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0)))
    return worst
