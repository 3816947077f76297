"""The speed and memory a conversion bought, measured on this machine.

Mixed precision is only worth its accuracy risk if it is faster where the
model runs, and that is hardware-specific: on a 2-core EPYC with
avx512_bf16 a mixed_bfloat16 Dense(4096)x2 served 1.6x faster than float32
at batch 256, while on this repository's 2-core EPYC without it (Zen 3,
AVX2 only) 16-bit matmuls took twice float32's time (GUIDE.md section 2,
doctor.py). So every figure here is a ratio against the float32 original
measured in the same process, through the same path, on the same rows:

    ratio = float32_ms / converted_ms    (above 1: the converted model is faster)

Hardware facts (`probe_hardware`, `fast_units`) and the timing helper
(`median_ms`) live here too; `mpconvert doctor` (doctor.py) builds on them.
Stages (explicit inputs, result objects, nothing written to disk):
`measure_speed` (the Keras call and the SavedModel serving function, both
models traced in memory), `activation_memory`, `measure_onnx_speed` (the
converted .onnx against a float32 export of the original, for --bench-onnx)
and `warning_for` (hardware facts only, no benchmark: a line to print before
converting). TensorFlow and ONNX Runtime are imported by the stages that
need them.
"""

from __future__ import annotations

import functools
import math
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .options import DEFAULT_OPSET
from .precision import Precision
from .signature import Signature, signature_of
from .trace import graph_of, is_container, nodes

# The fixed batch: the parity checks' row count, and large enough that a
# Dense(4096) layer is bound by arithmetic rather than by call overhead.
SPEED_BATCH = 256
SPEED_PATHS = ("keras", "savedmodel")
# Timing per path: both models take turns, median of up to REPEATS runs
# after one warm-up call (the trace; later calls of a traced function took
# the same time here), fewer when a run is slow (at least 3), to spend about
# BUDGET_S. Dense(4096)x2 at batch 256 took 240-700 ms a run on the 2 shared
# cores here, so it gets 3-6 runs; a small MLP gets all 10 in milliseconds.
REPEATS = 10
BUDGET_S = 3.0
COMPUTED = "computed from layer output shapes and dtypes"


# --- hardware facts (no benchmark) ------------------------------------------------

# The /proc/cpuinfo flags that decide 16-bit speed on a CPU. avx512f alone
# only converts between formats; the *_bf16 / *_fp16 ones compute.
CPU_FEATURES = ("avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")
CPU_UNITS = {"float16": ("avx512_fp16", "amx_fp16"), "bfloat16": ("avx512_bf16", "amx_bf16")}
# NVIDIA Tensor Cores: float16 from Volta (7.0), bfloat16 from Ampere (8.0).
TENSOR_CORES = {"float16": (7, 0), "bfloat16": (8, 0)}


@dataclass(frozen=True)
class Gpu:
    name: str
    compute_capability: tuple[int, int] | None  # None: TensorFlow did not say

    def tensor_cores(self, dtype: str) -> bool | None:
        if self.compute_capability is None:
            return None
        return tuple(self.compute_capability) >= TENSOR_CORES[dtype]

    def as_dict(self) -> dict:
        cc = self.compute_capability
        return {
            "name": self.name,
            "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
            **{f"{dtype}_tensor_cores": self.tensor_cores(dtype) for dtype in TENSOR_CORES},
        }


@dataclass(frozen=True)
class Hardware:
    """What TensorFlow and the kernel say about this machine; no benchmark."""

    cpu: str  # the CPU's model name
    cpu_features: tuple[str, ...]  # those of CPU_FEATURES it has
    gpus: tuple[Gpu, ...] = ()
    tpus: int = 0

    @property
    def device(self) -> str:
        """Where TensorFlow runs a model by default: "GPU: <name>", "TPU" or "CPU: <model name>"."""
        if self.gpus:
            return f"GPU: {self.gpus[0].name}"
        if self.tpus:
            return "TPU"
        return f"CPU: {self.cpu}"

    def as_dict(self) -> dict:
        return {
            "device": self.device,
            "cpu": self.cpu,
            "cpu_features": {name: name in self.cpu_features for name in CPU_FEATURES},
            "gpus": [gpu.as_dict() for gpu in self.gpus],
            "tpus": self.tpus,
        }


