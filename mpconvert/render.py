"""The report for CI systems: JUnit XML and a Markdown summary.

Both render the report's JSON form (as written, or as `mpconvert check`
re-judged it), one test case or table row per gate check, so what a CI page
shows is what decided the exit code.
"""

from __future__ import annotations

import json
from pathlib import Path

from junitparser import Failure, JUnitXml, TestCase, TestSuite

from .report import format_bytes, format_number, parity_limits


def _model_name(report: dict) -> str:
    return Path(report["source"]["path"]).name or report["source"]["path"]


def junit_xml(report: dict) -> JUnitXml:
    """One test suite for the run, one test case per gate check."""
    model, policy = _model_name(report), report["policy"]
    suite = TestSuite(f"mpconvert: {model} -> {policy}")
    suite.add_property("model", report["source"]["path"])
    suite.add_property("policy", policy)
    # Reporters group test cases by class name; dots read as a test path.
    classname = f"mpconvert.{model.replace('.', '_')}.{policy}"
    for check in report["gate"]["checks"]:
        case = TestCase(check["name"], classname, 0.0)
        if check["passed"]:
            case.system_out = check["message"]
        else:
            # The message is what reporters show in one line; the text keeps
            # every number the check used.
            failure = Failure(check["message"], "mpconvert.gate")
            failure.text = f"{check['name']}: {check['message']}\n{json.dumps(check['values'], indent=2)}"
            case.result = [failure]
        suite.add_testcase(case)
    suite.time = round(sum(report.get("timings", {}).values()), 3)
    xml = JUnitXml("mpconvert")
    xml.add_testsuite(suite)
    return xml


def write_junit(report: dict, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    junit_xml(report).write(str(path), pretty=True)


def _cell(value: object) -> str:
    # A "|" would end the table cell.
    return str(value).replace("|", "\\|").replace("\n", " ")


def _row(*cells: object) -> str:
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def markdown(report: dict) -> str:
    """A summary for a CI job page: metric, budget, artifacts and every check."""
    gate, v, policy = report["gate"], report["validation"], report["policy"]
    thresholds = gate["thresholds"]
    verdict = "✅ PASSED" if gate["passed"] else "❌ FAILED"
    lines = [f"## mpconvert: {_model_name(report)} → {policy}: {verdict}", ""]
    if v["metric"] is None:
        lines += [
            f"**Accuracy not measured**: no labelled data; output drift only "
            f"(max abs diff {format_number(v['max_abs_diff'], 6)} on {v['rows']} generated inputs).",
            "",
        ]
    else:
        lines += [
            _row("metric", "float32", policy, "drop", "budget"),
            "| --- | ---: | ---: | ---: | ---: |",
            _row(
                f"{v['metric']} ({v['rows']} samples)", format_number(v["reference"]), format_number(v["converted"]),
                format_number(v["drop"]), format_number(thresholds["max_drop"]),
            ),  # fmt: skip
            "",
        ]
    facts = []
    if v["agreement"] is not None:
        facts.append(f"Predictions agree on {v['agreement']:.2%} (min {thresholds['min_agreement']:.2%}).")
    if v["nonfinite_outputs"]:
        facts.append(f"**{v['nonfinite_outputs']} NaN/inf output values.**")
    tuning = report.get("finetune")
    if tuning:
        state = "healthy" if tuning["healthy"] else f"**stopped**: {tuning['problem']}"
        facts.append(
            f"Fine-tune: {tuning['steps']} of {tuning['requested_steps']} steps, {state}, kept {tuning['kept']} weights."
        )
    baseline = thresholds.get("baseline")
    if baseline:
        facts.append(f"Baseline: {baseline['metric']} {format_number(baseline['converted'])} from `{baseline['path']}`.")
    if facts:
        lines += [" ".join(facts), ""]
    if report["artifacts"]:
        limits = parity_limits(gate)
        lines += [_row("artifact", "size", "max abs diff", "limit", "checked with"), "| --- | ---: | ---: | ---: | --- |"]
        for art in report["artifacts"]:
            diff = "NaN/inf" if art["max_abs_diff"] is None else f"{art['max_abs_diff']:.3g}"
            limit = limits.get(art["kind"])
            lines.append(
                _row(f"{art['kind']} (`{art['path']}`)", format_bytes(art["bytes"]), diff,
                     "n/a" if limit is None else f"{limit:.3g}", art["runtime"])
            )  # fmt: skip
        lines.append("")
    lines += [_row("check", "result", "details"), "| --- | --- | --- |"]
    for check in gate["checks"]:
        lines.append(_row(check["name"], "✅ pass" if check["passed"] else "❌ **fail**", check["message"]))
    return "\n".join(lines) + "\n"
