"""The gate's thresholds: as given (`GateOptions`), their defaults, and as judged by (`Thresholds`).

One concept in two states. `GateOptions` holds what a user gave, None (or
no entry) for "keep the base value"; `Thresholds` holds every value the
checks compare against, resolved once (`Thresholds.defaults(policy)` for a
conversion, a report's stored ones for `mpconvert check`, then
`overridden(options)`), and is what report.json stores as gate.thresholds.
They differ in shape where a given value is a change to the base: a
tolerance for one artifact kind, a drop for one output, a baseline by path
(resolved: its numbers).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from mpconvert.options.artifact_kinds import ARTIFACT_KINDS
from mpconvert.options.keywords import Keyword, check_ranges, keyword, table
from mpconvert.options.precision import Precision
from mpconvert.options.tolerance import Tolerance
from mpconvert.system.errors import MpconvertError

# One percentage point of accuracy: small enough to catch a real regression,
# large enough that 16-bit rounding on a few hundred samples does not trip it.
DEFAULT_MAX_DROP = 0.01

# Fine-tuning that trained on more than a tenth of the rows the gate then
# judges makes the accuracy check measure memory: the gate fails (below it,
# and without fine-tuning, the summary warns).
DEFAULT_MAX_OVERLAP = 0.1

# The gate's own defaults (the policy's parity_rtol is in precision.py).
# The agreement check guards against harm, not change. With labels, at least
# this share of the rows the float32 model got right must still be right
# (predictions it fixes are improvements, e.g. from fine-tuning, and count
# for nothing); without labels, this share of predictions (argmax, or the 0.5
# threshold for a sigmoid) must be unchanged. 16-bit rounding flips a few
# borderline predictions: on the sample models the lowest agreement seen was
# 0.984 (1 of 64 generated inputs, digits_mlp under bfloat16; 0.9956 and above
# on labelled data, where the harmed rows are at most those flips). 0.95
# leaves three times that, and still catches a conversion that breaks one
# right prediction in twenty.
DEFAULT_MIN_AGREEMENT = 0.95

# Any regression against a baseline fails by default. Runs are deterministic
# (same model, data, options and seed give the same numbers on the same
# machine), so an unchanged model passes; and a tolerance would let a metric
# slide a little on every commit, each step within budget, without limit.
DEFAULT_MAX_REGRESSION = 0.0

# Artifact parity: an artifact passes when
#     max |artifact - converted Keras model| <= atol + rtol * max |converted Keras model|
# over the same rows, so the limit scales with the outputs and the check can
# be redone from the two numbers stored per artifact. atol is only a floor
# for outputs near zero.
DEFAULT_ATOL = 1e-5


@dataclass(frozen=True)
class GateOptions:
    """Gate thresholds given on the command line or to the Python API.

    None (or no entry) keeps the base value: the policy's default for a
    conversion (max_drop: DEFAULT_MAX_DROP), the value stored in the report
    for `mpconvert check`. This is the one place a budget is given.
    """

    # (output name, largest drop); name None sets every output, later entries winning.
    max_drop: tuple[tuple[str | None, float], ...] = keyword(
        (),
        kind="per_output",
        minimum=0,
        gate=True,
        metavar="[OUTPUT=]X",
        default_text=str(DEFAULT_MAX_DROP),
        help="Largest allowed metric drop, in the metric's units (0.01 = 1 point of accuracy): X for every "
        "output, OUTPUT=X for one (repeatable).",
    )
    min_agreement: float | None = keyword(
        None,
        kind="float",
        minimum=0,
        maximum=1,
        gate=True,
        default_text=str(DEFAULT_MIN_AGREEMENT),
        help="Classifiers: with labels, the smallest share of the rows the float32 model got right that the "
        "converted model must still get right (fixed rows do not count against it); without labels, the "
        "smallest share of unchanged predictions.",
    )
    # (artifact kind, value) in the order given, later entries winning; kind
    # None applies to every kind.
    atol: tuple[tuple[str | None, float], ...] = keyword(
        (),
        kind="tolerances",
        gate=True,
        metavar="[KIND=]X",
        default_text=f"{DEFAULT_ATOL:g}",
        help="Absolute artifact parity tolerance: X sets every artifact kind, KIND=X one of "
        f"{', '.join(ARTIFACT_KINDS)} (repeatable).",
    )
    rtol: tuple[tuple[str | None, float], ...] = keyword(
        (),
        kind="tolerances",
        gate=True,
        metavar="[KIND=]X",
        default_text="by policy and kind, see docs/gate.md",
        help="Relative parity tolerance, times the largest |output|: an artifact passes when "
        "max |diff| <= atol + rtol * max |output|. [KIND=]X as for --atol.",
    )
    baseline: Path | None = keyword(
        None,
        kind="path",
        file=True,
        gate=True,
        default_text="none",
        help="An earlier run's report.json: fail when the converted metric is worse than its by more than "
        "--max-regression.",
    )
    max_regression: float | None = keyword(
        None,
        kind="float",
        minimum=0,
        gate=True,
        default_text=f"{DEFAULT_MAX_REGRESSION:g}",
        help="Largest allowed worsening against --baseline, in the metric's units.",
    )
    max_overlap: float | None = keyword(
        None,
        kind="float",
        minimum=0,
        maximum=1,
        gate=True,
        default_text=str(DEFAULT_MAX_OVERLAP),
        help="Largest share of the validation rows that may also be training rows when fine-tuning runs "
        "(exact copies, over every input).",
    )
    # Smallest accepted float32 time / converted time; None: not judged.
    min_speedup: float | None = keyword(
        None,
        kind="float",
        minimum=0,
        minimum_open=True,
        gate=True,
        metavar="X",
        default_text="off",
        help="Fail unless the converted model is at least X times as fast as float32 on the machine that "
        "measured it (report.json's speed: the savedmodel path, else keras).",
    )

    def __post_init__(self) -> None:
        check_ranges(self)
        for name in ("atol", "rtol"):
            for kind, value in getattr(self, name):
                check_tolerance(name, kind, value)


def check_tolerance(name: str, kind: str | None, value: Any) -> None:
    """Refuse a parity tolerance (atol, rtol) for an unknown artifact kind, or not a finite number >= 0.

    Finite: report.json holds the tolerances and JSON has no infinity, and
    an infinite one would only switch the parity check off.
    """
    if not (kind is None or kind in ARTIFACT_KINDS):
        raise MpconvertError(
            f"{name} names an unknown artifact kind {kind!r}",
            hint=f"give a {name} for one of {', '.join(ARTIFACT_KINDS)}, or one number for every kind",
        )
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value >= 0):
        raise MpconvertError(
            f"{name}={value!r} is invalid: it must be a finite number >= 0", hint=f"pass a {name} >= 0"
        )


@dataclass(frozen=True)
class Baseline:
    """The numbers of an earlier run that this one must not fall behind (`GateOptions.baseline`, read back)."""

    path: str
    metric: str
    converted: float
    policy: str
    model: str
    # Several outputs: {output name: {"metric", "converted"}} of each measured output.
    outputs: dict | None = None


@dataclass(frozen=True)
class Thresholds:
    """Everything the checks compare against; stored as report.json's gate.thresholds.

    A field for each of GateOptions' (by the same name), resolved, plus
    max_drop_by_output (GateOptions.max_drop's per-output entries).
    """

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
        """These thresholds with the ones given in `options`.

        `baseline` is `options.baseline` read back (report.read.load_baseline,
        which checks it measured what this run measures); None keeps this
        one's. A one-number threshold (a "float" keyword) given replaces
        this one's, so a new one needs no line here.
        """
        numbers = {
            f.name: getattr(options, f.name)
            for f in fields(options)
            if f.metadata["keyword"].kind == "float" and getattr(options, f.name) is not None
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
    found = dict(base)
    for kind, value in given:
        found.update({kind: value} if kind else dict.fromkeys(found, value))
    return found


# What `mpconvert check` and `api.gate_options` take.
GATE_KEYWORDS: dict[str, Keyword] = table(GateOptions)
