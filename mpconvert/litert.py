"""The LiteRT (.tflite) artifact: float16 weights, float32 inputs and outputs.

TensorFlow's LiteRT converter has no builtin kernels for a mixed-precision
graph's float16 MatMul or Conv ("'tf.MatMul' op is neither a custom op nor
a flex op"), and mobile and edge runtimes store float16 weights and choose
the compute precision themselves: the CPU interpreter dequantizes them and
computes in float32, the GPU delegate computes in float16. So the file is
converted from the converted model's float32-computing copy (the same
weights, every layer in float32), with post-training float16 quantization
of the weights, the standard way to halve a .tflite file; its parity is
judged against the converted model like every other artifact's.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .errors import MpconvertError
from .writing import replace_atomically

WHAT = (
    "float16 weights, float32 inputs and outputs; the CPU interpreter dequantizes the weights and computes in "
    "float32, the GPU delegate computes in float16; an empty request runs on one row of zeros, cut away"
)


@dataclass(frozen=True)
class LiteRTFile:
    path: Path
    details: dict  # what the file is, for the report


@contextlib.contextmanager
def _stderr_hidden() -> Iterator[None]:
    """The converter writes its MLIR dumps to the C++ stderr; its exception carries what matters."""
    saved = os.dup(2)
    with open(os.devnull, "w") as sink:
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def write_litert(saved_model: Path, path: Path, float16_weights: bool = True) -> LiteRTFile:
    """A .tflite file at `path` from a float32-computing SavedModel, weights stored in float16 when asked."""
    import tensorflow as tf

    converter = tf.lite.TFLiteConverter.from_saved_model(str(saved_model))
    if float16_weights:
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    try:
        with _stderr_hidden():
            data = converter.convert()
    except Exception as exc:  # the converter's own errors: ops LiteRT has no builtin kernel for
        lines = [line for line in str(exc).splitlines() if "error:" in line] or str(exc).splitlines() or [""]
        reason = lines[0].split("error:", 1)[-1].strip()[:300]
        raise MpconvertError(
            f"the LiteRT converter cannot convert this model: {reason}",
            hint="export savedmodel and onnx only (--export savedmodel,onnx); an LSTM's TensorList ops have no "
            "LiteRT builtin for a variable batch",
        ) from None
    replace_atomically(path, data, "the LiteRT file")
    return LiteRTFile(path, {"weights": "float16" if float16_weights else "float32", "what": WHAT})
