"""Models with several outputs: labels, a task, a metric and gate checks per output; and the leakage check.

The models are tests/multi_models.py's: a digit classifier with an ink
regression head whose hidden layer overflows float16 (dict outputs, Keras 3;
list outputs, tf-keras), and two classifiers on one trunk.
"""

import json

import keras
import multi_models as mm
import numpy as np
import pytest
import tf_keras
from conftest import SAMPLES, invoke

import mpconvert
from mpconvert.batch.results import entry
from mpconvert.data.rows import load_npz
from mpconvert.data.signature import signature_of
from mpconvert.keras.kind import tasks_of
from mpconvert.report.report import Report
from mpconvert.runners.keras import predict

CANCER = SAMPLES / "cancer_mlp.keras"


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    root = tmp_path_factory.mktemp("multi")
    mm.digits_and_ink(keras, "dict").save(root / "dict.keras")
    mm.digits_and_ink(tf_keras, "list").save(root / "list.h5")
    mm.two_classifiers(keras).save(root / "two.keras")
    mm.digits_and_ink_npz(root / "both.npz")
    mm.digits_and_ink_npz(root / "digit_only.npz", ink_labels=False)
    return root


def report_of(folder) -> dict:
    return json.loads((folder / "report.json").read_text())


def checks_of(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["gate"]["checks"]}


@pytest.mark.parametrize("K,outputs", [(keras, "dict"), (tf_keras, "list")])
def test_each_output_gets_its_task_in_the_signatures_order(K, outputs):
    model = mm.digits_and_ink(K, outputs, epochs=1)
    signature = signature_of(model)
    tasks = tasks_of(model, signature)
    by_name = {t.output.name: t.kind for t in tasks}
    assert by_name == {"digit": "softmax", "ink": "regression"}
    # Dict outputs come back from predict in the order they were built with (ink first), while the
    # signature is sorted (digit first): every output is matched by name.
    predicted = predict(model, [mm.digits()["x"][:5]])
    assert [p.shape[-1] for p in predicted] == [dict(zip(("digit", "ink"), (10, 1)))[s.name] for s in signature.outputs]


def test_npz_labels_are_read_per_output_and_may_be_left_out(zoo):
    model = keras.models.load_model(zoo / "dict.keras")
    signature = signature_of(model)
    tasks = tasks_of(model, signature)
    names = [s.name for s in signature.outputs]
    both = load_npz(zoo / "both.npz", signature, tasks)
    labels = dict(zip(names, both.validation.labels))
    assert labels["digit"].dtype == np.int64 and labels["ink"].shape == (450, 1)
    assert both.train is not None and both.train.labelled
    partial = load_npz(zoo / "digit_only.npz", signature, tasks)
    assert dict(zip(names, partial.validation.labels))["ink"] is None


def test_plain_y_for_several_outputs_and_misshapen_labels_name_the_keys(zoo, tmp_path):
    model = keras.models.load_model(zoo / "dict.keras")
    signature, data = signature_of(model), mm.digits()
    tasks = tasks_of(model, signature)
    np.savez(tmp_path / "plain.npz", x=data["x"], y=data["y"])
    with pytest.raises(mpconvert.MpconvertError) as caught:
        load_npz(tmp_path / "plain.npz", signature, tasks)
    assert "y_digit" in caught.value.message and "not 'y'" in caught.value.hint and "y_ink" in caught.value.hint
    np.savez(tmp_path / "bad.npz", x=data["x"], y_digit=data["y"], y_ink=np.zeros((450, 3), np.float32))
    with pytest.raises(mpconvert.MpconvertError, match=r"'y_ink' has shape \(450, 3\), expected \(n, 1\) float32"):
        load_npz(tmp_path / "bad.npz", signature, tasks)


def test_the_api_takes_labels_by_output_name_or_in_output_order(zoo):
    model = keras.models.load_model(zoo / "dict.keras")
    data = mm.digits()
    x, y = data["x"], {"digit": data["y"], "ink": mm.ink(data["x"])}
    by_name = mpconvert.convert(model, "mixed_bfloat16", data=(x, y), finetune_steps=0, pad_multiple=0, speed=False)
    in_order = mpconvert.convert(
        model, "mixed_bfloat16", data=(x, [y["digit"], y["ink"]]), finetune_steps=0, pad_multiple=0, speed=False
    )
    for conversion in (by_name, in_order):
        outputs = {o["name"]: o for o in conversion.report["validation"]["outputs"]}
        assert outputs["digit"]["metric"] == "accuracy" and outputs["ink"]["metric"] == "mse"
        assert outputs["digit"]["reference"] > 0.9  # a trained classifier
        assert outputs["ink"]["reference"] < 1e-10  # the ink head is exact by construction
    assert by_name.report["validation"] == in_order.report["validation"]
    with pytest.raises(mpconvert.MpconvertError, match="an output 'boxes' the model does not have"):
        mpconvert.convert(model, "mixed_bfloat16", data=(x, {"boxes": data["y"]}), finetune_steps=0)


