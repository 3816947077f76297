"""A SavedModel written to disk, run through its serving signature (loaded once); or a signature in memory."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np

from mpconvert.data.signature import Signature
from mpconvert.runners.base import RUNTIME_TENSORFLOW, RunResult
from mpconvert.runners.keras import fetch

DEFAULT_SIGNATURE = "serving_default"


@dataclass(frozen=True)
class SignatureRunner:
    """A loaded serving signature (a concrete function that takes the inputs by name), run in one call."""

    serving: Any
    signature: Signature
    runtime: str = RUNTIME_TENSORFLOW

    def run(self, inputs: Sequence[np.ndarray]) -> RunResult:
        """Every row in one call, the outputs by the signature's names (else the serving keys' order)."""
        result = self.serving(**self._feeds(inputs))
        names = [spec.name for spec in self.signature.outputs]
        keys = names if set(names) <= set(result) else sorted(result)
        return RunResult([result[k].numpy() for k in keys], self.runtime, names=tuple(keys))

    def dtypes(self) -> dict:
        """The serving signature's input and output dtypes, by name."""
        _, specs = self.serving.structured_input_signature
        return {
            "inputs": {k: v.dtype.name for k, v in specs.items()},
            "outputs": {k: v.dtype.name for k, v in self.serving.structured_outputs.items()},
        }

    def timer(self, inputs: Sequence[Any]) -> Callable[[], None]:
        feeds, serving = self._feeds(inputs), self.serving
        return lambda: fetch(serving(**feeds))

    def _feeds(self, inputs: Sequence[Any]) -> dict:
        import tensorflow as tf

        return {spec.name: tf.constant(x) for spec, x in zip(self.signature.inputs, inputs)}


@dataclass(frozen=True)
class SavedModelRunner:
    """A SavedModel on disk, its signature `signature_name` loaded on the first run."""

    path: Path
    signature: Signature
    signature_name: str = DEFAULT_SIGNATURE
    runtime: str = RUNTIME_TENSORFLOW

    @cached_property
    def loaded(self) -> SignatureRunner:
        import tensorflow as tf

        serving = tf.saved_model.load(str(self.path)).signatures[self.signature_name]
        return SignatureRunner(serving, self.signature, self.runtime)

    def run(self, inputs: Sequence[np.ndarray]) -> RunResult:
        return self.loaded.run(inputs)

    def dtypes(self) -> dict:
        return self.loaded.dtypes()

    def timer(self, inputs: Sequence[Any]) -> Callable[[], None]:
        return self.loaded.timer(inputs)
