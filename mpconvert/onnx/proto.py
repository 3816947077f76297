"""ModelProto helpers shared by the repair passes and the runner.

Graph walking, op schemas and types, renaming and pruning, and wrapping ops
so that they compute in float32 between Casts. Imports onnx and numpy only.
"""

from __future__ import annotations

import hashlib
import math
from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HALF_TYPES = (TensorProto.FLOAT16, TensorProto.BFLOAT16)


def opset(proto):
    return next(o.version for o in proto.opset_import if o.domain in ("", "ai.onnx"))


def schema(node, opset):
    try:
        return onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except onnx.defs.SchemaError:
        return None


def bound_tensors(node, schema):
    """(tensor name, type string, is_output) for each tensor a node binds."""
    for names, formals, is_output in ((node.input, schema.inputs, False), (node.output, schema.outputs, True)):
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


def allowed_types(schema, type_str):
    """Type strings a formal parameter accepts ("T" -> its constraint)."""
    for tc in schema.type_constraints:
        if tc.type_param_str == type_str:
            return set(tc.allowed_type_strs)
    return {type_str}


def tensor_types(proto):
    """Element type of every tensor, subgraphs included, by shape inference.

    One dict for all scopes: ONNX forbids a subgraph to reuse an outer name.
    """
    types = {}
    for g in graphs(onnx.shape_inference.infer_shapes(without_weights(proto), strict_mode=False).graph):
        for vi in list(g.input) + list(g.value_info) + list(g.output):
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                types[vi.name] = vi.type.tensor_type.elem_type
        for init in g.initializer:
            types[init.name] = init.data_type
    return types


# Initializers with more elements are weights, never shapes or indices that
# shape inference reads the values of.
_WEIGHT_ELEMENTS = 1 << 14


def is_weight(tensor) -> bool:
    """A large initializer, or one whose data is in an external file: never a shape or an index that a pass
    reads the values of."""
    # not ByteSize(): upb serializes to count
    return math.prod(tensor.dims) > _WEIGHT_ELEMENTS or tensor.data_location == TensorProto.EXTERNAL


def without_weights(proto):
    """`proto` with its large initializers turned into typed graph inputs.

    Shape inference serializes the model into C++ and the inferred one back,
    weights included; the repair passes call it twice per export: 1.0-1.2 s
    of Dense(4096)x2's, 0.65 s of ResNet50's; under 0.1 s for either now.
    Element types do not depend on weight values, and small initializers
    (shapes, axes) stay.
    """
    g = proto.graph
    light = onnx.ModelProto(
        ir_version=proto.ir_version,
        opset_import=proto.opset_import,
        functions=proto.functions,
        graph=onnx.GraphProto(
            name=g.name,
            node=g.node,
            input=g.input,
            output=g.output,
            value_info=g.value_info,
            sparse_initializer=g.sparse_initializer,
        ),
    )
    inputs = {i.name for i in g.input}
    for init in g.initializer:
        if not is_weight(init):
            light.graph.initializer.append(init)
        elif init.name not in inputs:
            light.graph.input.append(helper.make_tensor_value_info(init.name, init.data_type, init.dims))
    return light


def cast_to(node):
    return next(a.i for a in node.attribute if a.name == "to")


def name_factory(proto):
    used = set()
    for g in graphs(proto.graph):
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


def wrap_ops(proto, select, exit_doc=""):
    """Run the ops `select` picks in float32, in every (sub)graph.

    select(node, schema, bound) gets the node's bound (tensor, type string,
    element type) triples and returns the 16-bit tensors to widen/round, or
    nothing. Returns a Counter of wrapped op types.
    """
    version = opset(proto)
    types = tensor_types(proto)
    fresh = name_factory(proto)
    wrapped: Counter[str] = Counter()
    # Subgraphs first: rebuilding a parent's node list copies its nodes, and
    # with them the subgraphs, so later edits through old references are lost.
    for graph in reversed(list(graphs(proto.graph))):
        widened: dict[str, str] = {}
        nodes: list = []  # an up-Cast is only visible in its own scope
        for node in graph.node:
            node_schema = schema(node, version)
            tensors = None
            # Control flow (Loop, If, Scan) passes types to its bodies, which
            # are wrapped op by op themselves.
            if node_schema is not None and node.op_type != "Cast" and not any(subgraphs(node)):
                bound = [(n, t, types.get(n)) for n, t, _ in bound_tensors(node, node_schema)]
                tensors = select(node, node_schema, bound)
            if not tensors:
                nodes.append(node)
                continue
            before, after = wrap_in_float32(node, list(dict.fromkeys(tensors)), types, fresh, widened, exit_doc)
            nodes.extend(before + [node] + after)
            wrapped[node.op_type] += 1
        if len(nodes) != len(graph.node):
            del graph.node[:]
            graph.node.extend(nodes)
    return wrapped


