"""Every ONNX file serves an empty batch (issue 37), and no runtime crash takes mpconvert down with it.

The padding pass (onnx/empty_batch.py) is checked on small graphs built
here, each run by ONNX Runtime before and after it: the 0-row outputs have
the shape (0, ...) and dtype a model's would have, and every other request
gets what the bare graph returns, bit for bit (the proof that the
transformation changes nothing else). A child-process runner
(runners/isolated.py) turns a runtime's abort into a named failure; one
conversion shows it end to end (exit 3, the report naming the size and
the signal, nothing left half-written), one that the whole of it serves.
"""

import copy
import json

import empty_batch_models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import invoke
from onnx import TensorProto, helper, numpy_helper

from mpconvert.export.artifacts import LARGE_BATCH, serving_batches
from mpconvert.onnx.empty_batch import serve_empty_batch
from mpconvert.runners.isolated import Crashed, Isolated
from mpconvert.runners.onnx import ORT_CPU, OnnxRunner, run_onnx

WORDS = ("red", "green", "blue")


def ragged_graph(opset: int = 17) -> onnx.ModelProto:
    """Three inputs of three kinds, and outputs whose non-batch dims are unknown or fixed, of three dtypes.

    x (n, t, 2) float -> Reshape to [n, -1] (the -1 beside an empty batch's 0 is what ONNX Runtime refuses)
    ids (n, 2) int64 -> ids + 1; words (n, 1) string -> LabelEncoder ids; x > 0 (bool).
    """
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "t", 2]),
        helper.make_tensor_value_info("ids", TensorProto.INT64, ["n", 2]),
        helper.make_tensor_value_info("words", TensorProto.STRING, ["n", 1]),
    ]
    outputs = [
        helper.make_tensor_value_info("flat", TensorProto.FLOAT, ["n", "m"]),
        helper.make_tensor_value_info("next_ids", TensorProto.INT64, ["n", 2]),
        helper.make_tensor_value_info("word_ids", TensorProto.INT64, ["n", 1]),
        helper.make_tensor_value_info("positive", TensorProto.BOOL, ["n", "t", 2]),
    ]
    consts = {"zero": np.array([0], np.int64), "one": np.array([1], np.int64), "minus_one": np.array([-1], np.int64)}
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Slice", ["x_shape", "zero", "one", "zero"], ["batch"]),
        helper.make_node("Concat", ["batch", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Add", ["ids", "one"], ["next_ids"]),
        helper.make_node(
            "LabelEncoder", ["words"], ["word_ids"], domain="ai.onnx.ml", keys_strings=WORDS, values_int64s=[1, 2, 3]
        ),
        helper.make_node("Greater", ["x", "zero_f"], ["positive"]),
    ]
    initializers = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    initializers.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero_f"))
    graph = helper.make_graph(nodes, "ragged", inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid("ai.onnx.ml", 2)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8)


def feeds(rows: int, steps: int = 3) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rows)
    return {
        "x": rng.normal(size=(rows, steps, 2)).astype(np.float32),
        "ids": rng.integers(0, 9, size=(rows, 2)).astype(np.int64),
        "words": np.array(WORDS + ("grey",), dtype=object)[rng.integers(0, 4, rows)].reshape(rows, 1),
    }


