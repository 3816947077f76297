"""report.json and batch.json follow the JSON Schemas shipped in the package, and readers refuse unknown versions.

Every report and batch.json any test writes is also validated by the
`reports_follow_the_schema` fixture in conftest.py.
"""

import copy
import json

import pytest
from conftest import broken_reports, invoke
from reports import make_report, stored, write

from mpconvert.batch.results import read_batch
from mpconvert.report.read import read_report
from mpconvert.report.schema import SCHEMA_VERSION, problems, schema
from mpconvert.system.errors import MpconvertError


def test_the_schemas_ship_in_the_package_and_are_draft_2020_12():
    from jsonschema import Draft202012Validator

    for kind in ("report", "batch"):
        Draft202012Validator.check_schema(schema(kind))
        assert schema(kind)["properties"]["schema_version"] == {"const": SCHEMA_VERSION}


def test_a_written_report_validates_and_its_breakages_are_named():
    report = stored(make_report())
    assert report["schema_version"] == SCHEMA_VERSION and problems(report, "report") == []
    broken = copy.deepcopy(report)
    del broken["validation"]["drop"]
    broken["gate"]["checks"][0]["passed"] = "yes"
    broken["surprise"] = 1
    found = problems(broken, "report")
    assert any(p.startswith("validation:") and "'drop' is a required property" in p for p in found), found
    assert any(p.startswith("gate/checks/0/passed:") for p in found), found
    assert any("'surprise' was unexpected" in p for p in found), found


def test_the_conftest_check_finds_a_broken_report_on_disk(tmp_path):
    report = stored(make_report())
    write(tmp_path / "ok" / "report.json", report)
    assert broken_reports(tmp_path) == []
    report["validation"]["rows"] = -3
    write(tmp_path / "bad" / "report.json", report)
    found = broken_reports(tmp_path)
    (tmp_path / "bad" / "report.json").unlink()  # so the fixture itself does not fail this test
    assert len(found) == 1 and "bad/report.json: validation/rows" in found[0]


@pytest.mark.parametrize(
    "version,needle",
    [(99, "schema_version 99, which this mpconvert does not know (it reads 1)"), (None, "has no schema_version")],
)
def test_check_refuses_a_report_of_an_unknown_schema_version(tmp_path, version, needle):
    report = stored(make_report())
    if version is None:
        del report["schema_version"]
    else:
        report["schema_version"] = version
    path = write(tmp_path / "old" / "r.json", report)
    with pytest.raises(MpconvertError) as caught:
        read_report(path)
    assert needle in caught.value.message and caught.value.hint
    result = invoke("check", path)
    assert result.exit_code == 1 and needle in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_batch_merge_refuses_a_batch_json_of_an_unknown_schema_version(tmp_path):
    summary = {
        "schema_version": 7,
        "root": str(tmp_path),
        "shard": None,
        "jobs": 1,
        "models": [],
        "totals": {},
        "exit_code": 0,
        "passed": True,
    }
    (tmp_path / "shard").mkdir()
    (tmp_path / "shard" / "b.json").write_text(json.dumps(summary))
    with pytest.raises(MpconvertError, match="schema_version 7, which this mpconvert does not know"):
        read_batch(tmp_path / "shard" / "b.json")
    result = invoke("batch-merge", tmp_path / "shard" / "b.json", "--out", tmp_path / "merged")
    assert result.exit_code == 1 and "schema_version 7" in result.stderr
    assert not (tmp_path / "merged").exists()