def wrap_in_float32(node, tensors, types, fresh, widened, exit_doc=""):
    """Make `node` compute in float32: Cast `tensors` among its inputs up,
    and its outputs among `tensors` back to their type. Returns the Casts to
    put (before, after) the node. `widened` shares one up-Cast per tensor."""
    before, after = [], []
    inputs, outputs = list(node.input), list(node.output)
    for name in tensors:
        if name in outputs:
            wide = fresh(name + "__f32")
            outputs[outputs.index(name)] = wide
            after.append(
                helper.make_node(
                    "Cast", [wide], [name], to=types[name], name=fresh(name + "__from_f32"), doc_string=exit_doc or None
                )
            )
        if name in inputs:
            if name not in widened:
                widened[name] = fresh(name + "__as_f32")
                before.append(
                    helper.make_node(
                        "Cast", [name], [widened[name]], to=TensorProto.FLOAT, name=fresh(name + "__to_f32")
                    )
                )
            inputs = [widened[name] if n == name else n for n in inputs]
    del node.input[:]
    node.input.extend(inputs)
    del node.output[:]
    node.output.extend(outputs)
    if after:
        _attributes_as_float32(node)
    return before, after


def _attributes_as_float32(node):
    """Retype the attributes that set a node's output type to float32.

    ConstantOfShape (its `value`; the zero initial state of every tf2onnx
    LSTM/GRU), EyeLike and the Random* ops (`dtype`) make their output type
    from an attribute, not an input: renaming the output alone would leave
    it 16-bit, and ConstantOfShape has no bfloat16 before opset 20.
    """
    for attr in node.attribute:
        if attr.name == "dtype" and attr.type == onnx.AttributeProto.INT and attr.i in HALF_TYPES:
            attr.i = TensorProto.FLOAT
        elif attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in HALF_TYPES:
            values = numpy_helper.to_array(attr.t).astype(np.float32)
            attr.t.CopyFrom(numpy_helper.from_array(values, attr.t.name))


def subgraphs(node):
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            yield attr.g
        elif attr.type == onnx.AttributeProto.GRAPHS:
            yield from attr.graphs


def graphs(graph):
    """`graph` and every subgraph in it, at any depth."""
    yield graph
    for node in graph.node:
        for sub in subgraphs(node):
            yield from graphs(sub)


def rename_uses(graph, old, new):
    # Subgraphs (If/Loop bodies) may read outer-scope tensors by name.
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for sub in subgraphs(node):
            rename_uses(sub, old, new)


def reads(node):
    """Tensor names a node reads, including from inside its subgraphs."""
    names = {i for i in node.input if i}
    for sub in subgraphs(node):
        for inner in sub.node:
            names |= reads(inner)
    return names


def prune(graph):
    """Drop nodes and initializers no graph output depends on."""
    needed = {o.name for o in graph.output}
    keep = []
    for node in reversed(graph.node):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed |= reads(node)
    keep.reverse()
    if len(keep) != len(graph.node):
        del graph.node[:]
        graph.node.extend(keep)
    inits = [t for t in graph.initializer if t.name in needed]
    if len(inits) != len(graph.initializer):
        del graph.initializer[:]
        graph.initializer.extend(inits)


def fed_inputs(proto):
    """Graph inputs a caller feeds (older exporters also list initializers as inputs)."""
    inits = {t.name for t in proto.graph.initializer}
    return [i.name for i in proto.graph.input if i.name not in inits]


def contents(proto):
    """What a model holds up to names: (initializer dtype, shape and value
    digest) and op types, each counted, subgraphs included. Two exports of
    one model compare equal here whatever their node names."""
    inits: Counter[tuple] = Counter()
    ops: Counter[str] = Counter()
    for g in graphs(proto.graph):
        for t in g.initializer:
            digest = hashlib.sha256(numpy_helper.to_array(t).tobytes()).hexdigest()
            inits[(t.data_type, tuple(t.dims), digest)] += 1
        ops.update(n.op_type for n in g.node)
    return inits, ops
