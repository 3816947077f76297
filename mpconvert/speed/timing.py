"""The timer every speed figure comes from: callables taking turns, the median of their wall times."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence

SPEED_PATHS = ("keras", "savedmodel")
# Timing per path: both models take turns, median of up to REPEATS runs
# after one warm-up call (the trace; later calls of a traced function took
# the same time here), fewer when a run is slow (at least 3), to spend about
# BUDGET_S. Dense(4096)x2 at batch 256 took 240-700 ms a run on the 2 shared
# cores here, so it gets 3-6 runs; a small MLP gets all 10 in milliseconds.
REPEATS = 10
BUDGET_S = 3.0


def timed_ms(
    runs: Mapping[str, Callable[[], object]],
    *,
    repeats: int = REPEATS,
    budget_s: float | None = None,
    warmup: int = 2,
    min_rounds: int = 3,
) -> dict[str, list[float]]:
    """Every timed call's wall time of each callable, in milliseconds, in the order they ran.

    The callables take turns (a b a b ...), so load from other processes on
    a shared machine falls on all of them alike. After the warm-ups (tracing,
    allocation) one round is timed; with `budget_s`, the remaining rounds
    are cut to what fits in it, but at least `min_rounds` are run. Each callable must
    return only when its work is done (fetch a result to the host). The one
    timer of every speed figure: the medians, the percentiles, `verify`.
    """
    for run in runs.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    rounds = repeats
    done = 0
    while done < rounds:
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append((time.perf_counter() - start) * 1000)
        done += 1
        if done == 1 and budget_s is not None:
            one_round = sum(t[0] for t in times.values()) / 1000
            rounds = max(min_rounds, min(repeats, int(budget_s / max(one_round, 1e-9))))
    return times


def timed_calls(
    call: Callable[[], object], *, repeats: int, budget_s: float | None, warmup: int, min_rounds: int
) -> list[float]:
    """One callable's timed calls in milliseconds (`timed_ms` of it alone): what `verify` sends to the child
    process that runs an ONNX file, bound with functools.partial, to time the file there."""
    return timed_ms({"call": call}, repeats=repeats, budget_s=budget_s, warmup=warmup, min_rounds=min_rounds)["call"]


def median_ms(
    runs: Mapping[str, Callable[[], object]], *, repeats: int = REPEATS, budget_s: float | None = None, warmup: int = 2
) -> dict[str, float]:
    """The median wall time of each callable, in milliseconds (`timed_ms`'s calls)."""
    samples = timed_ms(runs, repeats=repeats, budget_s=budget_s, warmup=warmup)
    return {name: statistics.median(t) for name, t in samples.items()}


def figures(ms: Mapping[str, float], names: Sequence[str], base: str = "float32") -> dict[str, dict]:
    """{name: {"ms", "speedup"}} for every name: the rounded median, and `base`'s rounded one over it.

    The ratio is taken of the rounded figures, so each speed-up is exactly
    the ratio of the numbers beside it: at 0.4 ms, rounding the times after
    taking the ratio moved it 0.2%. None where a name was not timed.
    """
    shown = {name: rounded_ms(value) for name, value in ms.items()}
    reference = shown.get(base)
    return {
        name: {
            "ms": shown.get(name),
            "speedup": round(reference / shown[name], 4) if shown.get(name) and reference else None,
        }
        for name in names
    }


def rounded_ms(value: float) -> float:
    # Rounded once, before the ratio is taken, so that the report's ratio is
    # exactly its float32_ms / converted_ms.
    return round(value, 3)
