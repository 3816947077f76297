"""End-to-end conversions through the command line, as a user runs them."""

import hashlib
import json
import os
import shutil

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import onnx
import pytest
import tensorflow as tf
import tf_keras
import tiny_models
from conftest import SAMPLES, invoke
from onnx_graph import weight_initializers

DIGITS = SAMPLES / "data" / "digits.npz"
CANCER = SAMPLES / "data" / "breast_cancer.npz"
CASES = {
    "digits_mlp": (SAMPLES / "digits_mlp", DIGITS),
    "digits_cnn": (SAMPLES / "digits_cnn.keras", DIGITS),
    "cancer_mlp": (SAMPLES / "cancer_mlp.keras", CANCER),
}
# Largest |artifact - converted Keras model| we accept: float16 keeps about
# 3-4 significant digits, bfloat16 about 2-3, on probabilities in [0, 1].
PARITY = {"mixed_float16": 5e-3, "mixed_bfloat16": 3e-2}


def tree_hash(path):
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        digest.update(str(file.relative_to(path.parent)).encode())
        digest.update(file.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """Each sample model converted once under each policy, shared by the tests."""
    results = {}
    base = tmp_path_factory.mktemp("converted")
    for name, (model, data) in CASES.items():
        before = tree_hash(model)
        for policy in ("mixed_float16", "mixed_bfloat16"):
            out = base / f"{name}_{policy}"
            # --no-speed: no test here reads the speed section (tests/test_speed.py and test_api's
            # CLI-against-API runs time converted models); the rest runs as a user's default run.
            result = invoke(model, "--policy", policy, "--data", data, "--out", out, "--no-speed")
            report = json.loads((out / "report.json").read_text()) if (out / "report.json").exists() else None
            results[name, policy] = (result, out, report)
        assert tree_hash(model) == before, f"{model} was modified"
    return results


CONVERSIONS = [(n, p) for n in CASES for p in ("mixed_float16", "mixed_bfloat16")]


@pytest.mark.parametrize("name,policy", CONVERSIONS)
def test_sample_converts_and_passes_the_gate(converted, name, policy):
    result, out, report = converted[name, policy]
    assert result.exit_code == 0, result.output + (result.stderr or "")
    assert "PASSED" in result.output
    assert report["passed"] is True and report["policy"] == policy
    v = report["validation"]
    assert v["metric"] == "accuracy" and v["data"] == "npz"
    assert v["reference"] >= 0.94 and v["drop"] <= report["gate"]["thresholds"]["max_drop"] == 0.01
    assert v["drop"] == pytest.approx(v["reference"] - v["converted"])
    assert 0.97 <= v["agreement"] <= 1.0
    if report["finetune"]["kept"] == "rewritten":  # fine-tuned weights move further, by design
        assert 0 < v["max_abs_diff"] < PARITY[policy] * 2
    for key in ("path", "format"):
        assert report["source"][key]
    assert set(report["versions"]) >= {"python", "tensorflow", "keras", "tf_keras", "tf2onnx", "onnx", "onnxruntime"}
    assert set(report["timings"]) >= {"load", "rewrite", "validate", "export"}


@pytest.mark.parametrize("name,policy", CONVERSIONS)
def test_samples_fine_tune_by_default_and_never_get_worse(converted, name, policy):
    _, _, report = converted[name, policy]
    ft = report["finetune"]
    assert ft["steps"] == ft["requested_steps"] == 100 and ft["healthy"] and ft["skipped_steps"] == 0
    assert ft["kept"] in ("finetuned", "rewritten")
    # no harm: the validated model is at least as good as before fine-tuning
    assert report["validation"]["converted"] >= ft["metric_before"]
    if ft["kept"] == "finetuned":
        assert ft["metric_after"] == report["validation"]["converted"]
    if policy == "mixed_float16":  # Keras 3 and tf-keras loss-scale optimizers
        assert ft["loss_scale"]["initial"] == 32768.0 and ft["loss_scale"]["min"] > 1
    else:
        assert ft["loss_scale"] is None
    assert ft["loss"]["first"] > 0 and ft["loss"]["last"] > 0
    assert ft["step_time"]["float32_ms"] > 0 and ft["step_time_ratio"] > 0
    assert ft["loss_function"].endswith("(saved with the model)")


@pytest.mark.parametrize("name,policy", CONVERSIONS)
def test_every_artifact_reloads_within_tolerance(converted, name, policy):
    _, out, report = converted[name, policy]
    kinds = {a["kind"]: a for a in report["artifacts"]}
    expected = {"savedmodel", "onnx"} | ({"keras"} if name != "digits_mlp" else set())
    assert set(kinds) == expected
    for art in report["artifacts"]:
        path = out / art["path"]
        assert path.exists()
        assert art["bytes"] > 0
        assert art["max_abs_diff"] is not None and art["max_abs_diff"] <= PARITY[policy], art
    sig = tf.saved_model.load(str(out / "savedmodel")).signatures["serving_default"]
    assert all(spec.dtype == tf.float32 for spec in sig.structured_input_signature[1].values())
    assert all(spec.dtype == tf.float32 for spec in sig.structured_outputs.values())


@pytest.mark.parametrize("name,policy", CONVERSIONS)
def test_onnx_file_is_valid_with_float32_edges(converted, name, policy):
    _, out, _ = converted[name, policy]
    proto = onnx.load(str(out / "model.onnx"))
    onnx.checker.check_model(proto, full_check=True)
    for value in list(proto.graph.input) + list(proto.graph.output):
        assert value.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    # bfloat16 Convs run in float32 islands; their weights stay bfloat16 in the file
    wanted = onnx.TensorProto.FLOAT16 if policy == "mixed_float16" else onnx.TensorProto.BFLOAT16
    weights = [w.data_type for w in weight_initializers(proto)]
    assert weights and all(w == wanted for w in weights), weights


@pytest.mark.parametrize("name,policy", CONVERSIONS)
def test_samples_are_padded_and_the_onnx_weights_show_it(converted, name, policy):
    _, out, report = converted[name, policy]
    padding = report["padding"]
    assert padding["passed"] and padding["exported"] == "padded" and padding["float32_max_abs_diff"] <= 1e-6
    assert padding["padded"] and all(d["to"] % 8 == 0 for d in padding["padded"])
    dims = {d for w in weight_initializers(onnx.load(str(out / "model.onnx"))) for d in w.dims}
    # the widths that were padded no longer occur in any weight
    assert not dims & {d["from"] for d in padding["padded"]}, (dims, padding["padded"])


def test_float16_onnx_is_about_half_the_float32_size(converted, tmp_path):
    # A float32 reference export of the same model, for the size ratio.
    _, out, report = converted["digits_cnn", "mixed_float16"]
    proto = onnx.load(str(out / "model.onnx"))
    half = sum(np.prod(i.dims) * 2 for i in proto.graph.initializer if i.data_type == onnx.TensorProto.FLOAT16)
    assert half > 0
    onnx_bytes = next(a["bytes"] for a in report["artifacts"] if a["kind"] == "onnx")
    # float32 bytes of the same (padded) weights, as the exported .keras holds them
    float32_weights = sum(w.size * 4 for w in keras.models.load_model(out / "model.keras").get_weights())
    assert onnx_bytes < 0.75 * float32_weights


@pytest.mark.parametrize("name", list(CASES))
def test_report_layers_match_the_converted_model(converted, name):
    _, out, report = converted[name, "mixed_float16"]
    layers = {layer["name"]: layer for layer in report["layers"]}
    output_name = report["source"]["outputs"][0]["name"]
    assert layers[output_name]["policy"] == "float32"
    assert layers[output_name]["pinned"].startswith("model output")
    assert layers[output_name + "_linear"]["policy"] == "mixed_float16"
    if name == "digits_mlp":
        reloaded = tf_keras.models.load_model(str(out / "savedmodel"), compile=False)
    else:
        reloaded = keras.models.load_model(out / "model.keras")
    for layer in reloaded.layers:
        if layer.name in layers and layers[layer.name]["pinned"] is None:
            assert layer.dtype_policy.name == "mixed_float16", layer.name
            assert layer.dtype_policy.compute_dtype == "float16"
    assert reloaded.get_layer(output_name).dtype_policy.compute_dtype == "float32"


def test_default_output_folder_is_a_sibling_named_after_model_and_policy(tmp_path):
    model = tmp_path / "cancer_mlp.keras"
    shutil.copy(CASES["cancer_mlp"][0], model)
    # Only where the output goes is read: no fine-tuning or timing.
    cheap = ("--finetune-steps", "0", "--no-speed")
    result = invoke(model, "--policy", "mixed_bfloat16", "--data", CANCER, "--export", "savedmodel", *cheap)
    assert result.exit_code == 0, result.output
    out = tmp_path / "cancer_mlp_mixed_bfloat16"
    assert (out / "report.json").is_file() and (out / "savedmodel" / "saved_model.pb").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cancer_mlp.keras", "cancer_mlp_mixed_bfloat16"]


def test_without_data_the_summary_says_accuracy_was_not_measured(tmp_path):
    out = tmp_path / "out"
    args = ("--policy", "mixed_float16", "--out", out, "--export", "savedmodel", "--no-speed")
    result = invoke(CASES["digits_cnn"][0], *args)
    assert result.exit_code == 0
    assert "accuracy not measured" in result.output
    v = json.loads((out / "report.json").read_text())["validation"]
    assert v["data"] == "generated" and v["metric"] is None and v["reference"] is None
    assert v["max_abs_diff"] > 0 and v["rows"] == 64


@pytest.fixture(scope="module")
def overflow_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("overflow")
    model = tiny_models.float16_overflow(keras)
    x = np.random.default_rng(1).standard_normal((200, 8)).astype("float32")
    # Labels are the float32 model's own predictions, so the reference scores 1.0.
    y = model.predict(x, verbose=0).argmax(axis=1)
    model.save(folder / "overflow.keras")
    np.savez(folder / "data.npz", x=x, y=y)
    return folder / "overflow.keras", folder / "data.npz"


def test_float16_overflow_fails_the_gate_with_exit_3_and_still_writes_artifacts(overflow_model, tmp_path):
    model, data = overflow_model
    out = tmp_path / "out"
    # --auto-keep off: the behaviour before the lint, which keeps this model's layers float32.
    result = invoke(
        model, "--policy", "mixed_float16", "--data", data, "--out", out, "--export", "savedmodel", "--auto-keep", "off",
        "--no-speed",
    )  # fmt: skip
    assert result.exit_code == 3, result.output
    assert "FAILED" in result.output
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is False
    v = report["validation"]
    assert v["reference"] == 1.0 and v["converted"] < 0.9 and v["nonfinite_outputs"] > 0
    assert v["drop"] > report["gate"]["thresholds"]["max_drop"]
    assert (out / "savedmodel" / "saved_model.pb").is_file()


def test_bfloat16_keeps_float32_range_on_the_same_model(overflow_model, tmp_path):
    model, data = overflow_model
    out = tmp_path / "o"
    result = invoke(
        model, "--policy", "mixed_bfloat16", "--data", data, "--out", out, "--export", "savedmodel", "--no-speed"
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    v = report["validation"]
    # bfloat16 holds the hidden layer's ~1e5 values: no NaN, the labels (the float32 model's own
    # predictions) still scored, and the overflowing layer itself converted, not kept float32.
    assert v["nonfinite_outputs"] == 0 and v["reference"] == 1.0 and v["drop"] <= 0.01
    assert {layer["name"]: layer["policy"] for layer in report["layers"]}["hidden"] == "mixed_bfloat16"


def test_inspect_prints_the_plan_and_writes_nothing(tmp_path):
    model = tmp_path / "digits_cnn.keras"
    shutil.copy(CASES["digits_cnn"][0], model)
    result = invoke("inspect", model, "--policy", "mixed_bfloat16", "--keep-float32", "conv1")
    assert result.exit_code == 0, result.output
    for expected in ("conv2", "mixed_bfloat16", "predictions_linear", "--keep-float32 'conv1'", "model output"):
        assert expected in result.output
    assert [p.name for p in tmp_path.iterdir()] == ["digits_cnn.keras"]


def test_h5_written_by_tf_keras_2_is_converted_in_tf_keras(tmp_path):
    # Keras 3 rejects this file: the tf.keras 2.x LSTM config carries `time_major`.
    path = tmp_path / "rnn.h5"
    tiny_models.recurrent(tf_keras).save(str(path))
    with pytest.raises(Exception, match="time_major"):
        keras.models.load_model(path)
    out = tmp_path / "out"
    result = invoke(path, "--policy", "mixed_float16", "--out", out, "--export", "savedmodel", "--no-speed")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert (report["source"]["format"], report["source"]["loader"]) == ("h5", "tf_keras")
    reloaded = tf_keras.models.load_model(str(out / "savedmodel"), compile=False)
    assert reloaded.get_layer("lstm").dtype_policy.name == "mixed_float16"
    assert reloaded.inputs[0].dtype == tf.int32


def test_h5_written_by_keras_3_is_converted_in_keras_3(tmp_path):
    path = tmp_path / "mlp.h5"
    tiny_models.mlp(keras).save(path)
    out = tmp_path / "out"
    result = invoke(path, "--policy", "mixed_bfloat16", "--out", out, "--export", "savedmodel", "--no-speed")
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert (report["source"]["format"], report["source"]["loader"]) == ("h5", "keras")
    assert keras.models.load_model(out / "model.keras").get_layer("hidden").dtype_policy.name == "mixed_bfloat16"
