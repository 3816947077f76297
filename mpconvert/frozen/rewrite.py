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
"""

from __future__ import annotations

import re
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


def _is_float(node) -> bool:
    import tensorflow as tf

    attr = node.attr.get("T") or node.attr.get("dtype")
    return attr is not None and attr.type == tf.float32.as_datatype_enum


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
    """
    import tensorflow as tf
    from tensorflow.core.framework import graph_pb2
    from tensorflow.python.framework import tensor_util

    half = tf.as_dtype(policy_dtype)
    nodes = {n.name: n for n in graph_def.node}
    patterns = [re.compile(p) for p in keep]

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
            data = [producer(r)[0] for r in node.input if not r.startswith("^")]
            floats = [p for p in data if p in nodes and _is_float(nodes[p])]
            if any(p in sixteen for p in floats) and all(p in sixteen or constant(p) for p in floats):
                sixteen.add(node.name)
                changed = True

    readers: dict[str, set[str]] = {}
    for node in graph_def.node:
        for ref in node.input:
            if not ref.startswith("^"):
                readers.setdefault(producer(ref)[0], set()).add(node.name)

    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    del out.node[:]
    casts: dict[tuple[str, str], str] = {}
    extra = []

    def cast(ref: str, to) -> str:
        key = (ref, to.name)
        if key not in casts:
            name = f"{ref.replace(':', '_')}/mpconvert_cast_{to.name}"
            node = tf.compat.v1.NodeDef(name=name, op="Cast")
            source = nodes[producer(ref)[0]]
            node.input.append(ref)
            node.attr["SrcT"].type = (half if source.name in sixteen else tf.float32).as_datatype_enum
            node.attr["DstT"].type = to.as_datatype_enum
            node.attr["Truncate"].b = False
            extra.append(node)
            casts[key] = name
        return casts[key]

    for original in graph_def.node:
        node = out.node.add()
        node.CopyFrom(original)
        in_sixteen = node.name in sixteen
        if in_sixteen:
            node.attr["T"].type = half.as_datatype_enum
        elif node.op == "Const" and _is_float(node) and readers.get(node.name) and readers[node.name] <= sixteen:
            value = tensor_util.MakeNdarray(node.attr["value"].tensor).astype(half.as_numpy_dtype)
            node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(value, dtype=half))
            node.attr["dtype"].type = half.as_datatype_enum
            sixteen.add(node.name)  # its readers need no cast
        for i, ref in enumerate(node.input):
            if ref.startswith("^"):
                continue
            name = producer(ref)[0]
            if name not in nodes or not _is_float(nodes[name]):
                continue
            source_sixteen = name in sixteen
            if in_sixteen and not source_sixteen:
                node.input[i] = cast(ref, half)
            elif not in_sixteen and source_sixteen:
                node.input[i] = cast(ref, tf.float32)
    out.node.extend(extra)
    for node in graph_def.node:  # infer ops are listed too: what a user's --keep-float32 would name
        if node.name in sixteen and node.name not in decisions and node.op in INFER and node.op not in PASS_THROUGH:
            decisions[node.name] = NodeDecision(node.name, node.op, "16-bit", None)
    return out, [decisions[n.name] for n in graph_def.node if n.name in decisions]


def op_dtypes(graph_def) -> dict[str, set[str]]:
    """{op type: the dtypes (T) it computes in}: what a test or a user checks the saved graph by."""
    import tensorflow as tf

    found: dict[str, set[str]] = {}
    for node in graph_def.node:
        if "T" in node.attr and node.attr["T"].type:
            found.setdefault(node.op, set()).add(tf.as_dtype(node.attr["T"].type).name)
    return found
