"""MLflow tracking and the model registry, against a real MLflow server started here on 127.0.0.1.

The server keeps its runs in SQLite and its artifacts in a folder of this
test session; every run and model version is read back with MLflow's own
client. The conversions are of the small cancer classifier without
fine-tuning (a few seconds each).
"""

import contextlib
import dataclasses
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from conftest import SAMPLES, console_script, invoke

import mpconvert
from mpconvert.export.tracking import gate_metrics, metric_name, run_params
from mpconvert.options.tracking import TrackingOptions
from mpconvert.system.digests import digest
from mpconvert.system.errors import MpconvertError

mlflow = pytest.importorskip("mlflow")
from mlflow import MlflowClient  # noqa: E402

MODEL = SAMPLES / "cancer_mlp.keras"
DATA = SAMPLES / "data" / "breast_cancer.npz"
POLICY = "mixed_bfloat16"
BASE = (MODEL, "--policy", POLICY, "--data", DATA, "--finetune-steps", "0")
# Without a tolerance the ONNX file's bfloat16 arithmetic (max |diff| about 1e-3 here) fails artifact parity.
FAILING = ("--atol", "0", "--rtol", "0")
# For the runs that read neither the timings nor the padding (passed_run reads both): a few seconds less each.
QUICK = ("--no-speed", "--pad-multiple", "0")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    """`mlflow server` on a free port, with a SQLite store and a local artifact root; stopped at the end."""
    base = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    log = (base / "server.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "mlflow",
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--backend-store-uri",
            f"sqlite:///{base / 'mlflow.db'}",
            "--artifacts-destination",
            str(base / "artifacts"),
            "--workers",
            "1",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        # Its background job runner (huey consumers, for GenAI jobs) is not needed here: fewer processes on 2 cores.
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        start_new_session=True,  # its own process group, stopped whole at the end
    )
    uri = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{uri}/health", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"the MLflow server did not start: {(base / 'server.log').read_text()[-2000:]}")
        time.sleep(0.2)
    yield uri
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass
    with contextlib.suppress(ProcessLookupError):  # whatever of its group is left (its uvicorn worker)
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    log.close()


def runs_of(client, experiment):
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r}"
    return client.search_runs([found.experiment_id])


def artifact_paths(client, run_id, path=None):
    """Every file the run holds, by its path under the run's artifact root."""
    found = []
    for item in client.list_artifacts(run_id, path):
        found += artifact_paths(client, run_id, item.path) if item.is_dir else [item.path]
    return found


@pytest.fixture(scope="module")
def passed_run(server, tmp_path_factory):
    """One passing conversion with --register: its output folder, report.json and its run read back."""
    out = tmp_path_factory.mktemp("passed") / "out"
    result = invoke(*BASE, "--out", out, "--mlflow", server, "--mlflow-experiment", "passed", "--register", "cancer")
    client = MlflowClient(server)
    (run,) = runs_of(client, "passed")
    return result, out, json.loads((out / "report.json").read_text()), client, run


def test_a_conversion_is_one_run_with_its_options_as_params(passed_run):
    result, out, report, _, run = passed_run
    assert result.exit_code == 0, result.output + result.stderr
    assert run.info.status == "FINISHED" and run.info.run_name == f"cancer_mlp [{POLICY}]"
    params = run.data.params
    assert params["policy"] == POLICY and params["finetune_steps"] == "0" and params["seed"] == "0"
    assert params["pad_multiple"] == "8" and params["export"] == '["savedmodel", "onnx"]'
    assert params["data"] == str(DATA)
    # Every option the report recorded, none left out.
    assert set(params) == set(report["provenance"]["options"])


