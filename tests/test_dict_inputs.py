"""Models built with dict inputs (and dict outputs): rebuild, fine-tune, validation, padding and every artifact.

The models are tests/dict_models.py's: inputs {"tokens": int32 (n, 4),
"num": float32 (n, 6)}, with Input layers named like the keys or not
("tok_ids", "numbers"), one softmax output or outputs {"score", "label"}.
Keras 3 refuses a list for such a model ("Expected: {'tokens': 'tokens',
'num': 'num'} Received: inputs=[...]"), which every stage used to pass.
"""

import json
import subprocess

import dict_models as dm
import keras
import numpy as np
import onnxruntime as ort
import pytest
import tensorflow as tf
import tf_keras
from conftest import console_script, invoke

import mpconvert
from mpconvert.data.rows import Task, load_npz
from mpconvert.data.signature import Signature, TensorSpec, signature_of

CONVERT = ["--policy", "mixed_float16", "--export", "savedmodel,onnx"]
# Where no test reads the timings: the speed stage of a dict model runs in the every-stage test.
QUICK = [*CONVERT, "--no-speed"]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("dicts")
    dm.tokens_and_num(keras, names="other").save(root / "other.keras")
    dm.tokens_and_num(keras, names="other", outputs="dict").save(root / "outputs.keras")
    dm.npz(root / "by_key.npz")
    dm.npz(root / "by_name.npz", keys=("tok_ids", "numbers"))
    dm.npz(root / "two_by_name.npz", outputs="dict", keys=("tok_ids", "numbers"))
    return root


def report_of(folder) -> dict:
    return json.loads((folder / "report.json").read_text())


def validation_rows() -> dict[str, np.ndarray]:
    d = dm.data()
    return {"tokens": d["tokens"][300:], "num": d["num"][300:]}


def test_the_signature_keys_inputs_and_outputs_by_identity_and_feeds_a_dict():
    model = dm.tokens_and_num(keras, names="other", outputs="dict", epochs=1)
    signature = signature_of(model)
    # The flat inputs follow the sorted keys; the layers' names differ from the keys.
    assert [s.name for s in signature.inputs] == ["numbers", "tok_ids"]
    assert signature.input_keys == ("num", "tokens")
    assert signature.output_keys == ("label", "score")
    rows = validation_rows()
    feed = signature.feed([rows["num"][:5], rows["tokens"][:5]])
    assert set(feed) == {"num", "tokens"} and feed["tokens"].dtype == np.int32
    outputs = signature.output_list(model(feed))
    assert [o.shape[-1] for o in outputs] == [3, 1]  # label, then score: the signature's order
    plain = signature_of(keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)]))
    assert plain.input_keys == () and plain.output_keys == ()


def test_a_keras3_dict_model_goes_through_every_stage_and_artifact(zoo, tmp_path):
    out = tmp_path / "out"
    result = invoke(zoo / "other.keras", *CONVERT, "--data", zoo / "by_key.npz", "--out", out)
    assert result.exit_code == 0, result.output
    report = report_of(out)
    assert report["passed"] and report["fidelity"]["max_abs_diff"] <= 1e-6
    assert report["finetune"]["steps"] == 100 and report["finetune"]["healthy"]
    validation = report["validation"]
    assert validation["rows"] == 100 and validation["reference"] == pytest.approx(0.78, abs=0.05)
    assert abs(validation["drop"]) <= 0.02
    assert report["padding"]["padded"] == [{"layer": "trunk", "dim": "units", "from": 30, "to": 32}]
    assert report["padding"]["passed"] and report["padding"]["exported"] == "padded"
    converted = keras.models.load_model(out / "model.keras")
    assert converted.get_layer("trunk").compute_dtype == "float16"
    assert tuple(converted.get_layer("trunk").kernel.shape) == (48, 32)  # 4 x 8 embedded + 16
    assert converted.get_layer("label").compute_dtype == "float32"
    # Every artifact re-runs to the Keras file's outputs on the validation rows.
    rows = validation_rows()
    expected = np.asarray(converted(rows, training=False), np.float32)
    served = tf.saved_model.load(str(out / "savedmodel")).signatures["serving_default"]
    got = served(tok_ids=tf.constant(rows["tokens"]), numbers=tf.constant(rows["num"]))
    # float16 kernels differ a little between an eager call and a traced one: the gate's savedmodel limit.
    np.testing.assert_allclose(got["label"].numpy(), expected, atol=2e-3)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert sorted(i.name for i in session.get_inputs()) == ["numbers", "tok_ids"]
    onnx_out = session.run(None, {"tok_ids": rows["tokens"], "numbers": rows["num"]})[0]
    np.testing.assert_allclose(onnx_out, expected, atol=2e-2)
    assert {a["kind"]: a["failed"] for a in report["artifacts"]} == {"savedmodel": False, "keras": False, "onnx": False}


