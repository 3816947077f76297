"""The CI gate: hand-computed checks on hand-written reports, the JUnit and
Markdown renderings, `mpconvert check`, and the CI flow end to end."""

import copy
import dataclasses
import json
import math
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest
from conftest import SAMPLES, invoke
from junitparser import Failure, JUnitXml
from option_values import changed_values
from reports import make_report, stored, thresholds, typed, write

from mpconvert.options.gate import Baseline, GateOptions, Thresholds
from mpconvert.render import markdown, write_junit
from mpconvert.report.gate import evaluate
from mpconvert.report.read import load_baseline, read_report, stored_thresholds
from mpconvert.report.report import Report
from mpconvert.report.sections import Source
from mpconvert.system.errors import MpconvertError


def checks_of(report, th=None) -> dict:
    th = th or thresholds()
    return {c.name: c for c in evaluate(typed(report, th), th).checks}


# --- the checks, by hand ------------------------------------------------------


def test_every_check_is_listed_with_its_numbers():
    result = evaluate(typed(make_report(), thresholds()), thresholds())
    names = [c.name for c in result.checks]
    assert names == [
        "policy rewrite",
        "accuracy gate",
        "agreement",
        "artifact parity: savedmodel",
        "artifact parity: onnx",
    ]
    checks = {c.name: c for c in result.checks}
    assert checks["policy rewrite"].message == "2 layers converted to mixed_float16, 1 kept float32"
    assert checks["accuracy gate"].message == "accuracy 0.9620 -> 0.9480, drop 0.0140 > max 0.0050"
    assert checks["agreement"].message == "predictions agree on 98.00% of 500 rows >= min 95.00%"
    # onnx: 0.001 + 0.0015 * 2.0 = 0.004, exactly its max |diff|
    assert checks["artifact parity: onnx"].passed
    assert checks["artifact parity: onnx"].values.limit == pytest.approx(0.004)
    assert [c.name for c in result.failed] == ["accuracy gate"] and not result.passed


@pytest.mark.parametrize(
    "max_drop,passed",
    [(0.014, True), (0.0139, False), (0.02, True), (0.0, False)],
    ids=["exactly-at-budget", "just-under-the-drop", "loose", "zero"],
)
def test_accuracy_drop_against_the_budget(max_drop, passed):
    # drop = 0.962 - 0.948 = 0.014 (plus binary rounding, which the gate forgives)
    check = checks_of(make_report(), thresholds(max_drop=max_drop))["accuracy gate"]
    assert check.passed is passed
    assert check.values.drop == pytest.approx(0.014) and check.values.max_drop == max_drop


def test_mse_drop_is_an_increase_in_error():
    report = make_report(
        validation={"metric": "mse", "reference": 0.100, "converted": 0.125, "drop": 0.025, "agreement": None}
    )
    checks = checks_of(report, thresholds(max_drop=0.025))
    assert checks["accuracy gate"].passed
    assert checks["accuracy gate"].message == "mse 0.1000 -> 0.1250, drop 0.0250 <= max 0.0250"
    assert "agreement" not in checks  # regression models have no predictions to agree on
    assert not checks_of(report, thresholds(max_drop=0.024))["accuracy gate"].passed


def test_nan_outputs_fail_whatever_the_budget():
    report = make_report(validation={"drop": 0.0, "nonfinite_outputs": 12, "max_abs_diff": None})
    check = checks_of(report, thresholds(max_drop=1.0))["accuracy gate"]
    assert not check.passed
    assert "drop 0.0000 <= max 1.0000; 12 NaN/inf output values" in check.message
    assert "mixed_bfloat16" in check.message


def test_unmeasured_accuracy_passes_and_says_so():
    report = make_report(
        validation={
            "metric": None,
            "reference": None,
            "converted": None,
            "drop": None,
            "data": "generated",
            "rows": 64,
            "max_abs_diff": 0.0031,
        }
    )
    check = checks_of(report)["accuracy gate"]
    assert check.passed
    assert check.message.startswith("accuracy not measured")
    assert "0.003100 on 64 generated inputs" in check.message


@pytest.mark.parametrize("min_agreement,passed", [(0.98, True), (0.9801, False), (0.5, True)])
def test_agreement_against_its_minimum(min_agreement, passed):
    check = checks_of(make_report(), thresholds(min_agreement=min_agreement))["agreement"]
    assert check.passed is passed
    assert ("<" if not passed else ">=") in check.message


HARM_KEYS = ("harmed", "fixed", "kept_correct", "kept_correct_rows")


def labelled(**numbers) -> dict:
    """A report whose validation has the harm counts (labelled data)."""
    return make_report(validation={"agreement_rows": numbers.get("rows", 500), **numbers})


def old_format(report: dict) -> dict:
    """The same report as written before the harm counts existed."""
    report = copy.deepcopy(report)
    for key in HARM_KEYS:
        report["validation"].pop(key)
    if "gate" in report:
        # Its verdict as that version stored it, by agreement: a report whose stored gate judged harm
        # counts it does not hold contradicts itself, and `mpconvert check` fails it as such.
        judged = Report.from_json(report).to_json()
        report.update(passed=judged["passed"], gate=judged["gate"])
    return report


