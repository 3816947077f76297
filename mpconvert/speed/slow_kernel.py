"""A conversion that guards itself against broken 16-bit kernels.

On an Intel Xeon with AMX and avx512_fp16, TensorFlow 2.21's oneDNN graph
rewrites fuse MatMul+BiasAdd(+Relu), and the float16 fused kernel took 34 s
for a 64x4096 @ 4096x4096 call the bare matmul did in 5 ms: a mixed_float16
conversion of a Dense(4096)x2 model spent 11 minutes in it (the
mixed_bfloat16 one took 15 s). With TF_ENABLE_ONEDNN_OPTS=0 the same graph
took 40 ms. The variable is read when TensorFlow is imported, so it cannot
be changed in a running process.

Two checks, both against SLOWER:

- Before the model is loaded, `kernel_probe` times one fused Dense(256) in
  a child process (cached per machine and TensorFlow build). When the
  policy's kernel is broken, a process that may restart itself (the command
  line, a batch worker) raises `Restart` straight after the load (`early`),
  before a second goes into the broken kernel on the user's model: the
  mixed_float16 run of that Dense(4096)x2 model took 945 s with no guard, 65 s
  with a guard that found it on the model, and should cost little more than
  the mixed_bfloat16 run (16 s) with the probe.
- Right after the rewrite, one batch at the speed stage's serving batch is
  timed through each model's traced call (`probe`): the digits demo's
  mixed_float16 model took 33x float32's time at batch 256 there, and a
  probe of 64 rows against a 20x threshold missed it.

The caller, once every staging folder and lock is released, executes itself
again with oneDNN's rewrites off and the finding in MPCONVERT_SLOW_KERNEL,
and that run records both figures: what a serving stack with default
settings sees, and what it sees with the fix. The arithmetic stays the
policy's real 16-bit arithmetic either way (oneDNN off runs Eigen's float16
kernels). The Python API cannot restart TensorFlow: there the finding and
the fix are recorded, and the run goes on.
"""

from __future__ import annotations

import json
import os

import numpy as np

from mpconvert.report.sections import KernelProbe, SlowKernel
from mpconvert.report.sections.speed import slower_of
from mpconvert.runners.base import Runner
from mpconvert.speed.kernel_probe import WHAT, Probed
from mpconvert.speed.measure import serving_rows
from mpconvert.speed.timing import timed_ms

# A 16-bit model this many times slower than float32 on one batch has hit a
# broken kernel. A missing speed-up costs at most about 2x: 16-bit matmuls on
# a 2-core AMD EPYC with AVX2 only took twice float32's time, and the probe's
# healthy policies read 1.1-1.3x. The broken kernel on the AMX Xeon read 122x
# on the probe's Dense(256) and 33x on the digits demo at batch 256; 8x sits
# four times above the worst healthy figure and four times below the
# smallest broken one.
SLOWER = 8.0
# Tests (and a user who wants to see the path) can lower it; a restarted
# run reads its finding from FOUND_ENV.
THRESHOLD_ENV = "MPCONVERT_SLOW_KERNEL_RATIO"
FOUND_ENV = "MPCONVERT_SLOW_KERNEL"
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
CALLS, CALLS_BUDGET_S = 3, 1.0  # the model's check: calls per side, and when to stop repeating
FIX = f"{ONEDNN_ENV}=0 (oneDNN's graph rewrites off)"


class Restart(BaseException):
    """Raised to run the conversion again with oneDNN's rewrites off; not an error.

    A BaseException, like KeyboardInterrupt, so that no `except Exception`
    on the way swallows it and every staging folder and lock unwinds.
    """

    def __init__(self, finding: dict):
        super().__init__(finding["summary"])
        self.finding = finding  # JSON: the restarted process reads it back from its environment

    def environment(self) -> dict[str, str]:
        return {**os.environ, ONEDNN_ENV: "0", FOUND_ENV: json.dumps(self.finding)}


def threshold() -> float:
    try:
        return float(os.environ.get(THRESHOLD_ENV, SLOWER))
    except ValueError:
        return SLOWER


def probe(original: Runner, converted: Runner, inputs: list, batch: int) -> KernelProbe:
    """One batch of `batch` rows through each model's traced call (after the trace): ms each, how much slower."""
    rows = serving_rows([np.asarray(x) for x in inputs], batch)
    timed = {}
    for name, runner in (("float32", original), ("converted", converted)):
        # The fastest of up to CALLS calls after the trace, fewer past CALLS_BUDGET_S: on a shared machine one
        # call of a sub-millisecond model can be preempted to 10x its time, and a normal mixed_bfloat16 run
        # once read past 8x on a single call; a broken kernel is slow on every call, so one may be enough.
        calls = timed_ms({name: runner.timer(rows)}, repeats=CALLS, budget_s=CALLS_BUDGET_S, warmup=1, min_rounds=1)
        timed[name] = min(calls[name])
    float32_ms, converted_ms = round(timed["float32"], 3), round(timed["converted"], 3)
    # The ratio of the rounded figures, the ones the report stores, so that a re-check derives the same.
    return KernelProbe(
        rows=len(rows[0]),
        float32_ms=float32_ms,
        converted_ms=converted_ms,
        slower=slower_of(float32_ms, converted_ms),
        what=f"the model, one batch of {len(rows[0])} rows",
    )


