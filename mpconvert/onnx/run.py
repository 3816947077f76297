"""Run an ONNX file, on ONNX Runtime where it can, without TensorFlow.

ONNX Runtime's CPU provider has almost no bfloat16 kernels (no MatMul, no
Relu). `run_onnx` then runs a copy of the graph in which each 16-bit op
computes in float32 and rounds its result back (`promote_16bit_ops`), on
ONNX Runtime. onnx.reference is the last resort only: it is fast enough on
these graphs (MobileNetV2 224x224, batch 4: 2.4 s vs 0.3 s emulated, on 2
cores) but stacks Loop scan outputs wrongly (np.vstack), so Keras 3 RNNs in
16-bit come back with the wrong shape, and its numpy bfloat16 arithmetic
accumulates in bfloat16.
"""

from __future__ import annotations

import copy
import functools
import pathlib
import subprocess
import sys
from dataclasses import dataclass, field

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper

from mpconvert.errors import MpconvertError
from mpconvert.onnx.proto import HALF_TYPES, allowed_types, fed_inputs, wrap_ops

RUNTIME_CUDA = "onnxruntime:CUDAExecutionProvider"
RUNTIME_CPU = "onnxruntime:CPUExecutionProvider"
RUNTIME_REFERENCE = "onnx.reference"


@dataclass(frozen=True)
class OnnxRun:
    outputs: list[np.ndarray]  # in the graph's output order
    runtime: str
    # Non-empty when ONNX Runtime could not run the file as written (missing
    # 16-bit kernels) and ran a copy with these op types computed in float32.
    promoted_ops: list[str] = field(default_factory=list)
    names: list[str] = field(default_factory=list)  # the graph's output names, in that order

    def by_name(self, names: list[str]) -> list[np.ndarray]:
        """The outputs in the order of `names` (a Keras signature's), where the graph has them all."""
        if not set(names) <= set(self.names):
            return self.outputs
        return [self.outputs[self.names.index(name)] for name in names]

    @property
    def native(self) -> bool:
        """Whether the runtime ran the file as written (not an emulated copy)."""
        return not self.promoted_ops and self.runtime != RUNTIME_REFERENCE

    @property
    def checked_with(self) -> str:
        """What really ran the file, in words for a report."""
        if self.promoted_ops:
            return f"{self.runtime} on an emulated copy"
        return self.runtime


ORT_CPU, ORT_CUDA = "CPUExecutionProvider", "CUDAExecutionProvider"


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


def missing_kernel(exc) -> bool:
    from onnxruntime.capi import onnxruntime_pybind11_state as ort_state

    return isinstance(exc, ort_state.NotImplemented) or "NOT_IMPLEMENTED" in str(exc)


def run_onnx(path, feeds: dict[str, np.ndarray], *, emulate_16bit: bool = True) -> OnnxRun:
    """Run an ONNX file on ONNX Runtime (CUDA when it loads, else CPU).

    Where ONNX Runtime has no kernel for an op in its dtype (bfloat16 on
    CPU), it runs a copy with 16-bit ops computed in float32 instead
    (`promote_16bit_ops`, reported in `promoted_ops`), or with
    `emulate_16bit=False` or if that fails too, the file on onnx.reference.
    """
    import onnxruntime as ort

    path = pathlib.Path(path)
    try:
        proto = onnx.load(path)
    except (OSError, DecodeError) as exc:
        raise MpconvertError(f"cannot read ONNX file {path}: {exc}") from exc
    expected = fed_inputs(proto)
    if sorted(feeds) != sorted(expected):
        raise MpconvertError(
            f"ONNX inputs are {expected}, but data was given for {sorted(feeds)}",
            hint="name the sample data after the model's inputs",
        )

    providers = session_providers()
    options = ort.SessionOptions()
    options.log_severity_level = 3  # else ORT warns about each node it puts on CPU

    def ort_run(model_bytes):
        session = ort.InferenceSession(model_bytes, options, providers=providers)
        return list(session.run(None, feeds)), "onnxruntime:" + session.get_providers()[0]

    names = [o.name for o in proto.graph.output]
    try:
        outputs, runtime = ort_run(proto.SerializeToString())
        return OnnxRun(outputs=outputs, runtime=runtime, names=names)
    except Exception as exc:
        if not missing_kernel(exc):
            raise

    if emulate_16bit:
        promoted, ops = promote_16bit_ops(proto)
        try:
            outputs, runtime = ort_run(promoted.SerializeToString())
            return OnnxRun(outputs=outputs, runtime=runtime, promoted_ops=ops, names=names)
        except Exception as exc:
            if not missing_kernel(exc):
                raise

    from onnx.reference import ReferenceEvaluator

    outputs = [np.asarray(o) for o in ReferenceEvaluator(proto).run(None, feeds)]
    _check_declared(proto, outputs)
    return OnnxRun(outputs=outputs, runtime=RUNTIME_REFERENCE, names=names)


def _check_declared(proto, outputs):
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


def promote_16bit_ops(proto):
    """A copy of `proto` with every op on 16-bit floats computed in float32.

    Each op's 16-bit inputs are widened (exactly) and its outputs rounded
    back to their 16-bit type, so the tensors between ops keep the values
    and types of the original graph; only the arithmetic inside each op is
    float32, as on bfloat16 hardware. For checking a file on a runtime that
    lacks 16-bit kernels, not for writing: the file would grow a Cast pair
    per op. Returns (copy, sorted op types promoted).
    """

    def on_16bit(node, schema, bound):
        half = [(n, t) for n, t, dtype in bound if dtype in HALF_TYPES]
        if all("tensor(float)" in allowed_types(schema, t) for _, t in half):
            return [n for n, _ in half]
        return None

    proto = copy.deepcopy(proto)
    return proto, sorted(wrap_ops(proto, on_16bit))
