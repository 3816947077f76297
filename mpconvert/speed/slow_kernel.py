"""A conversion that guards itself against broken 16-bit kernels.

On an Intel Xeon with AMX and avx512_fp16, TensorFlow 2.21's oneDNN graph
rewrites fuse MatMul+BiasAdd(+Relu), and the float16 fused kernel took 34 s
for a 64x4096 @ 4096x4096 call the bare matmul did in 5 ms: a mixed_float16
conversion of a Dense(4096)x2 model spent 11 minutes in it (the
mixed_bfloat16 one took 15 s). With TF_ENABLE_ONEDNN_OPTS=0 the same graph
took 40 ms. The variable is read when TensorFlow is imported, so it cannot
be changed in a running process.

So right after the rewrite, one batch of the 16-bit model is timed against
float32 through its traced call (`probe`). Past SLOWER times float32's,
a process that may restart itself (the command line, a batch worker) raises
`Restart`; the caller, once every staging folder and lock is released,
executes itself again with oneDNN's rewrites off and the finding in
MPCONVERT_SLOW_KERNEL, and that run records both figures: what a serving
stack with default settings sees, and what it sees with the fix. The
arithmetic stays the policy's real 16-bit arithmetic either way (oneDNN off
runs Eigen's float16 kernels). The Python API cannot restart TensorFlow:
there the finding and the fix are recorded, and the run goes on.
"""

from __future__ import annotations

import json
import os
import time

from ..runners.base import Runner
from ..sections import KernelProbe, SlowKernel
from ..sections.speed import slower_of

# A 16-bit model this many times slower than float32 on one batch has hit a
# broken kernel: no missing speed-up costs more than 2-3x.
SLOWER = 20.0
# Tests (and a user who wants to see the path) can lower it; a restarted
# run reads its finding from FOUND_ENV.
THRESHOLD_ENV = "MPCONVERT_SLOW_KERNEL_RATIO"
FOUND_ENV = "MPCONVERT_SLOW_KERNEL"
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
PROBE_ROWS = 64
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


def probe(original: Runner, converted: Runner, inputs: list) -> KernelProbe:
    """One batch through each model's traced call (after the trace): ms each, and how much slower."""
    rows = [x[:PROBE_ROWS] for x in inputs]
    timed = {}
    for name, runner in (("float32", original), ("converted", converted)):
        run = runner.timer(rows)
        run()  # traces
        start = time.perf_counter()
        run()
        timed[name] = (time.perf_counter() - start) * 1000
    float32_ms, converted_ms = round(timed["float32"], 3), round(timed["converted"], 3)
    # The ratio of the rounded figures, the ones the report stores, so that a re-check derives the same.
    return KernelProbe(
        rows=len(inputs[0][:PROBE_ROWS]),
        float32_ms=float32_ms,
        converted_ms=converted_ms,
        slower=slower_of(float32_ms, converted_ms),
    )


def _onednn_on() -> bool:
    return os.environ.get(ONEDNN_ENV, "1") not in ("0", "false", "False")


def guard(policy: str, original: Runner, converted: Runner, inputs: list, may_restart: bool) -> SlowKernel | None:
    """None when the 16-bit model runs normally here; else what was found and done (a report section).

    `original` and `converted` run the float32 and the 16-bit model (their
    kind's first speed path: the traced Keras call, or a graph's serving function).

    Raises Restart when the caller may restart and the fix has not been tried.
    """
    inherited = os.environ.get(FOUND_ENV)
    if inherited:  # the restarted run: the default-settings figures came with it
        try:
            found: KernelProbe | None = KernelProbe.from_json(json.loads(inherited)["found"])
        except (ValueError, KeyError, TypeError, AttributeError):
            found = None
        if found is not None:
            fixed = probe(original, converted, inputs)
            helped = fixed.slower is not None and found.slower is not None and fixed.slower < found.slower
            advice = (
                f"set {ONEDNN_ENV}=0 where this model serves on such a CPU"
                if helped
                else "the fix did not help: try the other policy (`mpconvert doctor MODEL` times both)"
            )
            summary = (
                f"{policy} took {found.slower:g}x float32's time with TensorFlow's default settings "
                f"(one batch of {found.rows} rows: {found.converted_ms:.1f} ms against "
                f"{found.float32_ms:.1f} ms); the conversion re-ran with {FIX}, where it takes "
                f"{fixed.slower:g}x float32's time: {advice}"
            )
            return SlowKernel(found, f"restarted with {FIX}", fixed, summary)
    found = probe(original, converted, inputs)
    if found.slower is None or found.slower < threshold():
        return None
    words = (
        f"{policy} takes {found.slower:g}x float32's time here (one batch of {found.rows} rows: "
        f"{found.converted_ms:.1f} ms against {found.float32_ms:.1f} ms): a broken kernel"
    )
    if may_restart and _onednn_on():
        raise Restart({"found": found.to_json(), "summary": words})
    if not _onednn_on():
        done = f"nothing: {ONEDNN_ENV}=0 is already set"
    else:
        done = f"nothing: a Python process cannot restart TensorFlow; set {FIX} before importing it"
    return SlowKernel(found, done, None, f"{words}; {done}")