def read_cpu(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[str, tuple[str, ...]]:
    """The CPU's model name and which of CPU_FEATURES it has (none known off Linux)."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        text = cpuinfo.read_text()
    except OSError:
        return name, ()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            name = value.strip()
        elif key.strip() == "flags":
            flags = set(value.split())
            break  # every core lists the same flags, after its model name
    return name, tuple(f for f in CPU_FEATURES if f in flags)


@functools.cache
def probe_hardware() -> Hardware:
    """This machine's facts (cached: they do not change while a process runs)."""
    import tensorflow as tf

    gpus = []
    for device in tf.config.list_physical_devices("GPU"):
        details = tf.config.experimental.get_device_details(device)
        gpus.append(Gpu(details.get("device_name", device.name), details.get("compute_capability")))
    cpu, features = read_cpu()
    return Hardware(cpu, features, tuple(gpus), len(tf.config.list_physical_devices("TPU")))


def fast_units(hardware: Hardware, dtype: str) -> tuple[bool | None, str]:
    """Whether the device TensorFlow runs on here has units for `dtype` ("float16"/"bfloat16"), and why.

    None when it cannot be told (a GPU whose compute capability is unknown).
    """
    if hardware.gpus:
        gpu = hardware.gpus[0]
        has = gpu.tensor_cores(dtype)
        need = "{}.{}".format(*TENSOR_CORES[dtype])
        if has is None:
            return None, f"the compute capability of {gpu.name} is unknown ({dtype} Tensor Cores need {need})"
        cc = "{}.{}".format(*gpu.compute_capability)
        if has:
            return True, f"{dtype} Tensor Cores on {gpu.name} (compute capability {cc})"
        return False, f"no {dtype} Tensor Cores on {gpu.name}: compute capability {cc}, they need {need}"
    if hardware.tpus:
        if dtype == "bfloat16":
            return True, "TPUs compute in bfloat16"
        return False, "TPUs have no float16 units (they compute in bfloat16)"
    units = [f for f in CPU_UNITS[dtype] if f in hardware.cpu_features]
    if units:
        return True, f"{dtype} units on this CPU: {', '.join(units)}"
    return False, f"no {dtype} units on this CPU: neither {' nor '.join(CPU_UNITS[dtype])}"


def median_ms(
    runs: dict[str, Callable[[], object]], *, repeats: int = REPEATS, budget_s: float | None = None, warmup: int = 2
) -> dict[str, float]:
    """The median wall time of each callable, in milliseconds.

    The callables take turns (a b a b ...), so load from other processes on
    a shared machine falls on all of them alike. After the warm-ups (tracing,
    allocation) one round is timed; with `budget_s`, the remaining rounds
    are cut to what fits in it, but at least 3 are run. Each callable must
    return only when its work is done (fetch a result to the host).
    """
    for run in runs.values():
        for _ in range(warmup):
            run()
    times: dict[str, list[float]] = {name: [] for name in runs}
    rounds = repeats
    done = 0
    while done < rounds:
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
        done += 1
        if done == 1 and budget_s is not None:
            one_round = sum(t[0] for t in times.values())
            rounds = max(3, min(repeats, int(budget_s / max(one_round, 1e-9))))
    return {name: statistics.median(t) * 1000 for name, t in times.items()}


def first_line(exc: Exception) -> str:
    """An exception's first line, for a report (ONNX Runtime's run to many)."""
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]


# --- the converted model against float32 -------------------------------------------


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


def _ms(value: float) -> float:
    # Rounded once, before the ratio is taken, so that the report's ratio is
    # exactly its float32_ms / converted_ms.
    return round(value, 3)


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


# --- TensorFlow paths ---------------------------------------------------------------


def _fetch(outputs: Any) -> None:
    # Copy the outputs to the host: a GPU returns before it has finished.
    import tensorflow as tf

    for tensor in tf.nest.flatten(outputs):
        tensor.numpy()


def _runner(path: str, model: Any, signature: Signature, feeds: list) -> Callable[[], None]:
    """One call of `model` on `feeds` through `path`, traced once."""
    import tensorflow as tf

    from .artifacts import _input_specs, _serving_fn

    if path == "keras":
        fn = tf.function(lambda *xs: model(list(xs) if len(xs) > 1 else xs[0], training=False))
    elif path == "savedmodel":
        # What the exported SavedModel's signature runs, traced in memory:
        # the same function write_savedmodel hands to the export archive.
        fn = tf.function(_serving_fn(model, signature), input_signature=_input_specs(signature))
    else:
        raise ValueError(f"unknown speed path {path!r}; known: {', '.join(SPEED_PATHS)}")
    return lambda: _fetch(fn(*feeds))


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
            name: _runner(path, model, signature, feeds)
            for name, model in (("float32", original), ("converted", converted))
        }
        ms = median_ms(runs, repeats=repeats, budget_s=budget_s, warmup=1)
        timed[path] = PathSpeed(_ms(ms["float32"]), _ms(ms["converted"]), "tensorflow")
    found = activation_memory(original, converted, n, inputs=feeds, signature=signature) if memory else None
    return Speed((hardware or probe_hardware()).device, n, rows, timed, found)


# --- activation memory --------------------------------------------------------------


def _calls(model: Any) -> list[tuple[Any, list]]:
    """Every call in `model`'s own graph, as (layer, its symbolic outputs): a shared layer once per call."""
    if graph_of(model) is None:  # no graph (a subclassed model): each layer's output, where it has one
        return [(layer, _output_of(layer)) for layer in model.layers]
    return [(node.layer, node.outputs) for node in nodes(model)]


def _output_of(layer: Any) -> list:
    import tensorflow as tf

    try:
        return tf.nest.flatten(layer.output)
    except (AttributeError, ValueError, RuntimeError):  # never called in a graph
        return []