def test_the_run_holds_every_figure_the_gate_judged_as_in_report_json(passed_run):
    _, _, report, _, run = passed_run
    metrics = run.data.metrics
    v = report["validation"]
    onnx = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    # Exactly the report's numbers (MLflow stores doubles).
    assert metrics["accuracy_gate/reference"] == v["reference"]
    assert metrics["accuracy_gate/converted"] == v["converted"]
    assert metrics["accuracy_gate/drop"] == v["drop"]
    assert metrics["agreement/kept_correct"] == v["kept_correct"]
    assert metrics["artifact_parity/onnx/max_abs_diff"] == onnx["max_abs_diff"] > 0  # bfloat16 rounding in ONNX
    parity = next(c for c in report["gate"]["checks"] if c["name"] == "artifact parity: savedmodel")
    assert metrics["artifact_parity/savedmodel/limit"] == parity["values"]["limit"]
    assert metrics["speed/savedmodel/ratio"] == report["speed"]["paths"]["savedmodel"]["ratio"]
    assert metrics["passed"] == 1.0
    # One metric group per gate check, per artifact: nothing judged is left out.
    groups = {name.rsplit("/", 1)[0] for name in metrics}
    assert {"policy_rewrite", "accuracy_gate", "agreement", "padding_proof"} <= groups
    assert {"artifact_parity/savedmodel", "artifact_parity/keras", "artifact_parity/onnx"} <= groups
    assert metrics == gate_metrics(report)


def test_the_run_is_tagged_with_the_verdict_and_holds_the_output_folder(passed_run):
    _, out, report, client, run = passed_run
    tags = run.data.tags
    assert tags["mpconvert.verdict"] == "passed" and tags["mpconvert.policy"] == POLICY
    assert tags["mpconvert.model"] == str(MODEL) and "mpconvert.failed_checks" not in tags
    files = set(artifact_paths(client, run.info.run_id))
    assert {"report.json", "report.html", "model.onnx", "model.keras", "golden.npz"} <= files
    assert "savedmodel/saved_model.pb" in files
    # The files logged are the folder's own: the same bytes.
    local = {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()}
    assert files == local
    fetched = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, tracking_uri=client.tracking_uri))
    assert digest(fetched / "savedmodel").sha256 == digest(out / "savedmodel").sha256
    assert json.loads((fetched / "report.json").read_text()) == report


def test_register_on_a_pass_makes_version_1_with_the_verdict_and_the_drop(passed_run):
    result, _, report, client, run = passed_run
    (version,) = client.search_model_versions("name='cancer'")
    assert version.version == "1" and version.run_id == run.info.run_id
    assert version.source == f"{run.info.artifact_uri}/savedmodel"
    assert version.tags["mpconvert.verdict"] == "passed"
    assert version.tags["mpconvert.drop"] == str(report["validation"]["drop"])
    assert version.tags["mpconvert.onnx"] == f"{run.info.artifact_uri}/model.onnx"
    assert "registered 'cancer' version 1" in result.stderr


def test_a_gate_failure_is_recorded_and_never_registered(server, tmp_path):
    out = tmp_path / "out"
    result = invoke(
        *BASE,
        *FAILING,
        *QUICK,
        "--out",
        out,
        "--mlflow",
        server,
        "--mlflow-experiment",
        "failed",
        "--register",
        "strict",
    )
    assert result.exit_code == 3, result.output + result.stderr
    assert "not registered: the gate failed" in result.stderr
    client = MlflowClient(server)
    assert client.search_model_versions("name='strict'") == []
    (run,) = runs_of(client, "failed")
    assert run.data.tags["mpconvert.verdict"] == "gate_failed"
    assert "artifact parity: onnx" in run.data.tags["mpconvert.failed_checks"]
    assert run.data.metrics["passed"] == 0.0 and run.data.metrics["artifact_parity/onnx/limit"] == 0.0
    assert run.data.params["atol"] == "[[null, 0.0]]"


def test_the_python_api_saves_through_the_same_tracking(server, tmp_path):
    conversion = mpconvert.convert(MODEL, POLICY, data=DATA, finetune_steps=0, speed=False, pad_multiple=0)
    report = conversion.save(tmp_path / "out", export=("savedmodel",), mlflow=server, mlflow_experiment="api")
    client = MlflowClient(server)
    (run,) = runs_of(client, "api")
    assert run.data.params["export"] == '["savedmodel"]'
    assert run.data.metrics["accuracy_gate/drop"] == report["validation"]["drop"]
    assert "model.onnx" not in artifact_paths(client, run.info.run_id)


def test_convert_names_save_as_the_place_for_tracking_keywords():
    with pytest.raises(MpconvertError) as caught:
        mpconvert.convert(MODEL, POLICY, data=DATA, mlflow="http://127.0.0.1:1")
    assert caught.value.message.startswith("mlflow is a keyword of Conversion.save")
    assert "conversion.save(out, mlflow=...)" in caught.value.hint


