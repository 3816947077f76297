"""Keras layers timed as models run them: traced in tf.function, under float32 and each policy.

A bare eager `tf.matmul` misleads: in graph mode TensorFlow's oneDNN
rewrites fuse MatMul+BiasAdd(+Relu), and on an Intel Xeon with AMX and
avx512_fp16 the float16 fused kernel took 64 ms for a Dense(256) where
float32 took 0.96 ms, while the bare matmul was 3x faster than float32. So
the doctor times the layers models are made of (Dense with bias and
activation, Conv2D+BatchNormalization+ReLU, an LSTM, a multi-head attention
block), each built under the policy and called through tf.function, and
flags a kernel far slower than float32 (`PATHOLOGICAL`). For such a finding
`with_onednn_off` times the same layer in a child process with oneDNN's
rewrites off (TF_ENABLE_ONEDNN_OPTS=0 must be set before TensorFlow is
imported), so the fix comes with its figure.

`python -m mpconvert.speed.layers [CASE ...]` prints the timings as JSON
(what the child process runs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from typing import Any

from mpconvert.report.doctor import Bench, Pathology, Timed
from mpconvert.runners.keras import KerasRunner
from mpconvert.speed.slow_kernel import SLOWER
from mpconvert.speed.timing import figures, median_ms
from mpconvert.system.errors import first_line

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
# A 16-bit layer this many times slower than float32 is a broken kernel, not
# a missing speed-up: the line the conversion's guard draws (slow_kernel.SLOWER,
# 8x), so that the doctor and a conversion call the same kernel broken.
PATHOLOGICAL = SLOWER
# A first call this many times float32's is not repeated for a median: a
# broken kernel can take seconds a call, and one call already tells.
TIMED_ONCE = 4 * PATHOLOGICAL
REPEATS = 5
BUDGET_S = 0.6  # per layer: every policy's runs together
CHILD_TIMEOUT_S = 120


def _dense(K):
    return K.Input((1024,)), lambda x, dtype: K.layers.Dense(1024, activation="relu", dtype=dtype)(x), 256


def _conv(K):
    def block(x, dtype):
        x = K.layers.Conv2D(64, 3, padding="same", use_bias=False, dtype=dtype)(x)
        x = K.layers.BatchNormalization(dtype=dtype)(x)
        return K.layers.ReLU(dtype=dtype)(x)

    return K.Input((32, 32, 64)), block, 16


def _lstm(K):
    return K.Input((32, 128)), lambda x, dtype: K.layers.LSTM(128, dtype=dtype)(x), 64


def _attention(K):
    def block(x, dtype):
        attended = K.layers.MultiHeadAttention(num_heads=4, key_dim=32, dtype=dtype)(x, x)
        return K.layers.LayerNormalization(dtype=dtype)(K.layers.Add(dtype=dtype)([x, attended]))

    return K.Input((64, 128)), block, 32


# name -> (what it is, in words; builder(K) -> (input, layer stack, batch))
CASES = {
    "dense": ("Dense(1024, relu) on 1024 features, batch 256", _dense),
    "conv": ("Conv2D(64, 3x3)+BatchNormalization+ReLU on 32x32x64, batch 16", _conv),
    "lstm": ("LSTM(128) over 32 steps of 128, batch 64", _lstm),
    "attention": ("MultiHeadAttention(4 heads, key 32)+Add+LayerNormalization on 64x128, batch 32", _attention),
}


def _runner(case: str, policy: str) -> tuple[Any, Any]:
    """A traced call of the case's layers under `policy`, and its input batch."""
    import keras
    import tensorflow as tf

    keras.utils.set_random_seed(0)
    inputs, stack, batch = CASES[case][1](keras)
    model = keras.Model(inputs, stack(inputs, keras.DTypePolicy(policy)))
    shape = (batch, *inputs.shape[1:])
    x = tf.random.stateless_normal(shape, seed=(0, 1))
    return KerasRunner(model).timer([x]), x


def bench_layers(
    cases: tuple[str, ...] | None = None, repeats: int = REPEATS, budget_s: float = BUDGET_S
) -> dict[str, Bench]:
    """Each case's timing under each policy (ms, speed-up over float32, or why not), each policy timed in turn.

    A policy whose first timed call is already TIMED_ONCE times float32's is
    timed once, not repeatedly: a broken kernel can take seconds a call.
    """
    result = {}
    for case in cases or tuple(CASES):
        runs, failed, single = {}, {}, {}
        for policy in POLICIES:
            try:
                run, _ = _runner(case, policy)
                run()  # traces
            except Exception as exc:  # a dtype this device has no kernel for
                failed[policy] = f"not supported: {first_line(exc, 200)}"
                continue
            runs[policy] = run
        probe = {}
        for policy, run in runs.items():
            start = time.perf_counter()
            run()
            probe[policy] = (time.perf_counter() - start) * 1000
        base = probe.get("float32")
        for policy in list(runs):
            if base and policy != "float32" and probe[policy] > TIMED_ONCE * base:
                single[policy] = probe[policy]  # far too slow to repeat
                del runs[policy]
        ms = {**median_ms(runs, repeats=repeats, budget_s=budget_s, warmup=0), **single}
        timed = figures(ms, POLICIES)
        each = {policy: Timed(timed[policy]["ms"], timed[policy]["speedup"], failed.get(policy)) for policy in POLICIES}
        result[case] = Bench(CASES[case][0], each)
    return result


def pathologies(layers: Mapping[str, Bench]) -> list[Pathology]:
    """The (layer, policy) pairs PATHOLOGICAL times slower than float32, slowest first."""
    found = []
    for case, entry in layers.items():
        for policy in POLICIES[1:]:
            speedup = entry.timings[policy].speedup
            if speedup is not None and speedup < 1 / PATHOLOGICAL:
                found.append(Pathology(case, policy, round(1 / speedup, 1), entry.label))
    return sorted(found, key=lambda f: -f.slower)


def with_onednn_off(cases: tuple[str, ...]) -> dict[str, Bench] | None:
    """The same layers timed in a child process with oneDNN's graph rewrites off; None when it could not run."""
    env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "3"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mpconvert.speed.layers", *cases],
            capture_output=True,
            text=True,
            timeout=CHILD_TIMEOUT_S,
            env=env,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    try:
        found = json.loads(done.stdout.strip().splitlines()[-1])
        return {case: Bench.from_json(entry) for case, entry in found.items()}
    except (ValueError, IndexError, AttributeError):
        return None


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    chosen = tuple(sys.argv[1:]) or tuple(CASES)
    print(json.dumps({case: bench.to_json() for case, bench in bench_layers(chosen).items()}))