# Fine-tuning fixed 22 of the 37 rows the float32 model got wrong and broke none:
# accuracy 0.63 -> 0.85, predictions agree on only 70 of 100 rows.
ONLY_FIXES = dict(
    reference=0.63,
    converted=0.85,
    drop=0.63 - 0.85,
    agreement=0.70,
    rows=100,
    harmed=0,
    fixed=22,
    kept_correct=1.0,
    kept_correct_rows=63,
)
# The README's example: 450 rows, the float32 model right on 440, the
# converted one on 445: 3 harmed, 8 fixed, kept 437 / 440 = 0.99318.
README_EXAMPLE = dict(
    reference=440 / 450,
    converted=445 / 450,
    drop=-5 / 450,
    agreement=439 / 450,
    rows=450,
    harmed=3,
    fixed=8,
    kept_correct=437 / 440,
    kept_correct_rows=440,
)


def test_with_labels_agreement_counts_harm_not_improvement():
    report = labelled(**ONLY_FIXES)
    check = checks_of(report)["agreement"]
    assert check.passed
    assert check.message == "kept 100.00% of the 63 rows the float32 model got right (0 harmed, 22 fixed) >= min 95.00%"
    assert check.values.agreement == 0.70 and check.values.rows == 63
    # A report written before the harm counts is judged by agreement, as then.
    old = checks_of(old_format(report))["agreement"]
    assert not old.passed and old.message == "predictions agree on 70.00% of 100 rows < min 95.00%"
    assert old.values.to_json() == {"agreement": 0.70, "min_agreement": 0.95, "rows": 100}


@pytest.mark.parametrize("min_agreement,passed", [(0.95, True), (437 / 440, True), (0.9932, False)])
def test_the_readme_example_against_the_minimum(min_agreement, passed):
    check = checks_of(labelled(**README_EXAMPLE), thresholds(min_agreement=min_agreement))["agreement"]
    assert check.passed is passed
    assert check.message.startswith("kept 99.32% of the 440 rows the float32 model got right (3 harmed, 8 fixed) ")
    assert check.values.harmed == 3 and check.values.fixed == 8


def test_harm_counts_of_none_fall_back_to_agreement():
    # Generated inputs: no labels, so no harm counts; agreement is the rule.
    report = make_report(
        validation={
            "metric": None,
            "reference": None,
            "converted": None,
            "drop": None,
            "data": "generated",
            "rows": 64,
            "agreement": 0.96875,
            "agreement_rows": 64,
            **dict.fromkeys(HARM_KEYS),
        }
    )
    check = checks_of(report)["agreement"]
    assert check.passed and check.message == "predictions agree on 96.88% of 64 rows >= min 95.00%"
    assert not checks_of(report, thresholds(min_agreement=0.97))["agreement"].passed


def test_near_ties_and_nothing_right_are_not_judged():
    tied = checks_of(
        labelled(agreement=None, agreement_rows=0, harmed=0, fixed=0, kept_correct=None, kept_correct_rows=0)
    )["agreement"]
    assert tied.passed and tied.message.startswith("not judged: all 500 rows are near-ties")
    wrong = checks_of(
        labelled(agreement=0.5, agreement_rows=10, harmed=0, fixed=5, kept_correct=None, kept_correct_rows=0)
    )["agreement"]
    assert wrong.passed
    assert (
        wrong.message
        == "not judged: the float32 model got none of the 10 decisive rows right, so none can be harmed (5 fixed)"
    )


@pytest.mark.parametrize(
    "rtol,passed",
    [(0.0015, True), (0.0014, False), (0.01, True)],
    ids=["exactly-at-limit", "just-under", "loose"],
)
def test_artifact_parity_scales_with_the_outputs(rtol, passed):
    # limit = atol + rtol * max |output| = 0.001 + rtol * 2.0; max |diff| 0.004
    th = thresholds(rtol={"savedmodel": 0.0, "keras": 0.0, "onnx": rtol})
    check = checks_of(make_report(), th)["artifact parity: onnx"]
    assert check.passed is passed
    assert check.values.limit == pytest.approx(0.001 + rtol * 2.0)
    assert check.message.startswith(f"max abs diff 0.004 {'<=' if passed else '>'} limit")


def test_artifact_parity_fails_on_nan_and_on_unknown_kinds():
    report = make_report()
    report["artifacts"][0]["max_abs_diff"] = None
    report["artifacts"].append(
        {
            "kind": "tflite",
            "path": "m.tflite",
            "bytes": 1,
            "max_abs_diff": 0.0,
            "max_abs_ref": 1.0,
            "runtime": "tflite",
            "details": {},
        }
    )
    checks = checks_of(report)
    assert not checks["artifact parity: savedmodel"].passed
    assert "not finite" in checks["artifact parity: savedmodel"].message
    assert "savedmodel's outputs" in checks["artifact parity: savedmodel"].message
    assert not checks["artifact parity: tflite"].passed
    assert "no tolerance known" in checks["artifact parity: tflite"].message


