"""--onnx-io float16: an ONNX file whose float inputs and outputs are float16, and the edges every report records."""

import json

import dict_models
import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import SAMPLES, invoke
from onnx import TensorProto

from mpconvert.report.schema import problems

CANCER = [SAMPLES / "cancer_mlp.keras", "--data", SAMPLES / "data" / "breast_cancer.npz"]


def convert(tmp_path, name, *args):
    out = tmp_path / name
    result = invoke(*args, "--policy", "mixed_float16", "--out", out, "--finetune-steps", "0", "--no-speed")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert problems(report, "report") == []
    return out, next(a for a in report["artifacts"] if a["kind"] == "onnx")


def elem_types(path) -> tuple[dict, dict]:
    graph = onnx.load(path).graph
    return (
        {v.name: v.type.tensor_type.elem_type for v in graph.input},
        {v.name: v.type.tensor_type.elem_type for v in graph.output},
    )


def test_float16_inputs_and_outputs_run_within_parity_of_the_float32_file(tmp_path):
    half, half_artifact = convert(tmp_path, "half", *CANCER, "--onnx-io", "float16")
    full, full_artifact = convert(tmp_path, "full", *CANCER)
    assert elem_types(half / "model.onnx") == ({"features": TensorProto.FLOAT16}, {"malignant": TensorProto.FLOAT16})
    assert elem_types(full / "model.onnx") == ({"features": TensorProto.FLOAT}, {"malignant": TensorProto.FLOAT})
    assert half_artifact["details"]["io"] == "float16" and full_artifact["details"]["io"] == "float32"
    assert half_artifact["details"]["opset"] == 17
    assert half_artifact["details"]["edges"] == {
        "inputs": {"features": {"type": "float16", "cast_to": ["float32"]}},
        "outputs": {"malignant": {"type": "float16", "cast_from": "float32"}},
    }
    assert full_artifact["details"]["edges"]["inputs"]["features"]["type"] == "float32"
    # The file itself, fed float16 rows by ONNX Runtime directly, against the float32-edged file.
    with np.load(SAMPLES / "data" / "breast_cancer.npz", allow_pickle=False) as npz:
        x = npz["x"][:64].astype(np.float32)
    sessions = [ort.InferenceSession(str(p / "model.onnx"), providers=["CPUExecutionProvider"]) for p in (half, full)]
    got = sessions[0].run(None, {"features": x.astype(np.float16)})[0]
    want = sessions[1].run(None, {"features": x})[0]
    assert got.dtype == np.float16 and got.shape == want.shape
    # float16 rounding of the inputs and of outputs in [0, 1]: well inside the ONNX parity limit.
    assert np.abs(got.astype(np.float32) - want).max() <= half_artifact["max_abs_ref"] * 0.02
    assert half_artifact["batches"] and all(b["error"] is None for b in half_artifact["batches"])
    # The schema describes the edges: a report that lost an input's casts or mistyped the opset is refused.
    report = json.loads((half / "report.json").read_text())
    onnx_details = next(a for a in report["artifacts"] if a["kind"] == "onnx")["details"]
    del onnx_details["edges"]["inputs"]["features"]["cast_to"]
    onnx_details["opset"] = "17"
    assert len(problems(report, "report")) == 2


def test_integer_inputs_stay_integer_with_float16_io(tmp_path):
    model = dict_models.tokens_and_num(keras)
    model.save(tmp_path / "dict.keras")
    dict_models.npz(tmp_path / "dict.npz")
    out, artifact = convert(
        tmp_path, "out", tmp_path / "dict.keras", "--data", tmp_path / "dict.npz", "--onnx-io", "float16"
    )
    inputs, outputs = elem_types(out / "model.onnx")
    assert inputs == {"tokens": TensorProto.INT32, "num": TensorProto.FLOAT16}
    assert set(outputs.values()) == {TensorProto.FLOAT16}
    assert artifact["details"]["edges"]["inputs"]["tokens"]["type"] == "int32"


@pytest.mark.parametrize("value", ["int8", "bfloat16"])
def test_an_io_type_onnx_runtime_servers_do_not_take_is_a_usage_error(tmp_path, value):
    result = invoke(*CANCER, "--policy", "mixed_float16", "--out", tmp_path / "out", "--onnx-io", value)
    assert result.exit_code == 2 and "--onnx-io" in result.output and not (tmp_path / "out").exists()
