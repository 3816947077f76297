"""An ONNX file on ONNX Runtime: the one place that opens ONNX Runtime sessions and chooses providers.

ONNX Runtime's CPU provider has almost no bfloat16 kernels (no MatMul, no
Relu). `run_onnx` then runs a copy of the graph in which each 16-bit op
computes in float32 and rounds its result back (`onnx.emulate`), on ONNX
Runtime. onnx.reference is the last resort only: it is fast enough on these
graphs (MobileNetV2 224x224, batch 4: 2.4 s vs 0.3 s emulated, on 2 cores)
but stacks Loop scan outputs wrongly (np.vstack), so Keras 3 RNNs in 16-bit
come back with the wrong shape, and its numpy bfloat16 arithmetic
accumulates in bfloat16. No TensorFlow is imported here.
"""

from __future__ import annotations

import functools
import pathlib
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper

from mpconvert.onnx.emulate import promote_16bit_ops
from mpconvert.onnx.external import external_files
from mpconvert.onnx.proto import fed_inputs
from mpconvert.runners.base import RUNTIME_REFERENCE, RunResult
from mpconvert.system.errors import MpconvertError

ORT_CPU, ORT_CUDA, ORT_TENSORRT = "CPUExecutionProvider", "CUDAExecutionProvider", "TensorrtExecutionProvider"
RUNTIME_CUDA = "onnxruntime:" + ORT_CUDA
RUNTIME_CPU = "onnxruntime:" + ORT_CPU


