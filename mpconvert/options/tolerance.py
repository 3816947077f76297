"""How far two figures or two runs' outputs may differ: the gate's tolerances, and the proofs' float32 rounding.

A value the options build (`Thresholds.tolerance`) and the comparator (report/compare.py) applies, so
that a figure judged at conversion and re-judged from report.json meets the same limit.
"""

from __future__ import annotations

from dataclasses import dataclass

# float32 rounding: 2**-24 = 6e-8 per operation, accumulated over a few
# hundred operations (a Dense softmax split into Dense + Activation rounds
# at other points) stays below this, relative to the outputs' magnitude
# (at least 1).
FLOAT32_ROUNDING = 1e-6

# Figures are compared with this much slack so that one exactly at its limit
# (0.96 - 0.95 vs 0.01 is 0.010000000000000009) passes despite binary rounding.
GATE_EPSILON = 1e-9


def within(value: float, limit: float) -> bool:
    return value <= limit + GATE_EPSILON


@dataclass(frozen=True)
class Tolerance:
    """How far outputs may differ: `atol` plus `rtol` times the reference's largest |value| (at least `floor`)."""

    atol: float = 0.0
    rtol: float = 0.0
    floor: float = 0.0
    nan_equal: bool = False  # a NaN (or infinity) where the reference has the same counts as equal

    def limit(self, max_abs_ref: float) -> float:
        return self.atol + self.rtol * max(self.floor, max_abs_ref)

    def admits(self, max_abs_diff: float | None, max_abs_ref: float) -> bool:
        """Whether a stored difference (None: not finite) is within the limit for that reference scale."""
        return max_abs_diff is not None and within(max_abs_diff, self.limit(max_abs_ref))

    @classmethod
    def float32_rounding(cls) -> Tolerance:
        """The rebuild proofs' tolerance: float32 rounding of the outputs' scale, NaN where the reference's."""
        return cls(rtol=FLOAT32_ROUNDING, floor=1.0, nan_equal=True)


# Figures only (the limit is 0): parity, served batches and drift store the difference for the gate to judge.
FIGURES = Tolerance()
