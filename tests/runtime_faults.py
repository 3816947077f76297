"""ONNX files that ONNX Runtime 1.31 cannot survive, built by committed code: a forged or swapped model.onnx.

Both take one float input (n, features) named as the model's they replace, so `verify` feeds them the
golden rows as it would the real file.

* `aborting_file`: the rows sliced to none, then the bidirectional LSTM op tf2onnx writes for an
  unmasked Bidirectional(LSTM): ONNX Runtime calls std::terminate on its empty batch, whatever the
  request's size (SIGABRT, "terminate called without an active exception").
* `hanging_file`: a Loop of 2**63 - 1 trips adding one to the rows' sum: it never returns.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

UNITS = 4


def _save(path: Path, name: str, features: int, nodes: list, initializers: list) -> Path:
    graph = helper.make_graph(
        nodes,
        "forged",
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["n", features])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        initializers,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(proto, full_check=True)
    onnx.save(proto, path)
    return Path(path)


def aborting_file(path: Path, name: str, features: int) -> Path:
    rng = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(rng.normal(size=(2, 4 * UNITS, features)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.normal(size=(2, 4 * UNITS, UNITS)).astype(np.float32), "R"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
    ]
    nodes = [
        helper.make_node("Slice", [name, "zero", "zero", "zero"], ["none"]),  # rows [0:0] of the request
        helper.make_node("Unsqueeze", ["none", "zero"], ["time_major"]),  # (1 step, 0 rows, features)
        helper.make_node("LSTM", ["time_major", "W", "R"], ["", "last"], direction="bidirectional", hidden_size=UNITS),
        helper.make_node("ReduceSum", ["last"], ["y"], keepdims=0),
    ]
    return _save(path, name, features, nodes, initializers)


def hanging_file(path: Path, name: str, features: int) -> Path:
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["total_in", "one"], ["total_out"]),
        ],
        "forever",
        [
            helper.make_tensor_value_info("trip", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("total_in", TensorProto.FLOAT, []),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("total_out", TensorProto.FLOAT, []),
        ],
        [numpy_helper.from_array(np.array(1.0, np.float32), "one")],
    )
    initializers = [
        numpy_helper.from_array(np.array(np.iinfo(np.int64).max, np.int64), "trips"),
        numpy_helper.from_array(np.array(True), "go"),
    ]
    nodes = [
        helper.make_node("ReduceSum", [name], ["total"], keepdims=0),
        helper.make_node("Loop", ["trips", "go", "total"], ["y"], body=body),
    ]
    return _save(path, name, features, nodes, initializers)