def test_dict_outputs_with_data_keyed_by_input_name(zoo, tmp_path):
    out = tmp_path / "out"
    result = invoke(zoo / "outputs.keras", *QUICK, "--data", zoo / "two_by_name.npz", "--out", out)
    assert result.exit_code == 0, result.output
    report = report_of(out)
    by_output = {o["name"]: o for o in report["validation"]["outputs"]}
    assert set(by_output) == {"label", "score"}
    assert by_output["label"]["metric"] == "accuracy" and abs(by_output["label"]["drop"]) <= 0.03
    assert by_output["score"]["metric"] == "mse"
    parity = {a["kind"]: a for a in report["artifacts"]}
    assert all(not a["failed"] for a in parity.values())
    assert set(parity["onnx"]["outputs"]) == {"label", "score"}
    assert all(o["max_abs_diff"] < 0.05 for o in parity["onnx"]["outputs"].values())
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    assert sorted(o.name for o in session.get_outputs()) == ["label", "score"]


def test_tf_keras_h5_and_a_plain_serving_savedmodel_of_a_dict_model(zoo, tmp_path):
    dm.tokens_and_num(tf_keras, names="other").save(tmp_path / "tfk.h5")
    result = invoke(tmp_path / "tfk.h5", *QUICK, "--data", zoo / "by_key.npz", "--out", tmp_path / "h5")
    assert result.exit_code == 0, result.output
    assert report_of(tmp_path / "h5")["padding"]["exported"] == "padded"
    # model.export() keeps the Input layers' names (not the dict keys) in its serving signature.
    keras.models.load_model(zoo / "other.keras").export(tmp_path / "served", verbose=False)
    result = invoke(tmp_path / "served", *QUICK, "--data", zoo / "by_name.npz", "--out", tmp_path / "graph")
    assert result.exit_code == 0, result.output
    report = report_of(tmp_path / "graph")
    assert report["source"]["format"] == "graph" and abs(report["validation"]["drop"]) <= 0.02


def test_the_api_takes_a_live_dict_model_and_data_by_key(zoo):
    model = keras.models.load_model(zoo / "other.keras")
    d = dm.data()
    train = ({"tokens": d["tokens"][:300], "num": d["num"][:300]}, d["label"][:300])
    validation = ({"tok_ids": d["tokens"][300:], "numbers": d["num"][300:]}, d["label"][300:])
    conv = mpconvert.convert(model, "mixed_bfloat16", data=(train, validation), finetune_steps=20)
    assert conv.passed, conv.report["gate"]
    assert conv.report["finetune"]["steps"] == 20
    assert conv.model.get_layer("num_dense").compute_dtype == "bfloat16"
    predicted = np.asarray(conv.model(validation_rows(), training=False))
    assert predicted.shape == (100, 3) and np.isfinite(predicted).all()


def test_an_input_given_by_key_and_by_name_is_a_user_error(zoo, tmp_path):
    d = dm.data()
    np.savez(tmp_path / "twice.npz", tokens=d["tokens"], tok_ids=d["tokens"], num=d["num"], y=d["label"])
    result = invoke(zoo / "other.keras", *CONVERT, "--data", tmp_path / "twice.npz", "--out", tmp_path / "out")
    assert result.exit_code == 1
    assert "input 'tokens' twice, as 'tokens' and as 'tok_ids'" in result.output
    assert result.output.count("error:") == 1 and "fix:" in result.output and "Traceback" not in result.output