def activation_bytes(model: Any, batch: int) -> tuple[int, list[str]]:
    """Bytes of every layer call's outputs at `batch` rows, and the layers whose size is unknown.

    Inputs are not counted (the caller holds them in any precision); a
    nested model counts its own layers. A layer whose output has a dimension
    only known at run time (a sequence length) is listed, not guessed.
    """
    import tensorflow as tf

    total, unknown = 0, []
    for layer, outputs in _calls(model):
        if type(layer).__name__ == "InputLayer":
            continue
        if is_container(layer):  # a nested model
            inner, missing = activation_bytes(layer, batch)
            total, unknown = total + inner, unknown + missing
            continue
        dims = [tuple(t.shape)[1:] for t in outputs]
        if not outputs or any(d is None for shape in dims for d in shape):
            unknown.append(layer.name)
            continue
        total += sum(batch * math.prod(shape) * tf.as_dtype(t.dtype).size for shape, t in zip(dims, outputs))
    return total, sorted(set(unknown))


def activation_memory(
    original: Any, converted: Any, batch: int, *, inputs: list | None = None, signature: Signature | None = None
) -> dict:
    """Activation memory at `batch` rows: the converted model against the float32 original.

    Measured (peak GPU memory of one forward pass, less what was allocated
    before it) where TensorFlow has a GPU and `inputs` (tensors of `batch`
    rows) are given; else computed from every layer's output shape and dtype
    and labelled so. ratio = converted / float32: below 1 the converted model
    needs less. The converted model may be wider than the original (padding
    to multiples of 8): each is counted as it is.
    """
    import tensorflow as tf

    if inputs is not None and tf.config.list_physical_devices("GPU"):
        signature = signature or signature_of(original)
        f32, conv = (_peak_gpu_bytes(_runner("keras", m, signature, inputs)) for m in (original, converted))
        method = (
            f"measured: peak GPU memory of one forward pass at batch {batch} (tf.config.experimental.get_memory_info)"
        )
        unknown: list[str] = []
    else:
        (f32, missing_f32), (conv, missing_conv) = activation_bytes(original, batch), activation_bytes(converted, batch)
        method, unknown = COMPUTED, sorted(set(missing_f32 + missing_conv))
    return {
        "batch": batch,
        "float32_bytes": f32,
        "converted_bytes": conv,
        "ratio": conv / f32 if f32 else None,
        "method": method,
        "unknown_layers": unknown,
    }


def _peak_gpu_bytes(run: Callable[[], None]) -> int:
    import tensorflow as tf

    run()  # traced and warmed up outside the measurement
    tf.config.experimental.reset_memory_stats("GPU:0")
    before = tf.config.experimental.get_memory_info("GPU:0")["current"]
    run()
    return tf.config.experimental.get_memory_info("GPU:0")["peak"] - before


# --- ONNX Runtime (--bench-onnx) ----------------------------------------------------


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

    from .artifacts import _input_specs
    from .onnx.export import keras_to_onnx
    from .onnx.run import _missing_kernel, cuda_usable

    signature = signature or signature_of(original)
    feeds = {spec.name: x[:batch] for spec, x in zip(signature.inputs, inputs)}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if cuda_usable() else ["CPUExecutionProvider"]
    with tempfile.TemporaryDirectory(prefix="mpconvert-bench-onnx-") as tmp:
        baseline = Path(tmp) / "float32.onnx"
        keras_to_onnx(original, _input_specs(signature), baseline, opset=opset)
        reference = ort.InferenceSession(str(baseline), options, providers=providers)
    runtime = "onnxruntime:" + reference.get_providers()[0]
    runs = {"float32": lambda: reference.run(None, feeds)}
    note = None
    try:
        session = ort.InferenceSession(str(converted_onnx), options, providers=providers)
        session.run(None, feeds)
        runs["converted"] = lambda: session.run(None, feeds)
    except Exception as exc:  # ONNX Runtime's own exception classes
        if not _missing_kernel(exc):
            raise
        note = (
            f"{Path(converted_onnx).name} does not run as written on {runtime} ({first_line(exc)}); "
            "not timed on an emulated copy, which would time float32 arithmetic"
        )
    ms = median_ms(runs, repeats=repeats, budget_s=budget_s, warmup=1)
    return PathSpeed(_ms(ms["float32"]), _ms(ms["converted"]) if "converted" in runs else None, runtime, note)


# --- before converting ------------------------------------------------------------


def warning_for(policy: str | Precision, hardware: Hardware | None = None) -> str | None:
    """A one-line warning when `policy` cannot be fast on this hardware; None when it can.

    From hardware facts alone (no benchmark): float16 on a CPU without
    avx512_fp16/amx_fp16 or a GPU below compute capability 7.0, bfloat16 on
    a CPU without avx512_bf16/amx_bf16 or a GPU below 8.0, float16 on a TPU.
    """
    precision = Precision.of(policy)
    hardware = hardware or probe_hardware()
    fast, why = fast_units(hardware, precision.compute_dtype)
    if fast is not False:
        return None
    return (
        f"{precision.name} may run slower than float32 here ({why}); the report's speed section "
        "gives the measured ratio, and `mpconvert doctor` measures this machine"
    )