def test_every_failure_is_listed_not_only_the_first():
    report = make_report(validation={"agreement": 0.9})
    report["artifacts"][1]["max_abs_diff"] = 0.5
    report["finetune"] = {
        "steps": 15,
        "requested_steps": 100,
        "skipped_steps": 15,
        "healthy": False,
        "kept": "rewritten",
        "problem": "the loss scale collapsed to 1",
        "advice": "--keep-float32 on a layer",
    }
    result = evaluate(typed(report, thresholds()), thresholds())
    assert [c.name for c in result.failed] == [
        "fine-tune health",
        "accuracy gate",
        "agreement",
        "artifact parity: onnx",
    ]
    assert result.failed[0].message == (
        "stopped after 15 of 100 steps: the loss scale collapsed to 1; try --keep-float32 on a layer"
    )


def test_healthy_fine_tune_and_padding_checks():
    report = make_report(
        finetune={"steps": 100, "requested_steps": 100, "skipped_steps": 2, "healthy": True, "kept": "finetuned"},
        padding={
            "multiple": 8,
            "padded": [],
            "skipped": [],
            "flops_overhead": 0.1,
            "max_abs_diff": 1e-6,
            "float32_max_abs_diff": 0.0,
            "passed": True,
            "exported": "padded",
            "reason": None,
        },
    )
    checks = checks_of(report, thresholds(max_drop=0.05))
    assert checks["fine-tune health"].passed and checks["fine-tune health"].message.startswith("100 steps, 2 skipped")
    assert checks["padding proof"].passed and "exported padded" in checks["padding proof"].message
    report["padding"].update(passed=False, max_abs_diff=0.3, reason="padded outputs differ from the unpadded model")
    check = checks_of(report)["padding proof"]
    assert not check.passed and check.message == "padded outputs differ from the unpadded model (max abs diff 0.3)"
    assert "padding proof" not in checks_of(make_report())  # only when padding ran


def test_policy_rewrite_fails_when_nothing_was_converted():
    report = make_report()
    for layer in report["layers"][1:]:
        layer.update(policy="float32", pinned="--keep-float32 '.*'")
    check = checks_of(report)["policy rewrite"]
    assert not check.passed and check.values.to_json() == {"policy": "mixed_float16", "converted": 0, "kept_float32": 3}


@pytest.mark.parametrize(
    "metric,baseline,converted,max_regression,passed",
    [
        ("accuracy", 0.950, 0.948, 0.0, False),  # worse by 0.002
        ("accuracy", 0.950, 0.948, 0.002, True),  # exactly the allowed regression
        ("accuracy", 0.940, 0.948, 0.0, True),  # better
        ("accuracy", 0.948, 0.948, 0.0, True),  # unchanged: deterministic reruns pass
        ("mse", 0.100, 0.125, 0.02, False),  # error rose by 0.025
        ("mse", 0.130, 0.125, 0.0, True),  # error fell
    ],
)
def test_baseline_regression(metric, baseline, converted, max_regression, passed):
    report = make_report(validation={"metric": metric, "converted": converted})
    th = thresholds(
        max_regression=max_regression, baseline=Baseline("prev/report.json", metric, baseline, "mixed_float16", "net")
    )
    check = checks_of(report, th)["baseline regression"]
    assert check.passed is passed
    assert "prev/report.json" in check.message


def test_thresholds_from_flags_override_per_kind_in_order():
    base = Thresholds.defaults("mixed_bfloat16")
    assert base.rtol == {"savedmodel": 1.6e-2, "keras": 1.6e-2, "onnx": 1e-1, "litert": 1e-1, "openvino": 1e-1}
    assert base.max_drop == 0.01
    options = GateOptions(min_agreement=0.9, atol=(("onnx", 0.1), (None, 0.5)), rtol=((None, 0.0), ("keras", 0.2)))
    th = base.overridden(options)
    every = ("savedmodel", "keras", "onnx", "litert", "openvino")
    assert th.atol == dict.fromkeys(every, 0.5)  # the later "every kind" wins
    assert th.rtol == {**dict.fromkeys(every, 0.0), "keras": 0.2}
    assert (th.min_agreement, th.max_drop, th.max_regression) == (0.9, 0.01, 0.0)
    assert Thresholds.from_dict(json.loads(json.dumps(th.as_dict()))) == th


def test_each_given_threshold_is_a_judged_one_of_the_same_name_and_changes_it():
    """GateOptions holds the thresholds as given, Thresholds as judged by: one field list, one name each."""
    given = [f.name for f in dataclasses.fields(GateOptions)]
    assert set(given) == {f.name for f in dataclasses.fields(Thresholds)} - {"max_drop_by_output"}
    base = Thresholds.defaults("mixed_float16")
    values = changed_values(Path("m.keras"), Path("d.npz"), Path("prev/report.json"))
    earlier = Baseline("prev/report.json", "accuracy", 0.9, "mixed_float16", "net")
    for name in given:
        options = GateOptions(**{name: values[f"GateOptions.{name}"]})
        judged = base.overridden(options, earlier if name == "baseline" else None)
        assert getattr(judged, name) != getattr(base, name), f"--{name} does not reach what the gate judges by"


# --- reports on disk, and baselines -------------------------------------------


def test_a_report_round_trips_through_json_with_its_verdict():
    written = stored(make_report(), thresholds(max_drop=0.02))
    again = json.loads(json.dumps(written, allow_nan=False))
    assert again["passed"] is True and again["gate"]["passed"] is True
    assert stored_thresholds(again) == thresholds(max_drop=0.02)
    report = Report.from_json(again, stored_thresholds(again))
    assert report.exit_code == 0 and report.as_dict() == written


