"""`mpconvert replay`: a conversion run again from its report reproduces its figures, and refuses changed inputs."""

import json

import keras
import numpy as np
import pytest
import tiny_models
from conftest import invoke

import mpconvert
from mpconvert.report.diff import EXPECTED


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A fine-tuned conversion (20 steps on the file's training split), as a user runs it."""
    base = tmp_path_factory.mktemp("replay")
    tiny_models.compiled_classifier(keras, "sparse_categorical_crossentropy").save(base / "clf.keras")
    tiny_models.classifier_npz(base / "clf.npz", one_hot=False)
    args = [base / "clf.keras", "--policy", "mixed_float16", "--data", base / "clf.npz"]
    result = invoke(*args, "--finetune-steps", "20", "--no-speed", "--out", base / "conv")
    assert result.exit_code == 0, result.output
    return base


def test_a_replay_reproduces_the_fine_tuned_figures_exactly(converted):
    result = invoke("replay", converted / "conv", "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert found["out"] == str(converted / "conv_replay") and found["passed"] is True
    # Only what differs between any two runs (a save time, traced-function names); no figure moved.
    assert [d["field"] for d in found["differences"] if d["field"] not in EXPECTED] == []
    before = json.loads((converted / "conv" / "report.json").read_text())
    after = json.loads((converted / "conv_replay" / "report.json").read_text())
    assert after["finetune"]["steps"] == 20 and after["finetune"]["history"] == before["finetune"]["history"]
    assert after["validation"] == before["validation"]
    assert after["provenance"]["options"] == before["provenance"]["options"]
    assert after["provenance"]["command"] == ["mpconvert", "replay", str(converted / "conv"), "--json"]
    for b, a in zip(before["artifacts"], after["artifacts"]):
        assert a["max_abs_diff"] == b["max_abs_diff"], a["kind"]  # each file computes the same outputs


def test_the_terminal_names_what_moved_and_why(converted, tmp_path):
    result = invoke("replay", converted / "conv" / "report.json", "--out", tmp_path / "again")
    assert result.exit_code == 0, result.output
    assert f"replay of {converted / 'conv' / 'report.json'} into {tmp_path / 'again'}" in result.output
    assert "(expected: a .keras file records the time it was saved)" in result.output
    assert "compared fields" in result.output


def test_a_changed_model_is_refused_before_any_work(converted, tmp_path):
    conv = tmp_path / "conv"
    (tmp_path / "clf.npz").write_bytes((converted / "clf.npz").read_bytes())
    other = tiny_models.compiled_classifier(keras, "sparse_categorical_crossentropy", seed=5)
    other.save(tmp_path / "clf.keras")
    report = json.loads((converted / "conv" / "report.json").read_text())
    report["provenance"]["model"]["path"] = str(tmp_path / "clf.keras")  # the same report, pointed at the other model
    conv.mkdir()
    (conv / "report.json").write_text(json.dumps(report))
    result = invoke("replay", conv)
    assert result.exit_code == 1
    assert f"the model {tmp_path / 'clf.keras'} has changed since" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "conv_replay").exists()


def test_a_changed_data_file_is_refused(converted, tmp_path):
    data = tmp_path / "clf.npz"
    with np.load(converted / "clf.npz") as found:
        arrays = dict(found)
    arrays["y"] = (arrays["y"] + 1) % 3
    np.savez(data, **arrays)
    report = json.loads((converted / "conv" / "report.json").read_text())
    report["provenance"]["data"]["file"]["path"] = str(data)
    (tmp_path / "conv").mkdir()
    (tmp_path / "conv" / "report.json").write_text(json.dumps(report))
    result = invoke("replay", tmp_path / "conv")
    assert result.exit_code == 1 and f"the data file {data} has changed since" in result.output


def test_a_report_without_provenance_says_why_it_cannot_be_replayed(converted, tmp_path):
    report = json.loads((converted / "conv" / "report.json").read_text())
    del report["provenance"]
    (tmp_path / "report.json").write_text(json.dumps(report))
    result = invoke("replay", tmp_path / "report.json")
    assert result.exit_code == 1 and "does not record what went in" in result.output


def test_an_existing_output_folder_needs_force(converted, tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    result = invoke("replay", converted / "conv", "--out", tmp_path / "taken")
    assert result.exit_code == 1 and (tmp_path / "taken" / "keep.txt").read_text() == "mine"


def test_the_python_api_refuses_a_live_model_s_report(tmp_path):
    model = tiny_models.compiled_classifier(keras, "sparse_categorical_crossentropy")
    x, y = tiny_models.separable_data(64, 8, 3)
    # Only the report's provenance is read: no padding, and the quickest artifact.
    conversion = mpconvert.convert(model, "mixed_bfloat16", data=(x, y), finetune_steps=0, speed=False, pad_multiple=0)
    conversion.save(tmp_path / "live", export=("savedmodel",))
    with pytest.raises(mpconvert.MpconvertError, match="live model handed to the Python API"):
        mpconvert.replay(tmp_path / "live")
