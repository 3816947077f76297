"""The report's typed sections: a report read back from its JSON is the report that wrote it.

Real conversions of three shapes (a classifier with labels, fine-tuned,
padded and exported; a model with two outputs; a graph-level SavedModel
the accuracy-driven search repairs), then reports of earlier versions,
which lack the keys added since, judged as they were then.
"""

import copy
import enum
import json

import graph_models as gm
import keras
import multi_models as mm
import pytest
from conftest import SAMPLES

import mpconvert
from mpconvert.api import conversion_options, export_options
from mpconvert.options.export import SaveOptions
from mpconvert.options.rewrite import AutoKeepMode
from mpconvert.pipeline import convert, convert_and_save
from mpconvert.report.report import Report
from mpconvert.report.schema import problems
from mpconvert.report.sections import FinetuneKept, SearchOutcome, Validation

CANCER = SAMPLES / "cancer_mlp.keras"
CANCER_DATA = SAMPLES / "data" / "breast_cancer.npz"


def not_native(value, where="") -> list[str]:
    """Where `value` holds anything but what json.loads gives back (dicts, lists, str, int, float, bool, None)."""
    if isinstance(value, enum.Enum) or isinstance(value, tuple):
        return [f"{where}: {type(value).__name__}"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in not_native(k, where) + not_native(v, f"{where}.{k}")]
    if isinstance(value, list):
        return [p for i, v in enumerate(value) for p in not_native(v, f"{where}[{i}]")]
    if value is None or type(value) in (str, int, float, bool):
        return []
    return [f"{where}: {type(value).__name__}"]


def read_back(report: Report) -> Report:
    """`report` through report.json's text, as `mpconvert check` reads it."""
    return Report.from_json(json.loads(json.dumps(report.to_json(), allow_nan=False)))


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    """cancer_mlp with its labelled data: fine-tuned, padded, timed, exported (ONNX timed too)."""
    out = tmp_path_factory.mktemp("classifier") / "out"
    options = conversion_options(str(CANCER), "mixed_float16", data=str(CANCER_DATA), finetune_steps=20)
    report, _ = convert_and_save(options, SaveOptions(out, export_options(bench_onnx=True)))
    return report, out


def test_a_classifier_report_reads_back_as_itself(classifier):
    report, out = classifier
    assert report.finetune is not None and report.finetune.kept in tuple(FinetuneKept)
    assert report.padding is not None and report.speed is not None and "onnx" in report.speed.paths
    assert report.validation.kept_correct_rows and len(report.artifacts) == 3
    again = read_back(report)
    assert again == report
    assert again.to_json() == report.to_json() == json.loads((out / "report.json").read_text())
    assert again.gate == report.gate


def test_the_json_form_holds_only_json_types(classifier):
    report, _ = classifier
    assert not_native(report.to_json()) == []


def test_a_two_output_report_reads_back_as_itself(tmp_path):
    model = mm.digits_and_ink(keras, "dict", epochs=5)
    data = mm.digits_and_ink_npz(tmp_path / "both.npz")
    options = conversion_options(model, "mixed_float16", data=str(data), finetune_steps=0, speed=False)
    report = convert(options).report
    assert report.validation.outputs is not None and len(report.validation.outputs) == 2
    assert report.auto_keep is not None and report.auto_keep.mode is AutoKeepMode.SEARCH
    assert read_back(report) == report
    assert not_native(report.to_json()) == []


def test_a_graph_level_report_with_a_search_reads_back_as_itself(tmp_path):
    saved = gm.offset(tmp_path / "offset")
    data = gm.offset_npz(saved, tmp_path / "offset.npz")
    options = conversion_options(str(saved), "mixed_bfloat16", data=str(data), speed=False)
    report = convert(options).report
    assert report.source.format == "graph" and report.skipped  # no padding for a graph
    search = report.auto_keep.search
    assert search is not None and search.outcome is SearchOutcome.PASSED and search.kept
    assert read_back(report) == report
    assert not_native(report.to_json()) == []


def test_the_api_report_is_report_json(tmp_path):
    conversion = mpconvert.convert(CANCER, "mixed_bfloat16", data=str(CANCER_DATA), finetune_steps=0, speed=False)
    assert not_native(conversion.report) == []
    saved = conversion.save(tmp_path / "out", export=("savedmodel",))
    written = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved == conversion.report == written
    assert not_native(saved) == []


# --- reports of earlier versions ------------------------------------------------


def old_report(stored: dict) -> dict:
    """`stored` as an mpconvert from before the harm counts, max_abs_ref and min_speedup wrote it."""
    old = copy.deepcopy(stored)
    for key in ("agreement_rows", "harmed", "fixed", "kept_correct", "kept_correct_rows", "overlap", "outputs"):
        old["validation"].pop(key, None)
    for artifact in old["artifacts"]:
        artifact.pop("max_abs_ref")
        artifact.pop("outputs", None)
    old["gate"]["thresholds"].pop("min_speedup")
    old["gate"]["thresholds"].pop("max_overlap")
    old.pop("skipped", None)
    return old


def test_an_old_report_is_judged_by_the_rules_of_its_time(classifier):
    report, out = classifier
    old = old_report(json.loads((out / "report.json").read_text()))
    again = Report.from_json(old)
    before, now = {c.name: c for c in report.gate.checks}, {c.name: c for c in again.gate.checks}
    assert list(before) == list(now)
    # Without the harm counts: agreement, as then.
    v = report.validation
    assert now["agreement"].message.startswith(f"predictions agree on {v.agreement:.2%} of {v.rows} rows")
    assert now["agreement"].values.rows == v.rows
    # Without max_abs_ref: the atol alone.
    for artifact in report.artifacts:
        name = f"artifact parity: {artifact.kind}"
        assert now[name].values.max_abs_ref == 0.0
        assert now[name].values.limit == report.thresholds.atol[artifact.kind]
    for name in set(before) - {"agreement"} - {n for n in before if n.startswith("artifact parity")}:
        assert now[name] == before[name], name
    assert again.thresholds.min_speedup is None


def test_an_old_report_without_per_output_fields_keeps_its_shape_when_read_back():
    validation = {
        "metric": "accuracy",
        "reference": 0.9,
        "converted": 0.89,
        "drop": 0.01,
        "agreement": 0.97,
        "max_abs_diff": 0.01,
        "data": "npz",
        "rows": 100,
        "nonfinite_outputs": 0,
        "max_drop": 0.01,  # where the budget lived before the gate section
        "outputs": [
            {"name": "digit", "metric": "accuracy", "reference": 0.9, "converted": 0.89, "drop": 0.01},
            {"name": "ink", "metric": None, "reference": None, "converted": None, "drop": None, "rows": 100},
        ],
    }
    v = Validation.from_json(validation)
    assert v.outputs[0].kept_correct_rows is None and v.outputs[1].nonfinite_outputs == 0
    assert v.metric == "accuracy" and v.data == "npz"
    assert Validation.from_json(v.to_json()) == v


def test_a_written_report_of_any_shape_follows_the_schema(classifier):
    report, _ = classifier
    assert problems(report.to_json(), "report") == []
    assert problems(read_back(report).to_json(), "report") == []
