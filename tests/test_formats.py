"""The registry of artifact formats: five formats, one file each, each opening the file it wrote as its record says.

One small conversion (a Keras 3 classifier, every format) gives the written
files; each format then opens its own as `verify` does, from report.json's
typed details alone, and its outputs on the golden rows are the converted
model's to that format's tolerance.
"""

from __future__ import annotations

import json

import keras
import numpy as np
import pytest
import tiny_models
from conftest import invoke

from mpconvert.data.signature import Signature
from mpconvert.export.formats import FORMATS
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.report.compare import compare
from mpconvert.report.golden import read_golden
from mpconvert.report.read import stored_thresholds
from mpconvert.report.sections import Source
from mpconvert.report.sections.details import (
    DETAILS,
    FailedDetails,
    OnnxDetails,
    SavedModelDetails,
    UnknownDetails,
    read_details,
)
from mpconvert.runners.onnx import OnnxRunner


def test_the_registry_holds_the_five_formats_each_with_its_own_file_and_record():
    assert list(FORMATS) == ["savedmodel", "keras", "onnx", "litert", "openvino"]  # the order written and listed
    assert set(FORMATS) == set(ArtifactKind)
    assert all(f.name == name and DETAILS[name] is f.details for name, f in FORMATS.items())
    filenames = [f.filename for f in FORMATS.values()]
    assert sorted(filenames) == ["model.keras", "model.onnx", "model.tflite", "openvino", "savedmodel"]
    # model.keras comes with --export savedmodel, and is the one file no server runs.
    assert [name for name, f in FORMATS.items() if not f.serves] == ["keras"]
    assert [name for name, f in FORMATS.items() if f.wanted(("savedmodel",))] == ["savedmodel", "keras"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    base = tmp_path_factory.mktemp("formats")
    keras.utils.set_random_seed(0)
    tiny_models.mlp(keras).save(base / "mlp.keras")
    data = tiny_models.classifier_npz(base / "mlp.npz", one_hot=False)
    out = base / "out"
    flags = ("--finetune-steps", "0", "--no-speed", "--export", "savedmodel,onnx,litert,openvino")
    result = invoke(base / "mlp.keras", "--policy", "mixed_float16", "--data", data, "--out", out, *flags)
    assert result.exit_code == 0, result.output
    return out


def test_each_format_opens_its_written_file_from_its_record_and_serves_the_converted_outputs(folder):
    report = json.loads((folder / "report.json").read_text())
    source = Source.from_json(report["source"])
    signature = Signature(source.inputs, source.outputs)
    golden = read_golden(folder / "golden.npz", [s.name for s in source.inputs], [s.name for s in source.outputs])
    thresholds = stored_thresholds(report)
    served = {}
    for stored in report["artifacts"]:
        kind = stored["kind"]
        fmt = FORMATS[kind]
        assert stored["path"] == fmt.filename and (folder / fmt.filename).exists()
        details = read_details(kind, stored["failed"], stored["details"])
        assert isinstance(details, fmt.details)
        assert details.to_json() == stored["details"]  # the typed record writes back the JSON it was read from
        got = fmt.open(folder / fmt.filename, details, signature).run(golden.inputs).outputs
        found = compare(golden.converted, got, thresholds.tolerance(kind))
        assert found.passed, (kind, found.max_abs_diff, found.limit)
        served[kind] = found.max_abs_diff
    assert set(served) == set(ArtifactKind)
    # LiteRT computes in float32 what the converted model computes in float16: a real difference, within its limit.
    assert 0.0 < served["litert"]


def test_an_onnx_record_from_before_the_names_were_recorded_opens_the_file_by_the_signature(folder):
    report = json.loads((folder / "report.json").read_text())
    source = Source.from_json(report["source"])
    signature = Signature(source.inputs, source.outputs)
    runner = FORMATS["onnx"].open(folder / "model.onnx", OnnxDetails(opset=17), signature)
    assert isinstance(runner, OnnxRunner)
    assert runner.inputs == ("features",) and runner.outputs == ("predictions",)
    rows = read_golden(folder / "golden.npz", ["features"], ["predictions"])
    assert np.asarray(runner.run(rows.inputs).outputs[0]).shape == rows.converted[0].shape


def test_details_read_back_keep_what_was_stored_and_only_that():
    # Reports from before a field existed write back without it.
    assert read_details("savedmodel", False, {}) == SavedModelDetails()
    assert read_details("savedmodel", False, {}).to_json() == {}
    old = {"opset": 13, "io": "float32", "repairs": [], "ran_as_written": False}
    assert read_details("onnx", False, old).to_json() == old
    assert read_details("onnx", True, {"error": "tf2onnx failed; fix: x"}) == FailedDetails("tf2onnx failed; fix: x")
    newer = {"precision": "FP16"}
    assert read_details("tensorrt", False, newer) == UnknownDetails(newer)
    assert read_details("tensorrt", False, newer).to_json() == newer


def test_one_export_traces_the_savedmodel_once_and_copies_it_for_the_formats_converted_from_it(tmp_path):
    """The OpenVINO IR is converted from a SavedModel: the savedmodel/ artifact written before it is copied,
    unless it is gone (its check failed and removed it), when the model is traced again."""
    import shutil

    from mpconvert.export.formats import SavedModelOnce

    traced = []

    class Tracing:  # the kind's side of writing: each call is one trace of the model
        signature, kinds = None, frozenset({"savedmodel", "openvino"})

        def savedmodel(self, path):
            traced.append(path)
            path.mkdir()
            (path / "saved_model.pb").write_bytes(b"graph %d" % len(traced))
            return "serving_default"

    once = SavedModelOnce(Tracing())
    assert once.savedmodel(tmp_path / "savedmodel") == "serving_default"
    assert once.savedmodel(tmp_path / "for_openvino") == "serving_default"
    assert traced == [tmp_path / "savedmodel"]
    assert (tmp_path / "for_openvino" / "saved_model.pb").read_bytes() == b"graph 1"
    shutil.rmtree(tmp_path / "savedmodel")
    once.savedmodel(tmp_path / "again")
    assert traced == [tmp_path / "savedmodel", tmp_path / "again"]
    assert (tmp_path / "again" / "saved_model.pb").read_bytes() == b"graph 2"
