"""The OpenVINO IR (openvino/model.xml + model.bin): float16 weights, float32 inputs and outputs, a 16-bit hint.

OpenVINO serves a float32-computing graph in bfloat16 on AMX/avx512_bf16
CPUs (and float16 on Intel GPUs) when it is compiled with
INFERENCE_PRECISION_HINT; neither TensorFlow nor ONNX Runtime's CPU
provider uses those units as well. So the IR is the converted model's own
SavedModel (its fine-tuned, padded weights, written by the kind into a
temporary folder) converted by OpenVINO, made to compute in float32 again
(`float32_compute`: the 16-bit Converts dropped, 16-bit constants widened),
its weights stored in float16 (`compress_to_fp16`), and the 16-bit type the
converted model computed in recorded in its runtime info, as the hint.

Why from the SavedModel, made float32, and not as it is or from the ONNX
file (MobileNetV2 at 160x160, batch 32, mixed_bfloat16, 2-core Xeon with
AMX-BF16, compiled with the bf16 hint): the mixed SavedModel as OpenVINO
converts it served in 128 ms with outputs 0.81 away from the converted
model's; made float32 63-66 ms and 5.5e-7 away, as fast as a hand-built
compile of the float32 original with the same hint (62-72 ms); and
OpenVINO returned 0 rows for 32 from mpconvert's bfloat16 ONNX file.

The hint is the converted model's 16-bit type where this machine's CPU
lists the units for it among OpenVINO's OPTIMIZATION_CAPABILITIES, else
f32, and the report names that fallback. Where the IR serves, `verify`
compiles it for the converted model's type where that device has the units.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mpconvert.data.signature import Signature
from mpconvert.export.artifacts import parity, serving_batches
from mpconvert.export.formats.base import Format, Writes
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.convert import ExportOptions
from mpconvert.report.sections import Artifact
from mpconvert.report.sections.details import OpenVinoDetails
from mpconvert.runners.isolated import Isolated
from mpconvert.runners.openvino import (
    CAPABILITY,
    COMPUTE_PATH,
    FALLBACK,
    HINT_PATH,
    OpenVinoRunner,
    capabilities,
    openvino,
)
from mpconvert.runners.savedmodel import DEFAULT_SIGNATURE
from mpconvert.system.errors import MpconvertError, first_line

XML, BIN = "model.xml", "model.bin"
CHECK_DEVICE = "CPU"
SOURCE = "the converted model's SavedModel, converted by OpenVINO and made to compute in float32"
_SIXTEEN = ("bf16", "f16")


@dataclass(frozen=True)
class OpenVinoIR:
    """A written IR folder: what it computes in, the hint it records, and its inputs' and outputs' names."""

    compute: str  # the converted model's 16-bit type ("bf16", "f16"), or "f32" where no op computed in one
    precision: str  # the INFERENCE_PRECISION_HINT recorded for the check's device
    fallback: str | None  # why `precision` is not `compute`, where it is not
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


class OpenVino(Format[OpenVinoIR, OpenVinoDetails]):
    name = ArtifactKind.OPENVINO
    filename = "openvino"
    details = OpenVinoDetails
    runtime = "openvino"
    # OpenVINO 2026.4 died of SIGFPE on an unmasked Bidirectional(LSTM)'s ONNX file fed 0 rows: a file is run
    # in a child, where such a death is this artifact's failure, named.
    isolated = True

    def write(self, writes: Writes, path: Path, options: ExportOptions) -> OpenVinoIR:
        return write_openvino(writes, path)

    def recorded(self, written: OpenVinoIR) -> OpenVinoDetails:
        return OpenVinoDetails(
            weights="float16",
            compute=written.compute,
            precision=written.precision,
            fallback=written.fallback,
            source=SOURCE,
            input_names=written.inputs,
            output_names=written.outputs,
        )

    def open(
        self,
        path: Path,
        details: OpenVinoDetails,
        signature: Signature,
        providers: Sequence[str] = (),
        device: str | None = None,
    ) -> OpenVinoRunner:
        """Without a `device`, as the conversion's check compiled it (the hint the IR records); with one (`verify`
        on the serving machine), for the converted model's 16-bit type where that device has the units."""
        inputs = details.input_names or tuple(s.name for s in signature.inputs)
        outputs = details.output_names or tuple(s.name for s in signature.outputs)
        if device is None:
            return OpenVinoRunner(path / XML, inputs, outputs, CHECK_DEVICE, details.precision)
        return OpenVinoRunner(path / XML, inputs, outputs, device)

    def check(
        self, written: OpenVinoIR, path: Path, rows: list[np.ndarray], expected: list[np.ndarray], signature: Signature
    ) -> Artifact:
        recorded = self.recorded(written)
        runner = self.open(path, recorded, signature)  # with the hint chosen for this machine, as the IR records
        with Isolated(runner) as isolated:
            run = isolated.run(rows)
            batches = serving_batches(isolated, rows, expected)
        ran = run.compiled
        details = dataclasses.replace(
            recorded,
            device=runner.device,
            ran_precision=ran.precision if ran else None,
            execution_devices=ran.devices if ran else None,
        )
        return parity(self.name, path, expected, run.outputs, run.checked_with, details, signature, batches=batches)