def _found_words(policy: str, found: KernelProbe, cached: bool | None) -> str:
    if found.what and found.what.startswith("one fused Dense"):
        where = f"{found.what}{' (cached for this machine)' if cached else ''}"
    else:
        where = f"one batch of {found.rows} rows"
    return f"{where}: {found.converted_ms:.1f} ms against {found.float32_ms:.1f} ms"


def early(policy: str, probed: Probed | None, may_restart: bool) -> SlowKernel | None:
    """The kernel probe's answer, acted on before the model's first call.

    None when the policy's kernel is sound here (or the probe could not
    tell). Raises Restart when the caller may restart and oneDNN's rewrites
    are on; otherwise returns what was found and that nothing could be done.
    """
    if probed is None or not probed.is_slow(threshold()) or not _onednn_on() or os.environ.get(FOUND_ENV):
        return None
    if probed.float32_ms is None or probed.converted_ms is None:  # the child ran past its time
        found = KernelProbe(rows=0, float32_ms=0.0, converted_ms=0.0, slower=None, what=f"{WHAT}: {probed.note}")
        words = f"{policy}'s kernel probe ({WHAT}) {probed.note}: a broken kernel"
    else:
        f32, c = round(probed.float32_ms, 3), round(probed.converted_ms, 3)
        found = KernelProbe(rows=64, float32_ms=f32, converted_ms=c, slower=slower_of(f32, c), what=WHAT)
        words = f"{policy} takes {found.slower:g}x float32's time here ({_found_words(policy, found, probed.cached)}): a broken kernel"
    if may_restart:
        raise Restart({"found": found.to_json(), "summary": words, "cached": probed.cached})
    done = f"nothing: a Python process cannot restart TensorFlow; set {FIX} before importing it"
    return SlowKernel(found, done, None, f"{words}; {done}", probed.cached)


def kernel_probe_wanted(policy: str) -> bool:
    """Whether a conversion to `policy` should probe the kernel first: a 16-bit policy, default oneDNN, no finding yet."""
    return policy != "float32" and _onednn_on() and not os.environ.get(FOUND_ENV)


def _onednn_on() -> bool:
    return os.environ.get(ONEDNN_ENV, "1") not in ("0", "false", "False")


def guard(
    policy: str, original: Runner, converted: Runner, inputs: list, batch: int, may_restart: bool
) -> SlowKernel | None:
    """None when the 16-bit model runs normally here; else what was found and done (a report section).

    `original` and `converted` run the float32 and the 16-bit model (their
    kind's first speed path: the traced Keras call, or a graph's serving function).

    One batch of `batch` rows (the speed stage's serving batch) is timed.
    Raises Restart when the caller may restart and the fix has not been tried.
    """
    inherited = os.environ.get(FOUND_ENV)
    if inherited:  # the restarted run: the default-settings figures came with it
        try:
            stored = json.loads(inherited)
            found: KernelProbe | None = KernelProbe.from_json(stored["found"])
            cached = stored.get("cached")
        except (ValueError, KeyError, TypeError, AttributeError):
            found = None
        if found is not None:
            fixed = probe(original, converted, inputs, batch)
            helped = fixed.slower is not None and (
                fixed.slower < threshold() or (found.slower is not None and fixed.slower < found.slower)
            )
            advice = (
                f"set {ONEDNN_ENV}=0 where this model serves on such a CPU"
                if helped
                else "the fix did not help: try the other policy (`mpconvert doctor MODEL` times both)"
            )
            took = f"{found.slower:g}x" if found.slower is not None else "far more than"
            summary = (
                f"{policy} took {took} float32's time with TensorFlow's default settings "
                f"({_found_words(policy, found, cached) if found.slower is not None else found.what}); "
                f"the conversion re-ran with {FIX}, where the model takes "
                f"{fixed.slower:g}x float32's time (one batch of {fixed.rows} rows): {advice}"
            )
            return SlowKernel(found, f"restarted with {FIX}", fixed, summary, cached)
    found = probe(original, converted, inputs, batch)
    if found.slower is None or found.slower < threshold():
        return None
    words = (
        f"{policy} takes {found.slower:g}x float32's time here ({_found_words(policy, found, None)}): a broken kernel"
    )
    if may_restart and _onednn_on():
        raise Restart({"found": found.to_json(), "summary": words})
    if not _onednn_on():
        done = f"nothing: {ONEDNN_ENV}=0 is already set"
    else:
        done = f"nothing: a Python process cannot restart TensorFlow; set {FIX} before importing it"
    return SlowKernel(found, done, None, f"{words}; {done}")
