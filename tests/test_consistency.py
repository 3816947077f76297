"""`mpconvert check` judges a report's raw figures, and fails one whose derived figures contradict them.

Real conversions (cancer_mlp with its labelled data, padded, timed and
exported; a model with two outputs, one of which overflows float16) are
tampered in one derived figure at a time: the re-check exits 3 and names
the field, with what the raw figures give, computed here by hand. The
untampered reports re-check to their own verdict; raw figures edited with
everything derived from them are judged on the new figures (a report is not
signed, docs/gate.md).
"""

import copy
import json

import keras
import multi_models as mm
import pytest
from conftest import SAMPLES, invoke

import mpconvert
from mpconvert.report.report import Report

CANCER = SAMPLES / "cancer_mlp.keras"
CANCER_DATA = SAMPLES / "data" / "breast_cancer.npz"
CONSISTENCY = "report consistency"


@pytest.fixture(scope="module")
def cancer(tmp_path_factory) -> dict:
    """report.json of cancer_mlp, mixed_float16: labels, a train split (overlap), padding, speed, two artifacts."""
    out = tmp_path_factory.mktemp("cancer") / "out"
    result = invoke(
        CANCER,
        "--policy",
        "mixed_float16",
        "--data",
        CANCER_DATA,
        "--out",
        out,
        "--finetune-steps",
        "0",
        "--export",
        "savedmodel",
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["padding"]["padded"] and report["validation"]["overlap"] and report["speed"]["memory"]
    return report


@pytest.fixture(scope="module")
def two(tmp_path_factory) -> dict:
    """report.json of a digit head and an ink head whose hidden layer overflows float16 (NaN values in 'ink')."""
    folder = tmp_path_factory.mktemp("two")
    model = mm.digits_and_ink(keras, "dict", epochs=5)
    data = mm.digits_and_ink_npz(folder / "both.npz")
    conversion = mpconvert.convert(
        model, "mixed_float16", data=str(data), finetune_steps=0, speed=False, auto_keep="off", pad_multiple=0
    )
    report = conversion.save(folder / "out", export=("savedmodel",))
    v = report["validation"]
    assert [o["name"] for o in v["outputs"]] == ["digit", "ink"] and v["outputs"][1]["nonfinite_outputs"] > 0
    return report


def recheck(tmp_path, report: dict, *args):
    """`mpconvert check --json` of `report` written as report.json: (exit code, the re-judged report)."""
    path = tmp_path / "tampered" / "report.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report))
    result = invoke("check", path, "--json", *args)
    assert result.exit_code in (0, 3), result.output
    return result.exit_code, json.loads(result.stdout)


def checks_of(report: dict) -> dict:
    return {c["name"]: c for c in report["gate"]["checks"]}


# --- untampered -----------------------------------------------------------------


@pytest.mark.parametrize("which", ["cancer", "two"])
def test_an_untampered_report_rechecks_to_its_own_verdict(request, tmp_path, which):
    stored = request.getfixturevalue(which)
    code, again = recheck(tmp_path, stored)
    assert code == (0 if stored["passed"] else 3) and again["passed"] is stored["passed"]
    assert which == "two" or code == 0
    consistency, *others = again["gate"]["checks"]
    assert consistency["name"] == CONSISTENCY and consistency["passed"], consistency["message"]
    assert consistency["values"] == {"contradictions": [], "fields": []}
    assert others == stored["gate"]["checks"]
    # The figures it was judged on are the ones it holds.
    assert {k: v for k, v in again.items() if k not in ("gate", "passed")} == {
        k: v for k, v in stored.items() if k not in ("gate", "passed")
    }


# --- one derived figure at a time -----------------------------------------------


def _drop(r):
    r["validation"]["drop"] = 0.5


def _agreement(r):
    r["validation"]["agreement"] = 0.5


def _kept_correct(r):
    r["validation"]["kept_correct"] = 0.5


def _harmed_over_rows(r):
    v = r["validation"]
    v["harmed"] = v["kept_correct_rows"] + 1


def _fixed_over_rows(r):
    v = r["validation"]
    v["fixed"] = v["agreement_rows"] - v["kept_correct_rows"] + 1


def _overlap_share(r):
    r["validation"]["overlap"]["share"] = 0.5


def _nonfinite_total(r):
    r["validation"]["nonfinite_outputs"] = 3


def _parity_flipped(r):
    check = checks_of(r)["artifact parity: savedmodel"]
    check["passed"] = not check["passed"]


def _speed_ratio(r):
    r["speed"]["paths"]["keras"]["ratio"] = 9.0


def _latency_p99(r):
    r["speed"]["paths"]["keras"]["latency"]["converted"]["p99_ms"] = 0.0001


def _memory_ratio(r):
    r["speed"]["memory"]["ratio"] = 0.01


def _padding_proof(r):
    r["padding"].update(passed=False, exported="unpadded")


def _passed_flag(r):
    r["passed"] = False


def _check_removed(r):
    r["gate"]["checks"] = [c for c in r["gate"]["checks"] if c["name"] != "agreement"]


def _layer_counts(r):
    checks_of(r)["policy rewrite"]["values"]["converted"] += 1


def _fidelity(r):
    r["fidelity"]["max_abs_diff"] = 1.0


TAMPERED = {
    # (what to change, the field named, the line naming it with what the raw figures give, by hand)
    "drop": (_drop, "validation.drop", lambda v: f"validation.drop is 0.5000 but reference {v['reference']:.6g} and "),
    "agreement": (
        _agreement,
        "validation.agreement",
        lambda v: (
            f"validation.agreement is 0.5000 but agreed {v['agreed']} and agreement_rows "
            f"{v['agreement_rows']} give {v['agreed'] / v['agreement_rows']:.4f}"
        ),
    ),
    "kept_correct": (
        _kept_correct,
        "validation.kept_correct",
        lambda v: (
            f"validation.kept_correct is 0.5000 but harmed {v['harmed']} and kept_correct_rows "
            f"{v['kept_correct_rows']} give {(v['kept_correct_rows'] - v['harmed']) / v['kept_correct_rows']:.4f}"
        ),
    ),
    "harmed": (
        _harmed_over_rows,
        "validation.harmed",
        lambda v: (
            f"validation.harmed is {v['kept_correct_rows'] + 1} but the number the float32 model got right "
            f"(kept_correct_rows) is {v['kept_correct_rows']}"
        ),
    ),
    "fixed": (
        _fixed_over_rows,
        "validation.fixed",
        lambda v: (
            f"validation.fixed is {v['agreement_rows'] - v['kept_correct_rows'] + 1} but the number the "
            f"float32 model got wrong (agreement_rows - kept_correct_rows) is {v['agreement_rows'] - v['kept_correct_rows']}"
        ),
    ),
    "overlap share": (
        _overlap_share,
        "validation.overlap.share",
        lambda v: (
            f"validation.overlap.share is 0.5000 but in_train {v['overlap']['in_train']} of validation_rows "
            f"{v['overlap']['validation_rows']} give {v['overlap']['in_train'] / v['overlap']['validation_rows']:.4f}"
        ),
    ),
    "nonfinite total": (
        _nonfinite_total,
        "validation.nonfinite_by_output",
        lambda v: 'validation.nonfinite_by_output is null but nonfinite_outputs 3 give {"malignant": 3}',
    ),
    "parity verdict": (
        _parity_flipped,
        'gate.checks["artifact parity: savedmodel"].passed',
        lambda v: (
            'gate.checks["artifact parity: savedmodel"].passed is false but the report\'s figures pass it: '
            "max abs diff 0 <= limit"
        ),
    ),
    "speed ratio": (
        _speed_ratio,
        "speed.paths.keras.ratio",
        lambda v: "speed.paths.keras.ratio is 9.0000 but float32_ms",
    ),
    "latency percentile": (
        _latency_p99,
        "speed.paths.keras.latency.converted.p99_ms",
        lambda v: "speed.paths.keras.latency.converted.p99_ms is 0.0001 but",
    ),
    "memory ratio": (
        _memory_ratio,
        "speed.memory.ratio",
        lambda v: "speed.memory.ratio is 0.0100 but float32_bytes",
    ),
    "padding proof": (_padding_proof, "padding.passed", lambda v: "padding.passed is false but its differences"),
    "passed flag": (
        _passed_flag,
        "passed",
        lambda v: "passed is false but its gate checks, judged on the report's figures, give true",
    ),
    "gate checks list": (
        _check_removed,
        'gate.checks["agreement"]',
        lambda v: "gate.checks has no 'agreement' check, which the report's figures call for (they pass it)",
    ),
    "layer counts": (
        _layer_counts,
        'gate.checks["policy rewrite"].values.converted',
        lambda v: 'gate.checks["policy rewrite"].values.converted is 3 but the report\'s figures give 2',
    ),
    "fidelity": (_fidelity, "fidelity.max_abs_diff", lambda v: "fidelity.max_abs_diff is 1.0000 but its limit is"),
}


@pytest.mark.parametrize("name", list(TAMPERED))
def test_each_tampered_derived_figure_fails_the_recheck_naming_it(cancer, tmp_path, name):
    tamper, field, line = TAMPERED[name]
    report = copy.deepcopy(cancer)
    tamper(report)
    code, again = recheck(tmp_path, report)
    assert code == 3
    consistency = checks_of(again)[CONSISTENCY]
    assert not consistency["passed"] and field in consistency["values"]["fields"], consistency["values"]
    expected = line(cancer["validation"])
    assert any(c.startswith(expected) for c in consistency["values"]["contradictions"]), (
        expected,
        consistency["values"]["contradictions"],
    )
    # Every other check is what the untampered report gets, where only a derived figure was changed (the
    # counts and the NaN/inf total are raw: those checks judge the figures as they are now).
    untampered = checks_of(cancer)
    if name not in ("harmed", "fixed", "nonfinite total"):
        assert {n: c for n, c in checks_of(again).items() if n != CONSISTENCY} == untampered


def test_a_lowered_converted_accuracy_is_judged_on_the_drop_it_gives(cancer, tmp_path):
    """The issue's report: converted lowered by 0.2, nothing else changed."""
    report = copy.deepcopy(cancer)
    v = report["validation"]
    reference, converted = v["reference"], v["converted"] - 0.2
    v["converted"] = converted
    code, again = recheck(tmp_path, report)
    assert code == 3
    drop = reference - converted  # accuracy: how much it fell
    checks = checks_of(again)
    assert checks["accuracy gate"]["message"] == (
        f"accuracy {reference:.4f} -> {converted:.4f}, drop {drop:.4f} > max 0.0100"
    )
    assert again["validation"]["drop"] == pytest.approx(drop)
    contradictions = checks[CONSISTENCY]["values"]["contradictions"]
    assert contradictions[0] == (
        f"validation.drop is {cancer['validation']['drop']:.4f} but reference {reference:.6g} and converted "
        f"{converted:.6g} give {drop:.4f}"
    )
    assert 'gate.checks["accuracy gate"].passed' in checks[CONSISTENCY]["values"]["fields"]
    result = invoke("check", write_report(tmp_path / "text", report))
    assert result.exit_code == 3
    assert "FAIL report consistency: the report contradicts itself: validation.drop is 0.0000 but" in result.output
    assert "FAILED: report consistency, accuracy gate (exit code 3)" in result.output


def write_report(folder, report):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(report))
    return folder / "report.json"


