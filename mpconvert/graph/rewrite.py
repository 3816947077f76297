"""A frozen graph rewritten to a 16-bit policy, node by node, on the principles of TensorFlow's own pass.

Grappler's auto_mixed_precision sorts ops into allow (compute-bound:
MatMul, Conv2D, ...), infer (cheap, follow their inputs: BiasAdd, Relu,
Add, pooling, reshapes) and deny (numerically sensitive: Softmax, Exp,
reductions). Its float16 pass only runs with a GPU in the cluster and its
CPU pass only emulates (float32 kernels between Casts), so the same rules
are applied here directly, which gives real float16 and bfloat16 kernels in
the saved graph on any machine:

1. every allow op computing in float32 goes to 16 bits, unless
   --keep-float32 matches its node name or op type;
2. an infer op follows when one of its float inputs is 16-bit and every
   other is 16-bit or a constant;
3. whatever produces a signature output (through Identity nodes) stays
   float32, as do deny ops and everything else, so inputs, outputs, Softmax
   and Sigmoid outputs stay float32 as for Keras models;
4. a float32 constant read only by 16-bit nodes is stored in 16 bits (half
   the bytes); every other edge between the two worlds gets a Cast.

Dtypes are read per port, from the op defs, as TensorFlow's pass does
(its TypeAttrId): an edge carries what its producer's output argument
says (Tparams for GatherV2, DstT for Cast, one entry of a type list, a
fixed type) and its consumer takes what its input argument says. An edge
gets a Cast exactly when the two differ after the retyping, whatever the
ops are, and check_edges verifies every edge of the result before anything
imports it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

ALLOW = {
    "MatMul",
    "BatchMatMul",
    "BatchMatMulV2",
    "BatchMatMulV3",
    "Conv2D",
    "Conv3D",
    "DepthwiseConv2dNative",
    "Conv2DBackpropInput",
    "Einsum",
}
INFER = {
    "BiasAdd",
    "Relu",
    "Relu6",
    "Elu",
    "Selu",
    "LeakyRelu",
    "Add",
    "AddV2",
    "Sub",
    "Mul",
    "MaxPool",
    "AvgPool",
    "Identity",
    "Reshape",
    "Squeeze",
    "ExpandDims",
    "ConcatV2",
    "Transpose",
    "Pad",
    "Tanh",
    "Maximum",
    "Minimum",
}
PASS_THROUGH = {"Identity", "IdentityN", "Snapshot", "StopGradient"}


@dataclass(frozen=True)
class NodeDecision:
    """One compute node's policy, named like a Keras layer decision (the report's `layers`)."""

    name: str
    class_name: str  # the op type
    policy: str | None
    pinned: str | None  # why it stays float32, None when converted


def producer(ref: str) -> tuple[str, int]:
    name, _, index = ref.lstrip("^").partition(":")
    return name, int(index or 0)


DT_FLOAT = 1  # types_pb2.DT_FLOAT, without importing TensorFlow at import time


class RewriteError(RuntimeError):
    """The rewrite made a graph whose edges TensorFlow would refuse: mpconvert's bug, never the model's."""


def _is_float(node) -> bool:
    """Whether an allow or infer op computes in float32: its T, the one dtype attribute the rewrite changes.

    BatchMatMulV3 (Ta, Tb, Tout) is left alone: TensorFlow 2.21 has a
    float16 kernel for it only on GPUs, so its rewrite could not be run
    and checked here.
    """
    return "T" in node.attr and node.attr["T"].type == DT_FLOAT


class _OpDefs:
    """Op defs by op type: TensorFlow's registry, then the graph's own functions (a call node's op is its name)."""

    def __init__(self, graph_def):
        self.functions = {f.signature.name: f.signature for f in graph_def.library.function}

    def get(self, op: str):
        from tensorflow.python.framework import op_def_registry

        return op_def_registry.get(op) or self.functions.get(op)


def _arg_dtypes(node, op_def, args) -> list[int] | None:
    """One DataType per port of `args` (an op def's input_arg or output_arg), as `node`'s attributes resolve them.

    An argument's dtype is fixed, a type attribute, or a type list, and a
    number attribute repeats it: TensorFlow's own mapping from ports to
    dtypes (auto_mixed_precision.cc's TypeAttrId). None when an attribute
    is missing and has no default.
    """
    defaults = {a.name: a.default_value for a in op_def.attr if a.HasField("default_value")}

    def attr(name):
        return node.attr[name] if name in node.attr else defaults.get(name)

    dtypes: list[int] = []
    for arg in args:
        if arg.type_list_attr:
            value = attr(arg.type_list_attr)
            if value is None:
                return None
            dtypes.extend(value.list.type)
            continue
        if arg.type_attr:
            value = attr(arg.type_attr)
            if value is None:
                return None
            dtype = value.type
        else:
            dtype = arg.type
        count = 1
        if arg.number_attr:
            value = attr(arg.number_attr)
            if value is None:
                return None
            count = value.i
        dtypes.extend([dtype] * count)
    return dtypes


def _ports(node, op_defs: _OpDefs) -> tuple[list[int], list[int]] | None:
    """(the dtype each data input takes, the dtype each output gives), or None for an op without an op def."""
    op_def = op_defs.get(node.op)
    if op_def is None:
        return None
    inputs = _arg_dtypes(node, op_def, op_def.input_arg)
    outputs = _arg_dtypes(node, op_def, op_def.output_arg)
    if inputs is None or outputs is None or len(inputs) != len(_data_inputs(node)):
        return None
    return inputs, outputs


def _data_inputs(node) -> list[str]:
    return [ref for ref in node.input if not ref.startswith("^")]


def _dtype_name(dtype: int) -> str:
    import tensorflow as tf

    try:
        return tf.as_dtype(dtype).name
    except TypeError:
        return f"DataType {dtype}"


def check_edges(graph_def) -> None:
    """Raise RewriteError unless node names are unique, every edge's two dtypes agree and its op allows each.

    Both ends are read from the op defs (the producer's output port, the
    consumer's input port), independently of how the rewrite decided them,
    so a missing Cast is caught here with the edge named rather than when
    TensorFlow first imports the graph. Nodes whose op has no op def
    (none in a graph TensorFlow froze) cannot be checked and are skipped.
    """
    op_defs = _OpDefs(graph_def)
    ports = {node.name: _ports(node, op_defs) for node in graph_def.node}
    ops = {node.name: node.op for node in graph_def.node}
    counts = Counter(node.name for node in graph_def.node)
    twice = sorted(name for name, count in counts.items() if count > 1)
    if twice:  # an edge names its producer, so none can be judged until names are unique
        raise RewriteError(f"the 16-bit rewrite made an invalid graph: two nodes are named {', '.join(twice)}")
    problems = []
    for node in graph_def.node:
        op_def = op_defs.get(node.op)
        if op_def is None:
            continue
        for attr_def in op_def.attr:
            allowed = attr_def.allowed_values.list.type
            if attr_def.type == "type" and allowed and attr_def.name in node.attr:
                if node.attr[attr_def.name].type not in allowed:
                    dtype = _dtype_name(node.attr[attr_def.name].type)
                    problems.append(f"{node.name} ({node.op}) has {attr_def.name}={dtype}, which its op does not allow")
        data = _data_inputs(node)
        mine = ports[node.name]
        if mine is None:  # an op def, but the node does not fit it
            problems.append(f"{node.name} ({node.op}) lacks a dtype attribute or has the wrong number of inputs")
            continue
        for i, ref in enumerate(data):
            name, index = producer(ref)
            if name not in ports:
                problems.append(f"input {i} of {node.name} ({node.op}) reads {ref}, which is not in the graph")
                continue
            port = ports[name]
            if port is None:
                continue
            gives = port[1]
            if index >= len(gives):
                problems.append(f"input {i} of {node.name} ({node.op}) reads {ref}, an output its producer lacks")
            elif gives[index] != mine[0][i]:
                problems.append(
                    f"input {i} of {node.name} ({node.op}) takes {_dtype_name(mine[0][i])} "
                    f"but {ref} ({ops[name]}) gives {_dtype_name(gives[index])}"
                )
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise RewriteError(f"the 16-bit rewrite made an invalid graph: {'; '.join(problems[:5])}{more}")


def candidates(graph_def) -> list[str]:
    """The nodes the rewrite may put in 16 bits: allow and infer ops computing in float32."""
    return [n.name for n in graph_def.node if n.op in ALLOW | INFER and n.op not in PASS_THROUGH and _is_float(n)]


def overflowing(graph_def, values: dict[str, float], limit: float) -> dict[str, str]:
    """{node: why} for the nodes whose float32 outputs pass `limit`, and the candidates that read them.

    A reader would cast the huge value to 16 bits on its way in, so it
    overflows too: it is kept with the node, as the Keras lint keeps a
    layer's readers.
    """
    found = {
        name: f"numeric lint: output max {value:.3g} > {limit:g}" for name, value in values.items() if value > limit
    }
    allowed = set(values)
    for node in graph_def.node:
        if node.name in allowed and node.name not in found:
            sources = [producer(r)[0] for r in node.input if not r.startswith("^")]
            hit = next((s for s in sources if s in found and not found[s].startswith("reads")), None)
            if hit:
                found[node.name] = f"reads {hit}, whose output overflows"
    return found


def rewrite_graph(
    graph_def,
    output_tensors: tuple[str, ...],
    policy_dtype: str,
    keep: tuple[str, ...] = (),
    auto_keep: dict[str, str] | None = None,
):
    """(the rewritten GraphDef, a NodeDecision per float32 compute node). The input GraphDef is not modified.

    `auto_keep` maps node names to why they stay float32 (the node-level lint).
    Raises RewriteError when the result would not import (check_edges).
    """
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2
    from tensorflow.python.framework import tensor_util

    half = tf.as_dtype(policy_dtype)
    nodes = {n.name: n for n in graph_def.node}
    patterns = [re.compile(p) for p in keep]
    op_defs = _OpDefs(graph_def)
    # Every data port's dtype, from the op defs: a producer's node-level attributes say nothing about
    # its outputs (GatherV2's is Tparams, a fused op's several), which is how an embedding lookup once
    # fed a bfloat16 MatMul uncast.
    ports = {n.name: _ports(n, op_defs) for n in graph_def.node}
    retyped_ports: dict[str, tuple[list[int], list[int]] | None] = {}

    def retyped(node):
        copy = tf.compat.v1.NodeDef()
        copy.CopyFrom(node)
        copy.attr["T"].type = half.as_datatype_enum
        return copy

    def new_ports(name: str):
        if name in sixteen:
            if name not in retyped_ports:
                retyped_ports[name] = _ports(retyped(nodes[name]), op_defs)
            return retyped_ports[name]
        return ports[name]

    def kept(node) -> str | None:
        for pattern in patterns:
            if pattern.fullmatch(node.name) or pattern.fullmatch(node.op):
                return f"--keep-float32 {pattern.pattern!r}"
        return (auto_keep or {}).get(node.name)

    def constant(name: str) -> bool:  # a Const, or an Identity of one (a frozen variable read)
        node = nodes[name]
        while node.op in PASS_THROUGH and node.input:
            node = nodes[producer(node.input[0])[0]]
        return node.op == "Const"

    def gives_half(ref: str) -> bool:
        name, index = producer(ref)
        found = new_ports(name) if name in sixteen else None
        return found is not None and found[1][index] == half.as_datatype_enum

    # What feeds the signature's outputs, through pass-through nodes, stays float32.
    feeding_outputs = set()
    for ref in output_tensors:
        name = producer(ref)[0]
        while name in nodes:
            feeding_outputs.add(name)
            node = nodes[name]
            if node.op not in PASS_THROUGH or not node.input:
                break
            name = producer(node.input[0])[0]

    decisions: dict[str, NodeDecision] = {}
    sixteen: set[str] = set()
    for node in graph_def.node:
        if node.op in ALLOW and _is_float(node):
            why = kept(node) or ("model output" if node.name in feeding_outputs else None)
            if why is None:
                sixteen.add(node.name)
            decisions[node.name] = NodeDecision(node.name, node.op, None if why else "16-bit", why)
    changed = True
    while changed:  # infer ops follow their 16-bit inputs
        changed = False
        for node in graph_def.node:
            if node.name in sixteen or node.op not in INFER or not _is_float(node) or node.name in feeding_outputs:
                continue
            if kept(node):
                decisions[node.name] = NodeDecision(node.name, node.op, None, kept(node))
                continue
            port = ports[node.name]
            if port is None:
                continue
            # The float inputs are the ports the op takes float32 at, whatever produces them.
            floats = [ref for ref, dtype in zip(_data_inputs(node), port[0]) if dtype == DT_FLOAT]
            if any(gives_half(r) for r in floats) and all(gives_half(r) or constant(producer(r)[0]) for r in floats):
                sixteen.add(node.name)
                changed = True

    reading: dict[str, list[tuple[str, int, str]]] = {}  # a node -> (reader, input index, ref) per edge from it
    for node in graph_def.node:
        for i, ref in enumerate(_data_inputs(node)):
            reading.setdefault(producer(ref)[0], []).append((node.name, i, ref))

    def takes(reader: str, i: int, ref: str) -> int | None:
        """The dtype input `i` of `reader` takes in the rewritten graph."""
        found = new_ports(reader)
        if found is not None:
            return found[0][i]
        name, index = producer(ref)  # an op without an op def is never retyped: it takes what it was given
        port = ports[name]
        return port[1][index] if port is not None else None

    # A float32 constant that every reader now takes in 16 bits is stored in 16 bits (half the bytes).
    halved = {
        node.name
        for node in graph_def.node
        if node.op == "Const"
        and node.attr["dtype"].type == DT_FLOAT
        and node.name not in feeding_outputs
        and reading.get(node.name)
        and all(takes(r, i, ref) == half.as_datatype_enum for r, i, ref in reading[node.name])
    }

    def gives(ref: str, reader: str, i: int) -> int | None:
        """The dtype `ref` carries in the rewritten graph; for an op without an op def, what its reader took."""
        name, index = producer(ref)
        if name in halved:
            return half.as_datatype_enum
        found = new_ports(name)
        if found is not None:
            return found[1][index]
        port = ports[reader]
        return port[0][i] if port is not None else None

    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    del out.node[:]
    casts: dict[tuple[str, int], str] = {}
    extra = []
    float_types = {DT_FLOAT, half.as_datatype_enum}

    def cast(ref: str, source: int, to: int) -> str:
        key = (ref, to)
        if key not in casts:
            # Named by node and port: "split:1" once became split_1/..., the name of node split_1's own cast.
            source_name, index = producer(ref)
            name = f"{source_name}/mpconvert_cast_{tf.as_dtype(to).name}" + (f"_{index}" if index else "")
            node = tf.compat.v1.NodeDef(name=name, op="Cast")
            node.input.append(ref)
            node.attr["SrcT"].type = source
            node.attr["DstT"].type = to
            node.attr["Truncate"].b = False
            extra.append(node)
            casts[key] = name
        return casts[key]

    for original in graph_def.node:
        node = out.node.add()
        if original.name in sixteen:
            node.CopyFrom(retyped(original))
        else:
            node.CopyFrom(original)
        if original.name in halved:
            value = tensor_util.MakeNdarray(node.attr["value"].tensor).astype(half.as_numpy_dtype)
            node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value, dtype=half))
            node.attr["dtype"].type = half.as_datatype_enum
        positions = [p for p, ref in enumerate(node.input) if not ref.startswith("^")]
        for i, position in enumerate(positions):  # i counts data inputs, as the op def's ports do
            ref = node.input[position]
            source, to = gives(ref, original.name, i), takes(original.name, i, ref)
            if source is None or to is None or source == to:
                continue
            if source not in float_types or to not in float_types:
                raise RewriteError(
                    f"the 16-bit rewrite left input {i} of {node.name} ({node.op}) taking {_dtype_name(to)} "
                    f"from {ref}, which gives {_dtype_name(source)}: no Cast can join them"
                )
            node.input[position] = cast(ref, source, to)
    out.node.extend(extra)
    # Walking the op defs costs 0.04 s on a Keras ResNet50 export's frozen graph (2315 nodes), where
    # importing it costs 0.56 s, and it names the edge: every search trial rewrites, so it runs each time.
    check_edges(out)
    for node in graph_def.node:  # infer ops are listed too: what a user's --keep-float32 would name
        if node.name in sixteen and node.name not in decisions and node.op in INFER and node.op not in PASS_THROUGH:
            decisions[node.name] = NodeDecision(node.name, node.op, "16-bit", None)
    return out, [decisions[n.name] for n in graph_def.node if n.name in decisions]
