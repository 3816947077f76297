"""Large models: weights kept out of every protobuf message, written to an ONNX external data file.

Protobuf caps one message at 2 GiB, and two messages of a plain export hold
every weight: the frozen TensorFlow GraphDef (float32 constants, which
grappler and TensorFlow's importer take serialized) and the ONNX ModelProto.
A 2.2 GB float32 model failed in the first ("Error parsing message with
type 'tensorflow.GraphDef'"), and a 1.07 GB one, which fit, peaked at 17.5
GiB resident (17.5x its size) through the copies of every weight that
freezing, grappler, tf2onnx, serializing and ONNX Runtime's sessions made.

So a model whose weights pass a size (--onnx-external-data) is traced with
its weights as extra inputs of the traced function, `stand-ins`: the
GraphDef and the ONNX graph that tf2onnx makes of it carry no weight.
The stand-ins become initializers whose data is not there yet (`pending`),
so that the repair passes see an ordinary graph; then each weight is read
from its variable, one at a time, run through what the graph does to it
alone (a Cast to the 16-bit type, a Transpose), and appended to one data
file beside the .onnx file (`write_weights`). The .onnx file holds the
graph and the small constants, its initializers point into the data file,
and nothing ever holds more than one weight beyond the model itself.
"""

from __future__ import annotations

import os
import pathlib
from collections.abc import Callable, Mapping

import numpy as np
from onnx import TensorProto, helper
from onnx.external_data_helper import uses_external_data

from mpconvert.onnx.graph_checks import PROTOBUF_LIMIT, TooLarge
from mpconvert.onnx.proto import graphs

# A variable under this many bytes stays in the graph as a constant (tf2onnx's own cut-off for weights:
# shapes and small vectors that its handlers and optimizers read as values).
STAND_IN_MIN_BYTES = 1000

# Offsets of weights in the data file: page-aligned, so that ONNX Runtime can map them.
_ALIGN = 4096

# Where a stand-in's data will be: marks an initializer as not written yet.
PENDING = "mpconvert-pending"


def data_file_of(path: pathlib.Path) -> pathlib.Path:
    """The external data file written beside an ONNX file (model.onnx -> model.onnx.data)."""
    return path.with_name(path.name + ".data")


def _dtype(variable) -> np.dtype:
    # A Keras 3 variable's dtype is a string, a tf-keras one's a tf.DType; a string variable counts as none.
    try:
        return np.dtype(getattr(variable.dtype, "as_numpy_dtype", variable.dtype))
    except TypeError:
        return np.dtype(np.uint8)


def variable_bytes(variable) -> int:
    return int(np.prod(variable.shape, dtype=np.int64)) * _dtype(variable).itemsize


def stand_ins(variables) -> list:
    """The float variables that leave the graph: every one of STAND_IN_MIN_BYTES or more, in model order."""
    return [v for v in variables if np.issubdtype(_dtype(v), np.floating) and variable_bytes(v) >= STAND_IN_MIN_BYTES]


def weights_apart(model, over: int, keras3: bool) -> list:
    """The variables to trace as inputs (stand-ins), or none when the model's weights are `over` bytes or less."""
    variables = list(model.variables)
    total = sum(variable_bytes(v) for v in variables)
    if total <= over:
        return []
    if not keras3:  # only Keras 3 calls a model on other values than its variables
        if total >= PROTOBUF_LIMIT:
            raise TooLarge(
                f"the model's weights ({total / 1e9:.2f} GB) are over protobuf's 2 GiB limit on one message, and "
                "a tf-keras model can only be converted to ONNX frozen into one TensorFlow GraphDef",
                hint="load the model in Keras 3 and save it as model.keras to export ONNX with external data, "
                "or use --export savedmodel",
            )
        return []
    return stand_ins(variables)


def reader(variable):
    return lambda: variable.numpy()


def as_pending_initializers(proto, names: list[str]) -> None:
    """Turn the graph inputs `names` (the traced stand-ins) into initializers without data yet."""
    wanted = set(names)
    kept = [i for i in proto.graph.input if i.name not in wanted]
    for graph_input in proto.graph.input:
        if graph_input.name not in wanted:
            continue
        tensor_type = graph_input.type.tensor_type
        tensor = TensorProto(name=graph_input.name, data_type=tensor_type.elem_type)
        tensor.dims.extend(d.dim_value for d in tensor_type.shape.dim)
        _point(tensor, PENDING)
        proto.graph.initializer.append(tensor)
    del proto.graph.input[:]
    proto.graph.input.extend(kept)