def test_raw_figures_edited_without_the_gate_are_caught_by_its_copies(cancer, tmp_path):
    """Reference and converted lowered together keep the drop, but the accuracy check stored what it judged."""
    report = copy.deepcopy(cancer)
    v = report["validation"]
    v["reference"] -= 0.1
    v["converted"] -= 0.1
    code, again = recheck(tmp_path, report)
    assert code == 3
    fields = checks_of(again)[CONSISTENCY]["values"]["fields"]
    assert 'gate.checks["accuracy gate"].values.reference' in fields
    assert 'gate.checks["accuracy gate"].values.converted' in fields
    assert "validation.drop" not in fields  # the drop itself still agrees


def test_a_report_rewritten_whole_is_judged_on_its_new_figures(cancer, tmp_path):
    """A report is not signed: figures edited with everything derived from them read as a real run."""
    forged = copy.deepcopy(cancer)
    v = forged["validation"]
    reference, converted = v["reference"], v["converted"] - 0.2
    v["converted"] = converted
    forged = Report.from_json(forged).derived().to_json()  # every derived figure and the verdict, recomputed
    code, again = recheck(tmp_path, forged)
    assert code == 3
    checks = checks_of(again)
    assert checks[CONSISTENCY]["passed"]
    assert checks["accuracy gate"]["message"] == (
        f"accuracy {reference:.4f} -> {converted:.4f}, drop {reference - converted:.4f} > max 0.0100"
    )
    assert [n for n, c in checks.items() if not c["passed"]] == ["accuracy gate"]


