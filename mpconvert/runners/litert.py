"""A .tflite file in the LiteRT interpreter, through its serving signature (loaded once).

TensorFlow 2.21 ships the interpreter as `tf.lite.Interpreter`; the
`ai-edge-litert` package's `Interpreter` takes the same calls and is used
where it is installed. Its CPU kernels compute in float32: a file with
float16 weights has them dequantized when it is loaded.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from mpconvert.data.signature import Signature
from mpconvert.runners.base import RunResult, as_float32

RUNTIME_LITERT = "litert (CPU interpreter)"


def interpreter_class() -> Any:
    try:
        from ai_edge_litert.interpreter import Interpreter

        return Interpreter
    except ImportError:
        import tensorflow as tf

        return tf.lite.Interpreter


@dataclass(frozen=True)
class LiteRTRunner:
    path: Path
    signature: Signature
    runtime: str = RUNTIME_LITERT

    @cached_property
    def interpreter(self) -> Any:
        with warnings.catch_warnings():  # tf.lite.Interpreter's notice that LiteRT moved to ai-edge-litert
            warnings.simplefilter("ignore")
            return interpreter_class()(model_path=str(self.path))

    @cached_property
    def serving(self) -> Any:
        names = list(self.interpreter.get_signature_list())
        return self.interpreter.get_signature_runner("serving_default" if "serving_default" in names else names[0])

    def tensor_dtypes(self) -> dict[str, int]:
        """How many of the file's tensors (weights included) hold each dtype."""
        found: dict[str, int] = {}
        for tensor in self.interpreter.get_tensor_details():
            name = np.dtype(tensor["dtype"]).name
            found[name] = found.get(name, 0) + 1
        return dict(sorted(found.items()))

    def run(self, inputs: Sequence[np.ndarray]) -> RunResult:
        result = self.serving(**self._feeds(inputs))
        names = [spec.name for spec in self.signature.outputs]
        keys = names if set(names) <= set(result) else sorted(result)
        return RunResult(as_float32([result[k] for k in keys]), self.runtime, names=tuple(keys))

    def timer(self, inputs: Sequence[np.ndarray]) -> Callable[[], None]:
        feeds, serving = self._feeds(inputs), self.serving
        return lambda: serving(**feeds)

    def _feeds(self, inputs: Sequence[np.ndarray]) -> dict:
        declared = self.serving.get_input_details()
        feeds = {}
        for spec, x in zip(self.signature.inputs, inputs):
            want = declared.get(spec.name, {}).get("dtype")
            if np.asarray(x).dtype.kind == "U":
                # Text as TensorFlow holds it, UTF-8 bytes: the interpreter would encode unicode as ASCII
                # ("'ascii' codec can't encode character '\xfc'").
                x = np.char.encode(np.asarray(x), "utf-8")
            feeds[spec.name] = np.asarray(x, dtype=want) if want is not None else np.asarray(x)
        return feeds