@pytest.mark.parametrize(
    "content,needle",
    [
        ('{"policy": ', "is not valid JSON"),
        ("[1, 2]", "is not an mpconvert report"),
        ('{"policy": "mixed_float16"}', "it has no source, layers, validation, artifacts"),
    ],
)
def test_unreadable_reports_are_user_errors(tmp_path, content, needle):
    with pytest.raises(MpconvertError, match=needle):
        read_report(write(tmp_path / "report.json", content))
    with pytest.raises(MpconvertError, match="not found"):
        read_report(tmp_path / "absent.json")


def test_a_baseline_must_measure_the_same_metric(tmp_path):
    path = write(tmp_path / "prev" / "report.json", stored(make_report()))
    assert load_baseline(path, "accuracy") == Baseline(
        str(path), "accuracy", 0.948, "mixed_float16", "models/net.keras"
    )
    with pytest.raises(MpconvertError, match="measured accuracy, this run measures mse"):
        load_baseline(path, "mse")
    with pytest.raises(MpconvertError, match="this run measures none"):
        load_baseline(path, None)
    unmeasured = make_report(validation={"metric": None, "converted": None, "reference": None, "drop": None})
    with pytest.raises(MpconvertError, match="measured no metric"):
        load_baseline(write(tmp_path / "gen.json", stored(unmeasured)), "accuracy")
    # A folder holding report.json is accepted too.
    assert load_baseline(tmp_path / "prev", "accuracy").converted == 0.948


# --- JUnit and Markdown -------------------------------------------------------


def failing_report() -> Report:
    report = make_report(validation={"agreement": 0.9})
    report["artifacts"][1]["max_abs_diff"] = 0.5
    return typed(report, thresholds())


def test_junit_parses_with_junitparser_and_names_the_failures(tmp_path):
    path = tmp_path / "ci" / "nested" / "junit.xml"  # parent folders are created
    write_junit(failing_report(), path)
    suites = list(JUnitXml.fromfile(str(path)))
    assert len(suites) == 1
    suite = suites[0]
    assert suite.name == "mpconvert: net.keras -> mixed_float16"
    assert (suite.tests, suite.failures, suite.errors) == (5, 3, 0)
    cases = {case.name: case for case in suite}
    assert set(cases) == {
        "policy rewrite",
        "accuracy gate",
        "agreement",
        "artifact parity: savedmodel",
        "artifact parity: onnx",
    }
    assert cases["policy rewrite"].is_passed and cases["artifact parity: savedmodel"].is_passed
    (failure,) = cases["accuracy gate"].result
    assert isinstance(failure, Failure)
    assert failure.message == "accuracy 0.9620 -> 0.9480, drop 0.0140 > max 0.0050"
    assert '"max_drop": 0.005' in failure.text
    (failure,) = cases["artifact parity: onnx"].result
    assert failure.message.startswith("max abs diff 0.5 > limit 0.004")
    assert {case.classname for case in suite} == {"mpconvert.net_keras.mixed_float16"}


def test_junit_has_the_elements_the_schema_requires(tmp_path):
    write_junit(failing_report(), tmp_path / "junit.xml")
    root = ET.parse(tmp_path / "junit.xml").getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    assert {"name", "tests", "failures", "errors"} <= set(suite.attrib)
    assert suite.get("tests") == "5" and suite.get("failures") == "3"
    cases = suite.findall("testcase")
    assert all({"name", "classname"} <= set(case.attrib) for case in cases)
    failures = {case.get("name"): case.find("failure") for case in cases}
    assert failures["policy rewrite"] is None
    assert failures["agreement"].get("message") == "predictions agree on 90.00% of 500 rows < min 95.00%"
    assert sum(f is not None for f in failures.values()) == 3


def test_junit_of_a_passing_report_has_no_failures(tmp_path):
    write_junit(typed(make_report(), thresholds(max_drop=0.02)), tmp_path / "junit.xml")
    (suite,) = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    assert suite.tests == 5 and suite.failures == 0 and all(case.is_passed for case in suite)


def test_markdown_summary_shows_metric_budget_artifacts_and_checks():
    text = markdown(failing_report())
    assert text.startswith("## mpconvert: net.keras → mixed_float16: ❌ FAILED\n")
    assert "| accuracy (500 samples) | 0.9620 | 0.9480 | 0.0140 | 0.0050 |" in text
    assert "Predictions agree on 90.00% (min 95.00%)." in text
    assert "| onnx (`model.onnx`) | 1.0 KB | 0.5 | 0.004 | onnxruntime |" in text
    assert "| savedmodel (`savedmodel`) | 2.0 KB | 0 | 0.001 | tensorflow |" in text
    assert "| accuracy gate | ❌ **fail** | accuracy 0.9620 -> 0.9480, drop 0.0140 > max 0.0050 |" in text
    assert "| policy rewrite | ✅ pass | 2 layers converted to mixed_float16, 1 kept float32 |" in text


