"""The ONNX file's edges: float16 inputs and outputs on request, and the casts at its inputs and outputs.

A mixed-precision model keeps float32 inputs and outputs (Keras pins its
outputs to float32), so a GPU server moves twice the bytes it computes on.
`float16_io` makes every float32 graph input and output float16, with a
Cast where the graph meets it, as onnxconverter-common's
`keep_io_types=False` does; integer and string inputs stay as they are.
`edge_casts` says, for the report, what the file does at its edges.
"""

from __future__ import annotations

from onnx import TensorProto, helper

from mpconvert.onnx.proto import name_factory, rename_uses, tensor_types

_NAMES: dict[int, str] = {
    TensorProto.FLOAT: "float32",
    TensorProto.FLOAT16: "float16",
    TensorProto.BFLOAT16: "bfloat16",
}


def float16_io(proto) -> list[str]:
    """Every float32 graph input and output made float16, cast to and from float32 at the edge."""
    g = proto.graph
    fresh = name_factory(proto)
    inputs, outputs = [], []
    casts_in = []
    for value in g.input:
        tensor = value.type.tensor_type
        if tensor.elem_type != TensorProto.FLOAT:
            continue
        inner = fresh(value.name + "_float32")
        rename_uses(g, value.name, inner)
        casts_in.append(helper.make_node("Cast", [value.name], [inner], to=TensorProto.FLOAT, name=fresh("io_cast")))
        tensor.elem_type = TensorProto.FLOAT16
        inputs.append(value.name)
    for value in g.output:
        tensor = value.type.tensor_type
        if tensor.elem_type != TensorProto.FLOAT:
            continue
        inner = fresh(value.name + "_float32")
        for node in g.node:
            node.output[:] = [inner if o == value.name else o for o in node.output]
        rename_uses(g, value.name, inner)
        g.node.append(helper.make_node("Cast", [inner], [value.name], to=TensorProto.FLOAT16, name=fresh("io_cast")))
        tensor.elem_type = TensorProto.FLOAT16
        outputs.append(value.name)
    for i, node in enumerate(casts_in):
        g.node.insert(i, node)
    if not inputs and not outputs:
        return []
    return [f"float16 inputs and outputs: {len(inputs)} input(s) and {len(outputs)} output(s) cast at the edge"]


def edge_casts(proto) -> dict:
    """{"inputs": {name: {"type", "cast_to"}}, "outputs": {name: {"type", "cast_from"}}} of the graph's edges.

    `cast_to`: the types the input is cast to where it enters (empty: used
    as it is); `cast_from`: the type a Cast producing the output read (None:
    no Cast there).
    """
    g = proto.graph
    producer = {out: n for n in g.node for out in n.output}
    types = tensor_types(proto)
    found: dict[str, dict] = {"inputs": {}, "outputs": {}}
    for value in g.input:
        to = sorted({_name(a.i) for n in g.node if n.op_type == "Cast" and value.name in n.input for a in n.attribute})
        found["inputs"][value.name] = {"type": _name(value.type.tensor_type.elem_type), "cast_to": to}
    for value in g.output:
        cast = producer.get(value.name)
        source = None
        if cast is not None and cast.op_type == "Cast":
            source = _name(types[cast.input[0]]) if cast.input[0] in types else "unknown"
        found["outputs"][value.name] = {"type": _name(value.type.tensor_type.elem_type), "cast_from": source}
    return found


def _name(elem_type: int) -> str:
    return _NAMES.get(elem_type) or TensorProto.DataType.Name(elem_type).lower()
