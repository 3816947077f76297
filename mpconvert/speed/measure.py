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

import numpy as np

from ..errors import first_line
from ..options import DEFAULT_OPSET, DEFAULT_SPEED_BATCH
from ..signature import Signature, signature_of
from .hardware import Hardware, probe_hardware
from .memory import activation_memory
from .timing import BUDGET_S, REPEATS, SPEED_PATHS, median_ms, path_runner, rounded_ms

# The default serving batch (--speed-batch): at 64 rows a mixed_bfloat16
# Dense(4096)x2 read 1.12x over float32 where it served 2.04x at 256.
SPEED_BATCH = DEFAULT_SPEED_BATCH


def serving_rows(original: Any, signature: Signature, inputs: list | tuple, batch: int) -> list:
    """`batch` rows to time: the first validation rows, or, when there are fewer, those rows repeated.

    Repeating real rows keeps every value valid for the model (token ids
    below an Embedding's vocabulary, even when the input is float-typed);
    timing depends on the shapes, not on which rows they are.
    """
    take = np.arange(batch) % len(inputs[0])
    return [x[take] for x in inputs]


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
    batch: int  # rows per call (--speed-batch); the data's rows repeated when it has fewer
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
        text = f"{timed or 'nothing timed'} as fast as float32 (above 1 is faster; {self.batch_words}, {self.device})"
        if self.memory and self.memory.get("ratio") is not None:
            text += f"; activation memory {self.memory['ratio']:.2f}x float32's ({self.memory['method']})"
        return "; ".join([text, *untimed])

    @property
    def batch_words(self) -> str:
        if self.batch > self.rows:
            return f"batch {self.batch}, the data's {self.rows} rows repeated"
        rows = f"all {self.rows} validation rows" if self.batch == self.rows else f"{self.rows} validation rows"
        return f"batch {self.batch} of {rows}"

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
    """Inference time of `converted` against the float32 `original`, per path, at `batch` rows (`serving_rows`).

    `inputs` are the validation inputs (one array per model input). Both
    models run through the same path on the same tensors, taking turns.
    With `memory`, the activation memory at that batch is added.
    """
    import tensorflow as tf

    signature = signature or signature_of(original)
    rows = len(inputs[0])
    n = batch
    feeds = [tf.constant(x) for x in serving_rows(original, signature, inputs, batch)]
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


def padding_cost(
    unpadded: Any,
    padded: Any,
    inputs: list | tuple,
    *,
    signature: Signature,
    batch: int = SPEED_BATCH,
    repeats: int = REPEATS,
    budget_s: float = BUDGET_S,
) -> dict:
    """What padding's pad and slice ops cost on this machine: the padded model's serving time against the unpadded.

    Padding is for the target's Tensor Cores (multiples of 8 in float16),
    so it is kept even where it costs here; this says how much it does.
    """
    import tensorflow as tf

    feeds = [tf.constant(x) for x in serving_rows(unpadded, signature, inputs, batch)]
    runs = {
        name: path_runner("savedmodel", m, signature, feeds) for name, m in (("unpadded", unpadded), ("padded", padded))
    }
    ms = median_ms(runs, repeats=repeats, budget_s=budget_s, warmup=1)
    cost = ms["padded"] / ms["unpadded"] if ms["unpadded"] else None
    summary = (
        f"the padded model serves in {cost:.2f}x the unpadded one's time on this machine "
        f"({rounded_ms(ms['padded'])} ms against {rounded_ms(ms['unpadded'])} ms, batch {batch}; "
        "padding is for the target's Tensor Cores, not this CPU)"
        if cost
        else "not timed"
    )
    return {
        "unpadded_ms": rounded_ms(ms["unpadded"]),
        "padded_ms": rounded_ms(ms["padded"]),
        "cost": round(cost, 4) if cost else None,
        "summary": summary,
    }


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
    feeds = {spec.name: x for spec, x in zip(signature.inputs, serving_rows(original, signature, inputs, batch))}
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
