"""Every artifact serves the batches a server sends: none, one, and a large one (report.json artifacts[].batches).

The repair for tf2onnx's Einsum Reshapes is checked on a graph built here
with the pattern tf2onnx writes, by ONNX Runtime before and after; the
conversions check the sample models, an attention model (whose ONNX file
needed that repair), and a graph whose outputs depend on the other rows in
the batch (which no batch size but its own serves).
"""

import json

import graph_models
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLES, invoke
from onnx import TensorProto, helper, numpy_helper

from mpconvert.export.artifacts import LARGE_BATCH
from mpconvert.onnx.repairs import explicit_reshape_sizes


def einsum_reshape() -> onnx.ModelProto:
    """x (n, 2, 12, 1, 8) -> Reshape to [prod(x.shape[0:2]), -1, x.shape[4]], as tf2onnx writes an Einsum."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 2, 12, 1, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", 12, 8])
    consts = {
        "batch_axes": np.array([0, 1], np.int64),
        "minus_one": np.array([-1], np.int64),
        "sum_axes": np.array([4], np.int64),
    }
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "batch_axes"], ["batch_dims"]),
        helper.make_node("ReduceProd", ["batch_dims"], ["batch"], keepdims=1),
        helper.make_node("Gather", ["shape", "sum_axes"], ["summed"]),
        helper.make_node("Concat", ["batch", "minus_one", "summed"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    graph = helper.make_graph(nodes, "einsum", [x], [y], [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def run(proto: onnx.ModelProto, rows: int) -> np.ndarray:
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.arange(rows * 2 * 12 * 8, dtype=np.float32).reshape(rows, 2, 12, 1, 8)
    return session.run(None, {"x": x})[0]


def test_the_reshape_repair_takes_an_empty_batch_and_changes_nothing_else():
    original = einsum_reshape()
    with pytest.raises(Exception, match="Reshape"):
        run(original, 0)  # the -1 beside a 0 is ambiguous: what the issue reported from ONNX Runtime
    repaired = einsum_reshape()
    assert explicit_reshape_sizes(repaired) == [
        "computed the -1 of 1 Reshape(s) from their input's shape, so that they take an empty batch"
    ]
    onnx.checker.check_model(repaired)
    assert run(repaired, 0).shape == (0, 12, 8)  # 0 * 2 rows, 12 * 1 in the middle, 8 summed
    for rows in (1, 3):
        assert run(repaired, rows).shape == (rows * 2, 12, 8)
        np.testing.assert_array_equal(run(repaired, rows), run(original, rows))
    assert explicit_reshape_sizes(repaired) == []  # nothing left to do: the pass is idempotent


def converted(model, out, *flags) -> dict:
    result = invoke(model, "--policy", "mixed_float16", "--out", out, "--finetune-steps", "0", "--no-speed", *flags)
    assert result.exit_code in (0, 3), result.output
    return json.loads((out / "report.json").read_text())


def served(report: dict) -> dict[str, list]:
    """What each serving artifact served; model.keras (the file training resumes from) is not run at them."""
    found = {a["kind"]: [(b["rows"], b["error"]) for b in a["batches"] or []] for a in report["artifacts"]}
    assert found.pop("keras", []) == []
    return found


def test_the_attention_model_s_onnx_file_serves_empty_and_large_batches(tmp_path):
    model = graph_models.keras_attention(tmp_path / "att.keras")
    graph_models.transformer_npz(tmp_path / "att.npz")
    report = converted(model, tmp_path / "out", "--data", tmp_path / "att.npz")
    assert report["passed"], [c["message"] for c in report["gate"]["checks"] if not c["passed"]]
    every = [(0, None), (1, None), (LARGE_BATCH, None)]
    assert served(report) == {"savedmodel": every, "onnx": every}
    onnx_artifact = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    assert any("so that they take an empty batch" in r for r in onnx_artifact["details"]["repairs"])
    parity = next(c for c in report["gate"]["checks"] if c["name"] == "artifact parity: onnx")
    assert parity["message"].endswith(f"serves 0, 1, {LARGE_BATCH} rows")
    for b in parity["values"]["batches"]:
        assert b["passed"] and b["max_abs_diff"] <= parity["values"]["limit"]


@pytest.mark.parametrize(
    ("model", "data"),
    [("cancer_mlp.keras", "breast_cancer.npz"), ("digits_mlp", "digits.npz"), ("digits_cnn.keras", "digits.npz")],
)
def test_every_artifact_of_the_sample_models_serves_0_1_and_4096_rows(tmp_path, model, data):
    report = converted(SAMPLES / model, tmp_path / "out", "--data", SAMPLES / "data" / data)
    assert report["passed"], [c["message"] for c in report["gate"]["checks"] if not c["passed"]]
    for kind, sizes in served(report).items():
        assert sizes == [(0, None), (1, None), (LARGE_BATCH, None)], kind


def test_outputs_that_depend_on_the_batch_fail_the_gate_naming_the_size(tmp_path):
    saved = graph_models.batch_centered(tmp_path / "centred")
    result = invoke(saved, "--policy", "mixed_float16", "--out", tmp_path / "out", "--no-speed")
    assert result.exit_code == 3, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    for kind in ("savedmodel", "onnx"):
        check = next(c for c in report["gate"]["checks"] if c["name"] == f"artifact parity: {kind}")
        assert not check["passed"] and "cannot serve 1 rows: max abs diff" in check["message"], check["message"]
        one = next(b for b in check["values"]["batches"] if b["rows"] == 1)
        # One row centred on itself is all zeros: the difference is that row's own centred scores.
        assert one["max_abs_diff"] > check["values"]["limit"] and not one["passed"]
    assert "cannot serve 1 rows" in result.output
