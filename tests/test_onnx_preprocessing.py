"""Keras preprocessing layers in the ONNX file: each layer against Keras, whole conversions, and the refusal.

Discretization (Bucketize), IntegerLookup (a hash table: ai.onnx.ml
LabelEncoder with its vocabulary and the out-of-vocabulary index),
CategoryEncoding (one_hot, multi_hot, count), Normalization and Rescaling
run in ONNX Runtime to exactly Keras's integers and to float32 rounding of
its floats. Hashing's FarmHash has no ONNX operator: the ONNX file is
refused as not exportable, and the SavedModel serves the model.
"""

import json

import numpy as np
import onnxruntime as ort
import preprocessing_models as pm
import pytest
import tensorflow as tf
from conftest import invoke

from mpconvert.onnx.export import keras_to_onnx

LAYERS = ["integer_lookup", "one_hot", "multi_hot", "count", "discretization", "normalization", "rescaling"]


@pytest.mark.parametrize("kind", LAYERS)
def test_each_layer_runs_in_onnx_runtime_as_in_keras(tmp_path, kind):
    model = pm.layer_model(kind)
    x = pm.layer_inputs(kind)
    spec = model.inputs[0]
    exported = keras_to_onnx(
        model, [tf.TensorSpec((None, *spec.shape[1:]), spec.dtype, name=spec.name)], tmp_path / "m.onnx"
    )
    session = ort.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
    got = session.run(None, {session.get_inputs()[0].name: x})[0]
    want = np.asarray(model(x))
    assert got.shape == want.shape
    if kind == "integer_lookup":
        # Hand-computed: id 2k (k < 10) is in the vocabulary at index k + 1; odd ids are out of it (0).
        expected = np.where(x % 2 == 0, x // 2 + 1, 0)
        np.testing.assert_array_equal(got, expected)
    if kind == "discretization":
        # The boundaries themselves: -2 -> bucket 1, 0 -> 2, 2 -> 3 (x == b goes above b).
        assert got[0].tolist() == [1, 2, 3]
    if np.issubdtype(want.dtype, np.integer) or kind in ("one_hot", "multi_hot", "count"):
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_a_tabular_model_of_preprocessing_layers_converts_with_an_onnx_file(tmp_path, policy):
    model = pm.tabular(tmp_path / "tabular.keras")
    data = pm.tabular_npz(tmp_path / "tabular.npz")
    out = tmp_path / "out"
    result = invoke(model, "--policy", policy, "--data", data, "--out", out, "--finetune-steps", "0", "--no-speed")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    onnx = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    assert not onnx["failed"] and onnx["path"] == "model.onnx"
    check = next(c for c in report["gate"]["checks"] if c["name"] == "artifact parity: onnx")
    assert check["passed"] and onnx["max_abs_diff"] <= check["values"]["limit"]
    assert [b["error"] for b in onnx["batches"]] == [None, None, None]
    assert report["validation"]["drop"] <= 0.01


@pytest.mark.parametrize("text", [False, True], ids=["ids", "text"])
def test_a_hashing_layer_is_not_exportable_to_onnx_and_the_savedmodel_serves_it(tmp_path, text):
    model = pm.hashed(tmp_path / "hashed.keras", text=text)
    out = tmp_path / "out"
    args = ["--data", pm.hashed_npz(tmp_path / "hashed.npz", text), "--out", out, "--finetune-steps", "0", "--no-speed"]
    result = invoke(model, "--policy", "mixed_float16", *args)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    onnx = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    assert onnx["exportable"] is False and onnx["path"] is None and not (out / "model.onnx").exists()
    assert "not exportable to ONNX: layer 'hash'" in onnx["reason"] and "FarmHash" in onnx["reason"]
    checks = {c["name"]: c for c in report["gate"]["checks"]}
    assert checks["artifact parity: onnx"]["passed"] and "not exportable" in checks["artifact parity: onnx"]["message"]
    assert checks["artifact parity: savedmodel"]["passed"]
    assert "not exportable" in result.output
    saved = next(a for a in report["artifacts"] if a["kind"] == "savedmodel")
    assert [(b["rows"], b["error"]) for b in saved["batches"]] == [(0, None), (1, None), (4096, None)]


def test_a_format_that_cannot_express_the_model_fails_when_it_was_the_only_file_asked_for(tmp_path):
    model = pm.hashed(tmp_path / "hashed.keras")
    out = tmp_path / "out"
    args = ["--data", pm.hashed_npz(tmp_path / "hashed.npz"), "--out", out, "--finetune-steps", "0", "--no-speed"]
    result = invoke(model, "--policy", "mixed_float16", *args, "--export", "onnx")
    # Nothing would serve the model: not a pass.
    assert result.exit_code == 3, result.output
    report = json.loads((out / "report.json").read_text())
    check = next(c for c in report["gate"]["checks"] if c["name"] == "artifact parity: onnx")
    assert not check["passed"] and "no other file serves the model: add --export savedmodel" in check["message"]
    assert [c["name"] for c in report["gate"]["checks"] if not c["passed"]] == ["artifact parity: onnx"]
    assert not (out / "model.onnx").exists()
    # The stored report re-judges to the same verdict.
    assert invoke("check", out / "report.json").exit_code == 3