OPENVINO = OpenVino()

# The frontend's own summary of what it could not convert. Its first line is an
# assertion's location ("Check 'false' failed at .../unconverted_ops_report.cpp"),
# which names nothing; the summary names the ops. Seen with OpenVINO 2026.4.1 on
# StringLookup/IntegerLookup models: "Conversion is failed for: HashTableV2, If"
# (a table read inside the SavedModel's empty-batch branch).
_FAILED_OPS = re.compile(r"Conversion is failed for:\s*([^\n]+)")
_FRONTEND_ERROR = re.compile(r"\[TensorFlow Frontend\][^\n]*")


def unconverted(text: str) -> MpconvertError:
    """OpenVINO's conversion error as one line naming the ops it could not convert and its own reason."""
    ops = _FAILED_OPS.search(text)
    reason = _FRONTEND_ERROR.search(text)
    if ops is None:
        return MpconvertError(f"OpenVINO cannot convert the model: {first_line(Exception(text), 300)}", hint=_SERVE)
    why = f" ({reason[0][:200]})" if reason else ""
    return MpconvertError(f"OpenVINO cannot convert the model's {ops[1].strip()} ops{why}", hint=_SERVE)


_SERVE = "serve the SavedModel or the ONNX file (--export savedmodel,onnx)"


def write_openvino(writes: Writes, path: Path, device: str = CHECK_DEVICE) -> OpenVinoIR:
    """The IR folder at `path` from the SavedModel `writes` makes, its hint chosen for `device`."""
    ov = openvino()
    with tempfile.TemporaryDirectory(prefix="mpconvert-openvino-") as tmp:
        saved = Path(tmp) / "savedmodel"
        name = writes.savedmodel(saved)
        _cast_bfloat16_constants(saved)
        try:
            model = ov.convert_model(str(saved) if name == DEFAULT_SIGNATURE else _signature(saved, name))
        except Exception as exc:  # OpenVINO's frontend errors: an op it has no conversion for
            raise unconverted(str(exc)) from None
    compute = float32_compute(model)
    precision, fallback = hint_for(compute, capabilities(device), device)
    model.set_rt_info(precision, HINT_PATH)
    model.set_rt_info(compute, COMPUTE_PATH)
    path.mkdir(parents=True, exist_ok=True)
    ov.save_model(model, str(path / XML), compress_to_fp16=True)
    inputs = _names(model.inputs, [s.name for s in writes.signature.inputs])
    outputs = _names(model.outputs, [s.name for s in writes.signature.outputs])
    return OpenVinoIR(compute, precision, fallback, inputs, outputs)


def _cast_bfloat16_constants(saved: Path) -> int:
    """Give each bfloat16 Const node of the SavedModel at `saved` as a float32 Const and a Cast, in place.

    OpenVINO 2026.4's TensorFlow frontend reads no bfloat16 constant ("Encountered unknown element type
    bf16"): an LSTM's initial state zeros in a mixed_bfloat16 model are two, inside a function TensorFlow
    did not fold. A Cast it converts (to a Convert, which `float32_compute` then drops). Returns how many.
    """
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import saved_model_pb2

    pb = saved / "saved_model.pb"
    model = saved_model_pb2.SavedModel.FromString(pb.read_bytes())
    changed = 0
    for meta in model.meta_graphs:
        graph = meta.graph_def
        changed += _cast_constants(graph.node, types_pb2, "")
        for function in graph.library.function:
            changed += _cast_constants(function.node_def, types_pb2, ":output:")
    if changed:
        pb.write_bytes(model.SerializeToString())
    return changed