def _point(tensor, location: str, offset: int | None = None, length: int | None = None) -> None:
    """What onnx's set_external_data writes, for a tensor whose bytes never were in it."""
    del tensor.external_data[:]
    tensor.data_location = TensorProto.EXTERNAL
    entries = {"location": location, "offset": offset, "length": length}
    for key, value in entries.items():
        if value is not None:
            entry = tensor.external_data.add()
            entry.key, entry.value = key, str(value)


def pending(proto) -> list[str]:
    return [t.name for t in proto.graph.initializer if _location(t) == PENDING]


def _location(tensor) -> str | None:
    if not uses_external_data(tensor):
        return None
    return next((e.value for e in tensor.external_data if e.key == "location"), None)


def _cast(node, value: np.ndarray) -> np.ndarray:
    to = next(a.i for a in node.attribute if a.name == "to")
    # ml_dtypes' bfloat16 and NumPy's float16 round to nearest even, as TensorFlow's Cast does.
    return value.astype(helper.tensor_dtype_to_np_dtype(to))


def _transpose(node, value: np.ndarray) -> np.ndarray:
    perm = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
    return np.ascontiguousarray(np.transpose(value, perm or None))


# What the graph does to a weight alone, done once here instead of at every run (and in the file's dtype:
# a float32 weight that only feeds a Cast to bfloat16 is stored in bfloat16, half the bytes).
_FOLD: dict[str, Callable] = {"Cast": _cast, "Transpose": _transpose, "Identity": lambda node, value: value}


def write_weights(proto, values: Mapping[str, Callable[[], np.ndarray]], path: pathlib.Path) -> pathlib.Path:
    """Write every pending initializer's value (`values[name]()`, read when its turn comes) to the data file.

    Each weight is first taken through the chain of Casts, Transposes and
    Identities that only it feeds; the chain's nodes leave the graph and
    the initializer takes the chain's last output name. Returns the data
    file (beside `path`, named after it), written whole before this returns.
    """
    data = data_file_of(path)
    consumers: dict[str, list] = {}
    for g in graphs(proto.graph):  # a use inside a subgraph counts: its node cannot be folded away
        for node in g.node:
            for name in node.input:
                consumers.setdefault(name, []).append(node)
    main = {id(n) for n in proto.graph.node}
    outputs = {o.name for o in proto.graph.output}
    folded: list = []
    written: list[TensorProto] = []
    names = pending(proto)
    offset = 0
    with open(data, "wb") as f:
        for name in names:
            value = np.asarray(values[name]())
            while name not in outputs and len(consumers.get(name, ())) == 1:
                node = consumers[name][0]
                foldable = node.op_type in _FOLD and node.domain in ("", "ai.onnx") and id(node) in main
                if not foldable or list(node.input) != [name]:
                    break
                value = _FOLD[node.op_type](node, value)
                folded.append(node)
                name = node.output[0]
            tensor = TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(value.dtype))
            tensor.dims.extend(value.shape)
            content = np.ascontiguousarray(value).tobytes()  # little-endian on every platform mpconvert runs on
            f.seek(offset)
            f.write(content)
            _point(tensor, data.name, offset, len(content))
            written.append(tensor)
            offset += -(-len(content) // _ALIGN) * _ALIGN
            del value, content
        f.flush()
        os.fsync(f.fileno())
    gone = {id(n) for n in folded}
    kept = [n for n in proto.graph.node if id(n) not in gone]
    del proto.graph.node[:]
    proto.graph.node.extend(kept)
    still = [t for t in proto.graph.initializer if _location(t) != PENDING]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend([*still, *written])
    return data


def external_files(proto) -> list[str]:
    """The external data files an ONNX model's initializers point into, relative to its folder, in order."""
    found: list[str] = []
    for tensor in proto.graph.initializer:
        location = _location(tensor)
        if location and location not in found:
            found.append(location)
    return found
