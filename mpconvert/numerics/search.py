"""Accuracy-driven search: the fewest units (layers, nodes) to keep float32 so the gate's budget holds.

The kind-free engine: each kind ranks its own units (keras/search.py, graph/search.py) and says how to
predict with a set of them kept float32; the grow-and-prune below is the same for both.

Measured on the task's own metric and data, at the Keras layer level, where
node-level bisection against output closeness is slow (onnxconverter-common:
52 attempts in 16 minutes in onnxmltools PR 543; attempt 671 in its issue
229).

1. Rank (one pass, no conversion): every convertible layer alone in 16 bits,
   fed the float32 model's own inputs for it, against its float32 output.
   The error is measured against how much the output varies across rows, so
   a layer that erases small differences on a large value ranks high even
   though its relative error is tiny.
2. Grow: keep the top k most sensitive layers float32, k found by binary
   search (about log2(L) trials), up to MAX_SEARCH_SHARE of the layers.
3. Prune: try each kept layer in 16 bits again, least sensitive first, and
   drop the ones that are not needed (L_kept trials). Layers that matter only
   together (one carries a large value, the next subtracts it) survive this,
   because each is tried with the other still kept.

Trials rebuild the model from its config with a set of layers in 16 bits and
predict the validation rows in memory: no disk, no fine-tune.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from mpconvert.data.context import Context
from mpconvert.options.gate import Thresholds
from mpconvert.options.rewrite import MAX_SEARCH_SHARE
from mpconvert.report.gate import validation_checks
from mpconvert.report.measure import judge
from mpconvert.report.sections import Ranked, SearchOutcome, SearchReport, Trial, Validation

Verdict = Callable[[Validation], bool]  # a trial's validation -> passes the gate's checks


@dataclass(frozen=True)
class Goal:
    """What a search must reach, and what it starts from, for layers and nodes alike."""

    verdict: Verdict  # a trial passes the gate's metric, agreement and drift checks
    budget: float  # seconds the search may take, ranking included
    reference: list[np.ndarray]  # the float32 model's outputs on the validation rows
    before: Validation  # the validation that failed: what a kept unit's reason compares with


@dataclass
class Search:
    """A search as it runs; `section()` is what the report keeps of it."""

    kept: list[str] = field(default_factory=list)  # plan names kept float32 (linear names for split heads)
    trials: list[Trial] = field(default_factory=list)
    ranking: list[tuple[str, float]] = field(default_factory=list)
    seconds: float = 0.0
    outcome: SearchOutcome | None = None  # None until it ends
    validation: Validation | None = None  # of the final set

    def section(self) -> SearchReport:
        assert self.outcome is not None, "a search is reported once it has ended"
        return SearchReport(
            outcome=self.outcome,
            trials=len(self.trials),
            seconds=round(self.seconds, 3),
            kept=tuple(self.kept),
            ranking=tuple(Ranked(n, None if not math.isfinite(s) else round(s, 6)) for n, s in self.ranking[:10]),
            drop=tuple(self.trials),
        )


def sensitivity(out32: np.ndarray, out16: np.ndarray) -> float:
    """rms error of the 16-bit output / rms spread of the float32 one across rows; inf when not finite."""
    if not np.isfinite(out16).all():
        return math.inf
    out32, out16 = np.asarray(out32, np.float64), np.asarray(out16, np.float64)
    error = float(np.sqrt(np.mean((out16 - out32) ** 2)))
    spread = float(np.sqrt(np.mean(out32.reshape(len(out32), -1).std(axis=0) ** 2))) if out32.ndim else 0.0
    return error / (spread + 1e-12)


def smallest_set(
    order: list[str], trial: Callable[[list[str]], bool], out_of_time: Callable[[], bool]
) -> tuple[list[str] | None, SearchOutcome]:
    """(the fewest of `order` to keep so that `trial` passes, the outcome): steps 2 and 3 above.

    `order` is most sensitive first; None when even MAX_SEARCH_SHARE of
    them kept does not pass (SHARE); BUDGET when time ran out with a
    passing set that may not be the smallest.
    """
    largest = max(1, int(len(order) * MAX_SEARCH_SHARE))
    if not trial(order[:largest]):
        return None, SearchOutcome.SHARE
    lo, hi = 0, largest  # keeping order[:hi] passes; order[:lo] does not (lo=0: the failing start)
    while hi - lo > 1 and not out_of_time():
        mid = (lo + hi) // 2
        if trial(order[:mid]):
            hi = mid
        else:
            lo = mid
    kept = order[:hi]
    for name in reversed(order[:hi]):
        if out_of_time():
            break
        fewer = [k for k in kept if k != name]
        if fewer and trial(fewer):
            kept = fewer
    return kept, SearchOutcome.BUDGET if out_of_time() else SearchOutcome.PASSED


def search_ranked(
    context: Context,
    ranking: list[tuple[str, float]],
    predict_keeping: Callable[[list[str]], list[np.ndarray]],
    goal: Goal,
    started: float,
) -> Search:
    """The search over any ranked units (Keras layers, graph nodes).

    `predict_keeping(kept)` is the validation rows' outputs of the model
    with `kept` float32 and every other unit in 16 bits; `started` is when
    the search began (the ranking counts against the budget).
    """
    result = Search(ranking=ranking)
    tried: dict[frozenset, Validation | None] = {}  # each set tried: its validation where it passed

    def trial(kept: list[str]) -> bool:
        if frozenset(kept) in tried:  # the grow and prune steps can meet the same set
            return tried[frozenset(kept)] is not None
        v = judge(context, goal.reference, predict_keeping(kept))
        passed = goal.verdict(v)
        tried[frozenset(kept)] = v if passed else None
        result.trials.append(Trial(tuple(sorted(kept)), v.drop, v.agreement, passed))
        return passed

    order = [name for name, _ in ranking]
    kept, result.outcome = smallest_set(order, trial, lambda: time.perf_counter() - started > goal.budget)
    if kept is not None:
        result.kept = kept
        result.validation = tried.get(frozenset(kept))
    result.seconds = time.perf_counter() - started
    return result


def search_reason(before: Validation, after: Validation) -> str:
    """Why the search kept a layer or node: what it fixed, with the numbers."""
    if before.nonfinite_outputs:  # on any output: the search fixed that first
        return f"accuracy-driven search: {before.nonfinite_outputs} NaN/inf outputs -> {after.nonfinite_outputs}"
    if before.drop is not None and after.drop is not None:
        return f"accuracy-driven search: drop {before.drop:.3f} -> {after.drop:.3f}"
    return f"accuracy-driven search: agreement {before.agreement or 0:.3f} -> {after.agreement or 0:.3f}"


def passes(validation: Validation, thresholds: Thresholds) -> bool:
    """The gate's metric, agreement and drift checks, on every output: the ones the search can fix."""
    return all(check.passed for check in validation_checks(validation, thresholds))