def test_a_batch_worker_converts_a_dict_model(zoo, tmp_path):
    manifest = tmp_path / "dicts.toml"
    manifest.write_text(
        # The worker's dict feeding is the subject; the every-stage test covers the speed stage and the ONNX file.
        '[defaults]\nspeed = false\nexport = ["savedmodel"]\n'
        f'[[model]]\npath = "{zoo / "other.keras"}"\ndata = "{zoo / "by_key.npz"}"\npolicy = "mixed_bfloat16"\n'
    )
    proc = subprocess.run(
        [console_script(), "batch", str(manifest), "--out", str(tmp_path / "out"), "--jobs", "1", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    reports = list((tmp_path / "out").rglob("report.json"))
    assert len(reports) == 1 and report_of(reports[0].parent)["passed"]


def test_a_keras2_savedmodel_with_dict_outputs_keyed_unlike_their_layers(zoo, tmp_path):
    model = dm.tokens_and_num(tf_keras, names="other", outputs="keys")
    signature = signature_of(model)
    assert signature.output_keys == ("l", "s") and [s.name for s in signature.outputs] == ["label", "score"]
    model.save(tmp_path / "k2", save_format="tf")
    assert (tmp_path / "k2" / "keras_metadata.pb").is_file()
    # Labels keyed by the dict keys (y_l, y_s), inputs by the Input layers' names.
    with np.load(zoo / "two_by_name.npz") as arrays:
        renamed = {k.replace("y_label", "y_l").replace("y_score", "y_s"): arrays[k] for k in arrays.files}
    np.savez(tmp_path / "by_keys.npz", **renamed)
    out = tmp_path / "out"
    result = invoke(tmp_path / "k2", *QUICK, "--data", tmp_path / "by_keys.npz", "--out", out)
    assert result.exit_code == 0, result.output
    report = report_of(out)
    assert report["source"]["format"] == "savedmodel"
    by_output = {o["name"]: o for o in report["validation"]["outputs"]}
    assert by_output["label"]["metric"] == "accuracy" and abs(by_output["label"]["drop"]) <= 0.03
    assert by_output["score"]["metric"] == "mse"
    assert report["padding"]["exported"] == "padded"
    parity = {a["kind"]: a for a in report["artifacts"]}
    assert set(parity) == {"savedmodel", "onnx"} and not any(a["failed"] for a in parity.values())
    assert set(parity["savedmodel"]["outputs"]) == {"label", "score"}
    np.savez(tmp_path / "twice.npz", **renamed, y_label=renamed["y_l"])
    result = invoke(tmp_path / "k2", *CONVERT, "--data", tmp_path / "twice.npz", "--out", tmp_path / "twice")
    assert result.exit_code == 1 and "labels output 'label' twice, as 'y_label' and 'y_l'" in result.output
    assert "Traceback" not in result.output


def test_the_api_takes_labels_keyed_like_the_models_dict_outputs():
    model = dm.tokens_and_num(keras, names="other", outputs="keys", epochs=5)
    d = dm.data()
    x = {"tokens": d["tokens"][300:], "num": d["num"][300:]}
    conv = mpconvert.convert(model, "mixed_bfloat16", data=(x, {"l": d["label"][300:]}), finetune_steps=0)
    assert {o["name"]: o["metric"] for o in conv.report["validation"]["outputs"]} == {
        "label": "accuracy",
        "score": None,  # no labels for it: a drift check
    }
    assert conv.report["validation"]["outputs"][0]["reference"] > 0.5  # labels read: an accuracy, not a drift check
    with pytest.raises(mpconvert.MpconvertError, match="give an output twice"):
        mpconvert.convert(model, "mixed_bfloat16", data=(x, {"l": d["label"][300:], "label": d["label"][300:]}))


def test_data_keys_for_dict_inputs_by_key_or_unambiguous_name(tmp_path):
    out = (TensorSpec("label", (None, 3), "float32"),)
    task = Task("softmax", out[0])
    # Keys swapped against the layers' names: each name is another input's key, so only keys read.
    swapped = Signature(
        (TensorSpec("a", (None, 2), "float32"), TensorSpec("b", (None, 2), "float32")), out, input_keys=("b", "a")
    )
    rows = np.zeros((4, 2), np.float32)
    np.savez(tmp_path / "swapped.npz", a=rows, b=rows + 1, y=np.zeros(4, np.int64))
    read = load_npz(tmp_path / "swapped.npz", swapped, task)
    assert read.validation.inputs[0].mean() == 1.0  # input "a" is fed by key "b"
    # One dict input: x, its key or its layer's name; two of them at once are refused.
    one = Signature((TensorSpec("numbers", (None, 2), "float32"),), out, input_keys=("num",))
    for key in ("x", "num", "numbers"):
        np.savez(tmp_path / f"{key}.npz", **{key: rows, "y": np.zeros(4, np.int64)})
        assert load_npz(tmp_path / f"{key}.npz", one, task).validation.rows == 4
    np.savez(tmp_path / "both.npz", num=rows, numbers=rows, y=np.zeros(4, np.int64))
    with pytest.raises(mpconvert.MpconvertError, match="one input twice"):
        load_npz(tmp_path / "both.npz", one, task)
