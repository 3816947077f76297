"""A replay converts exactly the files its report hashed, from whatever folder it runs in (issue 37, point 4).

The conversion runs in folder A with relative paths, as a user types them;
the replays run from folder B, where a same-named data file or module would
have been read in its place.
"""

import json
import re
import shutil
import subprocess

import keras
import numpy as np
import pytest
import tiny_models
from conftest import console_script

import mpconvert
from mpconvert.commands.replay import replay_inputs
from mpconvert.report.sections import InputFile

# A's module, imported with --import; B's of the same name would stop any run that imported it.
MODULE_A = "ROWS_FROM = 'A'\n"
MODULE_B = 'raise SystemExit("the replay imported the module of the folder it ran in")\n'
FAST = ["--policy", "mixed_float16", "--finetune-steps", "3", "--no-speed", "--export", "savedmodel"]
FAST += ["--pad-multiple", "0"]  # no test here reads the padding


def run(*args, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([console_script(), *map(str, args)], cwd=cwd, capture_output=True, text=True)


def rows_of(folder) -> int:
    return json.loads((folder / "report.json").read_text())["validation"]["rows"]


@pytest.fixture(scope="module")
def folder_a(tmp_path_factory):
    """A conversion run inside folder A: model.keras, data/clf.npz (200 validation rows), --import clf_helper."""
    a = tmp_path_factory.mktemp("A")
    tiny_models.compiled_classifier(keras, "sparse_categorical_crossentropy").save(a / "model.keras")
    (a / "data").mkdir()
    tiny_models.classifier_npz(a / "data" / "clf.npz", one_hot=False)
    (a / "clf_helper.py").write_text(MODULE_A)
    proc = run("model.keras", *FAST, "--data", "data/clf.npz", "--import", "clf_helper", "--out", "conv", cwd=a)
    assert proc.returncode == 0, proc.stderr
    provenance = json.loads((a / "conv" / "report.json").read_text())["provenance"]
    assert provenance["folder"] == str(a) and provenance["options"]["data"] == "data/clf.npz"
    assert provenance["modules"]["clf_helper"]["path"] == str(a / "clf_helper.py")
    assert rows_of(a / "conv") == 200
    return a


@pytest.fixture(scope="module")
def replayed_in_b(folder_a, tmp_path_factory):
    """One replay run from folder B, which holds a same-named data file (120 rows) and module of its own.

    Read by the two tests below: reading A's recorded files from B and never B's decoys are one run's results.
    """
    b = tmp_path_factory.mktemp("B")
    (b / "data").mkdir()
    x, y = tiny_models.separable_data(120, 8, 3, seed=7)
    np.savez(b / "data" / "clf.npz", x=x, y=y, x_train=x, y_train=y)
    (b / "clf_helper.py").write_text(MODULE_B)
    return b, run("replay", folder_a / "conv", "--out", "again", "--json", cwd=b)


def test_a_replay_from_another_folder_reads_the_recorded_files(folder_a, replayed_in_b):
    b, proc = replayed_in_b
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["passed"] is True
    report = json.loads((b / "again" / "report.json").read_text())
    assert report["validation"]["rows"] == 200
    assert report["provenance"]["data"]["file"]["path"] == str(folder_a / "data" / "clf.npz")
    assert report["provenance"]["modules"]["clf_helper"]["path"] == str(folder_a / "clf_helper.py")


def test_a_same_named_data_file_and_module_in_the_replay_s_folder_are_never_used(replayed_in_b):
    b, proc = replayed_in_b
    assert proc.returncode == 0, proc.stderr
    assert rows_of(b / "again") == 200  # A's rows: B's file holds 120


def test_a_data_file_changed_after_the_conversion_is_refused(folder_a, tmp_path):
    data = folder_a / "data" / "clf.npz"
    kept = data.read_bytes()
    recorded = json.loads((folder_a / "conv" / "report.json").read_text())["provenance"]["data"]["file"]["sha256"]
    try:
        with np.load(data) as found:
            arrays = dict(found)
        np.savez(data, **{**arrays, "x": arrays["x"][:120], "y": arrays["y"][:120]})
        proc = run("replay", folder_a / "conv", "--out", tmp_path / "again", cwd=tmp_path)
    finally:
        data.write_bytes(kept)
    assert proc.returncode == 1
    error, fix = proc.stderr.strip().splitlines()
    assert (
        error.startswith(f"error: the data file {data} has changed since") and f"{recorded[:12]}... recorded" in error
    )
    assert fix.startswith("  fix: ") and "Traceback" not in proc.stderr
    assert not (tmp_path / "again").exists()


def test_the_python_api_refuses_a_changed_module_from_any_folder(folder_a, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    module = folder_a / "clf_helper.py"
    try:
        module.write_text(MODULE_A + "ROWS_FROM = 'changed'\n")
        with pytest.raises(mpconvert.MpconvertError, match=re.escape(f"the --import clf_helper module {module} has")):
            mpconvert.replay(folder_a / "conv", tmp_path / "again")
    finally:
        module.write_text(MODULE_A)
    assert not (tmp_path / "again").exists()


def stored(folder_a) -> dict:
    return json.loads((folder_a / "conv" / "report.json").read_text())


def test_a_module_that_resolves_to_another_file_is_refused(folder_a, tmp_path, monkeypatch):
    # The report's helper lives elsewhere: from A, `import clf_helper` finds A's file, not that one.
    elsewhere = tmp_path / "lib" / "clf_helper.py"
    elsewhere.parent.mkdir()
    shutil.copy(folder_a / "clf_helper.py", elsewhere)
    report = stored(folder_a)
    report["provenance"]["modules"]["clf_helper"] = InputFile.of(elsewhere).to_json()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(
        mpconvert.MpconvertError, match=re.escape(f"would import {folder_a / 'clf_helper.py'} here, not")
    ):
        replay_inputs(report, folder_a / "conv" / "report.json")


def test_a_baseline_is_read_by_its_recorded_path_and_hash(folder_a, tmp_path, monkeypatch):
    report = stored(folder_a)
    baseline = folder_a / "conv" / "report.json"
    report["provenance"]["options"]["baseline"] = "conv/report.json"  # as typed in A
    report["provenance"]["baseline"] = InputFile.of(baseline).to_json()
    monkeypatch.chdir(tmp_path)
    (tmp_path / "conv").mkdir()
    (tmp_path / "conv" / "report.json").write_text("{}")  # B's file of that name
    inputs = replay_inputs(report, tmp_path / "r.json")
    assert inputs.keywords["baseline"] == str(baseline) and inputs.keywords["data"] == str(folder_a / "data/clf.npz")
    report["provenance"]["baseline"]["sha256"] = "0" * 64
    with pytest.raises(mpconvert.MpconvertError, match=re.escape(f"the baseline report {baseline} has changed since")):
        replay_inputs(report, tmp_path / "r.json")


def old(report: dict) -> dict:
    """The report as an mpconvert before the folder was recorded wrote it."""
    for key in ("folder", "baseline", "modules"):
        del report["provenance"][key]
    return report


def test_an_older_report_replays_where_its_paths_resolve_without_the_folder(folder_a, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = old(stored(folder_a))
    report["provenance"]["options"]["baseline"] = "conv/report.json"
    inputs = replay_inputs(report, tmp_path / "r.json")
    # The folder is inferred from the relative --data and the absolute file it named.
    assert inputs.folder == folder_a and inputs.keywords["baseline"] == str(folder_a / "conv/report.json")
    assert inputs.keywords["data"] == str(folder_a / "data/clf.npz")
    assert inputs.keywords["model"] == str(folder_a / "model.keras")


def test_an_older_report_whose_folder_cannot_be_known_is_refused_naming_the_path(folder_a, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    report = old(stored(folder_a))
    report["provenance"]["options"]["data"] = str(folder_a / "data/clf.npz")  # absolute: nothing to infer from
    report["provenance"]["options"]["baseline"] = "conv/report.json"
    with pytest.raises(mpconvert.MpconvertError, match="names --baseline conv/report.json relative to the folder"):
        replay_inputs(report, tmp_path / "r.json")
    report["provenance"]["options"]["baseline"] = None  # the --import alone: refused too
    with pytest.raises(mpconvert.MpconvertError, match="imports --import clf_helper, found from the folder"):
        replay_inputs(report, tmp_path / "r.json")
