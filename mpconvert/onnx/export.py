"""Export (mixed-precision) Keras models to ONNX with tf2onnx.

The only module in mpconvert that imports tf2onnx. What tf2onnx 1.17 gets
wrong for mixed precision, and how it is handled here:

* It maps tf.bfloat16 to ONNX FLOAT16 for every type it writes itself while
  weights keep their real BFLOAT16 type, and its optimizers crash on
  bfloat16 constants and give up silently, leaving a Transpose around every
  conv. `tf2onnx_knows_bfloat16` fixes both at the source for the duration
  of a conversion; the passes in repairs.py fix what is left (see there).
* `large_model=True` calls np.product, gone in NumPy 2, and freezes every
  weight into one GraphDef, which protobuf caps at 2 GiB. Models whose
  weights pass `external_data_over` are traced with their weights as extra
  inputs instead, which become initializers in an external data file
  (external.py).

Keras 3 models meet three more gaps, handled in `_from_concrete_function`
and `handlers.register_tf2onnx_handlers`: tensors the trace captures (EfficientNet's
Normalization statistics) became extra graph inputs, grouped convolutions
(ConvNeXt) are XLA-compiled calls that were never inlined, and the exact
GELU's Erfc had no handler. That code also skips what made tf2onnx slow on
25M-parameter models (a deep copy of the graph before each optimizer,
re-importing the frozen graph, reading 16-bit weights element by element):
ResNet50 converts in 7.7 s instead of 17.5 s, ConvNeXtTiny in 15 s instead
of 27 s, on 2 cores. `_lean_tf2onnx`, `_take_weights` and `checks.check` skip the
copies of every weight that tf2onnx and onnx make and never read (most of
the time went to page faults on fresh copies): the whole export of
Dense(4096)x2 takes 3.1-3.4 s instead of 13.6-14.5 s, ResNet50's 4.3-4.5 s
instead of 8.2-8.4 s: 3.4-3.7x and 3.4-3.9x faster than a bare
tf2onnx.convert.from_keras (bench/onnx_export_speed.py, two runs).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import pathlib
import threading
from collections import Counter
from dataclasses import dataclass, field

import onnx
import tensorflow as tf
from onnx import TensorProto, helper

from mpconvert.data.signature import signature_of
from mpconvert.onnx.edges import edge_casts, float16_io
from mpconvert.onnx.empty_batch import serve_empty_batch
from mpconvert.onnx.external import as_pending_initializers, data_file_of, reader, weights_apart, write_weights
from mpconvert.onnx.graph_checks import (
    check,
    check_file,
    check_inputs,
    layer_of,
    refuse_inexpressible,
    reject_unconverted_ops,
)
from mpconvert.onnx.graphdef import computing_nodes, drop_xla_markers, graph_dtypes, pack_16bit_constants, take_weights
from mpconvert.onnx.handlers import ML_DOMAIN, ML_OPSET, register_tf2onnx_handlers
from mpconvert.onnx.repairs import REPAIRS, retype_float16_as_bfloat16
from mpconvert.options.export import DEFAULT_ONNX_EXTERNAL_DATA, DEFAULT_OPSET, check_opset
from mpconvert.system.errors import MpconvertError
from mpconvert.system.writing import replace_atomically


@dataclass(frozen=True)
class OnnxExport:
    path: pathlib.Path
    bytes: int
    opset: int
    input_names: list[str]
    output_names: list[str]
    initializer_dtypes: dict[str, int]  # ONNX dtype name -> number of initializers
    repairs: list[str] = field(default_factory=list)
    io: str = "float32"  # the element type of its float inputs and outputs (--onnx-io)
    edges: dict = field(default_factory=dict)  # edges.edge_casts: the casts at its inputs and outputs
    # The external data files beside it, by name (empty: the weights are in the .onnx file); `bytes` counts them.
    external_data: tuple[str, ...] = ()


# Names of the traced function's extra inputs that stand in for a large model's weights.
_STAND_IN = "mpconvert_weight_"


def keras_to_onnx(
    model,
    input_specs: list[tf.TensorSpec],
    path: pathlib.Path,
    *,
    opset: int = DEFAULT_OPSET,
    io: str = "float32",
    external_data_over: int = DEFAULT_ONNX_EXTERNAL_DATA,
    keras3: bool = True,
) -> OnnxExport:
    """Convert a Keras 3 or tf-keras model to a checked ONNX file at `path`.

        Inputs are named after `input_specs` (unnamed ones after the model's
        inputs), outputs after the model's output layers; both float32, or
        float16 with `io="float16"`. `keras3`: the model is a Keras 3 one (the
    caller's kind knows; a tf-keras model cannot be traced with its weights
    apart). A Keras 3 model whose weights pass
        `external_data_over` bytes has them written to PATH.data beside it
        (external.py).
    """
    path = pathlib.Path(path)
    check_opset(opset)
    specs = _named_specs(model, input_specs)
    output_names = _output_names(model)
    apart = weights_apart(model, external_data_over, keras3)

    def unit_of(node_name):
        return layer_of(node_name, model)

    proto, tf_dtypes, patched = _convert(model, specs, output_names, opset, unit_of, apart)
    reject_unconverted_ops(proto, unit_of)
    values = None
    if apart:
        names = [i.name for i in proto.graph.input if i.name.startswith(_STAND_IN)]
        values = {name: reader(apart[int(name.removeprefix(_STAND_IN).split(":")[0])]) for name in names}
        as_pending_initializers(proto, names)
    check_inputs(proto, specs)

    return _finish(proto, tf_dtypes, patched, unit_of, path, opset, io, values)


def _finish(
    proto, tf_dtypes, patched: bool, unit_of, path: pathlib.Path, opset: int, io: str, weights=None
) -> OnnxExport:
    """Repair, check and write the converted graph; `unit_of(node name)` names a failing node's layer or node.

    `weights`: name -> reader of each pending initializer (external.py), written to an external data file.
    """
    repairs: list[str] = []
    if tf.bfloat16 in tf_dtypes:
        if patched:
            repairs.append(
                "converted with tf.bfloat16 mapped to ONNX BFLOAT16 "
                "(tf2onnx 1.17 maps it to FLOAT16 and skips optimizing bfloat16 graphs)"
            )
        # With float16 in the TF graph as well, a FLOAT16 here may be real;
        # nothing tells them apart and the checker reports any clash.
        if tf.float16 not in tf_dtypes:
            repairs.extend(retype_float16_as_bfloat16(proto))
    _shape_outputs(proto)
    if io == "float16":
        repairs.extend(float16_io(proto))
    for repair in REPAIRS:
        repairs.extend(repair(proto))
    edges = edge_casts(proto)  # the model's own edges: the empty-batch padding adds no Cast
    repairs.extend(serve_empty_batch(proto))
    external: tuple[str, ...] = ()
    if weights is None:
        replace_atomically(path, check(proto, unit_of), "the ONNX file")  # the bytes onnx.save writes
    else:
        external = _write_apart(proto, weights, unit_of, path)

    dtypes = Counter(TensorProto.DataType.Name(t.data_type) for t in proto.graph.initializer)
    return OnnxExport(
        path=path,
        bytes=path.stat().st_size + sum((path.parent / name).stat().st_size for name in external),
        opset=opset,
        input_names=[i.name for i in proto.graph.input],
        output_names=[o.name for o in proto.graph.output],
        initializer_dtypes=dict(sorted(dtypes.items())),
        repairs=repairs,
        io=io,
        edges=edges,
        external_data=external,
    )


def _write_apart(proto, weights, unit_of, path: pathlib.Path) -> tuple[str, ...]:
    """The weights to PATH.data, then the graph to PATH, checked by path (the checker reads the data file's
    size from there); both files are removed when anything fails."""
    data = data_file_of(path)
    try:
        write_weights(proto, weights, path)
        replace_atomically(path, proto.SerializeToString(), "the ONNX file")
        check_file(path, proto, unit_of)
    except BaseException:
        path.unlink(missing_ok=True)
        data.unlink(missing_ok=True)
        raise
    return (data.name,)


def _shape_outputs(proto) -> None:
    """Give graph outputs without a shape the one ONNX's shape inference finds (a table lookup's: TensorFlow
    leaves it unknown, and the checker requires one)."""
    missing = [o for o in proto.graph.output if not o.type.tensor_type.HasField("shape")]
    if not missing:
        return
    inferred = {o.name: o for o in onnx.shape_inference.infer_shapes(proto, strict_mode=False).graph.output}
    for output in missing:
        found = inferred.get(output.name)
        if found is not None and found.type.tensor_type.HasField("shape"):
            output.type.tensor_type.shape.CopyFrom(found.type.tensor_type.shape)


def graph_to_onnx(
    graph_def,
    input_tensors,
    output_tensors,
    path: pathlib.Path,
    *,
    opset: int = DEFAULT_OPSET,
    unit_of=lambda n: None,
    io: str = "float32",
):
    """A frozen (and rewritten) GraphDef to a checked ONNX file: the graph-level kind's export.

    Inputs and outputs keep the GraphDef's tensor names ("x:0"); bfloat16
    ops are mapped as for Keras models. `unit_of(node name)` names the node
    to keep float32 when a node fails.
    """
    import tf2onnx

    path = pathlib.Path(path)
    check_opset(opset)

    # The ops no ONNX operator expresses are refused before tf2onnx spends its time on them.
    refuse_inexpressible(computing_nodes(graph_def, output_tensors), unit_of)

    def convert():
        proto, _ = tf2onnx.convert.from_graph_def(
            graph_def, input_names=list(input_tensors), output_names=list(output_tensors), opset=opset
        )
        return proto

    proto, patched = _quietly(convert, "the graph")
    reject_unconverted_ops(proto, unit_of)
    return _finish(proto, graph_dtypes(graph_def), patched, unit_of, path, opset, io)


def _quietly(convert, what: str, lean: bool = False):
    """`convert()` under tf2onnx's process-wide settings: (its ONNX proto, whether bfloat16 was patched in).

    The logger settings, the dtype patch and tf2onnx's handler table are
    process-wide state, so conversions take turns. tf2onnx logs unsupported
    ops and swallowed optimizer tracebacks at ERROR/WARNING, some through
    the root logger ("onnxruntime only support float32 type for Gemm
    rewriter" for every 16-bit RNN); the caller gets an MpconvertError or a
    repair note instead.
    """
    import tf2onnx

    tf2onnx_logger, root = logging.getLogger("tf2onnx"), logging.getLogger()
    quiet = _FromPackage(os.path.dirname(tf2onnx.__file__))
    with _TF2ONNX_LOCK:
        register_tf2onnx_handlers()
        level = tf2onnx_logger.level
        tf2onnx_logger.setLevel(logging.CRITICAL)
        root.addFilter(quiet)
        try:
            with tf2onnx_knows_bfloat16() as patched, _lean_tf2onnx() if lean else contextlib.nullcontext():
                return convert(), patched
        except MpconvertError:
            raise
        except Exception as exc:
            raise MpconvertError(
                f"tf2onnx could not convert {what}: {type(exc).__name__}: {exc}", hint="use --export savedmodel"
            ) from exc
        finally:
            root.removeFilter(quiet)
            tf2onnx_logger.setLevel(level)


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
        raise MpconvertError(f"ONNX input names must be unique, got {names}", hint="give each input spec its own name")
    return specs


def _output_names(model):
    return [spec.name for spec in signature_of(model).outputs] or None


def _convert(model, specs, output_names, opset, unit_of, apart=()):
    """The model traced and converted; the variables in `apart` are traced as extra inputs after `specs`."""
    signature = signature_of(model)
    weight_specs = [tf.TensorSpec(v.shape, v.dtype, name=f"{_STAND_IN}{i}") for i, v in enumerate(apart)]

    def call(*args):
        inputs, weights = args[: len(specs)], args[len(specs) :]
        with _stateless(apart, weights):
            returned = model(signature.feed(inputs), training=False)
        if isinstance(returned, dict) and not (output_names and len(output_names) == len(returned)):
            names, flat = list(returned), list(returned.values())
        else:
            flat = tf.nest.flatten(signature.output_list(returned))
            if output_names and len(output_names) == len(flat):
                names = output_names
            else:
                names = ["output"] if len(flat) == 1 else [f"output_{i}" for i in range(len(flat))]
        # Mixed precision promises float32 at the edges, also when the last
        # layer was left in the 16-bit policy (keras.applications models).
        flat = [tf.cast(t, tf.float32) if t.dtype in (tf.float16, tf.bfloat16) else t for t in flat]
        # tf2onnx names graph outputs after the keys of a returned dict.
        return dict(zip(_unique(names), flat))

    fn = tf.function(call, input_signature=[*specs, *weight_specs], autograph=False)
    try:
        concrete = fn.get_concrete_function(*specs, *weight_specs)
    except Exception as exc:  # tracing fails on shapes/dtypes the model rejects
        given = ", ".join(f"{s.name}: {s.dtype.name}{s.shape}" for s in specs)
        raise MpconvertError(
            f"the model cannot be called on inputs ({given}): {type(exc).__name__}: {exc}",
            hint="pass input specs matching the model's inputs",
        ) from exc
    graph_def = concrete.graph.as_graph_def()
    # The ops no ONNX operator expresses are refused before tf2onnx spends its time on them.
    refuse_inexpressible(computing_nodes(graph_def, [t.name for t in concrete.outputs]), unit_of)
    tables = _lookup_tables(model)

    proto, patched = _quietly(lambda: _from_concrete_function(concrete, opset, tables), "the model", lean=True)

    # TF flattens a dict in key order; put outputs back in the model's order.
    by_name = {o.name: o for o in proto.graph.output}
    wanted = _unique(output_names) if output_names else []
    if wanted and set(wanted) == set(by_name) and wanted != list(by_name):
        ordered = [copy.deepcopy(by_name[name]) for name in wanted]
        del proto.graph.output[:]
        proto.graph.output.extend(ordered)
    return proto, graph_dtypes(graph_def), patched


def _stateless(variables, values):
    """Keras 3 reads `values` wherever the model reads `variables` (nothing when there are none)."""
    if not variables:
        return contextlib.nullcontext()
    import keras

    return keras.StatelessScope(state_mapping=list(zip(variables, values)))


def _lookup_tables(model) -> dict[int, tuple]:
    """The hash tables of a model's lookup layers (IntegerLookup, StringLookup): id(resource handle) -> (keys, values).

    A traced function reaches a table through a captured resource handle,
    which carries no contents; the contents go to tf2onnx by the name its
    placeholder is given (`_from_concrete_function`).
    """
    found = {}
    layers = model._flatten_layers(include_self=False) if hasattr(model, "_flatten_layers") else model.layers
    for layer in layers:
        table = getattr(layer, "lookup_table", None)
        if table is None or not hasattr(table, "export"):
            continue
        keys, values = table.export()
        found[id(table.resource_handle)] = (keys.numpy(), values.numpy(), table.resource_handle)
    return found


def _from_concrete_function(concrete, opset, tables=None):
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
    from tf2onnx.tf_utils import HashTableInfo, replace_placeholders_with_tables

    captured = {id(t) for t in concrete.graph.internal_captures}
    input_names = [t.name for t in concrete.inputs if id(t) not in captured and t.dtype != tf.resource]
    # Each lookup table's captured handle becomes a HashTableV2 with a shared name, its contents handed
    # to tf2onnx as an initialized table: what tf2onnx's own SavedModel loader does for tables.
    placeholders: dict = {}
    initialized: dict = {}
    for external, internal in concrete.graph.captures:
        if id(external) in (tables or {}):
            keys, values, _ = tables[id(external)]
            shared = f"mpconvert_table_{len(initialized)}".encode()
            key_type, value_type = tf.as_dtype(keys.dtype), tf.as_dtype(values.dtype)
            placeholders[internal.op.name] = HashTableInfo(
                shared, key_type.as_datatype_enum, value_type.as_datatype_enum
            )
            initialized[shared] = (keys, values)
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
        drop_xla_markers(graph_def)
        replace_placeholders_with_tables(graph_def, placeholders)
        graph_def = tf_loader.fix_freezing_errors_part2(graph_def)
        with tf.Graph().as_default():  # grappler's meta-graph export refuses eager mode
            graph_def = tf_loader.tf_optimize(input_names, output_names, graph_def)
        pack_16bit_constants(graph_def)
        weights = take_weights(graph_def)

        def onnx_graph():
            with tf.Graph().as_default() as tf_graph:
                tf.import_graph_def(graph_def, name="")
                return tfonnx.process_tf_graph(
                    tf_graph,
                    continue_on_error=True,
                    opset=opset,
                    input_names=input_names,
                    output_names=output_names,
                    tensors_to_rename=renames,
                    const_node_values=weights,
                    initialized_tables=initialized,
                    extra_opset=[helper.make_opsetid(ML_DOMAIN, ML_OPSET)] if initialized else None,
                )

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


@contextlib.contextmanager
def _lean_tf2onnx():
    """Skip two copies of every weight that tf2onnx makes and never reads.

    * After each of its optimizers (24 runs) and in make_graph, tf2onnx
      writes every node's attributes back into its NodeProto, the weights of
      Const nodes included, although make_graph builds initializers from
      the attributes and never reads a Const's NodeProto. Other nodes are
      still written: their NodeProtos are the graph, and a node with a body
      graph (If, Loop) rebuilds it there. Dense(4096)x2 exports in 3.1-3.4 s
      instead of 9.3-13.2 s (optimizers: 0.14 s instead of 5-7 s), ResNet50
      in 4.3-4.5 s instead of 5.7-7.6 s.
    * resolve_functions converts the whole graph, weights included, only to
      find the functions it calls; with none in the graph (grappler inlines
      them) the answer is known. Dense(4096)x2: 3.1-3.4 s instead of
      3.5-3.9 s; no measurable change on ResNet50.

    Module globals, restored afterwards; callers hold _TF2ONNX_LOCK.
    """
    from tf2onnx import graph as tf2onnx_graph
    from tf2onnx import tfonnx

    def update_proto(self, external_tensor_storage=None):
        for node in self._nodes:
            if not node.is_const():
                node.update_proto(external_tensor_storage)

    def resolve_functions(tf_graph):
        if not tf_graph._functions:  # pylint: disable=protected-access
            return []
        return resolve_all(tf_graph)

    saved_update, resolve_all = tf2onnx_graph.Graph.update_proto, tfonnx.resolve_functions
    tf2onnx_graph.Graph.update_proto, tfonnx.resolve_functions = update_proto, resolve_functions
    try:
        yield
    finally:
        tf2onnx_graph.Graph.update_proto, tfonnx.resolve_functions = saved_update, resolve_all


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
def tf2onnx_knows_bfloat16():
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

        entries = [
            (tf_utils.TF_TO_ONNX_DTYPE, types_pb2.DT_BFLOAT16, TensorProto.BFLOAT16),
            (utils.ONNX_TO_NUMPY_DTYPE, TensorProto.BFLOAT16, ml_dtypes.bfloat16),
        ]
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
