"""The speed a conversion bought: the converted model against the float32 original, per path.

Every figure is a ratio against the float32 original measured in the same
process, through the same path, on the same rows:

    ratio = float32_ms / converted_ms    (above 1: the converted model is faster)

`measure_speed` times the Keras call and the SavedModel serving function
(both models traced in memory); `measure_onnx_speed` the converted .onnx
against a float32 export of the original, in ONNX Runtime (--bench-onnx).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..errors import first_line
from ..options import DEFAULT_OPSET
from ..signature import Signature, signature_of
from .hardware import Hardware, probe_hardware
from .memory import activation_memory
from .timing import BUDGET_S, REPEATS, SPEED_PATHS, median_ms, path_runner, rounded_ms

# The fixed batch: the parity checks' row count, and large enough that a
# Dense(4096) layer is bound by arithmetic rather than by call overhead.
SPEED_BATCH = 256

# Timing per path: both models take turns, median of up to REPEATS runs
# after one warm-up call (the trace; later calls of a traced function took
# the same time here), fewer when a run is slow (at least 3), to spend about
# BUDGET_S. Dense(4096)x2 at batch 256 took 240-700 ms a run on the 2 shared
# cores here, so it gets 3-6 runs; a small MLP gets all 10 in milliseconds.


@dataclass(frozen=True)
class PathSpeed:
    """Both models through one path; a side that could not run has None and a note."""

    float32_ms: float | None
    converted_ms: float | None
    runtime: str  # what ran both: "tensorflow", "onnxruntime:CPUExecutionProvider", ...
    note: str | None = None

    @property
    def ratio(self) -> float | None:
        """float32 time / converted time: above 1 the converted model is faster."""
        if not self.float32_ms or not self.converted_ms:
            return None
        return self.float32_ms / self.converted_ms

    def as_dict(self) -> dict:
        return {
            "float32_ms": self.float32_ms,
            "converted_ms": self.converted_ms,
            "ratio": self.ratio,
            "runtime": self.runtime,
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, stored: dict) -> PathSpeed:
        return cls(stored["float32_ms"], stored["converted_ms"], stored.get("runtime", ""), stored.get("note"))


@dataclass(frozen=True)
class Speed:
    device: str  # "CPU: <model name>" or "GPU: <name>"
    batch: int  # rows per call: SPEED_BATCH, or every validation row when there are fewer
    rows: int  # validation rows available
    paths: dict[str, PathSpeed] = field(default_factory=dict)
    memory: dict | None = None  # activation_memory's result

    def with_path(self, name: str, timing: PathSpeed) -> Speed:
        """This result with one more path (the ONNX file, timed after the export)."""
        return replace(self, paths={**self.paths, name: timing})

    @property
    def summary(self) -> str:
        """ "savedmodel 1.62x, keras 1.58x as fast as float32 (batch 256 of 450 validation rows, CPU: ...)"."""
        timed = ", ".join(f"{name} {p.ratio:.2f}x" for name, p in self.paths.items() if p.ratio is not None)
        untimed = [f"{name} not timed: {p.note}" for name, p in self.paths.items() if p.ratio is None]
        rows = f"all {self.rows} validation rows" if self.batch == self.rows else f"{self.rows} validation rows"
        text = f"{timed or 'nothing timed'} as fast as float32 "
        text += f"(above 1 is faster; batch {self.batch} of {rows}, {self.device})"
        if self.memory and self.memory.get("ratio") is not None:
            text += f"; activation memory {self.memory['ratio']:.2f}x float32's ({self.memory['method']})"
        return "; ".join([text, *untimed])

    def as_dict(self) -> dict:
        return {
            "device": self.device,
            "batch": self.batch,
            "rows": self.rows,
            "paths": {name: p.as_dict() for name, p in self.paths.items()},
            "memory": self.memory,
            "summary": self.summary,
        }

    @classmethod
    def from_dict(cls, stored: dict) -> Speed:
        paths = {name: PathSpeed.from_dict(p) for name, p in stored["paths"].items()}
        return cls(stored["device"], stored["batch"], stored.get("rows", stored["batch"]), paths, stored.get("memory"))


def measure_speed(
    original: Any,
    converted: Any,
    inputs: list | tuple,
    *,
    signature: Signature | None = None,
    batch: int = SPEED_BATCH,
    paths: tuple[str, ...] = SPEED_PATHS,
    memory: bool = True,
    hardware: Hardware | None = None,
    repeats: int = REPEATS,
    budget_s: float = BUDGET_S,
) -> Speed:
    """Inference time of `converted` against the float32 `original`, per path, on the first `batch` rows.

    `inputs` are the validation inputs (one array per model input). Both
    models run through the same path on the same tensors, taking turns.
    With `memory`, the activation memory at that batch is added.
    """
    import tensorflow as tf

    signature = signature or signature_of(original)
    rows = len(inputs[0])
    n = min(batch, rows)
    feeds = [tf.constant(x[:n]) for x in inputs]
    timed = {}
    for path in paths:
        runs = {
            name: path_runner(path, model, signature, feeds)
            for name, model in (("float32", original), ("converted", converted))
        }
        ms = median_ms(runs, repeats=repeats, budget_s=budget_s, warmup=1)
        timed[path] = PathSpeed(rounded_ms(ms["float32"]), rounded_ms(ms["converted"]), "tensorflow")
    found = activation_memory(original, converted, n, inputs=feeds, signature=signature) if memory else None
    return Speed((hardware or probe_hardware()).device, n, rows, timed, found)


def measure_onnx_speed(
    original: Any,
    converted_onnx: Path,
    inputs: list | tuple,
    *,
    signature: Signature | None = None,
    batch: int = SPEED_BATCH,
    opset: int = DEFAULT_OPSET,
    repeats: int = REPEATS,
    budget_s: float = BUDGET_S,
) -> PathSpeed:
    """The converted ONNX file against a float32 export of `original`, in ONNX Runtime.

    Costs one more ONNX export (a temporary file, removed). Runs on CUDA
    where it really loads, else CPU. A file the provider has no kernels for
    (bfloat16 on the CPU provider) is reported as such and not timed: an
    emulated copy would time float32 arithmetic with extra casts.
    """
    import onnxruntime as ort

    from ..artifacts import input_specs
    from ..onnx.export import keras_to_onnx
    from ..onnx.run import missing_kernel, session_providers

    signature = signature or signature_of(original)
    feeds = {spec.name: x[:batch] for spec, x in zip(signature.inputs, inputs)}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    providers = session_providers()
    with tempfile.TemporaryDirectory(prefix="mpconvert-bench-onnx-") as tmp:
        baseline = Path(tmp) / "float32.onnx"
        keras_to_onnx(original, input_specs(signature), baseline, opset=opset)
        reference = ort.InferenceSession(str(baseline), options, providers=providers)
    runtime = "onnxruntime:" + reference.get_providers()[0]
    runs = {"float32": lambda: reference.run(None, feeds)}
    note = None
    try:
        session = ort.InferenceSession(str(converted_onnx), options, providers=providers)
        session.run(None, feeds)
        runs["converted"] = lambda: session.run(None, feeds)
    except Exception as exc:  # ONNX Runtime's own exception classes
        if not missing_kernel(exc):
            raise
        note = (
            f"{Path(converted_onnx).name} does not run as written on {runtime} ({first_line(exc, 200)}); "
            "not timed on an emulated copy, which would time float32 arithmetic"
        )
    ms = median_ms(runs, repeats=repeats, budget_s=budget_s, warmup=1)
    return PathSpeed(
        rounded_ms(ms["float32"]), rounded_ms(ms["converted"]) if "converted" in runs else None, runtime, note
    )