def test_markdown_escapes_table_pipes_and_says_when_accuracy_was_not_measured():
    report = make_report(
        validation={"metric": None, "reference": None, "converted": None, "drop": None, "data": "generated", "rows": 64}
    )
    report["finetune"] = {
        "steps": 1,
        "requested_steps": 50,
        "skipped_steps": 0,
        "healthy": False,
        "kept": "rewritten",
        "problem": "loss | nan",
        "advice": None,
    }
    text = markdown(typed(report))
    assert "**Accuracy not measured**" in text and "on 64 generated inputs" in text
    # In a table cell a bare "|" would start a new cell.
    assert "| fine-tune health | ❌ **fail** | stopped after 1 of 50 steps: loss \\| nan |" in text


# --- mpconvert check ----------------------------------------------------------


@pytest.fixture
def report_file(tmp_path):
    """A stored report that fails its own budget (drop 0.014 > 0.005) and nothing else."""
    return write(tmp_path / "out" / "report.json", stored(make_report(), thresholds()))


def test_check_re_applies_the_stored_thresholds(report_file):
    result = invoke("check", report_file)
    assert result.exit_code == 3, result.output
    assert "FAIL accuracy gate: accuracy 0.9620 -> 0.9480, drop 0.0140 > max 0.0050" in result.output
    assert "FAILED: accuracy gate (exit code 3)" in result.output


def test_check_with_a_looser_budget_passes(report_file):
    result = invoke("check", report_file, "--max-drop", "0.014")  # exactly the drop
    assert result.exit_code == 0, result.output
    assert "PASSED" in result.output
    assert json.loads(report_file.read_text())["passed"] is False  # the report is only read


def test_check_with_tighter_tolerances_fails_each_named_check(report_file, tmp_path):
    junit = tmp_path / "ci" / "junit.xml"
    result = invoke(
        "check", report_file, "--max-drop", "0.02", "--rtol", "onnx=0.001", "--min-agreement", "0.99", "--junit", junit
    )
    assert result.exit_code == 3
    (suite,) = JUnitXml.fromfile(str(junit))
    failed = sorted(case.name for case in suite if not case.is_passed)
    assert failed == ["agreement", "artifact parity: onnx"]


def test_check_json_prints_exactly_one_document_on_stdout(report_file):
    result = invoke("check", report_file, "--json", "--max-drop", "0.02")
    assert result.exit_code == 0
    report = json.loads(result.stdout)  # raises if anything else is on stdout
    assert report["passed"] is True and report["gate"]["thresholds"]["max_drop"] == 0.02
    assert "PASSED" in result.stderr  # the human summary moved to stderr


def test_check_summary_dash_writes_markdown_to_stdout(report_file):
    result = invoke("check", report_file, "--summary", "-")
    assert result.exit_code == 3
    assert result.stdout.startswith("## mpconvert: net.keras → mixed_float16: ❌ FAILED")
    assert "mpconvert models/net.keras" in result.stderr


def test_check_baseline_flag_and_stored_baseline(report_file, tmp_path):
    better = write(tmp_path / "prev" / "report.json", stored(make_report(validation={"converted": 0.95})))
    result = invoke("check", report_file, "--max-drop", "0.02", "--baseline", better, "--json")
    assert result.exit_code == 3
    rechecked = json.loads(result.stdout)
    assert rechecked["gate"]["thresholds"]["baseline"]["converted"] == 0.95
    (check,) = [c for c in rechecked["gate"]["checks"] if not c["passed"]]
    assert check["name"] == "baseline regression" and check["values"]["regression"] == pytest.approx(0.002)
    # The stored baseline is re-applied by a later check; a budget loosens it.
    again = write(tmp_path / "again.json", rechecked)
    assert invoke("check", again).exit_code == 3
    assert invoke("check", again, "--max-regression", "0.002").exit_code == 0


@pytest.mark.parametrize(
    "content,needle",
    [
        (None, "not found"),
        ("{nope", "is not valid JSON"),
        ('{"hello": "world"}', "is not an mpconvert report"),
        ('{"policy": "float8", "source": {}, "layers": [], "validation": {}, "artifacts": []}', "validation.metric"),
    ],
)
def test_check_of_a_bad_report_exits_1_with_one_message(tmp_path, content, needle):
    path = tmp_path / "report.json"
    if content is not None:
        write(path, content)
    junit = tmp_path / "junit.xml"
    result = invoke("check", path, "--junit", junit, "--json")
    assert result.exit_code == 1
    assert result.stderr.count("error: ") == 1 and needle in result.stderr, result.stderr
    assert result.stdout == "" and not junit.exists()


def test_check_judges_old_reports_by_agreement_and_new_ones_by_harm(tmp_path):
    new = write(tmp_path / "new" / "report.json", stored(labelled(**ONLY_FIXES), thresholds(max_drop=0.01)))
    old = write(tmp_path / "old" / "report.json", old_format(json.loads(new.read_text())))
    result = invoke("check", new)
    assert result.exit_code == 0, result.output
    assert (
        "predictions agree on 70.0% (0 harmed, 22 fixed: kept 100.0% of the 63 rows the float32 model got right)"
        in result.output
    )
    assert (
        "pass agreement: kept 100.00% of the 63 rows the float32 model got right (0 harmed, 22 fixed)" in result.output
    )
    result = invoke("check", old)
    assert result.exit_code == 3
    assert "FAIL agreement: predictions agree on 70.00% of 100 rows < min 95.00%" in result.output
    assert "harmed" not in result.output
    # --min-agreement is the threshold of whichever rule applies.
    assert invoke("check", new, "--min-agreement", "1").exit_code == 0
    assert invoke("check", old, "--min-agreement", "0.7").exit_code == 0