def test_a_recheck_written_back_stays_inconsistent(cancer, tmp_path):
    """`check --json` of a tampered report holds figures derived again; it still carries the finding."""
    report = copy.deepcopy(cancer)
    report["validation"]["drop"] = 0.5
    code, again = recheck(tmp_path, report, "--max-drop", "0.5")
    assert code == 3 and again["validation"]["drop"] == cancer["validation"]["drop"]
    code, twice = recheck(tmp_path, again)
    consistency = checks_of(twice)[CONSISTENCY]
    assert code == 3 and not consistency["passed"]
    assert consistency["values"]["contradictions"] == [
        "an earlier re-check found: " + checks_of(again)[CONSISTENCY]["message"]
    ]


def test_harm_counts_removed_under_a_gate_that_judged_them_are_caught(cancer, tmp_path):
    """Deleting the harm counts would move the agreement check to another rule: the stored gate says so."""
    report = copy.deepcopy(cancer)
    for key in ("harmed", "fixed", "kept_correct", "kept_correct_rows"):
        del report["validation"][key]
    code, again = recheck(tmp_path, report)
    v = cancer["validation"]
    assert code == 3 and checks_of(again)[CONSISTENCY]["values"]["contradictions"] == [
        # judged by harm over the rows the float32 model got right, by agreement over every decisive row
        f'gate.checks["agreement"].values.rows is {v["kept_correct_rows"]} but the report\'s figures give '
        f"{v['agreement_rows']}"
    ]


