"""Every ONNX file mpconvert writes serves an empty batch: a request of 0 rows runs on one blank row, cut off again.

Servers send empty batches, and tf2onnx exports of common models fail on
them in ONNX Runtime, each in its own op: Masking + LSTM (a Transpose
"perm size: 3 does not match input rank: 4"), a keras-hub ViT (a Reshape
with a -1 beside the 0), a FeatureSpace model (FusedGemm "Dimension
mismatch"), and worst, the ONNX LSTM op of an unmasked Bidirectional(LSTM)
makes ONNX Runtime 1.31 call std::terminate: the process dies with SIGABRT.
One repair per op pattern does not keep up with real graphs, so the file as
a whole is made to take the empty batch, whatever its ops, as the .tflite
already is (mpconvert/emptybatch.py):

    rows = Shape(first input)[0:1]
    each input x:  Concat(x, Slice(blank row, rows, 1))   (Slice clamps: the blank row for 0 rows, else none)
    each output y: Slice(y, 0, rows * 2**31)              (0 rows, or past the end: all of y)

A request with rows runs the model on exactly its own rows, and every
output comes back whole, whatever its batch size (an output that is not one
row per input row stays as wrong as it was, for the 0/1/large-batch check to
name). The blank row is zeros (False, "") of the input's type, expanded to
(1, d1, ...) from constants that runtimes fold where those dims are fixed,
else from the input's own shape: outputs whose non-batch dims are unknown
((batch, time, vocab)) and string inputs take the empty batch as well.
rows * 2**31 overflows int64 only past 2**32 rows.

Why not an ONNX If whose then-branch returns empty outputs: measured here
(2-core Xeon, ONNX Runtime 1.31, digits_cnn at batch 256), ONNX Runtime ran
the model inside the else-branch 2.4-4x slower than the bare file (its
layout optimizations did not apply there), and its results differed in the
last bits; TensorRT's If (to 10.1) needs both branches' outputs of one shape
unless the condition is a build-time constant, and takes no INT64 outputs;
and a then-branch needs every output's non-batch dims fixed. Padding uses
only Shape, Mul, Expand, Slice and Concat on shape values, which
TensorRT computes as shape tensors and OpenVINO and ONNX Runtime run as they
are. Its cost: bench/onnx_empty_batch.py.

A graph whose inputs or outputs have no batch to pad (a fixed or missing
first dimension, rank 0) is left as it is.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from mpconvert.onnx.proto import fed_inputs, name_factory, opset, rename_uses

# doc_string of the nodes this pass adds: it finds its own work (and does not do it twice).
MARK = "mpconvert: serves an empty batch"
# A large batch's ends stay past any output's end: rows * 2**31 >= rows outputs' worth for any real model.
_PAST_THE_END = 1 << 31


def serve_empty_batch(proto) -> list[str]:
    """Pad an empty request to one blank row and cut every output to 0 rows; returns what it did (or nothing)."""
    g = proto.graph
    if any(node.doc_string == MARK for node in g.node):
        return []
    fed = set(fed_inputs(proto))
    inputs = [value for value in g.input if value.name in fed]
    produced = {out for node in g.node for out in node.output}
    if not inputs or not all(_batched(v) for v in [*inputs, *g.output]):
        return []
    if not all(value.name in produced for value in g.output):
        return []  # an output that is an input or a weight as it is: nothing runs to pad

    fresh = name_factory(proto)
    version = opset(proto)
    added: list = []

    def node(op, ins, **attrs):
        out = fresh(f"empty_batch_{op.lower()}")
        added.append(helper.make_node(op, ins, [out], name=out, doc_string=MARK, **attrs))
        return out

    def const(name, value):
        tensor = numpy_helper.from_array(np.asarray(value), fresh(f"empty_batch_{name}"))
        g.initializer.append(tensor)
        return tensor.name

    zero, one = const("zero", np.array([0], np.int64)), const("one", np.array([1], np.int64))

    def shape(x, start, end=None):
        if version >= 15:  # Shape's start/end
            return node("Shape", [x], start=start, **({} if end is None else {"end": end}))
        stop = const("end", np.array([np.iinfo(np.int64).max if end is None else end], np.int64))
        return node("Slice", [node("Shape", [x]), const("start", np.array([start], np.int64)), stop, zero])

    # Outputs first: the graph's nodes now write each output's whole value under a new name.
    wholes = []
    for value in g.output:
        whole = fresh(f"{value.name}_all_rows")
        for n in g.node:
            n.output[:] = [whole if o == value.name else o for o in n.output]
        rename_uses(g, value.name, whole)
        wholes.append(whole)

    rows = shape(inputs[0].name, 0, 1)
    for value in inputs:
        padded = fresh(f"{value.name}_padded")
        rename_uses(g, value.name, padded)
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim[1:]]
        if None in dims:
            row_shape = node("Concat", [one, shape(value.name, 1)], axis=0)
        else:
            row_shape = const("row_shape", np.array([1, *dims], np.int64))
        blank = node("Expand", [const("blank", _blank(tensor.elem_type, 1 + len(dims))), row_shape])
        extra = node("Slice", [blank, rows, one, zero])
        added.append(helper.make_node("Concat", [value.name, extra], [padded], axis=0, name=padded, doc_string=MARK))
    cut = const("past_the_end", np.array([_PAST_THE_END], np.int64))
    ends = node("Mul", [rows, cut])
    first = list(added)
    added.clear()
    for value, whole in zip(g.output, wholes):
        added.append(
            helper.make_node(
                "Slice", [whole, zero, ends, zero], [value.name], name=fresh(f"{value.name}_rows"), doc_string=MARK
            )
        )
    nodes = [*first, *g.node, *added]
    del g.node[:]
    g.node.extend(nodes)
    return [
        f"serves an empty batch: a request of 0 rows runs on one blank row and each output is cut back to 0 rows "
        f"({len(inputs)} input(s), {len(g.output)} output(s)); other requests run as they are"
    ]


def _batched(value) -> bool:
    """Whether a graph input or output has a first dimension that can take any number of rows."""
    tensor = value.type.tensor_type
    if not value.type.HasField("tensor_type") or not tensor.HasField("shape") or not tensor.shape.dim:
        return False
    return not tensor.shape.dim[0].HasField("dim_value")


def _blank(elem_type: int, rank: int) -> np.ndarray:
    """One element of the input's type that any model can take: zero, False or the empty string, of `rank` dims."""
    if elem_type == TensorProto.STRING:
        return np.array([""], dtype=object).reshape([1] * rank)
    return np.zeros([1] * rank, dtype=helper.tensor_dtype_to_np_dtype(elem_type))
