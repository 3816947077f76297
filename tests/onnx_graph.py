"""Reading weights out of exported ONNX graphs, for the tests."""

import onnx


def weight_initializers(proto: onnx.ModelProto) -> list[onnx.TensorProto]:
    """The weight of every MatMul/Gemm/Conv, followed back through Cast and
    layout nodes (16-bit weights are often cast, bfloat16 Convs run in float32
    islands) to the initializer that holds it."""
    inits = {i.name: i for i in proto.graph.initializer}
    producers = {o: n for n in proto.graph.node for o in n.output}
    found = []
    for node in proto.graph.node:
        if node.op_type in ("MatMul", "Gemm", "Conv"):
            name = node.input[1]
            while name not in inits:
                name = producers[name].input[0]
            found.append(inits[name])
    return found


def io_dims(value: onnx.ValueInfoProto) -> list[int | None]:
    return [d.dim_value or None for d in value.type.tensor_type.shape.dim]
