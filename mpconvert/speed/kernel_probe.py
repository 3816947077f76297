"""Is this machine's 16-bit Dense kernel broken? Asked once per machine and TensorFlow build, in a child process.

On an Intel Xeon with AMX and avx512_fp16, TensorFlow 2.21's oneDNN graph
rewrites fuse MatMul+BiasAdd(+Relu) and the float16 fused kernel is
pathological: one batch of 64 rows through a mixed_float16 Dense(4096)x2
model took 21 s (1336x float32), one of 256 rows 77 s. Finding that out on
the user's model costs more than the whole conversion should. One fused
Dense(256, relu) on 256 features, batch 64, in tf.function, tells the same
in well under a second of compute: there mixed_float16 took 64 ms against
0.96 ms for float32, mixed_bfloat16 0.86 ms.

So the conversion starts this probe in a child process (a fresh
TensorFlow, the one setting TF_ENABLE_ONEDNN_OPTS can only be read at
import) beside model loading, and reads its answer after the load
(`start` / `Pending.result`). The answer is cached under
MPCONVERT_CACHE_DIR (else $XDG_CACHE_HOME/mpconvert, else
~/.cache/mpconvert), keyed by the CPU's model name and flags, the
TensorFlow build and the oneDNN setting: the next run on that machine pays
nothing. A child that does not finish in CHILD_TIMEOUT_S counts as slow
(a sound kernel answers in a second or two after the import).

`python -m mpconvert.speed.kernel_probe POLICY ...` is the child: it prints
{policy: {"float32_ms", "converted_ms", "slower"}} as JSON.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from mpconvert.speed.hardware import read_cpu

CACHE_ENV = "MPCONVERT_CACHE_DIR"
ONEDNN_ENV = "TF_ENABLE_ONEDNN_OPTS"
UNITS, ROWS = 256, 64
WHAT = f"one fused Dense({UNITS}, relu) on {UNITS} features, batch {ROWS}, in tf.function"
CHILD_TIMEOUT_S = 60.0
REPEATS = 5


def onednn_on(environ: dict | None = None) -> bool:
    return (environ if environ is not None else os.environ).get(ONEDNN_ENV, "1") not in ("0", "false", "False")


@dataclass(frozen=True)
class Probed:
    """A policy's kernel against float32's on the probe's one Dense, and whether the figure came from the cache."""

    policy: str
    float32_ms: float | None
    converted_ms: float | None
    slower: float | None  # converted / float32; None when the child failed
    cached: bool
    note: str | None = None  # why there is no figure, or that the child ran past its time

    def is_slow(self, threshold: float) -> bool:
        return self.slower is not None and self.slower >= threshold


def cache_dir() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "mpconvert"


def cache_key(environ: dict | None = None) -> str:
    """The CPU's model name and flags, the TensorFlow build, the oneDNN setting: what the answer depends on."""
    name, features = read_cpu()
    try:
        flags = next(
            line.partition(":")[2].split()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("flags")
        )
    except (OSError, StopIteration):
        flags = list(features)
    try:
        build = metadata.version("tensorflow")
    except metadata.PackageNotFoundError:
        build = "unknown"
    text = json.dumps([name, sorted(flags), build, onednn_on(environ), sys.version_info[:2], UNITS, ROWS])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def cache_file(environ: dict | None = None) -> Path:
    return cache_dir() / f"kernel-probe-{cache_key(environ)}.json"


def _read_cache(environ: dict | None) -> dict:
    try:
        stored = json.loads(cache_file(environ).read_text())
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def _write_cache(environ: dict | None, found: dict) -> None:
    path = cache_file(environ)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        temporary.write_text(json.dumps({**_read_cache(environ), **found}, indent=2))
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only home: the probe runs again next time


class Pending:
    """A probe under way in a child process (or answered by the cache): `result()` waits for it."""

    def __init__(self, policies: tuple[str, ...], environ: dict | None = None):
        self.policies = policies
        self.environ = dict(os.environ if environ is None else environ)
        cached = _read_cache(self.environ)
        self.cached = {p: cached[p] for p in policies if isinstance(cached.get(p), dict)}
        missing = [p for p in policies if p not in self.cached]
        self.started = time.perf_counter()
        self.child: subprocess.Popen | None = None
        if missing:
            env = {**self.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
            try:
                self.child = subprocess.Popen(
                    [sys.executable, "-m", "mpconvert.speed.kernel_probe", *missing],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=env,
                )
            except OSError:
                self.child = None

    def result(self, timeout_s: float = CHILD_TIMEOUT_S) -> dict[str, Probed]:
        found = {p: _probed(p, figures, cached=True) for p, figures in self.cached.items()}
        if self.child is None:
            for policy in self.policies:
                found.setdefault(policy, Probed(policy, None, None, None, False, "the probe could not start"))
            return found
        left = max(1.0, timeout_s - (time.perf_counter() - self.started))
        try:
            out, _ = self.child.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.communicate()
            for policy in self.policies:  # a kernel that has not answered by now is broken
                found.setdefault(
                    policy,
                    Probed(policy, None, None, float("inf"), False, f"did not finish in {timeout_s:g} s"),
                )
            return found
        try:
            answered = json.loads(out.strip().splitlines()[-1]) if self.child.returncode == 0 else {}
        except (ValueError, IndexError):
            answered = {}
        fresh = {p: v for p, v in answered.items() if p in self.policies and isinstance(v, dict)}
        if fresh:
            _write_cache(self.environ, fresh)
        for policy in self.policies:
            if policy in fresh:
                found.setdefault(policy, _probed(policy, fresh[policy], cached=False))
            else:
                found.setdefault(policy, Probed(policy, None, None, None, False, "the probe's child process failed"))
        return found

    def stop(self) -> None:
        if self.child is not None and self.child.poll() is None:
            self.child.kill()
            self.child.communicate()


def _probed(policy: str, figures: dict, cached: bool) -> Probed:
    return Probed(policy, figures.get("float32_ms"), figures.get("converted_ms"), figures.get("slower"), cached)


def start(policies: tuple[str, ...], environ: dict | None = None) -> Pending:
    """Start the probe of these 16-bit policies (cached answers need no child)."""
    return Pending(tuple(p for p in policies if p != "float32"), environ)


# --- the child ---------------------------------------------------------------------


def _time_dense(policies: tuple[str, ...]) -> dict:
    import keras
    import tensorflow as tf

    from mpconvert.runners.keras import KerasRunner
    from mpconvert.speed.timing import median_ms

    x = tf.random.stateless_normal((ROWS, UNITS), seed=(0, 1))
    runs = {}
    for policy in ("float32", *policies):
        keras.utils.set_random_seed(0)
        inputs = keras.Input((UNITS,))
        model = keras.Model(inputs, keras.layers.Dense(UNITS, activation="relu", dtype=policy)(inputs))
        run = KerasRunner(model).timer([x])
        run()  # traces
        runs[policy] = run
    ms = median_ms(runs, repeats=REPEATS, budget_s=1.0, warmup=1)
    result = {}
    for policy in policies:
        converted = ms[policy]
        slower = round(converted / ms["float32"], 2) if ms["float32"] > 0 else None
        result[policy] = {"float32_ms": round(ms["float32"], 3), "converted_ms": round(converted, 3), "slower": slower}
    return result


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    print(json.dumps(_time_dense(tuple(sys.argv[1:]))))
