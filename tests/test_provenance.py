"""Every report says exactly what went in, by content, and where it ran (report.json `provenance`).

The expectations are computed here by hand, apart from mpconvert's own
digest code: sha256 of the files as read back from disk, the CPU's flags
as /proc/cpuinfo lists them, the command as typed.
"""

import hashlib
import json
import shutil
from importlib import metadata
from pathlib import Path

import keras
import numpy as np
import pytest
import tiny_models
from conftest import SAMPLES, invoke

import mpconvert
from mpconvert.api import conversion_options, export_options
from mpconvert.options.export import EXPORT_KEYWORDS
from mpconvert.report.report import Report
from mpconvert.system.digests import digest

FLAGS = ("avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def folder_sha256(folder: Path) -> str:
    """The documented folder digest, spelt out: a line per file, sorted by relative path."""
    files = sorted((p for p in folder.rglob("*") if p.is_file()), key=lambda p: p.relative_to(folder).as_posix())
    lines = "".join(f"{p.relative_to(folder).as_posix()}\t{sha256(p)}\n" for p in files)
    return hashlib.sha256(lines.encode()).hexdigest()


def cpuinfo() -> tuple[str | None, set[str]]:
    name, flags = None, set()
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and name is None:
            name = value.strip()
        if key.strip() == "flags" and not flags:
            flags = set(value.split())
    return name, flags


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    base = tmp_path_factory.mktemp("provenance")
    model = tiny_models.compiled_classifier(keras, "sparse_categorical_crossentropy")
    model.save(base / "clf.keras")
    tiny_models.classifier_npz(base / "clf.npz", one_hot=False)
    return base / "clf.keras", base / "clf.npz"


@pytest.fixture(scope="module")
def cli_run(classifier, tmp_path_factory):
    model, data = classifier
    out = tmp_path_factory.mktemp("cli") / "out"
    args = [model, "--policy", "mixed_bfloat16", "--data", data, "--finetune-steps", "2", "--no-speed", "--out", out]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    return [str(a) for a in args], out, json.loads((out / "report.json").read_text())


def test_the_model_and_the_data_file_are_recorded_by_content(classifier, cli_run):
    model, data = classifier
    _, _, report = cli_run
    recorded = report["provenance"]
    assert recorded["model"] == {
        "path": str(model),
        "sha256": sha256(model),
        "bytes": model.stat().st_size,
        "files": 1,
    }
    assert recorded["data"] == {
        "source": "npz",
        "file": {"path": str(data), "sha256": sha256(data), "bytes": data.stat().st_size, "files": 1},
        "validation_rows": 200,  # classifier_npz: 200 validation rows, 400 training rows
        "train_rows": 400,
    }


def test_the_command_and_the_options_that_rebuild_the_run_are_recorded(classifier, cli_run):
    args, _, report = cli_run
    recorded = report["provenance"]
    assert recorded["command"] == ["mpconvert", *args]
    options = dict(recorded["options"])
    assert options["model"] == str(classifier[0]) and options["policy"] == "mixed_bfloat16"
    assert options["finetune_steps"] == 2 and options["speed"] is False and options["data"] == str(classifier[1])
    assert options["export"] == ["savedmodel", "onnx"]  # the default; a Keras model's .keras file comes too
    # The keywords the Python API takes: they rebuild the options the run used.
    export = {k: options.pop(k) for k in list(options) if k in EXPORT_KEYWORDS}
    rebuilt = conversion_options(options.pop("model"), options.pop("policy"), **options)
    assert rebuilt.finetune.steps == 2 and rebuilt.speed is False and rebuilt.rewrite.policy == "mixed_bfloat16"
    assert export_options(**export).kinds == ("savedmodel", "onnx")


def test_the_machine_and_mpconvert_s_own_version_are_recorded(cli_run):
    _, _, report = cli_run
    machine = report["provenance"]["machine"]
    name, flags = cpuinfo()
    if name is not None:
        assert machine["cpu"] == name
    for flag in FLAGS:
        assert machine["cpu_features"][flag] is (flag in flags), flag
    assert machine["gpus"] == [] or all("compute_capability" in g for g in machine["gpus"])
    assert report["versions"]["mpconvert"] == metadata.version("mpconvert")


def test_every_artifact_carries_the_digest_of_what_was_written(cli_run):
    _, out, report = cli_run
    assert sorted(a["kind"] for a in report["artifacts"]) == ["keras", "onnx", "savedmodel"]
    for artifact in report["artifacts"]:
        written = out / artifact["path"]
        if artifact["kind"] == "savedmodel":
            assert written.is_dir()
            assert artifact["sha256"] == folder_sha256(written)
            assert artifact["bytes"] == sum(p.stat().st_size for p in written.rglob("*") if p.is_file())
        else:
            assert artifact["sha256"] == sha256(written), artifact["kind"]
            assert artifact["bytes"] == written.stat().st_size


def test_a_folder_digest_holds_across_copies_and_changes_with_any_file(tmp_path):
    original = SAMPLES / "digits_mlp"
    copy = tmp_path / "copy"
    shutil.copytree(original, copy)
    assert digest(copy) == digest(original)
    assert digest(original).sha256 == folder_sha256(original)
    pb = copy / "saved_model.pb"
    changed = bytearray(pb.read_bytes())
    changed[-1] ^= 1
    pb.write_bytes(bytes(changed))
    assert digest(copy).sha256 != digest(original).sha256
    pb.write_bytes((original / "saved_model.pb").read_bytes())
    assert digest(copy) == digest(original)
    (copy / "saved_model.pb").rename(copy / "renamed.pb")  # same bytes, another name
    assert digest(copy).sha256 != digest(original).sha256


def test_the_python_api_records_a_live_model_and_arrays_as_such():
    model = tiny_models.compiled_classifier(keras, "sparse_categorical_crossentropy")
    x, y = tiny_models.separable_data(120, 8, 3, seed=3)
    conversion = mpconvert.convert(model, "mixed_float16", data=(x, y), finetune_steps=0, speed=False)
    recorded = conversion.report["provenance"]
    assert recorded["model"] is None and recorded["command"] is None
    assert recorded["data"] == {"source": "arrays", "file": None, "validation_rows": 120, "train_rows": None}
    assert recorded["options"]["model"] == "<Functional: not recorded>"
    assert recorded["options"]["data"] == [
        "<ndarray float32 (120, 8): not recorded>",
        "<ndarray int64 (120,): not recorded>",
    ]
    assert "export" not in recorded["options"]  # chosen when it is saved


def test_provenance_reads_back_as_it_was_written(cli_run):
    _, _, report = cli_run
    again = Report.from_json(report).to_json()
    assert again["provenance"] == report["provenance"]
    assert np.all([a["sha256"] == b["sha256"] for a, b in zip(again["artifacts"], report["artifacts"])])


def test_the_page_shows_the_provenance(classifier, cli_run):
    args, out, report = cli_run
    page = (out / "report.html").read_text()
    assert report["provenance"]["model"]["sha256"] in page
    assert report["provenance"]["data"]["file"]["sha256"] in page
    assert "mpconvert " + " ".join(args) in page.replace("&#34;", '"')


def test_golden_rows_hold_both_models_outputs_and_are_hashed(classifier, cli_run):
    model_path, data_path = classifier
    _, out, report = cli_run
    golden = report["golden"]
    assert golden["path"] == "golden.npz" and golden["rows"] == 32
    assert golden["sha256"] == sha256(out / "golden.npz") and golden["bytes"] == (out / "golden.npz").stat().st_size
    with np.load(out / "golden.npz", allow_pickle=False) as found:
        assert sorted(found.files) == ["converted.predictions", "float32.predictions", "input.features"]
        rows, float32, converted = found["input.features"], found["float32.predictions"], found["converted.predictions"]
    with np.load(data_path, allow_pickle=False) as data:
        np.testing.assert_array_equal(rows, data["x"][:32])  # the first validation rows
    original = keras.models.load_model(model_path)
    np.testing.assert_allclose(float32, original.predict(rows, verbose=0), rtol=1e-6, atol=1e-6)
    # The converted model's outputs: what its SavedModel serves, to bfloat16 rounding of the re-trace.
    import tensorflow as tf

    served = tf.saved_model.load(str(out / "savedmodel")).signatures["serving_default"]
    got = next(iter(served(tf.constant(rows)).values())).numpy()
    np.testing.assert_allclose(converted, got, atol=1e-3)
    assert np.abs(converted - float32).max() > 0  # 16-bit compute moved them: the two are not one array twice


def test_the_page_sets_each_artifact_s_size_beside_the_original_s(cli_run):
    _, out, report = cli_run
    page = (out / "report.html").read_text()
    original = report["provenance"]["model"]["bytes"]
    for artifact in report["artifacts"]:
        assert f"{artifact['bytes'] / original:.2f}x" in page, artifact["kind"]