def _cast_constants(nodes: Any, types: Any, output: str) -> int:
    """`_cast_bfloat16_constants` in one list of NodeDefs; `output`: how a function's nodes name a Const's
    output (":output:"; a Cast's is ":y:"), "" in the main graph (by node name, alike for both)."""
    import tensorflow as tf

    wanted = [n for n in nodes if n.op == "Const" and n.attr["dtype"].type == types.DT_BFLOAT16]
    for node in wanted:
        value = tf.make_ndarray(node.attr["value"].tensor).astype(np.float32)
        wide = nodes.add()
        wide.CopyFrom(node)
        wide.name = f"{node.name}/float32"
        wide.attr["dtype"].type = types.DT_FLOAT
        wide.attr["value"].tensor.CopyFrom(tf.make_tensor_proto(value))
        del node.input[:]  # control inputs stay on the float32 Const
        node.op = "Cast"
        node.ClearField("attr")
        node.attr["SrcT"].type, node.attr["DstT"].type = types.DT_FLOAT, types.DT_BFLOAT16
        node.attr["Truncate"].b = False
        node.input.append(f"{wide.name}{output}0" if output else wide.name)
        if output:
            old, new = f"{node.name}{output}", f"{node.name}:y:"
            for user in nodes:
                user.input[:] = [new + i[len(old) :] if i.startswith(old) else i for i in user.input]
    return len(wanted)


def hint_for(compute: str, units: frozenset[str], device: str = CHECK_DEVICE) -> tuple[str, str | None]:
    """The INFERENCE_PRECISION_HINT for a model that computed in `compute` on a device listing `units`,
    and the fallback named where the device lacks them."""
    if compute not in _SIXTEEN or CAPABILITY[compute] in units:
        return compute, None
    listed = ", ".join(sorted(units)) or "nothing"
    return FALLBACK, (
        f"this machine's {device} lists no {CAPABILITY[compute]} among OpenVINO's optimization capabilities "
        f"({listed}): the IR asks {FALLBACK}; a device with {CAPABILITY[compute]} units runs it in {compute} "
        "under `verify`"
    )


def float32_compute(model: Any) -> str:
    """Make `model` (an ov.Model) compute in float32, in place; returns the 16-bit type it computed in.

    Every Convert to a 16-bit float from a float is dropped (from an integer it converts to f32 instead),
    every Convert to f32 from a float too, and every 16-bit constant is widened to f32, in the graph and in
    the bodies of its If and Loop ops; types are inferred again after. "f32" where nothing was 16-bit.
    """
    ov = openvino()
    seen: Counter[str] = Counter()
    _widen(model, ov, seen)
    try:
        model.validate_nodes_and_infer_types()
    except RuntimeError as exc:
        raise MpconvertError(
            f"OpenVINO's graph of the model cannot be made to compute in float32: {first_line(exc, 300)}",
            hint="serve the SavedModel or the ONNX file (--export savedmodel,onnx)",
        ) from None
    return seen.most_common(1)[0][0] if seen else "f32"


def _widen(model: Any, ov: Any, seen: Counter[str]) -> None:
    from openvino import opset13 as ops

    sixteen = {ov.Type.bf16: "bf16", ov.Type.f16: "f16"}
    for op in model.get_ordered_ops():
        for body in _bodies(op):
            _widen(body, ov, seen)
        kind = op.get_type_name()
        if kind not in ("Constant", "Convert"):
            continue
        to = op.get_output_element_type(0)
        if kind == "Constant":
            if to in sixteen:
                seen[sixteen[to]] += 1
                # get_data() alone gives a bfloat16 constant's bits read as float16: asked for float32, its values.
                wide = ops.constant(op.get_data(dtype=np.float32), dtype=np.float32)
                _bypass(op, wide.output(0))
            continue
        source = op.input_value(0)
        # A 16-bit graph input keeps its type (the signature's): a Convert from it stays a conversion.
        sixteen_input = source.get_node().get_type_name() == "Parameter" and source.get_element_type() in sixteen
        from_float = source.get_element_type().is_real() and not sixteen_input
        if to in sixteen:
            seen[sixteen[to]] += 1
            _bypass(op, source if from_float else ops.convert(source, np.float32).output(0))
        elif to == ov.Type.f32 and from_float:
            _bypass(op, source)


def _bodies(op: Any) -> list[Any]:
    """The graphs an If, Loop or TensorIterator op holds (none for any other op)."""
    if op.get_type_name() == "If":
        return [op.get_then_body(), op.get_else_body()]
    return [op.get_function()] if op.get_type_name() in ("Loop", "TensorIterator") else []


def _bypass(op: Any, replacement: Any) -> None:
    for target in list(op.output(0).get_target_inputs()):
        target.replace_source_output(replacement)


def _signature(saved: Path, name: str) -> Any:
    """A SavedModel's signature other than serving_default, as the concrete function OpenVINO converts."""
    import tensorflow as tf

    return tf.saved_model.load(str(saved)).signatures[name]


def _names(ports: Sequence[Any], wanted: Sequence[str]) -> tuple[str, ...]:
    """Each port's name in the IR in the signature's order: the one named like the signature, else in order."""
    names = []
    for i, want in enumerate(wanted):
        named = next((p for p in ports if want in p.get_names()), None)
        port = named if named is not None else ports[min(i, len(ports) - 1)]
        names.append(want if named is not None else port.get_any_name())
    return tuple(names)
