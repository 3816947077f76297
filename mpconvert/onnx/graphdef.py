"""GraphDef passes the ONNX export runs before tf2onnx: weights read once, 16-bit constants packed, XLA marks dropped.

Each pass is a measured fix for time tf2onnx spends or a graph it cannot
read; export.py says where each runs.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf


def take_weights(graph_def):
    """tf2onnx's compress_graph_def, reading each weight once instead of twice.

    tf2onnx's own large-model path: constants over 1000 bytes leave the
    GraphDef, and process_tf_graph is handed them where it reads constant
    values (`const_node_values`), so TF imports and serializes node by node
    a graph without them. Dense(4096)x2 exports in 3.1-3.4 s instead of
    3.7-3.9 s; no measurable change on ResNet50, whose weights are smaller.
    """
    weights = {}
    for node in graph_def.node:
        if node.op == "Const":
            tensor = node.attr["value"].tensor
            content = tensor.tensor_content  # a copy: read it once
            if len(content) > 1000:
                weights[node.name] = content
                tensor.tensor_content = b""
    return weights


def all_nodes(graph_def) -> list:
    """A GraphDef's nodes and those of every function in its library."""
    return [*graph_def.node, *(node for fn in graph_def.library.function for node in fn.node_def)]


def pack_16bit_constants(graph_def):
    """Store 16-bit constants as raw bytes, as TF does other dtypes.

    Grappler writes the float16/bfloat16 weights it folds out of Casts into
    the repeated `half_val` field, which TF's MakeNdarray reads element by
    element with np.fromiter, and tf2onnx reads every constant twice: 3.5 s
    of ConvNeXtTiny's export. np.array reads the same field in milliseconds.
    """
    for node in all_nodes(graph_def):
        if node.op != "Const" or "value" not in node.attr:
            continue
        tensor = node.attr["value"].tensor
        # tensor_content last: reading it copies the weight (upb hands out bytes).
        if (
            tensor.dtype not in (tf.float16.as_datatype_enum, tf.bfloat16.as_datatype_enum)
            or not tensor.half_val
            or tensor.tensor_content
        ):
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


def drop_xla_markers(graph_def):
    def marked(attrs):
        return any(name in attrs and attrs[name].b for name in _XLA_MARKERS)

    for fn in graph_def.library.function:
        if marked(fn.attr):
            # Only XLA's own _noinline: one the model's author set stays.
            for name in _XLA_MARKERS + ("_noinline",):
                fn.attr.pop(name, None)
    for node in all_nodes(graph_def):
        if marked(node.attr):
            for name in _XLA_MARKERS + ("_noinline",):
                node.attr.pop(name, None)


def graph_dtypes(graph_def):
    """Every TF dtype named in a GraphDef's node attributes, functions included."""
    enums = set()
    for node in all_nodes(graph_def):
        for attr in node.attr.values():
            kind = attr.WhichOneof("value")
            if kind == "type":
                enums.add(attr.type)
            elif kind == "list":
                enums.update(attr.list.type)
            elif kind == "tensor":
                enums.add(attr.tensor.dtype)
    return {tf.dtypes.as_dtype(e) for e in enums if e}


def computing_nodes(graph_def, outputs) -> list[tuple[str, str]]:
    """(name, op type) of every node the `outputs` (tensor or node names) depend on, in the graph and in the
    library functions those nodes call: what an export has to express (a dead branch is not)."""
    by_name = {node.name: node for node in graph_def.node}
    functions = {fn.signature.name: fn for fn in graph_def.library.function}
    todo = [name.lstrip("^").split(":")[0] for name in outputs]
    seen: set[str] = set()
    called: set[str] = set()
    found = []
    while todo:
        name = todo.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        node = by_name[name]
        found.append((node.name, node.op))
        todo.extend(i.lstrip("^").split(":")[0] for i in node.input)
        called.update(_called(node, functions))
    pending = list(called)
    while pending:  # functions calling functions
        fn = functions[pending.pop()]
        for node in fn.node_def:
            found.append((node.name, node.op))
            for name in _called(node, functions) - called:
                called.add(name)
                pending.append(name)
    return found


def _called(node, functions) -> set[str]:
    """The library functions a node calls: as its op (a function-call node) or through a function attr."""
    names = {node.op} & functions.keys()
    for value in node.attr.values():
        if value.HasField("func"):
            names.add(value.func.name)
        names.update(f.name for f in value.list.func)
    return names & functions.keys()
