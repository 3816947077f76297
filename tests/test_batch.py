"""Batch conversion of a zoo: isolation, resume after SIGKILL, shards, the fleet view.

The zoo is small on purpose (each worker is a process that imports
TensorFlow): the samples in three formats, a broken file, a model whose
custom-layer module kills its interpreter, and a gate failure.
"""

import json
import signal
import subprocess
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import SAMPLES, console_script

from mpconvert.api import conversion_options
from mpconvert.batch.key import job_key
from mpconvert.batch.manifest import Job, load_manifest
from mpconvert.batch.runner import shard_of
from mpconvert.cli import cli
from mpconvert.system.digests import digest
from mpconvert.system.errors import MpconvertError

MANIFEST = """
[defaults]
policy = "mixed_bfloat16"
finetune_steps = 0
export = ["savedmodel", "onnx"]
# No test here reads the timings or the padding; each costs every conversion a few seconds.
speed = false
pad_multiple = 0

[[model]]
path = "models/digits_mlp"
data = "data/digits.npz"
policy = ["mixed_float16", "mixed_bfloat16"]

[[model]]
path = "models/cancer_mlp.keras"
data = "data/breast_cancer.npz"

[[model]]
path = "models/digits_cnn.keras"
data = "data/digits.npz"
name = "strict_cnn"
min_agreement = 1.0
max_drop = 0.0
rtol = 0.0
atol = 0.0

[[model]]
path = "models/broken.keras"

[[model]]
path = "models/crashing.keras"
imports = ["crash_on_import"]
"""