def test_a_report_without_its_stored_verdict_is_inconsistent(cancer, tmp_path):
    report = copy.deepcopy(cancer)
    del report["gate"], report["passed"]
    path = tmp_path / "stripped.json"  # not report.json: it breaks the schema on purpose
    path.write_text(json.dumps(report))
    result = invoke("check", path)
    assert result.exit_code == 3
    assert "FAIL report consistency: the report contradicts itself: the report has no stored verdict" in result.output


# --- several outputs ------------------------------------------------------------


def _output_drop(r):
    r["validation"]["outputs"][0]["drop"] += 0.3


def _primary_reference(r):
    r["validation"]["reference"] = 0.1


def _total_nonfinite(r):
    r["validation"]["nonfinite_outputs"] += 5


def _output_nonfinite(r):
    r["validation"]["outputs"][1]["nonfinite_outputs"] += 2


def _artifact_output(r):
    r["artifacts"][0]["outputs"]["digit"]["max_abs_diff"] = 0.75


def _artifact_finite(r):
    r["artifacts"][0]["outputs"]["ink"]["max_abs_diff"] = 0.125


def test_a_two_output_report_tampered_per_output_names_each_field(two, tmp_path):
    v = two["validation"]
    digit, ink = v["outputs"]
    nonfinite = ink["nonfinite_outputs"]
    cases = [
        (
            _output_drop,
            "validation.outputs[0].drop",
            f"validation.outputs[0].drop is {digit['drop'] + 0.3:.4f} but reference {digit['reference']:.6g} and "
            f"converted {digit['converted']:.6g} give {digit['reference'] - digit['converted']:.4f}",
        ),
        (
            _primary_reference,
            "validation.reference",
            "validation.reference is 0.1000 but the primary output's figures (validation.outputs[0], 'digit') give "
            f"{digit['reference']:.4f}",
        ),
        (
            _total_nonfinite,
            "validation.nonfinite_outputs",
            f"validation.nonfinite_outputs is {nonfinite + 5} but the per-output figures (validation.outputs) give "
            f"{nonfinite}",
        ),
        (
            _output_nonfinite,
            "validation.nonfinite_by_output",
            f'validation.nonfinite_by_output is {{"ink": {nonfinite}}} but the per-output figures '
            f'(validation.outputs) give {{"ink": {nonfinite + 2}}}',
        ),
        (
            # NaN in 'ink' keeps the whole artifact's difference null (not finite): its parity check kept a copy.
            _artifact_output,
            'gate.checks["artifact parity: savedmodel"].values.outputs.digit.max_abs_diff',
            'gate.checks["artifact parity: savedmodel"].values.outputs.digit.max_abs_diff is '
            f"{two['artifacts'][0]['outputs']['digit']['max_abs_diff']:.4f} but the report's figures give 0.7500",
        ),
        (
            # Every output finite now: the whole artifact's difference is their largest.
            _artifact_finite,
            "artifacts[0].max_abs_diff",
            "artifacts[0].max_abs_diff is null but its per-output figures (artifacts[0].outputs) give "
            f"{max(two['artifacts'][0]['outputs']['digit']['max_abs_diff'], 0.125):.4f}",
        ),
    ]
    for tamper, field, line in cases:
        report = copy.deepcopy(two)
        tamper(report)
        code, again = recheck(tmp_path, report)
        consistency = checks_of(again)[CONSISTENCY]
        found = consistency["values"]["contradictions"]
        assert code == 3 and field in consistency["values"]["fields"], (field, found)
        assert any(c.startswith(line) for c in found), (line, found)
