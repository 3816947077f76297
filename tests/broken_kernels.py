"""A broken 16-bit kernel for machines that have none, reached only through seams a user has too.

On an Intel Xeon with AMX and avx512_fp16, TensorFlow 2.21's oneDNN graph
rewrites make the fused float16 MatMul pathological (one batch of 256 rows
through a Dense(4096)x2 model: 77 s; the kernel probe's one Dense: 67x
float32), and TF_ENABLE_ONEDNN_OPTS=0 makes it sound. The code that finds
and survives such a kernel runs in child processes (the kernel probe,
`mpconvert doctor MODEL`'s timing child), where a monkeypatch in the test
process does not reach, so the stand-in goes where the product itself
reads:

- `BrokenKernel.probe_finds`: the kernel probe's per-machine answer,
  written to its cache (MPCONVERT_CACHE_DIR) under the oneDNN-on key, as a
  probe on such a machine writes it. With oneDNN off (the restart, the
  doctor's re-run with the fix) the key differs and the probe really runs.
- `BrokenKernel.model`: a model whose `HangsInFloat16` layer never returns
  when it computes in float16 with oneDNN's rewrites on: a kernel the probe
  may miss. Its class is registered by this module, which every process
  that loads the model imports with `--import broken_kernels` (the doctor
  passes it on to its timing child), as a user's custom layers are.

tests/conftest.py's `broken_kernel` fixture hands one out.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import keras

from mpconvert.speed import kernel_probe

POLICY = "mixed_float16"  # what is broken on the AMX Xeon
SLOWER = 100.0  # the probe's finding: far past the 8x threshold, short of a hang
HANG_S = 3600.0  # a kernel that does not return within any budget the tests set
IMPORTS = ("--import", "broken_kernels")


def _hang(x):
    time.sleep(HANG_S)
    return x


@keras.saving.register_keras_serializable(package="broken_kernels")
class HangsInFloat16(keras.layers.Layer):
    """Identity, except in float16 with oneDNN's rewrites on: then it does not return for an hour."""

    def call(self, x):
        import tensorflow as tf

        # Decided while tracing: a tf.function traced with these settings keeps its kernel.
        if keras.backend.standardize_dtype(x.dtype) == "float16" and kernel_probe.onednn_on():
            hung = tf.numpy_function(_hang, [x], x.dtype, stateful=True)
            return tf.ensure_shape(hung, x.shape)
        return x


@dataclass(frozen=True)
class BrokenKernel:
    """`env` for the commands a test runs (the probe's cache, this module on PYTHONPATH); `IMPORTS` their flags."""

    cache: Path
    env: dict[str, str]
    policy: str = POLICY
    imports: tuple[str, ...] = IMPORTS

    def probe_finds(self, slower: float = SLOWER) -> None:
        """The kernel probe has found `policy` `slower` times float32's time on this machine, oneDNN on."""
        float32_ms = 1.0
        answer = {self.policy: {"float32_ms": float32_ms, "converted_ms": float32_ms * slower, "slower": slower}}
        self.cache.mkdir(parents=True, exist_ok=True)
        # The key for oneDNN's rewrites on (the default: an empty environment): this CPU, this TensorFlow.
        (self.cache / kernel_probe.cache_file({}).name).write_text(json.dumps(answer))

    def model(self, folder: Path) -> Path:
        """A small classifier with `HangsInFloat16` between its two Dense layers, saved as a .keras file."""
        x = keras.Input((8,), name="features")
        h = keras.layers.Dense(16, activation="relu", name="hidden")(x)
        h = HangsInFloat16(name="hangs_in_float16")(h)
        out = keras.layers.Dense(3, activation="softmax", name="predictions")(h)
        path = folder / "hanging.keras"
        keras.Model(x, out, name="hanging_mlp").save(path)
        return path
