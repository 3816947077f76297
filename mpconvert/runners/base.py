"""What every runner is: it runs a model on inputs, and prepares one timed call.

The shape is Polygraphy's runner (activate, infer, deactivate) reduced to
what mpconvert needs: `run` for every row (parity, validation), `timer` for
one call on fixed rows, prepared once (traced, or a session opened) so that
what is timed is the model and not its preparation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True)
class Compiled:
    """What a runtime that compiles a model for a device says it runs (OpenVINO: the compiled model's
    INFERENCE_PRECISION_HINT and EXECUTION_DEVICES); None where it does not say."""

    precision: str | None
    devices: tuple[str, ...]


@dataclass(frozen=True)
class RunResult:
    outputs: list[np.ndarray]  # in the order the runner was asked for (a signature's), where it has them all
    runtime: str  # what ran them: "tensorflow", "onnxruntime:CPUExecutionProvider", "onnx.reference", ...
    # Non-empty when the runtime could not run the file as written (missing
    # 16-bit kernels) and ran a copy with these op types computed in float32.
    promoted_ops: list[str] = field(default_factory=list)
    names: tuple[str, ...] = ()  # the outputs' own names, in `outputs` order
    compiled: Compiled | None = None  # where the runtime compiles for a device: what it said it runs

    @property
    def native(self) -> bool:
        """Whether the runtime ran the model as written (not an emulated copy)."""
        return not self.promoted_ops and self.runtime != RUNTIME_REFERENCE

    @property
    def checked_with(self) -> str:
        """What really ran the model, in words for a report."""
        if self.promoted_ops:
            return f"{self.runtime} on an emulated copy"
        if self.compiled is not None and self.compiled.precision:
            return f"{self.runtime} ({self.compiled.precision} on {', '.join(self.compiled.devices) or '?'})"
        return self.runtime

    def by_name(self, names: Sequence[str]) -> list[np.ndarray]:
        """The outputs in the order of `names`, where the runner's have them all; else as they are."""
        if not names or not set(names) <= set(self.names):
            return self.outputs
        return [self.outputs[self.names.index(name)] for name in names]


RUNTIME_TENSORFLOW = "tensorflow"
RUNTIME_REFERENCE = "onnx.reference"


class Runner(Protocol):
    """Runs one model; `inputs` are one array per model input, in the signature's order."""

    @property
    def runtime(self) -> str: ...

    def run(self, inputs: Sequence[np.ndarray]) -> RunResult:
        """Every row's outputs, in the signature's output order, as float32 arrays where the model's are floats."""
        ...

    def timer(self, inputs: Sequence[np.ndarray]) -> Callable[[], None]:
        """One call on `inputs`, prepared now; returns only when the outputs are on the host."""
        ...


def as_float32(outputs: Sequence[object]) -> list[np.ndarray]:
    return [np.asarray(o, dtype=np.float32) for o in outputs]