def test_markdown_mentions_harmed_and_fixed_with_labels():
    text = markdown(typed(labelled(**README_EXAMPLE), thresholds(max_drop=0.02)))
    assert (
        "Predictions agree on 97.56% (3 harmed, 8 fixed: kept 99.32% of the 440 rows the float32 model got right, "
        "min 95.00%)."
    ) in text
    assert (
        "| agreement | ✅ pass | kept 99.32% of the 440 rows the float32 model got right (3 harmed, 8 fixed) >= min 95.00% |"
        in text
    )


def test_check_of_a_baseline_with_another_metric_exits_1(report_file, tmp_path):
    mse = write(tmp_path / "mse.json", stored(make_report(validation={"metric": "mse", "agreement": None})))
    result = invoke("check", report_file, "--baseline", mse)
    assert result.exit_code == 1 and "measured mse, this run measures accuracy" in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--atol", "tflite=1"],
        ["--rtol", "-1"],
        ["--atol", "onnx="],
        ["--min-agreement", "2"],
        ["--json", "--summary", "-"],
    ],
)
def test_check_usage_errors_exit_2(report_file, args):
    assert invoke("check", report_file, *args).exit_code == 2


def test_check_does_not_import_tensorflow(report_file):
    code = (
        "import sys; from click.testing import CliRunner; from mpconvert.cli import cli; "
        f"r = CliRunner().invoke(cli, ['check', {str(report_file)!r}, '--max-drop', '0.02']); "
        "print(r.exit_code, 'tensorflow' in sys.modules, 'keras' in sys.modules)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.stdout.split() == ["0", "False", "False"], proc.stderr


# --- the CI flow, end to end with the real conversion -------------------------


def near_tie_model(scale: float):
    """A linear softmax classifier whose logits sit near 1000, where float16
    resolves only 0.5: rounding flips the predictions whose top two logits
    are closer than that, without any NaN. A smaller `scale` brings the
    logits closer (more flips); the float32 argmax does not depend on it, so
    the same labels serve every scale."""
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    x = keras.Input((8,), name="features")
    out = keras.layers.Dense(3, activation="softmax", name="predictions")(x)
    model = keras.Model(x, out, name="near_tie")
    model.get_layer("predictions").set_weights(
        [rng.standard_normal((8, 3)).astype("float32") * scale, np.full(3, 1000.0, "float32")]
    )
    return model


@pytest.fixture(scope="module")
def ci_models(tmp_path_factory):
    import keras
    import numpy as np
    import tiny_models

    folder = tmp_path_factory.mktemp("ci_models")
    x = np.random.default_rng(1).standard_normal((200, 8)).astype("float32")
    for scale, name in ((3.0, "v1"), (1.5, "v2")):
        near_tie_model(scale).save(folder / f"near_tie_{name}.keras")
    y = near_tie_model(1.0).predict(x, verbose=0).argmax(axis=1)
    np.savez(folder / "near_tie.npz", x=x, y=y)
    overflow = tiny_models.float16_overflow(keras)
    overflow.save(folder / "overflow.keras")
    np.savez(folder / "overflow.npz", x=x, y=overflow.predict(x, verbose=0).argmax(axis=1))
    return folder


def convert(model, data, out, *args):
    # --auto-keep off: these runs test the gate's verdict on failures the
    # lint and search would otherwise repair. --no-speed: no run here sets
    # --min-speedup, so the timing would only add seconds and no check.
    return invoke(
        model,
        "--policy",
        "mixed_float16",
        "--data",
        data,
        "--out",
        out,
        "--export",
        "savedmodel",
        "--auto-keep",
        "off",
        "--no-speed",
        *args,
    )


def test_ci_a_model_within_budget_exits_0_with_a_passing_junit(tmp_path):
    out, junit, summary = tmp_path / "out", tmp_path / "ci" / "junit.xml", tmp_path / "ci" / "summary.md"
    result = convert(
        SAMPLES / "cancer_mlp.keras",
        SAMPLES / "data" / "breast_cancer.npz",
        out,
        "--finetune-steps",
        "0",
        "--junit",
        junit,
        "--summary",
        summary,
        "--json",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)  # stdout is the report and nothing else
    assert report == json.loads((out / "report.json").read_text())
    assert report["passed"] is True and report["gate"]["passed"] is True
    assert all(a["max_abs_ref"] > 0 for a in report["artifacts"])
    (suite,) = JUnitXml.fromfile(str(junit))
    assert suite.failures == 0 and suite.tests == len(report["gate"]["checks"]) >= 4
    assert "✅ PASSED" in summary.read_text().splitlines()[0]


def test_ci_float16_overflow_exits_3_and_its_junit_and_summary_name_the_check(ci_models, tmp_path):
    out, junit, summary = tmp_path / "out", tmp_path / "ci" / "junit.xml", tmp_path / "ci" / "summary.md"
    result = convert(
        ci_models / "overflow.keras",
        ci_models / "overflow.npz",
        out,
        "--finetune-steps",
        "0",
        "--junit",
        junit,
        "--summary",
        summary,
    )
    assert result.exit_code == 3, result.output
    cases = {case.name: case for case in next(iter(JUnitXml.fromfile(str(junit))))}
    (failure,) = cases["accuracy gate"].result
    assert failure.message.startswith("accuracy 1.0000 -> ")
    assert " > max 0.0100; " in failure.message and "NaN/inf output values" in failure.message
    assert cases["policy rewrite"].is_passed
    text = summary.read_text()
    assert "❌ FAILED" in text and "| accuracy gate | ❌ **fail** | accuracy 1.0000 -> " in text
    # No budget excuses NaN outputs: a looser budget still fails.
    assert (
        invoke("check", out / "report.json", "--max-drop", "1", "--min-agreement", "0", "--atol", "1e9").exit_code == 3
    )


def test_ci_a_drop_over_budget_passes_check_with_a_looser_budget(ci_models, tmp_path):
    out = tmp_path / "out"
    result = convert(ci_models / "near_tie_v2.keras", ci_models / "near_tie.npz", out, "--finetune-steps", "0")
    assert result.exit_code == 3, result.output
    report = json.loads((out / "report.json").read_text())
    v = report["validation"]
    assert v["nonfinite_outputs"] == 0 and v["drop"] > 0.01
    assert [c["name"] for c in report["gate"]["checks"] if not c["passed"]] == ["accuracy gate"]
    drop = v["drop"]
    assert invoke("check", out / "report.json", "--max-drop", drop).exit_code == 0  # exactly at the drop
    assert invoke("check", out / "report.json", "--max-drop", drop - 0.001).exit_code == 3


def test_ci_baseline_catches_a_regression_between_two_runs(ci_models, tmp_path):
    budget = ["--finetune-steps", "0", "--max-drop", "0.2"]
    first = convert(ci_models / "near_tie_v1.keras", ci_models / "near_tie.npz", tmp_path / "v1", *budget)
    assert first.exit_code == 0, first.output
    baseline = tmp_path / "v1" / "report.json"
    second = convert(
        ci_models / "near_tie_v2.keras", ci_models / "near_tie.npz", tmp_path / "v2", *budget, "--baseline", baseline
    )
    assert second.exit_code == 3, second.output
    report = json.loads((tmp_path / "v2" / "report.json").read_text())
    (failed,) = [c for c in report["gate"]["checks"] if not c["passed"]]
    assert failed["name"] == "baseline regression"
    before = json.loads(baseline.read_text())["validation"]["converted"]
    assert failed["values"]["baseline"] == before > report["validation"]["converted"]
    assert report["gate"]["thresholds"]["baseline"]["path"] == str(baseline)
    # The same comparison, re-checked later with a tolerance that covers it.
    regression = before - report["validation"]["converted"]
    assert invoke("check", tmp_path / "v2", "--max-regression", regression).exit_code == 0


def test_ci_a_bad_baseline_fails_before_anything_is_written(ci_models, tmp_path):
    out, junit = tmp_path / "out", tmp_path / "junit.xml"
    result = convert(
        ci_models / "near_tie_v1.keras",
        ci_models / "near_tie.npz",
        out,
        "--baseline",
        tmp_path / "missing.json",
        "--junit",
        junit,
    )
    assert result.exit_code == 1
    assert "error: baseline" in result.stderr and "not found" in result.stderr
    assert not out.exists() and not junit.exists()


def test_ci_a_stopped_fine_tune_fails_the_gate(tmp_path):
    import keras
    import numpy as np
    import tiny_models

    model = tiny_models.gradient_overflow(keras)
    model.save(tmp_path / "grad.keras")
    x = np.random.default_rng(0).standard_normal((128, 8)).astype("float32")
    y = (x[:, :1] * 0.5).astype("float32")
    np.savez(tmp_path / "data.npz", x=x[64:], y=y[64:], x_train=x[:64], y_train=y[:64])
    out = tmp_path / "out"
    # A huge budget isolates the fine-tune check from the accuracy gate.
    result = convert(
        tmp_path / "grad.keras", tmp_path / "data.npz", out, "--finetune-steps", "30", "--max-drop", "1e30"
    )
    assert result.exit_code == 3, result.output
    report = json.loads((out / "report.json").read_text())
    (failed,) = [c for c in report["gate"]["checks"] if not c["passed"]]
    assert failed["name"] == "fine-tune health" and "loss scale collapsed" in failed["message"]
    assert math.isclose(report["gate"]["thresholds"]["max_drop"], 1e30)


def test_the_policy_tolerance_tables_cannot_be_changed_by_one_caller():
    from mpconvert.options.precision import Precision

    with pytest.raises(TypeError):
        Precision.of("mixed_float16").parity_rtol["onnx"] = 9.0
    thresholds = Thresholds.defaults("mixed_float16")
    thresholds.rtol["onnx"] = 9.0  # a conversion's own copy
    assert Precision.of("mixed_float16").parity_rtol["onnx"] == 0.02


# --- checks and lines that claim no comparison that did not run -----------------


def test_nothing_to_pad_is_said_with_the_stages_reason():
    reason = "nothing to pad: every channel dimension is already a multiple of 8"
    padding = {"multiple": 8, "padded": [], "skipped": [], "passed": True, "exported": "unpadded", "reason": reason}
    check = checks_of(make_report(padding=padding))["padding proof"]
    assert check.passed and check.message == f"{reason}; nothing was compared, the unpadded model was exported"


def test_drift_and_agreement_without_rows_are_not_judged():
    from mpconvert.report.gate import check_drift
    from mpconvert.report.sections import OutputValidation

    empty = OutputValidation("boxes", None, None, None, None, max_abs_diff=0.0, rows=0)
    check = check_drift(empty)
    assert check.passed and check.message == "not judged: no labels for output 'boxes' and no rows"
    no_rows = make_report(validation={"rows": 0, "agreement": None, "agreement_rows": None})
    assert checks_of(no_rows)["agreement"].message == "not judged: no rows"
    generated = make_report(
        validation={"metric": None, "reference": None, "converted": None, "drop": None, "max_abs_diff": None}
    )
    assert "(max abs diff not finite on 500 generated inputs)" in checks_of(generated)["accuracy gate"].message


@pytest.mark.parametrize(
    "fidelity,line",
    [
        (
            {"rows": 256, "max_abs_diff": 0.0, "limit": 1e-6},
            "the float32 rebuild reproduces the original (max |diff| 0 <= 1e-06 on 256 rows)",
        ),
        (
            {"rows": 256, "max_abs_diff": 0.5, "limit": 1e-6},
            "the float32 rebuild differs from the original: max |diff| 0.5 > 1e-06 on 256 rows",
        ),
        (
            {"rows": 256, "max_abs_diff": None, "limit": 1e-6},
            "the float32 rebuild against the original: max |diff| n/a, limit 0.000001 on 256 rows",
        ),
        (
            {"rows": 0, "max_abs_diff": 0.0, "limit": 1e-6},
            "the float32 rebuild was not compared with the original: no rows",
        ),
    ],
)
def test_the_rebuild_line_claims_a_reproduction_only_where_its_figures_show_one(fidelity, line, capsys):
    from mpconvert.render import render_summary

    report = typed(make_report(fidelity=fidelity))
    render_summary(report)
    assert f"  rebuild: {line}\n" in capsys.readouterr().out


def test_the_summary_names_each_format_and_what_its_proof_compared(capsys):
    # The words come from the model format (data/formats.py), not from a table keyed on format names here.
    from mpconvert.render import describe_source, render_summary

    source = {**make_report()["source"], "path": "models/served", "format": "graph", "loader": "tensorflow"}
    render_summary(typed(make_report(source=source, fidelity={"rows": 256, "max_abs_diff": 0.0, "limit": 1e-6})))
    out = capsys.readouterr().out
    assert "models/served (SavedModel without Keras metadata, as a frozen graph, tensorflow) ->" in out
    assert (
        "  rebuild: the frozen graph reproduces the SavedModel's signature (max |diff| 0 <= 1e-06 on 256 rows)\n" in out
    )
    h5 = Source.from_json({**source, "format": "h5", "loader": "tf_keras"})
    assert describe_source(h5) == "models/served (.h5 file, tf-keras)"
    # A format a newer mpconvert wrote: its own name.
    assert describe_source(Source.from_json({**source, "format": "openvino"})) == "models/served (openvino, tensorflow)"


# A random-weight language model: the float32 model gets 1 of 586 tokens right; the converted, fine-tuned one
# loses it and gets 19 others right.
ONE_RIGHT = dict(
    reference=1 / 586, converted=19 / 586, drop=-18 / 586, agreement=0.5, rows=586, harmed=1, fixed=19, kept_correct=0.0
)


@pytest.mark.parametrize(
    "right,harmed,min_agreement,judged,passed",
    [
        (1, 1, 0.95, False, True),  # 1 right: one harm alone is 100% of them
        (19, 1, 0.95, False, True),  # 1/19 = 5.3% > 5%: still too few for the budget to allow one
        (20, 1, 0.95, True, True),  # 19/20 = 95%: the least count judged, and within it
        (20, 2, 0.95, True, False),
        (1, 1, 1.0, True, False),  # at a minimum of 100% any harm fails, whatever the count
        (9, 1, 0.9, False, True),  # 1 / (1 - 0.9) = 10 right needed
        (10, 1, 0.9, True, True),
    ],
)
def test_harm_is_judged_once_one_harmed_row_could_be_within_the_budget(right, harmed, min_agreement, judged, passed):
    numbers = {**ONE_RIGHT, "kept_correct_rows": right, "harmed": harmed, "kept_correct": (right - harmed) / right}
    check = checks_of(labelled(**numbers), thresholds(min_agreement=min_agreement))["agreement"]
    assert check.passed is passed
    assert check.message.startswith("kept ") is judged
    if not judged:
        least = {0.95: 20, 0.9: 10}[min_agreement]
        assert check.message == (
            f"not judged: the float32 model got only {right} of the 586 decisive rows right, fewer than {least}, "
            f"the least at which min {min_agreement:.2%} allows one harmed ({harmed} harmed, 19 fixed; "
            "the accuracy check judges the change)"
        )
