"""`mpconvert doctor MODEL`: the user's own model timed here under float32 and each policy.

Layer benchmarks say what a machine does with typical layers; a model is
its own mix. The model is rewritten to each policy (the same rewrite a
conversion does, proven faithful in float32), and each version is timed
through the SavedModel serving function (traced in memory, as the export
traces it) on generated rows at a serving batch. Time-boxed: the traces
and first calls come first, and when they already take the budget the
figures are single calls and the result says it was cut short.
"""

from __future__ import annotations

import time
from typing import Any

from ..options import DEFAULT_SPEED_BATCH, PARITY_SAMPLES, LoadOptions, RewriteOptions
from .hardware import probe_hardware
from .timing import median_ms, path_runner

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
# keras.applications-sized models trace and run a batch of 256 in seconds
# on 2 cores; a minute leaves room for three of them, each timed a few times.
DEFAULT_BUDGET_S = 60.0
# A policy pays for this model when it serves at least this much faster.
PAYS = 1.1


def time_model(load: LoadOptions, batch: int = DEFAULT_SPEED_BATCH, budget_s: float = DEFAULT_BUDGET_S) -> dict:
    """{model, batch, device, policies: {policy: {ms, speedup, note}}, recommendation, cut_short, seconds}."""
    import tensorflow as tf

    from ..load import load_model
    from ..rewrite import rewrite
    from ..signature import generate_inputs, signature_of

    started = time.perf_counter()
    loaded = load_model(load)
    model, framework = loaded.model, loaded.framework
    signature = signature_of(model)
    rows = generate_inputs(model, signature, batch, seed=0)
    feeds = [tf.constant(x) for x in rows]
    builds: dict[str, Any] = {"float32": model}
    notes: dict[str, str] = {}
    clock = time.perf_counter()  # the budget counts from here: loading is not the doctor's to cut
    with framework.preserved_global_policy(), loaded.deserialization():
        for policy in POLICIES[1:]:
            builds[policy] = rewrite(model, framework, RewriteOptions(policy), [x[:PARITY_SAMPLES] for x in rows]).model
    runs, first = {}, {}
    cut_short = None
    for policy, built in builds.items():
        if policy != "float32" and time.perf_counter() - clock > budget_s:  # float32 is the baseline: always timed
            cut_short = cut_short or f"the {budget_s:g} s budget ran out before {policy} was timed"
            notes[policy] = "not timed: the budget ran out"
            continue
        run = path_runner("savedmodel", built, signature, feeds)
        run()  # traces
        start = time.perf_counter()
        run()
        first[policy] = (time.perf_counter() - start) * 1000
        runs[policy] = run
    left = budget_s - (time.perf_counter() - clock)
    if left > 3 * sum(first.values()) / 1000:
        ms = median_ms(runs, repeats=5, budget_s=left, warmup=0)
    else:
        ms = first
        cut_short = cut_short or f"the {budget_s:g} s budget allowed one timed call per policy"
    base = ms.get("float32")
    timed = {
        policy: {
            "ms": round(ms[policy], 3) if policy in ms else None,
            "speedup": round(base / ms[policy], 3) if policy in ms and base else None,
            "note": notes.get(policy),
        }
        for policy in POLICIES
    }
    paying = [p for p in POLICIES[1:] if (timed[p]["speedup"] or 0) >= PAYS]
    best = max(paying, key=lambda p: timed[p]["speedup"]) if paying else None
    device = probe_hardware().device
    if best:
        advice = f"{best}: this model serves {timed[best]['speedup']:.2f}x as fast as float32 here ({device})"
    else:
        figures = ", ".join(f"{p} {timed[p]['speedup']:.2f}x" for p in POLICIES[1:] if timed[p]["speedup"] is not None)
        advice = (
            f"keep float32 here: neither policy serves this model at least {PAYS:g}x as fast as float32 "
            f"({figures or 'not timed'}; {device}); convert for the hardware it will serve on"
        )
    return {
        "model": str(load.path) if load.path else str(getattr(model, "name", "model")),
        "batch": batch,
        "device": device,
        "policies": timed,
        "recommendation": advice,
        "recommended_policy": best,
        "cut_short": cut_short,
        "seconds": round(time.perf_counter() - started, 2),
    }