def run(*args, cwd=None, timeout=600):
    return subprocess.run([console_script(), *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=timeout)


def batch(*args, cwd=None):
    return run("batch", *args, cwd=cwd)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    """A manifest with relative paths, beside its models and data."""
    base = tmp_path_factory.mktemp("zoo")
    models, data = base / "models", base / "data"
    models.mkdir()
    data.mkdir()
    subprocess.run(["cp", "-r", str(SAMPLES / "digits_mlp"), str(models)], check=True)
    for name in ("cancer_mlp.keras", "digits_cnn.keras"):
        (models / name).write_bytes((SAMPLES / name).read_bytes())
    (models / "crashing.keras").write_bytes((SAMPLES / "cancer_mlp.keras").read_bytes())
    (models / "broken.keras").write_bytes(b"not a zip file")
    for name in ("digits.npz", "breast_cancer.npz"):
        (data / name).write_bytes((SAMPLES / "data" / name).read_bytes())
    # A custom-layer module that takes the interpreter down, as a segfaulting extension would.
    (base / "crash_on_import.py").write_text("import os\nos.abort()\n")
    (base / "zoo.toml").write_text(MANIFEST)
    return base


@pytest.fixture(scope="module")
def full_run(zoo):
    out = zoo / "out"
    proc = batch(
        zoo / "zoo.toml",
        "--out",
        out,
        "--jobs",
        "2",
        "--summary",
        zoo / "summary.md",
        "--junit",
        zoo / "junit.xml",
        cwd=zoo,
    )
    return proc, out, json.loads((out / "batch.json").read_text())


def by_folder(summary):
    return {m["folder"]: m for m in summary["models"]}


def test_every_model_gets_its_own_outcome_and_the_rest_finish(full_run):
    proc, out, summary = full_run
    assert proc.returncode == 1, proc.stderr  # an error (and a crash) make the batch exit 1
    models = by_folder(summary)
    assert set(models) == {
        "digits_mlp/mixed_float16",
        "digits_mlp/mixed_bfloat16",
        "cancer_mlp/mixed_bfloat16",
        "strict_cnn/mixed_bfloat16",
        "broken/mixed_bfloat16",
        "crashing/mixed_bfloat16",
    }
    assert {k: m["status"] for k, m in models.items()} == {
        "digits_mlp/mixed_float16": "passed",
        "digits_mlp/mixed_bfloat16": "passed",
        "cancer_mlp/mixed_bfloat16": "passed",
        "strict_cnn/mixed_bfloat16": "gate_failed",
        "broken/mixed_bfloat16": "error",
        "crashing/mixed_bfloat16": "error",
    }
    assert "damaged or not a Keras model" in models["broken/mixed_bfloat16"]["message"]
    assert "died from SIGABRT" in models["crashing/mixed_bfloat16"]["message"]
    assert "artifact parity: onnx" in models["strict_cnn/mixed_bfloat16"]["failed_checks"]
    totals = summary["totals"]
    assert (totals["passed"], totals["gate_failed"], totals["error"], totals["timed_out"]) == (3, 1, 2, 0)
    assert totals["models_per_minute"] > 0 and summary["exit_code"] == 1


def test_each_result_folder_is_what_the_single_command_writes_plus_its_key(full_run, zoo):
    _, out, summary = full_run
    for m in summary["models"]:
        folder = out / m["folder"]
        if m["status"] in ("error", "timed_out"):
            assert not folder.exists()
            continue
        report = json.loads((folder / "report.json").read_text())
        assert report["policy"] == m["policy"] and (folder / "savedmodel" / "saved_model.pb").is_file()
        assert (folder / "model.onnx").is_file()
        assert json.loads((folder / "batch_result.json").read_text())["key"] == m["key"]
        assert m["before"] == report["validation"]["reference"] and m["after"] == report["validation"]["converted"]
        assert 0 < m["kept_float32_share"] < 1 and 0.3 < m["onnx_vs_float32"] < 1.5
        # Each model's report names the batch command that made it and the model file it read.
        assert report["provenance"]["command"][:3] == ["mpconvert", "batch", str(zoo / "zoo.toml")]
        assert report["provenance"]["model"]["sha256"] == digest(Path(report["provenance"]["model"]["path"])).sha256
    # Nothing hidden left beside the results: no staging, no locks, no worker files.
    assert [p.name for p in out.rglob(".*")] == []


def test_the_summaries_show_the_fleet(full_run, zoo):
    proc, _, summary = full_run
    assert "3 passed, 1 failed the gate, 2 errors" in proc.stdout
    assert "crashing [mixed_bfloat16]: the worker process died from SIGABRT" in proc.stdout
    markdown = (zoo / "summary.md").read_text()
    assert markdown.startswith("## mpconvert batch: ❌ FAILED")
    assert markdown.count("| digits_mlp |") == 2
    cases = ET.parse(zoo / "junit.xml").getroot().iter("testcase")
    outcome = {c.get("name"): [child.tag for child in c if child.tag in ("failure", "error")] for c in cases}
    assert outcome == {
        "digits_mlp [mixed_float16]": [],
        "digits_mlp [mixed_bfloat16]": [],
        "cancer_mlp [mixed_bfloat16]": [],
        "strict_cnn [mixed_bfloat16]": ["failure"],
        "broken [mixed_bfloat16]": ["error"],
        "crashing [mixed_bfloat16]": ["error"],
    }


def test_an_existing_root_needs_resume_or_force(full_run, zoo):
    _, out, _ = full_run
    proc = batch(zoo / "zoo.toml", "--out", out, cwd=zoo)
    assert proc.returncode == 1 and "already holds results" in proc.stderr and "--resume" in proc.stderr


# make test-full: two more runs of the whole zoo (45 s on 2 cores); every run merges shards into one
# root through test_shared_root.py (Kubernetes indexes, GitHub matrix) and separate shard roots through
# test_html.py::test_batch_merge_of_separate_shards_gets_one_page.
@pytest.mark.full
def test_two_shards_merge_into_the_unsharded_summary(full_run, zoo, tmp_path):
    _, _, whole = full_run
    for i in (1, 2):
        proc = batch(zoo / "zoo.toml", "--out", tmp_path / f"shard{i}", "--shard", f"{i}/2", "--jobs", "1", cwd=zoo)
        assert proc.returncode in (0, 1, 3), proc.stderr
    # A shard's own summary; no root holds all the shards, so none wrote a combined batch.json.
    shard_models = [
        json.loads((tmp_path / f"shard{i}" / "shards" / f"{i}-of-2" / "batch.json").read_text())["models"]
        for i in (1, 2)
    ]
    assert not any((tmp_path / f"shard{i}" / "batch.json").exists() for i in (1, 2))
    assert shard_models[0] and shard_models[1]
    assert not {m["folder"] for m in shard_models[0]} & {m["folder"] for m in shard_models[1]}
    proc = run("batch-merge", tmp_path / "shard1", tmp_path / "shard2", "--out", tmp_path / "merged", "--json")
    assert proc.returncode == whole["exit_code"] == 1, proc.stderr
    merged = json.loads(proc.stdout)
    same = ("folder", "status", "metric", "before", "after", "drop", "kept_float32_share", "key", "failed_checks")
    assert [{k: m[k] for k in same} for m in merged["models"]] == [{k: m[k] for k in same} for m in whole["models"]]
    counts = ("models", "passed", "gate_failed", "error", "timed_out")
    assert {k: merged["totals"][k] for k in counts} == {k: whole["totals"][k] for k in counts}


def worker_processes(root: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if "mpconvert.batch.worker" in cmdline and str(root) in cmdline:
            found.append(int(proc.name))
    return found


def test_sigkill_then_resume_redoes_only_what_was_not_finished(zoo, tmp_path):
    out = tmp_path / "out"
    manifest = zoo / "ok.toml"
    # Two models are enough for one finished before the kill and one redone after it; strict_cnn's gate sets the code.
    defaults, _, cancer, strict, *_ = MANIFEST.split("[[model]]")
    manifest.write_text("[[model]]".join([defaults, cancer, strict]))
    batch_process = subprocess.Popen(
        [console_script(), "batch", manifest, "--out", out, "--jobs", "1"],
        cwd=zoo,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def finished() -> list[dict]:
        try:
            return json.loads((out / "batch.json").read_text())["models"]
        except (OSError, ValueError):
            return []

    def recorded() -> bool:
        # batch.json is written first, then index.html: a kill between them leaves index.html's
        # hidden .partial file, which --resume does not remove (a product bug, reported). Kill after both.
        done = finished()
        page = out / "index.html"
        return bool(done) and page.is_file() and all(f'href="{m["folder"]}/' in page.read_text() for m in done)

    deadline = time.monotonic() + 300
    while not recorded() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert finished(), "the first model never finished"
    batch_process.send_signal(signal.SIGKILL)
    batch_process.wait()
    # Its worker notices and stops: nothing keeps converting in the background.
    # (Parent-death signals act at once; the deadline only keeps a broken build from hanging.)
    deadline = time.monotonic() + 300
    while worker_processes(out) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert worker_processes(out) == []
    done = {m["folder"]: (out / m["folder"] / "report.json").stat().st_mtime_ns for m in finished()}

    proc = batch(manifest, "--out", out, "--jobs", "2", "--resume", "--json", cwd=zoo)
    assert proc.returncode == 3, proc.stderr  # strict_cnn fails its gate
    summary = json.loads(proc.stdout)
    assert len(summary["models"]) == 2
    for m in summary["models"]:
        assert m["reused"] is (m["folder"] in done)
        assert m["status"] in ("passed", "gate_failed")
    for folder, mtime in done.items():
        assert (out / folder / "report.json").stat().st_mtime_ns == mtime  # not redone
    assert [p.name for p in out.rglob(".*")] == []


def test_a_model_that_runs_too_long_times_out_and_the_batch_goes_on(zoo, tmp_path):
    # Models whose custom-layer module never returns: each can only end by the timeout, however fast the machine.
    (zoo / "never_returns.py").write_text("import threading\nthreading.Event().wait()\n")
    manifest = zoo / "stuck.toml"
    manifest.write_text(
        '[defaults]\nimports = ["never_returns"]\n'
        '[[model]]\npath = "models/cancer_mlp.keras"\npolicy = ["mixed_float16", "mixed_bfloat16"]\n'
    )
    proc = batch(manifest, "--out", tmp_path / "out", "--timeout", "2", "--jobs", "1", "--json", cwd=zoo)
    assert proc.returncode == 1
    models = by_folder(json.loads(proc.stdout))
    # The first one timing out did not stop the batch: the second ran, and timed out too.
    assert {k: m["status"] for k, m in models.items()} == {
        "cancer_mlp/mixed_float16": "timed_out",
        "cancer_mlp/mixed_bfloat16": "timed_out",
    }
    assert "2 s (--timeout)" in models["cancer_mlp/mixed_float16"]["message"]
    assert not (tmp_path / "out" / "cancer_mlp" / "mixed_float16").exists()
    assert [p.name for p in (tmp_path / "out").rglob(".*")] == []


def test_a_regression_against_the_previous_batch_fails_it(full_run, zoo, tmp_path):
    _, out, summary = full_run
    previous = json.loads(json.dumps(summary))
    for m in previous["models"]:
        if m["folder"] == "cancer_mlp/mixed_bfloat16":
            m["after"] = 0.99  # the previous result was better than this one
    (tmp_path / "old.json").write_text(json.dumps(previous))
    proc = batch(zoo / "zoo.toml", "--out", out, "--resume", "--baseline", tmp_path / "old.json", "--json", cwd=zoo)
    models = by_folder(json.loads(proc.stdout))
    cancer = models["cancer_mlp/mixed_bfloat16"]
    assert cancer["reused"] and cancer["status"] == "gate_failed"
    assert cancer["message"].startswith("baseline regression: accuracy 0.9720 vs 0.9900")
    assert models["digits_mlp/mixed_float16"]["status"] == "passed"


def test_a_folder_of_models_converts_with_shared_options(tmp_path):
    zoo = tmp_path / "zoo"
    (zoo / "team_a").mkdir(parents=True)
    (zoo / "team_a" / "cancer.keras").write_bytes((SAMPLES / "cancer_mlp.keras").read_bytes())
    (zoo / "team_a" / "cancer.npz").write_bytes((SAMPLES / "data" / "breast_cancer.npz").read_bytes())
    subprocess.run(["cp", "-r", str(SAMPLES / "digits_mlp"), str(zoo / "digits")], check=True)
    result = CliRunner().invoke(
        cli,
        [
            "batch",
            str(zoo),
            "--policy",
            "mixed_bfloat16",
            "--out",
            str(tmp_path / "out"),
            "--export",
            "savedmodel",
            "--finetune-steps",
            "0",
            "--no-speed",
            "--pad-multiple",
            "0",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    models = by_folder(json.loads(result.stdout))
    assert set(models) == {"digits/mixed_bfloat16", "team_a__cancer/mixed_bfloat16"}
    assert models["team_a__cancer/mixed_bfloat16"]["metric"] == "accuracy"  # the .npz beside it
    assert models["digits/mixed_bfloat16"]["metric"] is None  # no data: drift only


# --- the manifest and the key, without converting ------------------------------------


def test_a_bad_manifest_lists_every_problem(tmp_path):
    (tmp_path / "m.keras").write_bytes((SAMPLES / "cancer_mlp.keras").read_bytes())
    (tmp_path / "bad.toml").write_text(
        textwrap.dedent("""
        [defaults]
        policy = "mixed_float8"
        max_dorp = 0.1

        [[model]]
        path = "m.keras"
        finetune_steps = -3

        [[model]]
        path = "missing.keras"
        data = "nowhere.npz"

        [[model]]
        policy = "mixed_float16"
    """)
    )
    with pytest.raises(MpconvertError) as caught:
        load_manifest(tmp_path / "bad.toml")
    message = caught.value.message
    for needle in (
        "[defaults]: unknown key 'max_dorp' (did you mean 'max_drop'?)",
        "unknown policy 'mixed_float8'",
        "model 1 (m.keras): finetune_steps=-3 is invalid",
        "model 2 (missing.keras): model not found",
        "data 'nowhere.npz' not found",
        "model 3: no path",
    ):
        assert needle in message, message
    result = CliRunner().invoke(cli, ["batch", str(tmp_path / "bad.toml"), "--out", str(tmp_path / "out")])
    assert result.exit_code == 1 and "problems:" in result.stderr and not (tmp_path / "out").exists()


def test_a_value_out_of_range_is_named_with_its_model(tmp_path):
    (tmp_path / "m.keras").write_bytes((SAMPLES / "cancer_mlp.keras").read_bytes())
    (tmp_path / "m.toml").write_text('[[model]]\npath = "m.keras"\npolicy = "mixed_float16"\nfinetune_steps = -3\n')
    with pytest.raises(MpconvertError, match=r"model 1 \(m.keras\): finetune_steps=-3 is invalid"):
        load_manifest(tmp_path / "m.toml")


def test_the_key_follows_content_not_paths(tmp_path):
    a, b = tmp_path / "a.keras", tmp_path / "elsewhere" / "b.keras"
    b.parent.mkdir()
    a.write_bytes((SAMPLES / "cancer_mlp.keras").read_bytes())
    b.write_bytes(a.read_bytes())
    key = job_key(Job("m", conversion_options(a, "mixed_float16")))
    assert job_key(Job("m", conversion_options(b, "mixed_float16"))) == key  # same content elsewhere: a cache hit
    assert job_key(Job("m", conversion_options(a, "mixed_bfloat16"))) != key
    assert job_key(Job("m", conversion_options(a, "mixed_float16", max_drop=0.02))) != key
    b.write_bytes(a.read_bytes() + b"\0")
    assert job_key(Job("m", conversion_options(b, "mixed_float16"))) != key


def test_shards_are_disjoint_complete_and_balanced_by_size(tmp_path):
    jobs = []
    for i, size in enumerate([900, 500, 400, 300, 200, 100]):
        path = tmp_path / f"m{i}.keras"
        path.write_bytes(b"\0" * size)
        jobs.append(Job(f"m{i}", conversion_options(path, "mixed_float16")))
    shards = [shard_of(jobs, i, 2) for i in (1, 2)]
    assert sorted(j.name for s in shards for j in s) == [j.name for j in jobs]
    # largest first, each to the lighter shard (ties to the first): 900+300 / 500+400+200+100
    assert [sum(j.size() for j in s) for s in shards] == [1200, 1200]
    assert shard_of(jobs, 1, 2) == shards[0]  # the same answer on every machine