def test_the_overflowing_head_fails_alone_and_the_default_run_keeps_only_that_head_float32(zoo, tmp_path):
    model, data = zoo / "dict.keras", zoo / "both.npz"
    # Neither run's fine-tune nor speed section is read: the checks and layers are the validation's and the rewrite's.
    args = [model, "--policy", "mixed_float16", "--data", data, "--finetune-steps", "0", "--no-speed"]
    off = invoke(*args, "--out", tmp_path / "off", "--auto-keep", "off", "--export", "savedmodel")
    assert off.exit_code == 3, off.output
    checks = checks_of(report_of(tmp_path / "off"))
    assert not checks["mse gate: ink"]["passed"] and "NaN/inf" in checks["mse gate: ink"]["message"]
    assert checks["accuracy gate: digit"]["passed"] and checks["agreement: digit"]["passed"]
    assert "accuracy gate" not in checks  # one metric check per output, named after it
    assert report_of(tmp_path / "off")["validation"]["nonfinite_by_output"] == {"ink": 450}

    default = invoke(*args, "--out", tmp_path / "on")
    assert default.exit_code == 0, default.output
    report = report_of(tmp_path / "on")
    policies = {layer["name"]: layer["policy"] for layer in report["layers"]}
    assert policies["ink_hidden"] == "float32" and policies["ink"] == "float32"
    assert policies["trunk"] == "mixed_float16" and policies["digit_linear"] == "mixed_float16"
    assert "output ink: mse" in default.output and "output digit: accuracy" in default.output
    # ONNX (and SavedModel) parity is judged per output, by name.
    onnx = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    assert set(onnx["outputs"]) == {"digit", "ink"}
    assert onnx["outputs"]["ink"]["max_abs_diff"] < 1e-4
    assert "ink " in checks_of(report)["artifact parity: onnx"]["message"]


def test_tf_keras_list_outputs_with_an_unlabelled_head_get_a_drift_check(zoo, tmp_path):
    args = ["--policy", "mixed_float16", "--data", zoo / "digit_only.npz", "--export", "savedmodel"]
    args += ["--finetune-steps", "0", "--no-speed"]  # only the checks and the artifact's outputs are read
    result = invoke(zoo / "list.h5", *args, "--out", tmp_path / "o", "--auto-keep", "off")
    assert result.exit_code == 3, result.output
    checks = checks_of(report_of(tmp_path / "o"))
    assert not checks["drift: ink"]["passed"] and "NaN/inf" in checks["drift: ink"]["message"]
    assert checks["accuracy gate: digit"]["passed"]
    saved = report_of(tmp_path / "o")["artifacts"][0]
    assert saved["kind"] == "savedmodel" and set(saved["outputs"]) == {"digit", "ink"}


def test_per_output_budgets_and_metrics_and_unknown_output_names(zoo, tmp_path):
    args = [zoo / "two.keras", "--policy", "mixed_bfloat16", "--data", zoo / "both.npz"]
    # two.keras's outputs are digit and odd; the npz has no y_odd, so odd is drift-only.
    bad = invoke(*args, "--max-drop", "boxes=0.1", "--out", tmp_path / "bad")
    assert bad.exit_code == 1 and "--max-drop boxes=... names an output" in bad.stderr
    assert "digit, odd" in bad.stderr and not (tmp_path / "bad").exists()
    usage = invoke(*args, "--metric", "digit=f1", "--out", tmp_path / "usage")
    assert usage.exit_code == 2 and "digit=f1" in usage.output
    cheap = ["--finetune-steps", "0", "--no-speed", "--export", "savedmodel"]  # only the gate's thresholds are read
    ok = invoke(*args, "--max-drop", "0.05", "--max-drop", "digit=0", *cheap, "--out", tmp_path / "o")
    thresholds = report_of(tmp_path / "o")["gate"]["thresholds"]
    assert thresholds["max_drop"] == 0.05 and thresholds["max_drop_by_output"] == {"digit": 0.0}
    assert checks_of(report_of(tmp_path / "o"))["accuracy gate: digit"]["values"]["max_drop"] == 0.0
    assert "accuracy gate: digit" in ok.output
    # check re-judges with a plain value, which sets every output again
    again = invoke("check", tmp_path / "o", "--max-drop", "0.5", "--json")
    rejudged = json.loads(again.stdout)["gate"]
    assert rejudged["thresholds"]["max_drop_by_output"] == {} and rejudged["thresholds"]["max_drop"] == 0.5


