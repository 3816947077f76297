"""Reading weights out of exported ONNX graphs, for the tests."""

import onnx

# Nodes a weight may pass through on its way to a MatMul/Conv: 16-bit weights
# are often cast, bfloat16 Convs run in float32 islands, layouts change.
_PASS_THROUGH = ("Cast", "Reshape", "Transpose", "Squeeze", "Unsqueeze")


def weights_by_node(proto: onnx.ModelProto) -> list[tuple[onnx.NodeProto, onnx.TensorProto]]:
    """(node, initializer holding its weight) for every MatMul/Gemm/Conv whose
    second input traces back to an initializer."""
    inits = {i.name: i for i in proto.graph.initializer}
    producers = {o: n for n in proto.graph.node for o in n.output}
    found = []
    for node in proto.graph.node:
        if node.op_type not in ("MatMul", "Gemm", "Conv"):
            continue
        name = node.input[1]
        while name not in inits and name in producers and producers[name].op_type in _PASS_THROUGH:
            name = producers[name].input[0]
        if name in inits:
            found.append((node, inits[name]))
    return found


def weight_initializers(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    return [init for _, init in weights_by_node(proto)]


def io_dims(value: onnx.ValueInfoProto) -> list[int | None]:
    return [d.dim_value or None for d in value.type.tensor_type.shape.dim]