def test_an_unreachable_server_fails_before_any_work_and_writes_nothing(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"  # closed: nothing listens there now
    out = tmp_path / "out"
    started = time.monotonic()
    result = invoke(*BASE, "--out", out, "--mlflow", uri)
    assert result.exit_code == 1
    (error, fix) = result.stderr.strip().splitlines()
    assert error == f"error: MLflow tracking server {uri} cannot be reached: Connection refused"
    assert fix.startswith("  fix:") and "--mlflow-optional" in fix
    assert not out.exists() and list(tmp_path.iterdir()) == []
    assert time.monotonic() - started < 60  # no retries with backoff, which take minutes


@pytest.fixture
def refusing_server():
    """An HTTP server on 127.0.0.1 that answers 401 to every request, as a tracking server behind auth does."""

    class Refuse(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="mlflow"')
            self.end_headers()
            self.wfile.write(b"You are not authenticated.")

        do_POST = do_GET

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refuse)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_server_that_refuses_access_fails_naming_the_401(refusing_server, tmp_path):
    out = tmp_path / "out"
    result = invoke(*BASE, "--out", out, "--mlflow", refusing_server)
    assert result.exit_code == 1
    assert f"error: MLflow tracking server {refusing_server} refused access (401 Unauthorized)" in result.stderr
    assert "MLFLOW_TRACKING_USERNAME" in result.stderr
    assert not out.exists()


def test_mlflow_optional_warns_and_converts_untracked(tmp_path):
    uri = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "out"
    result = invoke(*BASE, *QUICK, "--export", "savedmodel", "--out", out, "--mlflow", uri, "--mlflow-optional")
    assert result.exit_code == 0, result.output + result.stderr
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: MLflow tracking server {uri} cannot be reached: Connection refused; converting untracked "
        "(--mlflow-optional)"
    ]
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is True
    assert report["skipped"] == [
        {"stage": "mlflow", "reason": f"MLflow tracking server {uri} cannot be reached: Connection refused"}
    ]


def test_a_bare_mlflow_flag_takes_the_uri_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    result = invoke(*BASE, "--out", tmp_path / "out", "--mlflow")
    assert result.exit_code == 1 and not (tmp_path / "out").exists()
    assert "error: --mlflow was given without a URI and MLFLOW_TRACKING_URI is not set" in result.stderr
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert mpconvert.api.tracking_options(mlflow=True).uri == "http://127.0.0.1:5000"
    assert mpconvert.api.tracking_options(mlflow="http://other:80").uri == "http://other:80"
    assert mpconvert.api.tracking_options().enabled is False
    # A batch worker rebuilds them from JSON, the URI already resolved (its own environment may lack it).
    resolved = mpconvert.api.tracking_options(mlflow=True, register="m", mlflow_experiment="e")
    monkeypatch.delenv("MLFLOW_TRACKING_URI")
    again = TrackingOptions(**json.loads(json.dumps({**resolved.spec(), "parent_run": "abc"})))
    assert again.uri == "http://127.0.0.1:5000" and again.register == "m" and again.parent_run == "abc"


def test_register_needs_a_server_and_the_savedmodel(tmp_path):
    result = invoke(*BASE, "--out", tmp_path / "out", "--register", "cancer")
    assert result.exit_code == 1 and "error: --register cancer needs a tracking server" in result.stderr
    with pytest.raises(MpconvertError, match="not a registered model name"):
        TrackingOptions(uri="http://127.0.0.1:1", register="team/cancer")
    result = invoke(
        *BASE, "--out", tmp_path / "out", "--export", "onnx", "--mlflow", "http://127.0.0.1:1", "--register", "x"
    )
    assert result.exit_code == 1 and "--export leaves it out" in result.stderr
    assert not (tmp_path / "out").exists()


def test_without_mlflow_installed_the_error_names_the_extra(monkeypatch):
    from mpconvert.export.tracking import start

    monkeypatch.setitem(sys.modules, "mlflow", None)  # what `import mlflow` meets where it is not installed
    with pytest.raises(MpconvertError) as caught:
        start(TrackingOptions(uri="http://127.0.0.1:1"))
    assert "MLflow, which is not installed" in caught.value.message
    assert "pip install 'mpconvert[mlflow]'" in caught.value.hint


