"""Repair passes for what tf2onnx 1.17 gets wrong in mixed-precision graphs.

Each pass mutates a ModelProto and returns descriptions of what it changed
(empty: nothing to do), so they can run on any export.

* tf2onnx maps tf.bfloat16 to ONNX FLOAT16 for every type it writes itself
  (Cast targets, constants it creates such as Relu6's Clip bounds) while
  weights keep their real BFLOAT16 type: the graph is invalid. export.py
  fixes that at the source for the duration of a conversion;
  `retype_float16_as_bfloat16` repairs the graph afterwards should that
  patch not apply.
* ONNX opsets before 22 have no bfloat16 Conv, pooling and a few
  activations, and tf2onnx cannot write opset 22: `insert_float32_islands`
  computes those ops in float32 between Casts, keeping bfloat16 weights.
* tf2onnx writes an Einsum (Keras's MultiHeadAttention, EinsumDense) as
  Reshapes to [prod(batch axes), -1, prod(sum axes)], each part read from
  the input's Shape. With an empty batch the -1 is ambiguous (0 elements
  over a product of 0) and ONNX Runtime refuses the request ("Input shape
  {0,2,12,1,8}, requested {0,-1,8}"); `explicit_reshape_sizes` computes
  that part as the product of the input's remaining axes instead.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from mpconvert.onnx.proto import (
    HALF_TYPES,
    allowed_types,
    cast_to,
    graphs,
    is_weight,
    name_factory,
    opset,
    prune,
    rename_uses,
    schema,
    tensor_types,
    wrap_ops,
)

# Target types that hold every value of the source type exactly.
_EXACT_WIDENING = {
    TensorProto.FLOAT16: {TensorProto.FLOAT, TensorProto.DOUBLE},
    TensorProto.BFLOAT16: {TensorProto.FLOAT, TensorProto.DOUBLE},
    TensorProto.FLOAT: {TensorProto.DOUBLE},
}
# doc_string of the Casts that end a float32 island, so later passes know
# that rounding was added by us.
ISLAND_EXIT = "mpconvert: end of float32 island"


def retype_float16_as_bfloat16(proto) -> list[str]:
    """Turn every FLOAT16 in the graph into BFLOAT16.

    Only for graphs whose TensorFlow source had bfloat16 and no float16 at
    all (the caller checks): there, every FLOAT16 is tf2onnx's mis-mapping.
    That includes constants tf2onnx makes itself, such as the 0/6 bounds of
    Relu6's Clip, which look exactly like float16 weights; so this cannot be
    decided from the ONNX graph alone by type inference.
    """
    counts: Counter[str] = Counter()
    for graph in graphs(proto.graph):
        for node in graph.node:
            for attr in node.attribute:
                if (
                    attr.name in ("to", "dtype")
                    and attr.type == onnx.AttributeProto.INT
                    and attr.i == TensorProto.FLOAT16
                ):
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


def _as_bfloat16(tensor):
    import ml_dtypes

    values = numpy_helper.to_array(tensor).astype(np.float32).astype(ml_dtypes.bfloat16)
    return numpy_helper.from_array(values, tensor.name)


def insert_float32_islands(proto) -> list[str]:
    """Compute ops whose schema lacks bfloat16 at the model's opset in float32.

    Conv, pooling and some activations only allow bfloat16 from opset 22,
    which tf2onnx cannot write. Their bfloat16 inputs, weights included (so
    the file keeps 16-bit weights), are Cast to float32 and their outputs
    Cast back, so the rest of the graph keeps its types. An op that makes a
    bfloat16 output from an attribute, with no bfloat16 input (ConstantOfShape,
    the zero initial state of every LSTM/GRU loop, bfloat16 only from opset
    20), has that attribute made float32 too (`graph.wrap_in_float32`).
    """

    def lacking_bfloat16(node, schema, bound):
        lacking = {
            t
            for _, t, dtype in bound
            if dtype == TensorProto.BFLOAT16
            and "tensor(bfloat16)" not in allowed_types(schema, t)
            and "tensor(float)" in allowed_types(schema, t)
        }
        # All tensors bound to one type parameter must change type together.
        return [n for n, t, dtype in bound if t in lacking and dtype == TensorProto.BFLOAT16]

    version = opset(proto)
    wrapped = wrap_ops(proto, lacking_bfloat16, exit_doc=ISLAND_EXIT)
    if not wrapped:
        return []
    ops = ", ".join(f"{n} {op}" for op, n in sorted(wrapped.items()))
    return [
        f"computed {ops} in float32 between Casts (no bfloat16 in their opset-{version} schema); "
        "their weights stay bfloat16"
    ]


def fold_cast_pairs(proto) -> list[str]:
    """Bypass back-to-back Casts that return to the starting type.

    Cast(a -> wider) -> Cast(wider -> a) changes nothing. A float32 island's
    exit Cast to bfloat16 followed by a Cast to float32 (a Conv feeding a
    float32 BatchNormalization) is bypassed too: that rounding came from
    `insert_float32_islands`, not from the model.
    """
    g = proto.graph
    types = tensor_types(proto)
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
        t0, t1 = types.get(origin), cast_to(first)
        if t0 != cast_to(node):
            continue
        if t1 in _EXACT_WIDENING.get(t0, ()) or first.doc_string == ISLAND_EXIT:
            rename_uses(g, node.output[0], origin)
            folded += 1
    if not folded:
        return []
    prune(g)
    return [f"bypassed {folded} back-to-back Cast pair(s) that returned to their input type"]


_FLOATS = {TensorProto.FLOAT, *HALF_TYPES}
# Each round fixes the nodes whose input types are known; a fixed node's
# output type is known to the next round (shape inference stops at an
# invalid node).
_UNIFY_ROUNDS = 8


def unify_input_types(proto) -> list[str]:
    """Bring the inputs an op binds to one type parameter to one type: the graph's 16-bit type.

    tf2onnx 1.17 computes a bfloat16 pool in float32 by inserting its input
    Cast on the *producer's output*, so every other reader of that tensor
    (NASNet's Add and Concat beside the AveragePool) reads the float32 copy
    beside bfloat16 tensors: "B has inconsistent type". In TensorFlow each
    of those ops had one dtype, the 16-bit one, so a float32 input that is a
    Cast of a 16-bit tensor reads that tensor again (exact), and any other
    float32 input is cast to 16 bits, as TensorFlow computed it.
    """
    version = opset(proto)
    rewired = rounded = 0
    for _ in range(_UNIFY_ROUNDS):
        types = tensor_types(proto)
        fresh = name_factory(proto)
        changed = False
        for graph in graphs(proto.graph):
            producer = {out: n for n in graph.node for out in n.output}
            nodes = []
            for node in graph.node:
                node_schema = schema(node, version)
                if node_schema is not None and node.op_type != "Cast":
                    for i, target in _mixed_inputs(node, node_schema, types):
                        source = producer.get(node.input[i])
                        if source is not None and source.op_type == "Cast" and types.get(source.input[0]) == target:
                            node.input[i] = source.input[0]
                            rewired += 1
                        else:
                            narrowed = fresh(node.input[i] + "__as_16bit")
                            nodes.append(
                                helper.make_node(
                                    "Cast", [node.input[i]], [narrowed], to=target, name=fresh(node.name + "__unify")
                                )
                            )
                            node.input[i] = narrowed
                            rounded += 1
                        changed = True
                nodes.append(node)
            if len(nodes) != len(graph.node):
                del graph.node[:]
                graph.node.extend(nodes)
        if not changed:
            break
    if not rewired and not rounded:
        return []
    prune(proto.graph)
    return [
        f"unified mixed input types: {rewired} input(s) read their 16-bit source again instead of a "
        f"float32 copy, {rounded} cast to 16 bits (tf2onnx casts a bfloat16 pool's input for all its readers)"
    ]


def _mixed_inputs(node, node_schema, types) -> list[tuple[int, int]]:
    """(input index, 16-bit type) of the float32 inputs bound beside a 16-bit one to one type parameter."""
    by_param: dict[str, list[int]] = {}
    for i, name in enumerate(node.input):
        if not name:
            continue
        if i < len(node_schema.inputs):
            formal = node_schema.inputs[i]
        elif node_schema.inputs and node_schema.inputs[-1].option == onnx.defs.OpSchema.FormalParameterOption.Variadic:
            formal = node_schema.inputs[-1]
        else:
            continue
        by_param.setdefault(formal.type_str, []).append(i)
    mixed = []
    for indices in by_param.values():
        kinds = {types.get(node.input[i]) for i in indices}
        halves = kinds & set(HALF_TYPES)
        if None in kinds or not kinds <= _FLOATS or len(halves) != 1 or TensorProto.FLOAT not in kinds:
            continue
        target = halves.pop()
        mixed += [(i, target) for i in indices if types.get(node.input[i]) == TensorProto.FLOAT]
    return mixed


# Run on every export, in this order (retype_float16_as_bfloat16 only where
# the caller knows FLOAT16 is a mis-mapping).
def explicit_reshape_sizes(proto) -> list[str]:
    """Replace a Reshape's -1 by the product of the input's other axes, where its shape is read from that input.

    Only the pattern whose value is certain is rewritten: the shape is a
    Concat of one constant [-1] and parts that are each Gather(Shape(x),
    constant axes), optionally through ReduceProd (all of it), of the very
    tensor x being reshaped, over distinct axes, with x's rank known. Then
    -1 = size(x) / product(the parts) = product of the axes no part reads,
    which is what the Reshape computed for every non-empty batch, and is
    defined for an empty one too.
    """
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False).graph
    ranks = {
        vi.name: len(vi.type.tensor_type.shape.dim)
        for vi in [*inferred.input, *inferred.value_info, *inferred.output]
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")
    }
    fresh = name_factory(proto)
    g = proto.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer if not is_weight(t)}
    consts.update(
        {
            n.output[0]: numpy_helper.to_array(n.attribute[0].t)
            for n in g.node
            if n.op_type == "Constant" and n.attribute
        }
    )
    producer = {out: n for n in g.node for out in n.output}
    fixed = 0
    for node in list(g.node):
        if node.op_type != "Reshape" or node.input[0] not in ranks:
            continue
        concat = producer.get(node.input[1])
        if concat is None or concat.op_type != "Concat":
            continue
        minus = [i for i, name in enumerate(concat.input) if name in consts and consts[name].tolist() == [-1]]
        read = _axes_read(concat, minus, producer, consts, node.input[0], ranks[node.input[0]])
        if len(minus) != 1 or read is None:
            continue
        shape_of_x, axes = read
        rest = [a for a in range(ranks[node.input[0]]) if a not in axes]
        if not rest:
            continue
        axes_name, gathered, size = fresh("mpconvert_rest_axes"), fresh("mpconvert_rest_dims"), fresh("mpconvert_rest")
        g.initializer.append(numpy_helper.from_array(np.array(rest, dtype=np.int64), axes_name))
        added = [
            helper.make_node("Gather", [shape_of_x, axes_name], [gathered], name=fresh("mpconvert_rest_gather")),
            helper.make_node("ReduceProd", [gathered], [size], keepdims=1, name=fresh("mpconvert_rest_prod")),
        ]
        at = list(g.node).index(concat)
        for offset, new in enumerate(added):
            g.node.insert(at + offset, new)
        concat.input[minus[0]] = size
        fixed += 1
    if not fixed:
        return []
    prune(g)
    return [f"computed the -1 of {fixed} Reshape(s) from their input's shape, so that they take an empty batch"]


def _axes_read(concat, minus, producer, consts, x, rank) -> tuple[str, set[int]] | None:
    """(Shape(x)'s output, the axes the Concat's other parts read) when every part reads distinct axes of x."""
    shape_out, axes = None, set[int]()
    for i, name in enumerate(concat.input):
        if i in minus:
            continue
        part = producer.get(name)
        if part is not None and part.op_type == "ReduceProd":
            if len(part.input) != 1 or any(a.name == "axes" for a in part.attribute):
                return None  # it must reduce all of what it reads
            part = producer.get(part.input[0])
        if part is None or part.op_type != "Gather" or part.input[1] not in consts:
            return None
        shape = producer.get(part.input[0])
        if shape is None or shape.op_type != "Shape" or shape.attribute or shape.input[0] != x:
            return None
        read = {int(a) % rank for a in consts[part.input[1]].reshape(-1)}
        if read & axes:
            return None
        axes |= read
        shape_out = shape.output[0]
    return (shape_out, axes) if shape_out is not None else None


REPAIRS = (unify_input_types, insert_float32_islands, fold_cast_pairs, explicit_reshape_sizes)