def test_two_classifiers_fine_tune_on_both_losses_and_compare_per_output_with_a_baseline(zoo, tmp_path):
    data = mm.digits()
    labels = {"digit": data["y"], "odd": data["y"] % 2}
    train = {"digit": data["y_train"], "odd": data["y_train"] % 2}
    conversion = mpconvert.convert(
        zoo / "two.keras",
        "mixed_bfloat16",
        data=((data["x_train"], train), (data["x"], labels)),
        finetune_steps=20,
        pad_multiple=0,
        speed=False,
    )
    report = conversion.save(tmp_path / "first", export=("savedmodel",))
    tuning = report["finetune"]
    assert tuning["loss_function"].startswith("digit: sparse_categorical_crossentropy (saved with the model)")
    assert "; odd: sparse_categorical_crossentropy" in tuning["loss_function"]
    assert set(tuning["outputs"]) == {"digit", "odd"} and tuning["healthy"]
    names = set(checks_of(report))
    assert {"accuracy gate: digit", "accuracy gate: odd", "agreement: digit", "agreement: odd"} <= names
    again = mpconvert.check(tmp_path / "first", baseline=tmp_path / "first" / "report.json")
    baselines = {c["name"]: c for c in again["gate"]["checks"] if c["name"].startswith("baseline")}
    assert set(baselines) == {"baseline regression: digit", "baseline regression: odd"}
    assert all(c["passed"] and c["values"]["regression"] == 0 for c in baselines.values())
    # batch.json carries each scored output's numbers
    job = type("Job", (), {"name": "two", "given_path": "two.keras", "policy": "mixed_bfloat16", "folder": "two/b"})
    item = entry(job, "k", Report.from_json(report), "passed", "", 1.0).to_json()
    assert [o["name"] for o in item["outputs"]] == ["digit", "odd"]
    assert item["outputs"][1]["before"] == report["validation"]["outputs"][1]["reference"]


def _cancer(tmp_path, train_from):
    with np.load(SAMPLES / "data" / "breast_cancer.npz", allow_pickle=False) as npz:
        x, y, x_train, y_train = npz["x"], npz["y"], npz["x_train"], npz["y_train"]
    if train_from == "validation":  # the classic mistake: the validation rows are training rows too
        x_train, y_train = np.concatenate([x_train, x]), np.concatenate([y_train, y])
    path = tmp_path / f"{train_from}.npz"
    np.savez(path, x=x, y=y, x_train=x_train, y_train=y_train)
    return path, len(x)


def test_a_leaked_split_fails_the_gate_when_fine_tuning_trains_on_it_and_warns_without(tmp_path):
    leaked, rows = _cancer(tmp_path, "validation")
    args = [CANCER, "--policy", "mixed_bfloat16", "--data", leaked, "--export", "savedmodel", "--no-speed"]
    tuned = invoke(*args, "--finetune-steps", "10", "--out", tmp_path / "tuned")
    assert tuned.exit_code == 3, tuned.output
    check = checks_of(report_of(tmp_path / "tuned"))["validation independent of training"]
    assert not check["passed"] and f"{rows} of {rows} validation rows (100.0%)" in check["message"]
    assert report_of(tmp_path / "tuned")["validation"]["overlap"]["share"] == 1.0
    untuned = invoke(*args, "--finetune-steps", "0", "--out", tmp_path / "untuned")
    assert untuned.exit_code == 0, untuned.output
    assert "validation independent of training" not in checks_of(report_of(tmp_path / "untuned"))
    assert f"warning: {rows} of {rows} validation rows (100.0%) are also training rows" in untuned.output
    # A looser share lets the same run pass, and says so.
    loose = invoke(*args, "--finetune-steps", "10", "--max-overlap", "1", "--out", tmp_path / "loose")
    assert checks_of(report_of(tmp_path / "loose"))["validation independent of training"]["passed"]
    assert loose.exit_code == 0, loose.output


def test_a_clean_split_says_nothing_and_repeats_within_validation_are_counted(tmp_path):
    clean, _ = _cancer(tmp_path, "train")
    args = [CANCER, "--policy", "mixed_bfloat16", "--export", "savedmodel", "--no-speed"]
    result = invoke(*args, "--data", clean, "--finetune-steps", "10", "--out", tmp_path / "clean")
    assert result.exit_code == 0 and "training rows" not in result.output
    report = report_of(tmp_path / "clean")
    assert report["validation"]["overlap"]["in_train"] == 0
    assert "validation independent of training" not in checks_of(report)
    with np.load(clean) as npz:
        arrays = {k: npz[k] for k in npz.files}
    arrays["x"], arrays["y"] = (
        np.concatenate([arrays["x"], arrays["x"][:7]]),
        np.concatenate([arrays["y"], arrays["y"][:7]]),
    )
    np.savez(tmp_path / "repeats.npz", **arrays)
    repeated = invoke(*args, "--data", tmp_path / "repeats.npz", "--finetune-steps", "0", "--out", tmp_path / "r")
    assert "7 validation rows repeat other validation rows" in repeated.output
    assert report_of(tmp_path / "r")["validation"]["overlap"]["duplicates_within_validation"] == 7