def test_metric_names_and_params_are_what_mlflow_accepts():
    assert metric_name("accuracy gate: digit", "drop") == "accuracy_gate/digit/drop"
    assert (
        metric_name("artifact parity: onnx", "rows_4096", "max_abs_diff")
        == "artifact_parity/onnx/rows_4096/max_abs_diff"
    )
    assert metric_name("validation independent of training", "share") == "validation_independent_of_training/share"
    stored = {"provenance": {"options": {"keep_float32": ["a" * 7000], "seed": 3, "loss": None, "speed": True}}}
    params = run_params(stored)
    assert params["seed"] == "3" and params["loss"] == "null" and params["speed"] == "true"
    assert len(params["keep_float32"]) == 6000  # MLflow's limit on a param value


MANIFEST = f"""
[defaults]
policy = "{POLICY}"
finetune_steps = 0
export = ["savedmodel"]
speed = false
pad_multiple = 0

[[model]]
path = "{MODEL}"
data = "{DATA}"

[[model]]
path = "{SAMPLES / "digits_mlp"}"
data = "{SAMPLES / "data" / "digits.npz"}"
"""


def test_a_batch_is_a_parent_run_with_one_child_per_model(server, tmp_path):
    (tmp_path / "zoo.toml").write_text(MANIFEST)
    root = tmp_path / "root"
    env = {**os.environ, "MLFLOW_TRACKING_URI": server}
    proc = subprocess.run(
        [
            console_script(),
            "batch",
            tmp_path / "zoo.toml",
            "--out",
            root,
            "--jobs",
            "2",
            "--mlflow",
            "--mlflow-experiment",
            "zoo",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    client = MlflowClient(server)
    runs = runs_of(client, "zoo")
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    (parent,) = parents
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    assert len(runs) == 3 and len(children) == 2
    assert sorted(r.info.run_name for r in children) == [f"cancer_mlp [{POLICY}]", f"digits_mlp [{POLICY}]"]
    assert all(r.data.tags["mpconvert.verdict"] == "passed" and r.info.status == "FINISHED" for r in children)
    summary = json.loads((root / "batch.json").read_text())
    for child in children:
        model = child.info.run_name.split(" ")[0]
        report = json.loads((root / model / POLICY / "report.json").read_text())
        assert child.data.metrics["accuracy_gate/drop"] == report["validation"]["drop"]
    assert parent.info.status == "FINISHED" and parent.info.run_name == "batch zoo.toml"
    assert parent.data.metrics["totals/passed"] == summary["totals"]["passed"] == 2
    files = set(artifact_paths(client, parent.info.run_id))
    assert files == {"batch.json", "index.html"}
    fetched = Path(mlflow.artifacts.download_artifacts(run_id=parent.info.run_id, tracking_uri=server))
    assert json.loads((fetched / "batch.json").read_text()) == summary
    assert (fetched / "index.html").read_bytes() == (root / "index.html").read_bytes()


def test_several_outputs_get_their_own_metrics_and_version_tags():
    from mpconvert.export.tracking import drop_tags

    stored = {
        "passed": False,
        "gate": {
            "checks": [
                {"name": "accuracy gate: digit", "passed": True, "values": {"metric": "accuracy", "drop": 0.004}},
                {"name": "mse gate: ink", "passed": False, "values": {"drop": 0.03, "max_drop": 0.02, "ok": True}},
                {"name": "drift: aux", "passed": True, "values": {"max_abs_diff": float("nan")}},
            ]
        },
        "validation": {"drop": None, "outputs": [{"name": "digit", "drop": 0.004}, {"name": "ink", "drop": 0.03}]},
    }
    # Text, booleans and non-finite values are not figures; every number is, under its output's check.
    assert gate_metrics(stored) == {
        "passed": 0.0,
        "accuracy_gate/digit/drop": 0.004,
        "mse_gate/ink/drop": 0.03,
        "mse_gate/ink/max_drop": 0.02,
    }
    assert drop_tags(stored) == {"mpconvert.drop.digit": "0.004", "mpconvert.drop.ink": "0.03"}


def test_an_s3_output_is_logged_from_its_local_copy_with_the_same_files(server, tmp_path):
    pytest.importorskip("s3fs")
    from moto_s3 import moto_s3

    with moto_s3("models") as (_, fs, _):
        result = invoke(*BASE, *QUICK, "--out", "s3://models/cancer", "--mlflow", server, "--mlflow-experiment", "s3")
        assert result.exit_code == 0, result.output + result.stderr
        uploaded = {
            path.split("models/cancer/", 1)[1]: fs.cat_file(path)
            for path in fs.find("models/cancer")
            if fs.isfile(path)
        }
    client = MlflowClient(server)
    (run,) = runs_of(client, "s3")
    assert set(artifact_paths(client, run.info.run_id)) == set(uploaded)
    fetched = Path(mlflow.artifacts.download_artifacts(run_id=run.info.run_id, tracking_uri=server))
    assert (fetched / "report.json").read_bytes() == uploaded["report.json"]
    assert (fetched / "model.onnx").read_bytes() == uploaded["model.onnx"]


@pytest.fixture
def failing_after_check():
    """A server that passes the pre-flight (an empty experiment search) and answers 404 to everything else."""

    class Half(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            ok = "/experiments/search" in self.path
            body = json.dumps({"experiments": []} if ok else {"error_code": "ENDPOINT_NOT_FOUND", "message": "gone"})
            self.send_response(200 if ok else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode())

        do_POST = do_GET

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Half)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_a_server_failing_while_the_run_is_logged_leaves_the_output_complete(failing_after_check, tmp_path):
    out = tmp_path / "out"
    result = invoke(*BASE, *QUICK, "--out", out, "--mlflow", failing_after_check)
    assert result.exit_code == 1
    error = result.stderr.strip().splitlines()[0]
    assert error.startswith(f"error: MLflow tracking server {failing_after_check} failed a request (HTTP 404): ")
    assert f"after the output was written to {out}: its MLflow run is incomplete" in error
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] is True and (out / "model.onnx").is_file() and (out / "savedmodel").is_dir()
    optional = invoke(*BASE, *QUICK, "--out", tmp_path / "again", "--mlflow", failing_after_check, "--mlflow-optional")
    assert optional.exit_code == 0, optional.stderr
    assert [line for line in optional.stderr.splitlines() if line.startswith("warning:")] == [
        f"warning: MLflow run not recorded: MLflow tracking server {failing_after_check} failed a request "
        f"(HTTP 404): {error.split('(HTTP 404): ', 1)[1].split(', after', 1)[0]}"
    ]


def test_a_uri_that_is_no_tracking_server_fails_naming_the_http_status(server, tmp_path):
    out = tmp_path / "out"
    result = invoke(*BASE, "--out", out, "--mlflow", f"{server}/not-mlflow")
    assert result.exit_code == 1 and not out.exists()
    (error, fix) = result.stderr.strip().splitlines()
    assert error.startswith(f"error: MLflow tracking server {server}/not-mlflow failed a request (HTTP 404): ")
    assert "<" not in error  # not the HTML page the server answered with
    assert "names an MLflow tracking server" in fix


def test_a_batch_result_whose_run_was_not_recorded_is_not_one_resume_reuses(failing_after_check, tmp_path):
    from mpconvert.api import conversion_options
    from mpconvert.batch.manifest import Job
    from mpconvert.batch.worker import RESULT_NAME, job_spec, run
    from mpconvert.export.tracking import RunNotRecorded

    job = Job("cancer", conversion_options(MODEL, POLICY, data=DATA, finetune_steps=0, speed=False, pad_multiple=0))
    out = tmp_path / "cancer" / POLICY
    tracking = TrackingOptions(uri=failing_after_check, parent_run="parent-id")
    spec = dataclasses.replace(job_spec(job), out=str(out), key="k", tracking=tracking)
    with pytest.raises(RunNotRecorded):
        run(spec)
    # The conversion is there, but without the stamp that --resume trusts.
    assert json.loads((out / "report.json").read_text())["passed"] is True
    assert not (out / RESULT_NAME).exists()