def session(proto: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(proto.SerializeToString(), providers=[ORT_CPU])


@pytest.mark.parametrize("opset", [13, 17])  # before and since Shape's start/end (opset 15)
def test_the_padding_serves_0_rows_of_every_output_and_changes_no_other_request(opset):
    bare = ragged_graph(opset)
    with pytest.raises(Exception, match="Reshape"):
        session(bare).run(None, feeds(0))  # what the issue reported of the ViT: the -1 beside the 0
    padded = copy.deepcopy(bare)
    done = serve_empty_batch(padded)
    assert len(done) == 1 and "serves an empty batch" in done[0] and "(3 input(s), 4 output(s))" in done[0]
    onnx.checker.check_model(padded, full_check=True)
    assert [i.name for i in padded.graph.input] == ["x", "ids", "words"]
    assert [o.name for o in padded.graph.output] == ["flat", "next_ids", "word_ids", "positive"]

    empty = session(padded).run(None, feeds(0, steps=5))
    # The shapes a model returns for 0 rows: its non-batch dims from the request (t = 5: 10 values a row).
    assert [(o.shape, o.dtype) for o in empty] == [
        ((0, 10), np.float32),
        ((0, 2), np.int64),
        ((0, 1), np.int64),
        ((0, 5, 2), np.bool_),
    ]
    for rows in (1, 7, 300):
        request = feeds(rows)
        for got, want in zip(session(padded).run(None, request), session(bare).run(None, request)):
            assert got.dtype == want.dtype and got.shape[0] == rows
            np.testing.assert_array_equal(got, want)
    assert serve_empty_batch(padded) == []  # its own work is recognised: not padded twice


def test_an_output_that_is_not_one_row_per_input_row_comes_back_whole():
    """y = x stacked twice (2n rows): the cut only applies to an empty request, so a wrong batch stays visible."""
    graph = helper.make_graph(
        [helper.make_node("Concat", ["x", "x"], ["y"], axis=0)],
        "twice",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", 3])],
    )
    bare = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    padded = copy.deepcopy(bare)
    assert serve_empty_batch(padded)
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = session(padded).run(None, {"x": x})[0]
    assert got.shape == (8, 3)
    np.testing.assert_array_equal(got, np.concatenate([x, x]))
    assert session(padded).run(None, {"x": x[:0]})[0].shape == (0, 3)


@pytest.mark.parametrize(
    ("x_dims", "y_dims"),
    [([1, 3], [1, 3]), (["n", 3], [1, 3]), ([], [])],
    ids=["fixed input batch", "fixed output batch", "scalars"],
)
def test_a_graph_without_a_batch_to_pad_is_left_as_it_is(x_dims, y_dims):
    graph = helper.make_graph(
        [helper.make_node("ReduceMean", ["x"], ["y"], axes=[0], keepdims=1)]
        if x_dims
        else [helper.make_node("Relu", ["x"], ["y"])],
        "fixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_dims)],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    before = proto.SerializeToString()
    assert serve_empty_batch(proto) == []
    assert proto.SerializeToString() == before


# --- a runtime that aborts ---------------------------------------------------------------------------------

STEPS, FEATURES, UNITS = 3, 2, 4


def lstm_file(path, pad: bool = False):
    """x (n, 3, 2) -> a bidirectional ONNX LSTM -> its last states (n, 2, 4): the op tf2onnx writes for an
    unmasked Bidirectional(LSTM), on which ONNX Runtime 1.31 calls std::terminate with 0 rows."""
    rng = np.random.default_rng(0)
    weights = {
        "W": rng.normal(size=(2, 4 * UNITS, FEATURES)).astype(np.float32) * 0.5,
        "R": rng.normal(size=(2, 4 * UNITS, UNITS)).astype(np.float32) * 0.5,
    }
    nodes = [
        helper.make_node("Transpose", ["x"], ["time_major"], perm=[1, 0, 2]),
        helper.make_node("LSTM", ["time_major", "W", "R"], ["", "last"], direction="bidirectional", hidden_size=UNITS),
        helper.make_node("Transpose", ["last"], ["states"], perm=[1, 0, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "bilstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", STEPS, FEATURES])],
        [helper.make_tensor_value_info("states", TensorProto.FLOAT, ["n", 2, UNITS])],
        [numpy_helper.from_array(v, k) for k, v in weights.items()],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    if pad:
        serve_empty_batch(proto)
    onnx.save(proto, path)
    return path


def test_a_runtime_that_aborts_is_a_named_failure_and_the_padded_file_serves(tmp_path):
    """A real file and a real abort (not a stand-in): ONNX Runtime's LSTM kernel on 0 rows. In-process this
    test would die with SIGABRT; through `Isolated` the crash is the 0-row finding, and the child that died
    is replaced for the next size."""
    x = np.random.default_rng(1).normal(size=(5, STEPS, FEATURES)).astype(np.float32)
    bare = OnnxRunner(lstm_file(tmp_path / "bare.onnx"), ("x",), ("states",), providers=(ORT_CPU,))
    with Isolated(bare) as runner:
        expected = runner.run([x]).outputs
        assert expected[0].shape == (5, 2, UNITS)
        batches = serving_batches(runner, [x], expected)
        with pytest.raises(Crashed, match=r"aborted the process \(SIGABRT\) on 0 rows"):
            runner.run([x[:0]])
    assert [b.rows for b in batches] == [0, 1, LARGE_BATCH]
    assert batches[0].error.startswith("ONNX Runtime aborted the process (SIGABRT) on 0 rows")
    assert batches[0].max_abs_diff is None
    assert [(b.error, b.max_abs_diff) for b in batches[1:]] == [(None, 0.0), (None, 0.0)]

    padded = OnnxRunner(lstm_file(tmp_path / "padded.onnx", pad=True), ("x",), ("states",), providers=(ORT_CPU,))
    with Isolated(padded) as runner:
        served = serving_batches(runner, [x], expected)
    assert [(b.rows, b.error, b.max_abs_diff) for b in served] == [
        (0, None, 0.0),
        (1, None, 0.0),
        (LARGE_BATCH, None, 0.0),
    ]


def test_an_error_the_runtime_raises_comes_back_as_raised(tmp_path):
    bare = OnnxRunner(lstm_file(tmp_path / "bare.onnx"), ("x",), ("states",), providers=(ORT_CPU,))
    with Isolated(bare) as runner, pytest.raises(Exception, match="Got invalid dimensions for input: x") as raised:
        runner.run([np.zeros((2, STEPS + 1, FEATURES), np.float32)])
    assert type(raised.value).__name__ == "InvalidArgument"  # ONNX Runtime's own type, as in-process


# --- end to end ------------------------------------------------------------------------------------------


def test_the_spam_classifier_converts_and_every_artifact_serves_0_1_and_large_batches(tmp_path):
    """The issue's legacy .h5: its bare ONNX file aborted ONNX Runtime on 0 rows (exit 134); now it passes."""
    model, data = empty_batch_models.spam_bilstm_h5(tmp_path, vocab=50, maxlen=8, units=4, epochs=1)
    out = tmp_path / "out"
    result = invoke(
        model, "--policy", "mixed_bfloat16", "--data", data, "--out", out, "--finetune-steps", "0", "--no-speed"
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    served = {a["kind"]: [(b["rows"], b["error"]) for b in a["batches"] or []] for a in report["artifacts"]}
    every = [(0, None), (1, None), (LARGE_BATCH, None)]
    assert served["onnx"] == every and served["savedmodel"] == every
    onnx_artifact = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    assert any(r.startswith("serves an empty batch") for r in onnx_artifact["details"]["repairs"])
    # bfloat16 inside: ONNX Runtime's CPU provider runs it on a copy with those ops in float32.
    empty = run_onnx(out / "model.onnx", {"tokens": np.zeros((0, 8), np.int32)}).outputs
    assert [(o.shape, o.dtype) for o in empty] == [((0, 1), np.float32)]


def test_a_runtime_abort_in_a_conversion_is_exit_3_naming_it_with_nothing_left_behind(tmp_path):
    """A real abort end to end. No file mpconvert pads sends 0 rows to its ops any more, so the model is one
    it cannot pad: its output is the mean over the batch (first dimension fixed at 1), and its LSTM op meets
    the empty request. Before, the process died with SIGABRT (exit 134), leaving .partial-* and a lock."""
    model = empty_batch_models.batch_pooled_bilstm(tmp_path)
    out = tmp_path / "out"
    result = invoke(model, "--policy", "mixed_float16", "--out", out, "--finetune-steps", "0", "--no-speed")
    assert result.exit_code == 3, result.output
    report = json.loads((out / "report.json").read_text())
    onnx_artifact = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    empty = onnx_artifact["batches"][0]
    assert empty["rows"] == 0 and empty["error"].startswith("ONNX Runtime aborted the process (SIGABRT) on 0 rows")
    assert not any("serves an empty batch" in r for r in onnx_artifact["details"]["repairs"])
    check = next(c for c in report["gate"]["checks"] if c["name"] == "artifact parity: onnx")
    assert not check["passed"] and "cannot serve 0 rows: ONNX Runtime aborted the process (SIGABRT)" in check["message"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "pooled.h5"]  # no .partial-*, no lock
