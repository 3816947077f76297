"""`Isolated` beyond a crash (test_empty_batch.py has those): a run that never returns is stopped at its
deadline and named, and a file is timed and measured inside its child, as `verify` needs.

The files are real ONNX graphs run by ONNX Runtime: a Loop of 2**63 - 1 trips (runtime_faults.py) is the
hang, a MatMul the model that serves.
"""

import functools

import numpy as np
import pytest
import runtime_faults
from onnx import TensorProto, helper, numpy_helper, save

from mpconvert.runners.isolated import Crashed, Hung, Isolated
from mpconvert.runners.onnx import ORT_CPU, OnnxRunner
from mpconvert.speed.timing import timed_calls

FEATURES = 5


def matmul_file(path):
    weights = np.arange(FEATURES * 3, dtype=np.float32).reshape(FEATURES, 3) / 10
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", FEATURES])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])],
        [numpy_helper.from_array(weights, "w")],
    )
    save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path, weights


def test_a_run_that_never_returns_is_stopped_at_the_deadline_and_named(tmp_path):
    # The loop never ends, so a deadline of seconds says nothing about this machine's speed.
    path = runtime_faults.hanging_file(tmp_path / "forever.onnx", "x", FEATURES)
    runner = Isolated(OnnxRunner(path, ("x",), ("y",), providers=(ORT_CPU,)), deadline_s=5)
    with runner, pytest.raises(Hung) as stopped:
        runner.run([np.ones((7, FEATURES), np.float32)])
    assert isinstance(stopped.value, Crashed)  # every caller that names a crash names a hang too
    assert stopped.value.message == (
        "ONNX Runtime did not answer within 5 s on 7 rows (the deadline of a run; a hang?): its child process "
        "was stopped"
    )
    assert runner.memory() is None  # no child left running


def test_a_file_is_timed_and_measured_inside_its_child(tmp_path):
    path, weights = matmul_file(tmp_path / "matmul.onnx")
    x = np.random.default_rng(0).normal(size=(64, FEATURES)).astype(np.float32)
    timing = functools.partial(timed_calls, repeats=7, budget_s=None, warmup=1, min_rounds=7)
    with Isolated(OnnxRunner(path, ("x",), ("y",), providers=(ORT_CPU,)), preload=("onnxruntime",)) as runner:
        assert runner.memory() is None  # nothing has run: nothing to measure
        np.testing.assert_allclose(runner.run([x]).outputs[0], x @ weights, rtol=1e-6)
        calls = runner.timed([x], timing, calls=8)
        growth = runner.memory()
        call = runner.timer([x[:2]])  # prepared in the child; each call a request to it
        assert call() is None and call() is None
    # The child's own calls: 7 timed after 1 warm-up (budget_s=None: all of them), none of them nothing.
    assert len(calls) == 7 and all(isinstance(c, float) and c > 0 for c in calls)
    # The child's resident memory before its first run (a Python with NumPy, ONNX and ONNX Runtime imported:
    # tens of MB) and what the session and the runs added to it.
    assert growth is not None and growth.before > 10 << 20 and growth.peak >= growth.before + growth.bytes
    assert growth.bytes > 0