@functools.cache
def provider_loads(provider: str) -> bool:
    """Whether ONNX Runtime's `provider` really loads here (cached per provider).

    onnxruntime-gpu lists CUDAExecutionProvider (and TensorRT) even without
    CUDA, then logs a load error through its process-wide logger (whatever
    the session's log level) and runs on CPU. The probe runs in a child
    process so that text goes nowhere and this process's logger settings
    stay untouched.
    """
    import onnxruntime as ort

    if provider not in ort.get_available_providers():
        return False
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "probe",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    probe = (
        "import sys, onnxruntime as ort\n"
        f"s = ort.InferenceSession(sys.stdin.buffer.read(), providers=[{provider!r}, {ORT_CPU!r}])\n"
        "print(s.get_providers()[0])\n"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", probe],
            input=model.SerializeToString(),
            capture_output=True,
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0 and result.stdout.decode().strip().endswith(provider)


def cuda_usable() -> bool:
    return provider_loads(ORT_CUDA)


def session_providers() -> list[str]:
    """The providers a session here should ask for: CUDA where it really loads, then CPU."""
    return [ORT_CUDA, ORT_CPU] if cuda_usable() else [ORT_CPU]


def usable_providers() -> dict[str, list[str]]:
    """The providers ONNX Runtime lists, and those that really load here (best first).

    onnxruntime-gpu lists CUDA and TensorRT without CUDA present, then falls
    back to CPU with a logged error: only a real load counts.
    """
    import onnxruntime as ort

    available = list(ort.get_available_providers())
    usable = [ORT_CPU]
    if ORT_CUDA in available and provider_loads(ORT_CUDA):
        usable.insert(0, ORT_CUDA)
    if ORT_TENSORRT in available and provider_loads(ORT_TENSORRT):
        usable.insert(0, ORT_TENSORRT)
    return {"available": available, "usable": usable}


# What a server gets when ONNX Runtime's default (all) graph optimizations fail on a batch its file serves:
# the CPU layout transform (NCHWc) rewrites a Reshape to {0,-1,1,1,16}, which an empty batch makes ambiguous.
EXTENDED = "ORT_ENABLE_EXTENDED"


def open_session(
    model: str | pathlib.Path | bytes,
    providers: Sequence[str] | None = None,
    optimization: str | None = None,
    data_folder: pathlib.Path | None = None,
    streamed: bool = False,
) -> Any:
    """An ONNX Runtime session for a file or serialized model, quiet, on `providers` (default: the best here).

    `optimization` names a GraphOptimizationLevel; None keeps ONNX Runtime's default (all). `data_folder`:
    where a serialized model's external data files are (a file's are found beside it). `streamed`: the
    graph's computed weights (an emulated copy's Casts of 16-bit weights to float32) are made one op before
    their use and freed after it, instead of all at once (see `run_onnx`).
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # else ORT warns about each node it puts on CPU
    if optimization is not None:
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, optimization)
    if data_folder is not None:
        options.add_session_config_entry("session.model_external_initializers_file_folder_path", str(data_folder))
    extra: dict[str, Any] = {}
    if streamed:
        extra["disabled_optimizers"] = ["ConstantFolding"]
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
        options.enable_cpu_mem_arena = False
    source = str(model) if isinstance(model, pathlib.Path) else model
    return ort.InferenceSession(source, options, providers=list(providers or session_providers()), **extra)


def runtime_of(session: Any) -> str:
    return "onnxruntime:" + session.get_providers()[0]


def missing_kernel(exc: BaseException) -> bool:
    """Whether ONNX Runtime failed for want of a kernel (an op in a dtype the provider lacks)."""
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    return isinstance(exc, ort_state.NotImplemented) or "NOT_IMPLEMENTED" in str(exc)


def run_onnx(
    path: str | pathlib.Path,
    feeds: dict[str, np.ndarray],
    *,
    emulate_16bit: bool = True,
    providers: Sequence[str] | None = None,
) -> RunResult:
    """Run an ONNX file on ONNX Runtime (on `providers`; default CUDA where it loads, else CPU).

    The outputs come in the graph's order.

    Where ONNX Runtime has no kernel for an op in its dtype (bfloat16 on
    CPU), it runs a copy with 16-bit ops computed in float32 instead
    (`promote_16bit_ops`, reported in `promoted_ops`), or with
    `emulate_16bit=False` or if that fails too, the file on onnx.reference.
    """
    path = pathlib.Path(path)
    try:
        # The weights of a file with external data stay where they are: ONNX Runtime reads them from there.
        proto = onnx.load(path, load_external_data=False)
    except (OSError, DecodeError) as exc:
        raise MpconvertError(f"cannot read ONNX file {path}: {exc}") from exc
    external = bool(external_files(proto))
    expected = fed_inputs(proto)
    if sorted(feeds) != sorted(expected):
        raise MpconvertError(
            f"ONNX inputs are {expected}, but data was given for {sorted(feeds)}",
            hint="name the sample data after the model's inputs",
        )
    names = tuple(o.name for o in proto.graph.output)
    feeds = as_declared(feeds, {i.name: i.type.tensor_type.elem_type for i in proto.graph.input})

    def ort_run(
        model: bytes | pathlib.Path, optimization: str | None = None, streamed: bool = False
    ) -> tuple[list[np.ndarray], str]:
        session = open_session(model, providers, optimization, path.parent if external else None, streamed)
        return list(session.run(None, feeds)), runtime_of(session)

    as_written = path if external else proto.SerializeToString()
    try:
        outputs, runtime = ort_run(as_written)
        return RunResult(outputs, runtime, names=names)
    except Exception as exc:
        if not missing_kernel(exc):
            try:  # the file may be right and ONNX Runtime's layout optimization wrong for this batch
                outputs, runtime = ort_run(as_written, EXTENDED)
            except Exception:
                raise exc from None
            why = " ".join(str(exc).split())[:160]
            return RunResult(
                outputs, f"{runtime} with {EXTENDED} (its default optimizations failed: {why})", names=names
            )

    if emulate_16bit:
        promoted, ops = promote_16bit_ops(proto)
        # With external data (a large model) the copy reads the same data file (ort_run's data_folder), and
        # its weights' Casts to float32 are streamed: ONNX Runtime's constant folding would hold a float32
        # copy of every weight while the session lives, and without folding its default order ran every
        # Cast before the first MatMul. Streamed (no folding, ops by priority, no memory arena), the
        # bfloat16 file of a 0.60 GB Dense stack peaked at 0.88 GiB on a 1638-row batch, against 0.96 GiB
        # folded and 1.20 GiB unfolded in the default order. A file without external data keeps the
        # default session, whose figures the reports of small models carry.
        try:
            outputs, runtime = ort_run(promoted.SerializeToString(), streamed=external)
            return RunResult(outputs, runtime, promoted_ops=list(ops), names=names)
        except Exception as exc:
            if not missing_kernel(exc):
                raise

    from onnx.reference import ReferenceEvaluator

    if external:
        onnx.load_external_data_for_model(proto, str(path.parent))
    outputs = [np.asarray(o) for o in ReferenceEvaluator(proto).run(None, feeds)]
    _check_declared(proto, outputs)
    return RunResult(outputs, RUNTIME_REFERENCE, names=names)


def as_declared(feeds: dict[str, np.ndarray], types: dict[str, int]) -> dict[str, np.ndarray]:
    """Float feeds in the element type the graph declares for them (a file written with --onnx-io float16)."""
    return {
        name: x.astype(np.float16)
        if types.get(name) == TensorProto.FLOAT16 and np.issubdtype(np.asarray(x).dtype, np.floating)
        else x
        for name, x in feeds.items()
    }


def _check_declared(proto: Any, outputs: list[np.ndarray]) -> None:
    """Refuse onnx.reference results that contradict the graph's own output types."""
    for declared, value in zip(proto.graph.output, outputs):
        tensor_type = declared.type.tensor_type
        want = helper.tensor_dtype_to_np_dtype(tensor_type.elem_type)
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        ok = value.dtype == want
        if tensor_type.HasField("shape"):
            ok = ok and value.ndim == len(dims) and all(d is None or d == v for d, v in zip(dims, value.shape))
        if not ok:
            raise MpconvertError(
                f"onnx.reference computed output '{declared.name}' as {value.dtype}{list(value.shape)}, but the "
                f"graph declares {np.dtype(want)}{['?' if d is None else d for d in dims]} (onnx.reference "
                "is known to mis-stack Loop outputs, as of RNN layers)",
                hint="check the file with ONNX Runtime on a machine with the needed kernels (a GPU), "
                "or use --export savedmodel",
            )


@dataclass(frozen=True)
class OnnxRunner:
    """An ONNX file fed by position: `inputs` are its graph inputs' names in the signature's order.

    `outputs` are the names to return, in that order (where the file has them
    all); `emulate_16bit` as for `run_onnx`; `providers` the ONNX Runtime
    providers to ask for, best first (default: CUDA where it loads, then
    CPU). `timer` times the file as written only: an emulated copy would
    time float32 arithmetic, so a file the provider has no kernels for
    raises (`missing_kernel` tells).
    """

    path: pathlib.Path
    inputs: tuple[str, ...]
    outputs: tuple[str, ...] = ()
    emulate_16bit: bool = True
    providers: tuple[str, ...] = ()

    @property
    def runtime(self) -> str:
        return "onnxruntime:" + (self.providers or session_providers())[0]

    def run(self, inputs: Sequence[np.ndarray]) -> RunResult:
        feeds = dict(zip(self.inputs, inputs))
        result = run_onnx(self.path, feeds, emulate_16bit=self.emulate_16bit, providers=self.providers or None)
        if not self.outputs or not set(self.outputs) <= set(result.names):
            return result
        return RunResult(result.by_name(self.outputs), result.runtime, result.promoted_ops, self.outputs)

    def timer(self, inputs: Sequence[np.ndarray]) -> Callable[[], None]:
        session = open_session(self.path, self.providers or None)
        declared = {i.name: TensorProto.FLOAT16 if i.type == "tensor(float16)" else 0 for i in session.get_inputs()}
        feeds = as_declared(dict(zip(self.inputs, (np.asarray(x) for x in inputs))), declared)
        session.run(None, feeds)  # a missing kernel fails here, before any timing
        return lambda: session.run(None, feeds)
