"""Export (mixed-precision) Keras models to ONNX, and run ONNX files.

This is the only module that imports tf2onnx. What tf2onnx 1.17 gets wrong
for mixed precision, and how it is handled here:

* It maps tf.bfloat16 to ONNX FLOAT16 for every type it writes itself (Cast
  targets, constants it creates such as Relu6's Clip bounds) while weights
  keep their real BFLOAT16 type: the graph is invalid. Its optimizers also
  crash on bfloat16 constants and give up silently, leaving a Transpose
  around every conv. `_tf2onnx_knows_bfloat16` fixes both at the source for
  the duration of a conversion; `retype_float16_as_bfloat16` repairs the
  graph afterwards should that patch not apply.
* ONNX opsets before 22 have no bfloat16 Conv, pooling and a few
  activations, and tf2onnx cannot write opset 22: `insert_float32_islands`
  computes those ops in float32 between Casts, keeping bfloat16 weights.
* `large_model=True` calls np.product, gone in NumPy 2, so graphs over the
  2 GiB protobuf limit cannot be written.

Keras 3 models meet three more gaps, handled in `_from_concrete_function`
and `_register_tf2onnx_handlers`: tensors the trace captures (EfficientNet's
Normalization statistics) became extra graph inputs, grouped convolutions
(ConvNeXt) are XLA-compiled calls that were never inlined, and the exact
GELU's Erfc had no handler. That code also skips what made tf2onnx slow on
25M-parameter models (a deep copy of the graph before each optimizer,
re-importing the frozen graph, reading 16-bit weights element by element):
ResNet50 converts in 7.7 s instead of 17.5 s, ConvNeXtTiny in 15 s instead
of 27 s, on 2 cores.

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

import contextlib
import copy
import functools
import logging
import os
import pathlib
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import onnx
import tensorflow as tf
from google.protobuf.message import DecodeError
from onnx import TensorProto, helper, numpy_helper

from mpconvert.errors import MpconvertError
from mpconvert.signature import signature_of

# tf2onnx 1.17 writes opsets up to 18. 17 is the newest TensorRT 8.x and most
# mobile runtimes accept, and bfloat16 coverage is the same as at 18.
DEFAULT_OPSET = 17
MIN_OPSET = 13  # the first opset with bfloat16 in most op schemas
MAX_OPSET = 18

RUNTIME_CUDA = "onnxruntime:CUDAExecutionProvider"
RUNTIME_CPU = "onnxruntime:CPUExecutionProvider"
RUNTIME_REFERENCE = "onnx.reference"

_PROTOBUF_LIMIT = 2**31 - 1
_HALF_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
# Target types that hold every value of the source type exactly.
_EXACT_WIDENING = {
    TensorProto.FLOAT16: {TensorProto.FLOAT, TensorProto.DOUBLE},
    TensorProto.BFLOAT16: {TensorProto.FLOAT, TensorProto.DOUBLE},
    TensorProto.FLOAT: {TensorProto.DOUBLE},
}
# doc_string of the Casts that end a float32 island, so later passes know
# that rounding was added by us.
_ISLAND_EXIT = "mpconvert: end of float32 island"


@dataclass(frozen=True)
class OnnxExport:
    path: pathlib.Path
    bytes: int
    opset: int
    input_names: list[str]
    output_names: list[str]
    initializer_dtypes: dict[str, int]  # ONNX dtype name -> number of initializers
    repairs: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class OnnxRun:
    outputs: list[np.ndarray]
    runtime: str
    # Non-empty when ONNX Runtime could not run the file as written (missing
    # 16-bit kernels) and ran a copy with these op types computed in float32.
    promoted_ops: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------
# export


def keras_to_onnx(model, input_specs: list[tf.TensorSpec], path: pathlib.Path, *,
                  opset: int = DEFAULT_OPSET) -> OnnxExport:
    """Convert a Keras 3 or tf-keras model to a checked ONNX file at `path`.

    Inputs are named after `input_specs` (unnamed ones after the model's
    inputs), outputs after the model's output layers; both stay float32.
    """
    path = pathlib.Path(path)
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise MpconvertError(
            f"ONNX opset {opset} is not supported: tf2onnx 1.17 writes opsets {MIN_OPSET} to {MAX_OPSET}",
            hint=f"use --opset {DEFAULT_OPSET}, or --export savedmodel")
    specs = _named_specs(model, input_specs)
    output_names = _output_names(model)

    proto, tf_dtypes, patched = _convert(model, specs, output_names, opset)
    _reject_unconverted_ops(proto, model)
    _check_inputs(proto, specs)

    repairs: list[str] = []
    if tf.bfloat16 in tf_dtypes:
        if patched:
            repairs.append("converted with tf.bfloat16 mapped to ONNX BFLOAT16 "
                           "(tf2onnx 1.17 maps it to FLOAT16 and skips optimizing bfloat16 graphs)")
        # With float16 in the TF graph as well, a FLOAT16 here may be real;
        # nothing tells them apart and the checker reports any clash.
        if tf.float16 not in tf_dtypes:
            repairs.extend(retype_float16_as_bfloat16(proto))
    for repair in _REPAIRS:
        repairs.extend(repair(proto))
    _check(proto, model)

    tmp = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        onnx.save(proto, tmp)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)
        raise MpconvertError(f"cannot write the ONNX file {path}: {exc.strerror or exc}",
                             hint="choose a writable output path") from exc

    dtypes = Counter(TensorProto.DataType.Name(t.data_type) for t in proto.graph.initializer)
    return OnnxExport(
        path=path,
        bytes=path.stat().st_size,
        opset=opset,
        input_names=[i.name for i in proto.graph.input],
        output_names=[o.name for o in proto.graph.output],
        initializer_dtypes=dict(sorted(dtypes.items())),
        repairs=repairs,
    )


def _named_specs(model, input_specs):
    # tf2onnx names graph inputs after the specs; an unnamed spec would
    # become "args_0", which no caller could feed by a predictable name.
    model_names = [spec.name for spec in signature_of(model).inputs]
    specs = []
    for i, spec in enumerate(input_specs):
        if not isinstance(spec, tf.TensorSpec):
            raise MpconvertError(f"input spec {i} is {type(spec).__name__}, not a tf.TensorSpec")
        name = spec.name or (model_names[i] if i < len(model_names) else f"input_{i}")
        specs.append(tf.TensorSpec(spec.shape, spec.dtype, name=name))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise MpconvertError(f"ONNX input names must be unique, got {names}",
                             hint="give each input spec its own name")
    return specs


def _output_names(model):
    return [spec.name for spec in signature_of(model).outputs] or None


def _convert(model, specs, output_names, opset):
    import tf2onnx  # slow to import; only exports need it

    def call(*args):
        outputs = model(args[0] if len(args) == 1 else list(args), training=False)
        if isinstance(outputs, dict):
            names, flat = list(outputs), list(outputs.values())
        else:
            flat = tf.nest.flatten(outputs)
            if output_names and len(output_names) == len(flat):
                names = output_names
            else:
                names = ["output"] if len(flat) == 1 else [f"output_{i}" for i in range(len(flat))]
        # Mixed precision promises float32 at the edges, also when the last
        # layer was left in the 16-bit policy (keras.applications models).
        flat = [tf.cast(t, tf.float32) if t.dtype in (tf.float16, tf.bfloat16) else t for t in flat]
        # tf2onnx names graph outputs after the keys of a returned dict.
        return dict(zip(_unique(names), flat))

    fn = tf.function(call, input_signature=specs, autograph=False)
    try:
        concrete = fn.get_concrete_function(*specs)
    except Exception as exc:  # tracing fails on shapes/dtypes the model rejects
        given = ", ".join(f"{s.name}: {s.dtype.name}{s.shape}" for s in specs)
        raise MpconvertError(f"the model cannot be called on inputs ({given}): {type(exc).__name__}: {exc}",
                             hint="pass input specs matching the model's inputs") from exc
    graph_def = concrete.graph.as_graph_def()

    tf2onnx_logger, root = logging.getLogger("tf2onnx"), logging.getLogger()
    quiet = _FromPackage(os.path.dirname(tf2onnx.__file__))
    # The logger settings, the dtype patch and tf2onnx's handler table are
    # process-wide state.
    with _TF2ONNX_LOCK:
        _register_tf2onnx_handlers()
        level = tf2onnx_logger.level
        # tf2onnx logs unsupported ops and swallowed optimizer tracebacks at
        # ERROR/WARNING, some through the root logger ("onnxruntime only
        # support float32 type for Gemm rewriter" for every 16-bit RNN); the
        # caller gets an MpconvertError or a repair note instead.
        tf2onnx_logger.setLevel(logging.CRITICAL)
        root.addFilter(quiet)
        try:
            with _tf2onnx_knows_bfloat16() as patched:
                proto = _from_concrete_function(concrete, opset)
        except Exception as exc:
            raise MpconvertError(f"tf2onnx could not convert the model: {type(exc).__name__}: {exc}",
                                 hint="use --export savedmodel") from exc
        finally:
            root.removeFilter(quiet)
            tf2onnx_logger.setLevel(level)

    # TF flattens a dict in key order; put outputs back in the model's order.
    by_name = {o.name: o for o in proto.graph.output}
    wanted = _unique(output_names) if output_names else []
    if wanted and set(wanted) == set(by_name) and wanted != list(by_name):
        ordered = [copy.deepcopy(by_name[name]) for name in wanted]
        del proto.graph.output[:]
        proto.graph.output.extend(ordered)
    return proto, _graph_dtypes(graph_def), patched


def _from_concrete_function(concrete, opset):
    """tf2onnx.convert.from_function, minus two of its failures on Keras 3 models.

    * from_function lists every placeholder of the function as a graph input,
      captured tensors included. Keras 3 keeps some state as plain tensors
      (Normalization's mean and variance in EfficientNet), which the trace
      captures; they would become ONNX inputs no caller can feed. Here only
      the function's own arguments are inputs, and freezing turns the
      captured tensors into constants like the variables.
    * Keras 3 runs grouped convolutions (ConvNeXt's depthwise convs) in a
      `tf.function(jit_compile=True)`. Grappler never inlines a call marked
      for XLA, so it would reach tf2onnx as a StatefulPartitionedCall, which
      has no ONNX mapping. The markers are dropped from the frozen graph so
      the call is inlined; XLA is a TF runtime choice, ONNX has no use for it.
    """
    from tf2onnx import convert as tf2onnx_convert
    from tf2onnx import optimizer, tf_loader, tfonnx

    captured = {id(t) for t in concrete.graph.internal_captures}
    input_names = [t.name for t in concrete.inputs if id(t) not in captured and t.dtype != tf.resource]
    output_names = [t.name for t in concrete.outputs if t.dtype != tf.resource]
    renames = tf2onnx_convert.tensor_names_from_structed(concrete, input_names, output_names)
    with tf.device("/cpu:0"):
        # tf2onnx's freezing for large models: it returns the GraphDef without
        # importing it back as a function (4 s of 40 on ConvNeXtTiny), and
        # freezes non-resource captures too (they are not skipped like table
        # handles), so no placeholder but the arguments survives.
        graph_def = tf_loader.convert_variables_to_constants_large_model(concrete)
        # What from_function does when TF's own freezing trips over a state
        # update (AssignVariableOp) that inference never runs.
        graph_def = tf_loader.fix_freezing_errors(graph_def)
        _drop_xla_markers(graph_def)
        graph_def = tf_loader.fix_freezing_errors_part2(graph_def)
        with tf.Graph().as_default():  # grappler's meta-graph export refuses eager mode
            graph_def = tf_loader.tf_optimize(input_names, output_names, graph_def)
        _pack_16bit_constants(graph_def)

        def onnx_graph():
            with tf.Graph().as_default() as tf_graph:
                tf.import_graph_def(graph_def, name="")
                return tfonnx.process_tf_graph(tf_graph, continue_on_error=True, opset=opset,
                                               input_names=input_names, output_names=output_names,
                                               tensors_to_rename=renames)

        # tf2onnx deep-copies the whole graph, weights included, before each
        # of its optimizers so that one that raises can be skipped (12 s of
        # 40 on ConvNeXtTiny). They rarely raise with bfloat16 known to
        # tf2onnx, so the copies are only made when a first pass without them
        # fails.
        try:
            graph = optimizer.optimize_graph(onnx_graph(), catch_errors=False)
        except Exception:
            graph = optimizer.optimize_graph(onnx_graph(), catch_errors=True)
        return graph.make_model(f"converted from {concrete.name}")


def _pack_16bit_constants(graph_def):
    """Store 16-bit constants as raw bytes, as TF does other dtypes.

    Grappler writes the float16/bfloat16 weights it folds out of Casts into
    the repeated `half_val` field, which TF's MakeNdarray reads element by
    element with np.fromiter, and tf2onnx reads every constant twice: 3.5 s
    of ConvNeXtTiny's export. np.array reads the same field in milliseconds.
    """
    for node in list(graph_def.node) + [n for fn in graph_def.library.function for n in fn.node_def]:
        if node.op != "Const" or "value" not in node.attr:
            continue
        tensor = node.attr["value"].tensor
        if tensor.tensor_content or not tensor.half_val or tensor.dtype not in (tf.float16.as_datatype_enum,
                                                                                tf.bfloat16.as_datatype_enum):
            continue
        size = int(np.prod([d.size for d in tensor.tensor_shape.dim], dtype=np.int64))
        bits = np.array(tensor.half_val, dtype=np.uint16)
        if len(bits) < size:  # the last value repeats to fill the shape
            bits = np.concatenate([bits, np.full(size - len(bits), bits[-1], dtype=np.uint16)])
        tensor.tensor_content = bits.tobytes()  # host byte order, as TF writes it
        tensor.ClearField("half_val")


# Marks of a function compiled by XLA. tf.function(jit_compile=True) also
# sets _noinline on it; grappler inlines neither kind of call.
_XLA_MARKERS = ("_XlaMustCompile", "_XlaCompile")


def _drop_xla_markers(graph_def):
    def marked(attrs):
        return any(name in attrs and attrs[name].b for name in _XLA_MARKERS)

    nodes = list(graph_def.node)
    for fn in graph_def.library.function:
        nodes.extend(fn.node_def)
        if marked(fn.attr):
            # Only XLA's own _noinline: one the model's author set stays.
            for name in _XLA_MARKERS + ("_noinline",):
                fn.attr.pop(name, None)
    for node in nodes:
        if marked(node.attr):
            for name in _XLA_MARKERS + ("_noinline",):
                node.attr.pop(name, None)


def _register_tf2onnx_handlers():
    """Teach tf2onnx the TF ops it lacks that Keras models use (once).

    Only ops tf2onnx has no handler for at all, so a tf2onnx release that
    adds one keeps its own.
    """
    from tf2onnx import utils
    from tf2onnx.handler import tf_op

    known = {name for opsets in tf_op.get_opsets().values() for table in opsets for name in table}
    if "Erfc" not in known:
        # Keras's exact GELU is 0.5 * x * erfc(-x / sqrt(2)) (ConvNeXt).
        # Where erfc is tiny, 1 - erf(x) keeps only erf's absolute precision
        # (2^-11 in float16, 2^-8 in bfloat16); GELU multiplies it by x/2 in
        # its negative tail, whose outputs are near 0 either way.
        @tf_op("Erfc")
        class _Erfc:
            @classmethod
            def version_13(cls, ctx, node, **kwargs):
                # opset 13: the first with Erf and Sub for bfloat16.
                dtype = ctx.get_dtype(node.input[0])
                one = ctx.make_const(utils.make_name(node.name + "/one"),
                                     np.array(1, dtype=utils.map_onnx_to_numpy_type(dtype)))
                erf = ctx.make_node("Erf", [node.input[0]], op_name_scope=node.name,
                                    shapes=[ctx.get_shape(node.input[0])], dtypes=[dtype])
                ctx.replace_inputs(node, [one.output[0], erf.output[0]])
                node.type = "Sub"


class _FromPackage(logging.Filter):
    """Drops log records emitted by code under one directory."""

    def __init__(self, directory):
        super().__init__()
        self.directory = os.path.join(directory, "")

    def filter(self, record):
        return not record.pathname.startswith(self.directory)


def _unique(names):
    seen, out = set(), []
    for name in names:
        new, i = name, 0
        while new in seen:
            i += 1
            new = f"{name}_{i}"
        seen.add(new)
        out.append(new)
    return out


_TF2ONNX_LOCK = threading.Lock()


@contextlib.contextmanager
def _tf2onnx_knows_bfloat16():
    """Give tf2onnx's dtype tables a bfloat16 entry during one conversion.

    tf2onnx 1.17 maps tf.bfloat16 to FLOAT16, and has no numpy type for
    BFLOAT16, so its constant folding and transpose optimizer raise on
    bfloat16 weights and are skipped (MobileNetV2: 121 Transposes left, 1
    with the entries). The tables are module globals, restored afterwards;
    callers hold _TF2ONNX_LOCK. Yields whether the patch applied.
    """
    try:
        import ml_dtypes
        from tensorflow.core.framework import types_pb2
        from tf2onnx import tf_utils, utils

        entries = [(tf_utils.TF_TO_ONNX_DTYPE, types_pb2.DT_BFLOAT16, TensorProto.BFLOAT16),
                   (utils.ONNX_TO_NUMPY_DTYPE, TensorProto.BFLOAT16, ml_dtypes.bfloat16)]
    except (ImportError, AttributeError):
        yield False
        return
    missing = object()
    saved = [(table, key, table.get(key, missing)) for table, key, _ in entries]
    try:
        for table, key, value in entries:
            table[key] = value
        yield True
    finally:
        for table, key, old in saved:
            if old is missing:
                table.pop(key, None)
            else:
                table[key] = old


def _graph_dtypes(graph_def):
    """Every TF dtype named in a GraphDef's node attributes, functions included."""
    nodes = list(graph_def.node)
    for fn in graph_def.library.function:
        nodes.extend(fn.node_def)
    enums = set()
    for node in nodes:
        for attr in node.attr.values():
            kind = attr.WhichOneof("value")
            if kind == "type":
                enums.add(attr.type)
            elif kind == "list":
                enums.update(attr.list.type)
            elif kind == "tensor":
                enums.add(attr.tensor.dtype)
    return {tf.dtypes.as_dtype(e) for e in enums if e}


def _layer_of(node_name, model):
    """Best guess at the Keras layer a converted node came from.

    A layer inside a nested model is named "outer/inner", as --keep-float32
    accepts it.
    """
    with contextlib.suppress(Exception):
        # Keras 3 on TF enters each layer's name scope twice, so TF makes
        # "dense" unique as "dense_1", and a layer named "dense_1" shows as
        # "dense_1_1": with both layers present, "dense_1" is "dense". tf-keras
        # enters it once; only a shared layer's later calls get a suffix.
        keras3 = any(c.__module__.split(".")[0] == "keras" for c in type(model).__mro__)
        found, layers = [], {layer.name: layer for layer in model.layers}
        for part in node_name.split("/"):
            names = [part]
            base, _, suffix = part.rpartition("_")
            if base and suffix.isdigit():
                names = [base, part] if keras3 else [part, base]
            layer = next((layers[n] for n in names if n in layers), None)
            if layer is None:
                continue
            found.append(layer.name)
            layers = {inner.name: inner for inner in getattr(layer, "layers", None) or []}
            if not layers:
                break
        return "/".join(found) or None
    return None


# Call wrappers are unconvertible because of what they call, so they are
# named after the ops that are unconvertible themselves.
_CALL_OPS = ("PartitionedCall", "StatefulPartitionedCall")


def _reject_unconverted_ops(proto, model):
    # process_tf_graph runs with continue_on_error=True, as from_function
    # has it: ops tf2onnx cannot map stay in the graph under their TensorFlow
    # op type, so that all of them can be named here with their layers.
    opsets = {o.domain or "": o.version for o in proto.opset_import}
    first = {}  # op type -> first node of that type
    for g in _graphs(proto.graph):
        for n in g.node:
            if _schema(n, opsets.get(n.domain or "", 1)) is None:
                first.setdefault(n.op_type, n)
    if not first:
        return
    ops = sorted(first, key=lambda op: (op in _CALL_OPS, op))
    blamed = []
    for op in ops:
        layer = _layer_of(first[op].name, model)
        blamed.append(f"{op} (node '{first[op].name}'" + (f" in layer '{layer}')" if layer else ")"))
    layer = _layer_of(first[ops[0]].name, model)
    hint = "use --export savedmodel"
    if layer:
        hint += f", or --keep-float32 {layer} if the op only fails in 16-bit"
    noun = "op" if len(ops) == 1 else "ops"
    raise MpconvertError(f"tf2onnx cannot convert the TensorFlow {noun} {', '.join(blamed)} to ONNX", hint=hint)


def _fed_inputs(proto):
    """Graph inputs a caller feeds (older exporters also list initializers as inputs)."""
    inits = {t.name for t in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in inits]


def _check_inputs(proto, specs):
    # A graph input beyond the model's own (a tensor the trace captured and
    # freezing left as a placeholder) is one that no caller knows to feed.
    got = _fed_inputs(proto)
    want = [s.name for s in specs]
    if got != want:
        extra = [n for n in got if n not in want]
        raise MpconvertError(f"the ONNX graph's inputs are {got}, not the model's {want}"
                             + (f": {extra} came from tensors the model captures" if extra else ""),
                             hint="use --export savedmodel")


def _check(proto, model):
    if proto.ByteSize() > _PROTOBUF_LIMIT:
        raise MpconvertError("the ONNX model is over the 2 GiB protobuf limit, and tf2onnx's external-data "
                             "mode does not work with NumPy 2", hint="use --export savedmodel")
    try:
        onnx.checker.check_model(proto, full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        msg = str(exc).strip().splitlines()[0]
        layer = next((_layer_of(n.name, model) for n in proto.graph.node if n.name and n.name in msg), None)
        hint = "use --export savedmodel" + (f", or --keep-float32 {layer}" if layer else "")
        raise MpconvertError(f"the converted ONNX graph is invalid: {msg}", hint=hint) from exc


# --------------------------------------------------------------------------
# ModelProto helpers


def _opset(proto):
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def _schema(node, opset):
    try:
        return onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except onnx.defs.SchemaError:
        return None


def _bound_tensors(node, schema):
    """(tensor name, type string, is_output) for each tensor a node binds."""
    for names, formals, is_output in ((node.input, schema.inputs, False),
                                      (node.output, schema.outputs, True)):
        for i, name in enumerate(names):
            if not name:  # an omitted optional input
                continue
            if i < len(formals):
                formal = formals[i]
            elif formals and formals[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
                formal = formals[-1]
            else:
                continue
            yield name, formal.type_str, is_output


def _allowed(schema, type_str):
    """Type strings a formal parameter accepts ("T" -> its constraint)."""
    for tc in schema.type_constraints:
        if tc.type_param_str == type_str:
            return set(tc.allowed_type_strs)
    return {type_str}


def _tensor_types(proto):
    """Element type of every tensor, subgraphs included, by shape inference.

    One dict for all scopes: ONNX forbids a subgraph to reuse an outer name.
    """
    types = {}
    for g in _graphs(onnx.shape_inference.infer_shapes(proto, strict_mode=False).graph):
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types[vi.name] = vi.type.tensor_type.elem_type
        for init in g.initializer:
            types[init.name] = init.data_type
    return types


def _cast_to(node):
    return next(a.i for a in node.attribute if a.name == "to")


def _name_factory(proto):
    used = set()
    for g in _graphs(proto.graph):
        used |= {t.name for t in g.initializer} | {v.name for v in list(g.input) + list(g.output)}
        for node in g.node:
            used.update(node.input)
            used.update(node.output)
            used.add(node.name)

    def fresh(base):
        name, i = base, 0
        while name in used:
            i += 1
            name = f"{base}_{i}"
        used.add(name)
        return name

    return fresh


def _wrap_ops(proto, select, exit_doc=""):
    """Run the ops `select` picks in float32, in every (sub)graph.

    select(node, schema, bound) gets the node's bound (tensor, type string,
    element type) triples and returns the 16-bit tensors to widen/round, or
    nothing. Returns a Counter of wrapped op types.
    """
    opset = _opset(proto)
    types = _tensor_types(proto)
    fresh = _name_factory(proto)
    wrapped = Counter()
    # Subgraphs first: rebuilding a parent's node list copies its nodes, and
    # with them the subgraphs, so later edits through old references are lost.
    for graph in reversed(list(_graphs(proto.graph))):
        widened, nodes = {}, []  # an up-Cast is only visible in its own scope
        for node in graph.node:
            schema = _schema(node, opset)
            tensors = None
            # Control flow (Loop, If, Scan) passes types to its bodies, which
            # are wrapped op by op themselves.
            if schema is not None and node.op_type != "Cast" and not any(_subgraphs(node)):
                bound = [(n, t, types.get(n)) for n, t, _ in _bound_tensors(node, schema)]
                tensors = select(node, schema, bound)
            if not tensors:
                nodes.append(node)
                continue
            before, after = _wrap_in_float32(node, list(dict.fromkeys(tensors)), types, fresh, widened, exit_doc)
            nodes.extend(before + [node] + after)
            wrapped[node.op_type] += 1
        if len(nodes) != len(graph.node):
            del graph.node[:]
            graph.node.extend(nodes)
    return wrapped


def _wrap_in_float32(node, tensors, types, fresh, widened, exit_doc=""):
    """Make `node` compute in float32: Cast `tensors` among its inputs up,
    and its outputs among `tensors` back to their type. Returns the Casts to
    put (before, after) the node. `widened` shares one up-Cast per tensor."""
    before, after = [], []
    inputs, outputs = list(node.input), list(node.output)
    for name in tensors:
        if name in outputs:
            wide = fresh(name + "__f32")
            outputs[outputs.index(name)] = wide
            after.append(helper.make_node("Cast", [wide], [name], to=types[name],
                                          name=fresh(name + "__from_f32"), doc_string=exit_doc or None))
        if name in inputs:
            if name not in widened:
                widened[name] = fresh(name + "__as_f32")
                before.append(helper.make_node("Cast", [name], [widened[name]], to=TensorProto.FLOAT,
                                               name=fresh(name + "__to_f32")))
            inputs = [widened[name] if n == name else n for n in inputs]
    del node.input[:]
    node.input.extend(inputs)
    del node.output[:]
    node.output.extend(outputs)
    return before, after


def _subgraphs(node):
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def _rename_uses(graph, old, new):
    # Subgraphs (If/Loop bodies) may read outer-scope tensors by name.
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for sub in _subgraphs(node):
            _rename_uses(sub, old, new)


def _reads(node):
    """Tensor names a node reads, including from inside its subgraphs."""
    names = {i for i in node.input if i}
    for sub in _subgraphs(node):
        for inner in sub.node:
            names |= _reads(inner)
    return names


def _prune(graph):
    """Drop nodes and initializers no graph output depends on."""
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed |= _reads(node)
    keep.reverse()
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
    inits = [t for t in graph.initializer if t.name in needed]
    if len(inits) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(inits)


# --------------------------------------------------------------------------
# Repair passes. Each mutates a ModelProto and returns descriptions of what
# it changed (empty: nothing to do), so they can run on any export.


def retype_float16_as_bfloat16(proto) -> list[str]:
    """Turn every FLOAT16 in the graph into BFLOAT16.

    Only for graphs whose TensorFlow source had bfloat16 and no float16 at
    all (the caller checks): there, every FLOAT16 is tf2onnx's mis-mapping.
    That includes constants tf2onnx makes itself, such as the 0/6 bounds of
    Relu6's Clip, which look exactly like float16 weights; so this cannot be
    decided from the ONNX graph alone by type inference.
    """
    counts = Counter()
    for graph in _graphs(proto.graph):
        for node in graph.node:
            for attr in node.attribute:
                if attr.name in ("to", "dtype") and attr.type == onnx.AttributeProto.INT \
                        and attr.i == TensorProto.FLOAT16:
                    attr.i = TensorProto.BFLOAT16
                    counts[f"{node.op_type} target"] += 1
                elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT16:
                    attr.t.CopyFrom(_as_bfloat16(attr.t))
                    counts[f"{node.op_type} constant"] += 1
        for init in graph.initializer:
            if init.data_type == TensorProto.FLOAT16:
                init.CopyFrom(_as_bfloat16(init))
                counts["initializer"] += 1
        for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
            if vi.type.tensor_type.elem_type == TensorProto.FLOAT16:
                vi.type.tensor_type.elem_type = TensorProto.BFLOAT16
                counts["type annotation"] += 1
    if not counts:
        return []
    what = ", ".join(f"{n} {kind}(s)" for kind, n in sorted(counts.items()))
    return [f"retyped FLOAT16 as BFLOAT16 (tf2onnx writes tf.bfloat16 as float16): {what}"]


def _graphs(graph):
    yield graph
    for node in graph.node:
        for sub in _subgraphs(node):
            yield from _graphs(sub)


def _as_bfloat16(tensor):
    import ml_dtypes

    values = numpy_helper.to_array(tensor).astype(np.float32).astype(ml_dtypes.bfloat16)
    return numpy_helper.from_array(values, tensor.name)


def insert_float32_islands(proto) -> list[str]:
    """Compute ops whose schema lacks bfloat16 at the model's opset in float32.

    Conv, pooling and some activations only allow bfloat16 from opset 22,
    which tf2onnx cannot write. Their bfloat16 inputs, weights included (so
    the file keeps 16-bit weights), are Cast to float32 and their outputs
    Cast back, so the rest of the graph keeps its types.
    """
    def lacking_bfloat16(node, schema, bound):
        lacking = {t for _, t, dtype in bound if dtype == TensorProto.BFLOAT16
                   and "tensor(bfloat16)" not in _allowed(schema, t) and "tensor(float)" in _allowed(schema, t)}
        # All tensors bound to one type parameter must change type together.
        return [n for n, t, dtype in bound if t in lacking and dtype == TensorProto.BFLOAT16]

    opset = _opset(proto)
    wrapped = _wrap_ops(proto, lacking_bfloat16, exit_doc=_ISLAND_EXIT)
    if not wrapped:
        return []
    ops = ", ".join(f"{n} {op}" for op, n in sorted(wrapped.items()))
    return [f"computed {ops} in float32 between Casts (no bfloat16 in their opset-{opset} schema); "
            "their weights stay bfloat16"]


def fold_cast_pairs(proto) -> list[str]:
    """Bypass back-to-back Casts that return to the starting type.

    Cast(a -> wider) -> Cast(wider -> a) changes nothing. A float32 island's
    exit Cast to bfloat16 followed by a Cast to float32 (a Conv feeding a
    float32 BatchNormalization) is bypassed too: that rounding came from
    `insert_float32_islands`, not from the model.
    """
    g = proto.graph
    types = _tensor_types(proto)
    producer = {out: n for n in g.node for out in n.output}
    graph_outputs = {o.name for o in g.output}
    folded = 0
    for node in g.node:
        if node.op_type != "Cast" or node.output[0] in graph_outputs:
            continue
        first = producer.get(node.input[0])
        if first is None or first.op_type != "Cast":
            continue
        origin = first.input[0]
        t0, t1 = types.get(origin), _cast_to(first)
        if t0 != _cast_to(node):
            continue
        if t1 in _EXACT_WIDENING.get(t0, ()) or first.doc_string == _ISLAND_EXIT:
            _rename_uses(g, node.output[0], origin)
            folded += 1
    if not folded:
        return []
    _prune(g)
    return [f"bypassed {folded} back-to-back Cast pair(s) that returned to their input type"]


_REPAIRS = (insert_float32_islands, fold_cast_pairs)


# --------------------------------------------------------------------------
# running


@functools.cache
def _cuda_usable() -> bool:
    """Whether ONNX Runtime's CUDA provider really loads here (cached).

    onnxruntime-gpu lists CUDAExecutionProvider even without CUDA, then logs
    a load error through its process-wide logger (whatever the session's
    log level) and runs on CPU. The probe runs in a child process so that
    text goes nowhere and this process's logger settings stay untouched.
    """
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return False
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "probe",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)
    probe = ("import sys, onnxruntime as ort\n"
             "s = ort.InferenceSession(sys.stdin.buffer.read(),"
             " providers=['CUDAExecutionProvider', 'CPUExecutionProvider'])\n"
             "print(s.get_providers()[0])\n")
    try:
        result = subprocess.run([sys.executable, "-c", probe], input=model.SerializeToString(),
                                capture_output=True, timeout=300, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return result.returncode == 0 and result.stdout.decode().strip().endswith("CUDAExecutionProvider")


def _missing_kernel(exc) -> bool:
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
    expected = _fed_inputs(proto)
    if sorted(feeds) != sorted(expected):
        raise MpconvertError(f"ONNX inputs are {expected}, but data was given for {sorted(feeds)}",
                             hint="name the sample data after the model's inputs")

    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if _cuda_usable() else ["CPUExecutionProvider"]
    options = ort.SessionOptions()
    options.log_severity_level = 3  # else ORT warns about each node it puts on CPU

    def ort_run(model_bytes):
        session = ort.InferenceSession(model_bytes, options, providers=providers)
        return list(session.run(None, feeds)), "onnxruntime:" + session.get_providers()[0]

    try:
        outputs, runtime = ort_run(proto.SerializeToString())
        return OnnxRun(outputs=outputs, runtime=runtime)
    except Exception as exc:
        if not _missing_kernel(exc):
            raise

    if emulate_16bit:
        promoted, ops = promote_16bit_ops(proto)
        try:
            outputs, runtime = ort_run(promoted.SerializeToString())
            return OnnxRun(outputs=outputs, runtime=runtime, promoted_ops=ops)
        except Exception as exc:
            if not _missing_kernel(exc):
                raise

    from onnx.reference import ReferenceEvaluator

    outputs = [np.asarray(o) for o in ReferenceEvaluator(proto).run(None, feeds)]
    _check_declared(proto, outputs)
    return OnnxRun(outputs=outputs, runtime=RUNTIME_REFERENCE)


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
                     "or use --export savedmodel")


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
        half = [(n, t) for n, t, dtype in bound if dtype in _HALF_TYPES]
        if all("tensor(float)" in _allowed(schema, t) for _, t in half):
            return [n for n, _ in half]
        return None

    proto = copy.deepcopy(proto)
    return proto, sorted(_wrap_ops(proto, on_16bit))
