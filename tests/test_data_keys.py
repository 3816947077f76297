"""Data keys: every key is read, or refused by name; a single input's data may use the input's own name.

Labels may be left out, so a misspelt label key used to pass unnoticed: its
output got only a drift check and the key was never mentioned. The models
are tests/multi_models.py's `detector` (outputs boxes, objectness, cls),
the sample digits classifier (one input named `pixels`) and
tests/graph_models.py's `two_matmuls` (a graph-level SavedModel whose one
input is `features`).
"""

import json
import textwrap

import graph_models as gm
import keras
import multi_models as mm
import numpy as np
import pytest
from conftest import SAMPLES, invoke, refused

import mpconvert

DIGITS_CNN = SAMPLES / "digits_cnn.keras"  # one input, "pixels" (n, 64); softmax over 10 classes
FAST = ["--export", "savedmodel", "--no-speed"]


def report_of(folder) -> dict:
    return json.loads((folder / "report.json").read_text())


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    root = tmp_path_factory.mktemp("detector")
    mm.detector(keras).save(root / "detector.keras")
    return root / "detector.keras"


@pytest.fixture(scope="module")
def digits():
    return mm.digits()


# --- a key nobody reads -----------------------------------------------------------


def test_a_misspelt_label_key_is_refused_with_a_did_you_mean(detector, tmp_path):
    data = mm.detector_npz(tmp_path / "typo.npz", cls_key="y_class")
    out = tmp_path / "out"
    result = invoke(detector, "--policy", "mixed_bfloat16", "--data", data, "--out", out, *FAST)
    err = refused(result, out, "'y_class' (did you mean 'y_cls'?)", "'y_class_train' (did you mean 'y_cls_train'?)")
    # The fix names every key the model reads, so the user can see which one was meant.
    assert "y_boxes, y_cls, y_objectness" in err.splitlines()[1], err


def test_the_correctly_spelt_file_scores_both_labelled_outputs_and_names_a_key_it_does_not_read(detector, tmp_path):
    data = mm.detector_npz(tmp_path / "good.npz")
    # A file shared with another model: its `ink` labels are far from any key this model reads.
    with np.load(data) as npz:
        np.savez(data, **npz, y_ink=np.zeros((len(npz["x"]), 1), np.float32))
    out = tmp_path / "out"
    result = invoke(detector, "--policy", "mixed_bfloat16", "--data", data, "--out", out, *FAST)
    assert result.exit_code == 0, result.output
    assert report_of(out)["validation"]["unread_keys"] == ["y_ink"]
    assert "warning: not read: 'y_ink'" in result.output
    assert "not read: y_ink, neither inputs nor labels" in (out / "report.html").read_text()
    outputs = {o["name"]: o for o in report_of(out)["validation"]["outputs"]}
    assert outputs["cls"]["metric"] == "accuracy" and outputs["cls"]["reference"] > 0.9
    assert outputs["boxes"]["metric"] == "mse"
    assert outputs["objectness"]["metric"] is None  # unlabelled: compared with float32 only
    names = {c["name"] for c in report_of(out)["gate"]["checks"]}
    assert {"accuracy gate: cls", "mse gate: boxes", "drift: objectness"} <= names


def test_plain_y_for_several_outputs_names_the_label_keys(detector, tmp_path, digits):
    np.savez(tmp_path / "plain.npz", x=digits["x"], y=digits["y"] % 3)
    out = tmp_path / "out"
    result = invoke(detector, "--policy", "mixed_bfloat16", "--data", tmp_path / "plain.npz", "--out", out, *FAST)
    refused(result, out, "'y'", "3 outputs", "y_boxes, y_cls, y_objectness")


