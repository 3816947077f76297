"""`mpconvert verify OUT`: an output folder re-checked as the serving machine would.

Folders come from real conversions of three shapes (a fine-tuned Keras
classifier, a model with dict inputs and outputs, a plain SavedModel with
two inputs and two outputs, converted at graph level) and a batch root;
faults are made on disk the way a copy or a person makes them: a flipped
byte, a changed variable, a missing file, golden outputs that no longer
match what the artifact computes, a model.onnx swapped for one that aborts
ONNX Runtime with its hash forged in report.json.
"""

import hashlib
import json
import shutil
from pathlib import Path

import dict_models
import graph_models
import keras
import numpy as np
import pytest
import runtime_faults
import tiny_models
from conftest import SAMPLES, invoke

import mpconvert
from mpconvert.report.schema import problems
from mpconvert.runners.onnx import cuda_usable


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def convert(model, data, out, *flags):
    result = invoke(model, "--policy", "mixed_float16", "--data", data, "--out", out, *flags)
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A fine-tuned conversion of a small classifier, SavedModel + model.keras + ONNX, timed at batch 64."""
    base = tmp_path_factory.mktemp("verify")
    tiny_models.compiled_classifier(keras, "sparse_categorical_crossentropy").save(base / "clf.keras")
    tiny_models.classifier_npz(base / "clf.npz", one_hot=False)
    return convert(base / "clf.keras", base / "clf.npz", base / "out", "--finetune-steps", "5", "--speed-batch", "64")


def copy_of(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / "copy"))


def verified(folder: Path, *flags) -> tuple[int, dict]:
    result = invoke("verify", folder, *flags, "--json")
    return result.exit_code, json.loads(result.stdout) if result.stdout.strip() else {}


def checks(document: dict) -> dict:
    return {c["name"]: c for c in document["checks"]}


def test_an_untouched_folder_passes_with_percentiles_memory_and_versions(folder):
    code, found = verified(folder)
    assert code == 0, found
    assert problems(found, "verify") == []
    assert json.loads((folder / "verify.json").read_text()) == found  # written beside report.json
    report = json.loads((folder / "report.json").read_text())
    # Every file's hash, as this test computes it, is the one report.json recorded and verify found.
    files = {f["path"]: f for f in found["files"]}
    assert files["model.onnx"]["found"] == sha256(folder / "model.onnx") == files["model.onnx"]["recorded"]
    assert files["golden.npz"]["found"] == sha256(folder / "golden.npz") == report["golden"]["sha256"]
    assert set(files) == {"savedmodel", "model.keras", "model.onnx", "golden.npz"}
    ran = {a["kind"]: a for a in found["artifacts"]}
    assert set(ran) == {"savedmodel", "onnx"}  # model.keras is hash-checked only
    for artifact in ran.values():
        assert artifact["passed"] and artifact["parity"]["passed"]
        limit = artifact["parity"]["values"]["limit"]
        assert 0 <= artifact["parity"]["values"]["max_abs_diff"] <= limit
        latency = artifact["latency"]
        assert latency["batch"] == found["speed_batch"] == 64  # the batch the conversion timed
        calls = latency["calls_ms"]
        assert latency["calls"] == len(calls) >= 5
        assert latency["p50_ms"] <= latency["p90_ms"] <= latency["p99_ms"] <= max(calls) + 1e-3
        assert latency["rows_per_s"] == pytest.approx(64 * len(calls) / (sum(calls) / 1000), rel=1e-3)
        assert latency["p50_ms"] > 0
        # verify's own process (the test's here) may reuse what earlier tests freed: growth is never negative.
        assert artifact["memory"]["rss_growth_bytes"] >= 0
        # The drift here is the conversion's own: the same rows, the same converted outputs.
        for output in artifact["drift"].values():
            assert output["here"] == pytest.approx(output["converted"], abs=limit)
    assert ran["onnx"]["runtime"].startswith("onnxruntime:")
    # The ONNX file ran, was timed and measured in its own child process; the SavedModel in verify's.
    assert "of the child process that ran it" in ran["onnx"]["memory"]["method"]
    # A fresh child that loads a model and opens its session grows by megabytes, never by nothing.
    assert ran["onnx"]["memory"]["rss_growth_bytes"] > 1_000_000
    assert "of this process" in ran["savedmodel"]["memory"]["method"]
    assert found["versions"] == {}  # verified where it was converted
    assert found["machine"]["here"]["cpu"] == found["machine"]["converted"]["cpu"]
    assert checks(found)["conversion gate"]["passed"]


def test_a_flipped_byte_in_the_onnx_file_fails_naming_it(folder, tmp_path):
    copy = copy_of(folder, tmp_path)
    data = bytearray((copy / "model.onnx").read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / "model.onnx").write_bytes(bytes(data))
    result = invoke("verify", copy, "--junit", tmp_path / "verify.xml")
    assert result.exit_code == 3, result.output
    assert "FAIL hash: model.onnx: model.onnx has changed" in result.output
    found = json.loads((copy / "verify.json").read_text())
    failed = [c["name"] for c in found["checks"] if not c["passed"]]
    assert failed == ["hash: model.onnx", "runs: onnx"]  # the SavedModel still ran and passed
    onnx = next(a for a in found["artifacts"] if a["kind"] == "onnx")
    assert onnx["skipped"].startswith("model.onnx has changed") and onnx["latency"] is None
    xml = (tmp_path / "verify.xml").read_text()
    assert xml.count("<failure") == 2 and "model.onnx has changed" in xml


def test_a_savedmodel_variable_changed_on_disk_fails(folder, tmp_path):
    copy = copy_of(folder, tmp_path)
    weights = next((copy / "savedmodel" / "variables").glob("variables.data-*"))
    data = bytearray(weights.read_bytes())
    data[-8:] = bytes(8)  # the last values of the last variable zeroed
    weights.write_bytes(bytes(data))
    code, found = verified(copy)
    assert code == 3
    assert not checks(found)["hash: savedmodel"]["passed"]
    assert "savedmodel has changed" in checks(found)["hash: savedmodel"]["message"]
    assert checks(found)["hash: model.onnx"]["passed"] and checks(found)["runs: onnx"]["passed"]


def test_a_missing_artifact_fails_naming_it(folder, tmp_path):
    copy = copy_of(folder, tmp_path)
    (copy / "model.keras").unlink()
    code, found = verified(copy)
    assert code == 3 and checks(found)["hash: model.keras"]["message"] == "model.keras is missing"


def test_outputs_that_no_longer_match_the_recorded_ones_fail_parity(folder, tmp_path):
    # What a serving machine that computes something else looks like: the artifacts are intact, but
    # they do not give the converted outputs recorded with them (golden.npz re-hashed in the report).
    copy = copy_of(folder, tmp_path)
    with np.load(copy / "golden.npz", allow_pickle=False) as npz:
        arrays = dict(npz)
    name = next(k for k in arrays if k.startswith("converted."))
    arrays[name] = arrays[name] + 0.25
    np.savez(copy / "golden.npz", **arrays)
    report = json.loads((copy / "report.json").read_text())
    report["golden"]["sha256"] = sha256(copy / "golden.npz")
    (copy / "report.json").write_text(json.dumps(report))
    code, found = verified(copy)
    assert code == 3
    for kind in ("savedmodel", "onnx"):
        check = checks(found)[f"runs: {kind}"]
        assert not check["passed"] and "max abs diff 0.25" in check["message"], check
    assert all(f["passed"] for f in found["files"])


def test_an_explicit_provider_that_does_not_load_fails_in_one_line_and_falls_back_only_when_asked(folder):
    if cuda_usable():
        pytest.skip("CUDA loads here: the refusal is for machines without it")
    result = invoke("verify", folder, "--provider", "cuda")
    assert result.exit_code == 1
    assert result.output.startswith("error: --provider cuda: ONNX Runtime's CUDAExecutionProvider does not load")
    assert "--fallback" in result.output and "Traceback" not in result.output
    code, found = verified(folder, "--provider", "cuda", "--fallback")
    assert code == 0
    assert found["provider"]["providers"] == ["CPUExecutionProvider"]
    assert "does not load here; ran on CPUExecutionProvider (--fallback)" in found["provider"]["note"]
    onnx = next(a for a in found["artifacts"] if a["kind"] == "onnx")
    assert onnx["runtime"] == "onnxruntime:CPUExecutionProvider"


def test_the_python_api_gives_the_command_s_document(folder):
    found = mpconvert.verify(folder, provider="cpu", speed_batch=16, write=False)
    assert found["passed"] and found["speed_batch"] == 16 and found["provider"]["providers"] == ["CPUExecutionProvider"]
    assert all(a["latency"]["batch"] == 16 for a in found["artifacts"])
    with pytest.raises(mpconvert.MpconvertError, match="speed_batch=0 is invalid"):
        mpconvert.verify(folder, speed_batch=0)


def test_a_report_from_before_verify_is_refused_with_the_fix(folder, tmp_path):
    copy = copy_of(folder, tmp_path)
    report = json.loads((copy / "report.json").read_text())
    del report["golden"]
    (copy / "report.json").write_text(json.dumps(report))
    result = invoke("verify", copy)
    assert result.exit_code == 1
    assert "records no golden rows or artifact hashes" in result.output and "convert the model again" in result.output
    missing = invoke("verify", tmp_path / "nowhere")
    assert missing.exit_code == 1 and "nowhere not found" in missing.output
    # Nothing to verify is not a pass: the folder has no .tflite.
    absent = invoke("verify", folder, "--artifacts", "litert")
    assert absent.exit_code == 1 and "has none of the artifacts asked for (litert)" in absent.output
    assert "it holds onnx,savedmodel" in absent.output and "--artifacts onnx,savedmodel" in absent.output


def test_dict_inputs_and_outputs_verify(tmp_path):
    model = dict_models.tokens_and_num(keras, outputs="dict")
    model.save(tmp_path / "dict.keras")
    dict_models.npz(tmp_path / "dict.npz", outputs="dict")
    out = convert(
        tmp_path / "dict.keras", tmp_path / "dict.npz", tmp_path / "out", "--finetune-steps", "0", "--no-speed"
    )
    code, found = verified(out)
    assert code == 0, found
    for artifact in found["artifacts"]:
        assert set(artifact["drift"]) == {"label", "score"} and artifact["passed"]
        assert artifact["latency"]["batch"] == 256  # no speed stage ran: the default serving batch


def test_a_graph_level_savedmodel_with_two_inputs_and_outputs_verifies(tmp_path):
    saved = graph_models.two_inputs(tmp_path / "two")
    out = convert_graph(saved, tmp_path / "out")
    report = json.loads((out / "report.json").read_text())
    assert report["source"]["format"] == "graph"
    code, found = verified(out)
    assert code == 0, found
    onnx = next(a for a in found["artifacts"] if a["kind"] == "onnx")
    assert set(onnx["drift"]) == {s["name"] for s in report["source"]["outputs"]} and len(onnx["drift"]) == 2


def convert_graph(saved: Path, out: Path) -> Path:
    result = invoke(saved, "--policy", "mixed_float16", "--out", out, "--no-speed")
    assert result.exit_code == 0, result.output
    return out


def test_a_batch_root_verifies_every_converted_model_and_names_the_rest(tmp_path):
    from conftest import SAMPLES

    broken = tmp_path / "broken.keras"
    broken.write_bytes(b"not a model")
    manifest = tmp_path / "zoo.toml"
    manifest.write_text(
        '[defaults]\npolicy = "mixed_bfloat16"\nfinetune_steps = 0\nspeed = false\n'
        f'[[model]]\npath = "{SAMPLES / "cancer_mlp.keras"}"\ndata = "{SAMPLES / "data" / "breast_cancer.npz"}"\n'
        f'[[model]]\npath = "{broken}"\n'
    )
    result = invoke("batch", manifest, "--out", tmp_path / "zoo")
    assert result.exit_code == 1, result.output  # the broken file is an error
    code, found = verified(tmp_path / "zoo", "--artifacts", "savedmodel")  # what a TensorFlow server serves
    assert code == 3 and problems(found, "verify") == []
    by_name = {m["name"]: m for m in found["models"]}
    assert by_name["cancer_mlp"]["passed"] and by_name["cancer_mlp"]["verification"]["passed"]
    assert not by_name["broken"]["passed"] and by_name["broken"]["message"] == "not converted (error)"
    converted = tmp_path / "zoo" / by_name["cancer_mlp"]["folder"]
    mine = json.loads((converted / "verify.json").read_text())
    assert mine["passed"] and [a["kind"] for a in mine["artifacts"]] == ["savedmodel"]
    assert {f["path"] for f in mine["files"]} == {"savedmodel", "model.keras", "golden.npz"}
    if not cuda_usable():
        # ONNX Runtime's CPU provider has no bfloat16 MatMul: the .onnx file cannot serve on this machine.
        code, found = verified(converted)
        onnx = checks(found)["runs: onnx"]
        assert code == 3 and not onnx["passed"] and "does not run as written on onnxruntime:CPU" in onnx["message"]
        assert "MatMul" in next(a for a in found["artifacts"] if a["kind"] == "onnx")["emulated_ops"]


def test_a_folder_whose_conversion_failed_its_gate_is_not_fit_to_deploy(folder, tmp_path):
    copy = copy_of(folder, tmp_path)
    report = json.loads((copy / "report.json").read_text())
    report["gate"]["thresholds"]["max_drop"] = -1.0  # no drop can pass: the report's own verdict is now a fail
    (copy / "report.json").write_text(json.dumps(report))
    code, found = verified(copy)
    assert code == 3 and all(f["passed"] for f in found["files"]) and all(a["passed"] for a in found["artifacts"])
    gate = checks(found)["conversion gate"]
    assert not gate["passed"] and "accuracy" in gate["message"] and "not fit to deploy" in gate["message"]


def test_a_broken_kernel_the_conversion_found_is_named_where_onednn_is_on(tmp_path, monkeypatch):
    # A threshold under any real ratio makes the guard report a finding; in-process it cannot restart.
    monkeypatch.setenv("MPCONVERT_SLOW_KERNEL_RATIO", "0.0001")
    data = SAMPLES / "data" / "breast_cancer.npz"
    # Only the ONNX file is verified below: the SavedModel and .keras exports would add seconds and no check.
    args = ("--finetune-steps", "0", "--no-speed", "--export", "onnx")
    out = convert(SAMPLES / "cancer_mlp.keras", data, tmp_path / "out", *args)
    assert json.loads((out / "report.json").read_text())["slow_kernel"]["found"] is not None
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    code, found = verified(out, "--artifacts", "onnx")
    assert code == 0 and len(found["notes"]) == 1
    assert "oneDNN rewrites on" in found["notes"][0] and "serve with TF_ENABLE_ONEDNN_OPTS=0" in found["notes"][0]
    monkeypatch.setenv("TF_ENABLE_ONEDNN_OPTS", "0")
    assert verified(out, "--artifacts", "onnx")[1]["notes"] == []


def forged_onnx(folder: Path, tmp_path: Path) -> Path:
    """A copy whose model.onnx aborts ONNX Runtime on any request, its sha256 and size rewritten in
    report.json so that the hash check passes: what verify must survive on a serving machine."""
    copy = copy_of(folder, tmp_path)
    report = json.loads((copy / "report.json").read_text())
    artifact = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    (name,) = artifact["details"]["input_names"]
    (features,) = report["source"]["inputs"][0]["shape"][1:]
    runtime_faults.aborting_file(copy / "model.onnx", name, features)
    artifact["sha256"], artifact["bytes"] = sha256(copy / "model.onnx"), (copy / "model.onnx").stat().st_size
    (copy / "report.json").write_text(json.dumps(report))
    return copy


def test_a_forged_onnx_file_that_aborts_the_runtime_is_a_failed_check_not_the_end_of_verify(folder, tmp_path):
    """In verify's own process this file killed it with SIGABRT (exit 134, no verify.json)."""
    copy = forged_onnx(folder, tmp_path)
    result = invoke("verify", copy, "--artifacts", "onnx")
    assert result.exit_code == 3, result.output
    rows = json.loads((copy / "report.json").read_text())["golden"]["rows"]  # the golden rows' first run
    crash = f'ONNX Runtime aborted the process (SIGABRT) on {rows} rows: "terminate called without an active exception"'
    lines = [line for line in result.output.splitlines() if "SIGABRT" in line]
    assert lines == [f"  FAIL runs: onnx: cannot run here: {crash}"], result.output
    found = json.loads((copy / "verify.json").read_text())
    assert problems(found, "verify") == [] and found["exit_code"] == 3
    assert checks(found)["hash: model.onnx"]["passed"]  # the forged hash holds: only running it tells
    (onnx,) = found["artifacts"]
    assert onnx["error"] == crash and onnx["latency"] is None and onnx["memory"] is None
    # The other artifacts are still verified, and pass.
    every = mpconvert.verify(copy, write=False)
    assert [c["name"] for c in every["checks"] if not c["passed"]] == ["runs: onnx"]
    assert next(a for a in every["artifacts"] if a["kind"] == "savedmodel")["latency"]["p50_ms"] > 0