def test_the_api_refuses_a_label_or_input_key_the_model_does_not_have(detector, digits):
    x, cls = digits["x"], digits["y"] % 3
    model = keras.models.load_model(detector)
    with pytest.raises(mpconvert.MpconvertError, match=r"output 'class' .*\(did you mean 'cls'\?\)"):
        mpconvert.convert(model, "mixed_bfloat16", data=(x, {"boxes": mm.boxes_target(x), "class": cls}))
    with pytest.raises(mpconvert.MpconvertError, match=r"key 'pixel' \(did you mean 'pixels'\?\)"):
        mpconvert.convert(model, "mixed_bfloat16", data=({"pixel": x}, {"cls": cls}))
    # A dict beside the input's own key: the extra array would be dropped unread.
    with pytest.raises(mpconvert.MpconvertError, match=r"key 'mask'"):
        mpconvert.convert(model, "mixed_bfloat16", data=({"pixels": x, "mask": x}, {"cls": cls}))


def test_the_api_refuses_extra_label_keys_for_one_output(digits):
    model = keras.models.load_model(DIGITS_CNN)
    x, y = digits["x"], digits["y"]
    with pytest.raises(mpconvert.MpconvertError, match=r"keys 'predictions', 'extra'.* one output"):
        mpconvert.convert(model, "mixed_bfloat16", data=(x, {"predictions": y, "extra": y}))


def test_a_data_function_returning_a_misspelt_key_is_refused(detector, tmp_path, monkeypatch, digits):
    (tmp_path / "detector_data.py").write_text(
        textwrap.dedent(
            """
            import numpy as np

            def load():
                x = np.zeros((8, 64), np.float32)
                return None, (x, {"boxes": np.zeros((8, 4), np.float32), "clss": np.zeros(8, np.int64)})
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    result = invoke(detector, "--policy", "mixed_bfloat16", "--data", "detector_data:load", "--out", out, *FAST)
    refused(result, out, "'clss'", "(did you mean 'cls'?)")


# --- a single input under its own name ------------------------------------------------


def test_a_single_keras_input_is_read_under_its_own_name(tmp_path, digits):
    np.savez(
        tmp_path / "named.npz",
        pixels=digits["x"],
        y=digits["y"],
        pixels_train=digits["x_train"],
        y_train=digits["y_train"],
    )
    out = tmp_path / "out"
    args = ["--policy", "mixed_bfloat16", "--data", tmp_path / "named.npz", "--finetune-steps", "5"]
    result = invoke(DIGITS_CNN, *args, "--out", out, *FAST)
    assert result.exit_code == 0, result.output
    report = report_of(out)
    assert report["validation"]["rows"] == len(digits["x"]) and report["finetune"]["steps"] == 5


def test_x_and_the_input_name_together_are_refused(tmp_path, digits):
    np.savez(tmp_path / "both.npz", x=digits["x"], pixels=digits["x"], y=digits["y"])
    out = tmp_path / "out"
    result = invoke(DIGITS_CNN, "--policy", "mixed_bfloat16", "--data", tmp_path / "both.npz", "--out", out, *FAST)
    refused(result, out, "'x'", "'pixels'", "twice")


def test_a_missing_input_names_both_keys_it_may_have(tmp_path, digits):
    np.savez(tmp_path / "labels.npz", y=digits["y"])
    out = tmp_path / "out"
    result = invoke(DIGITS_CNN, "--policy", "mixed_bfloat16", "--data", tmp_path / "labels.npz", "--out", out, *FAST)
    refused(result, out, "has no key 'x' or 'pixels'")


def test_a_graph_level_input_is_read_under_its_signature_name(tmp_path):
    saved = gm.two_matmuls(tmp_path / "mlp")
    rng = np.random.default_rng(0)
    np.savez(tmp_path / "named.npz", features=rng.normal(size=(64, 16)).astype(np.float32), y=rng.integers(0, 4, 64))
    out = tmp_path / "out"
    args = ["--policy", "mixed_bfloat16", "--data", tmp_path / "named.npz", "--max-drop", "1", "--min-agreement", "0"]
    result = invoke(saved, *args, "--out", out, *FAST)
    assert result.exit_code == 0, result.output
    validation = report_of(out)["validation"]
    assert validation["data"] == "npz" and validation["rows"] == 64 and validation["metric"] == "accuracy"
