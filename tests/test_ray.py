"""`batch --executor ray` on a real local Ray cluster (`ray start --head` on 127.0.0.1, two CPUs: two workers).

The Ray run must give the batch.json a local run of the same manifest
gives (folders, statuses, keys), and survive a Ray worker killed in the
middle of a conversion: Ray retries the task on a fresh worker.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import SAMPLES, console_script

pytest.importorskip("ray")

MANIFEST = """
[defaults]
finetune_steps = 0
# Ray runs each conversion as a local batch would, whatever it writes: the cheapest artifact, no timing, no padding.
export = ["savedmodel"]
speed = false
pad_multiple = 0

[[model]]
path = "models/cancer_mlp.keras"
data = "data/breast_cancer.npz"
policy = ["mixed_float16", "mixed_bfloat16"]

[[model]]
path = "models/broken.keras"
policy = "mixed_float16"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    """A Ray head node with two CPUs on 127.0.0.1, in a process group of its own: (address, environment).

    It takes Ray's token authentication, as a shared cluster should; the
    environment holds the token for the batches that use it.
    """
    port = free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    # Ray's sockets live under its temp folder, whose path must stay short (a Unix socket path has ~107 bytes).
    temp = Path(tempfile.mkdtemp(prefix="mpc-ray-", dir="/tmp"))
    ray = Path(sys.executable).with_name("ray")
    head = subprocess.Popen(
        [ray, "start", "--head", "--block", "--port", str(port), "--node-ip-address", "127.0.0.1"]
        + ["--num-cpus", "2", "--include-dashboard", "false", "--disable-usage-stats", "--temp-dir", str(temp)]
        + ["--object-store-memory", str(200 << 20)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env=env,
    )
    started = threading.Event()
    lines: list[str] = []

    def read() -> None:
        for line in head.stdout:
            lines.append(line)
            if "Ray runtime started" in line:
                started.set()

    threading.Thread(target=read, daemon=True).start()
    # The deadline only keeps a broken install from hanging the suite; the head answers in seconds.
    if not started.wait(180):
        os.killpg(head.pid, signal.SIGKILL)
        pytest.fail("the Ray head did not start:\n" + "".join(lines[-20:]))
    try:
        yield f"127.0.0.1:{port}", env
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        try:
            # Ray's gcs_server takes about 30 s to exit on SIGTERM (34 s measured here); nothing of the
            # cluster is kept, so after a short grace the whole group is killed.
            head.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    base = tmp_path_factory.mktemp("rayzoo")
    (base / "models").mkdir()
    (base / "data").mkdir()
    (base / "models" / "cancer_mlp.keras").write_bytes((SAMPLES / "cancer_mlp.keras").read_bytes())
    (base / "models" / "broken.keras").write_bytes(b"not a zip file")
    (base / "data" / "breast_cancer.npz").write_bytes((SAMPLES / "data" / "breast_cancer.npz").read_bytes())
    (base / "zoo.toml").write_text(MANIFEST)
    return base


def conversions() -> list[tuple[int, int, dict]]:
    """(pid, parent pid, spec) of every batch worker process a Ray task started."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")
            if "mpconvert.batch.worker" not in argv or "mpconvert-ray-" not in argv[-2]:
                continue
            parent = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            found.append((int(proc.name), parent, json.loads(Path(argv[-2]).read_text())))
        except (OSError, ValueError, IndexError):
            continue
    return found


def wait_for(what, description: str, batch: subprocess.Popen):
    """Poll until `what()` is truthy while the batch runs; the deadline only keeps a broken build from hanging."""
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and batch.poll() is None:
        found = what()
        if found:
            return found
        time.sleep(0.05)
    batch.kill()
    pytest.fail(f"gave up waiting for {description}: " + batch.communicate()[1][-2000:])


def outcome(summary: dict) -> list[tuple]:
    return [(m["folder"], m["status"], m["key"]) for m in summary["models"]]


def test_a_ray_batch_survives_a_killed_worker_and_matches_a_local_batch(cluster, zoo):
    address, env = cluster
    ray_out, local_out = zoo / "ray_out", zoo / "local_out"
    batch = subprocess.Popen(
        [console_script(), "batch", "zoo.toml", "--out", ray_out, "--executor", "ray", "--ray-address", address]
        + ["--json"],
        cwd=zoo,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )

    def float16_job() -> list:
        return [c for c in conversions() if c[2]["policy"] == "mixed_float16" and "cancer" in c[2]["model"]]

    # The Ray worker whose task is converting cancer_mlp under mixed_float16, mid-conversion (no result yet).
    pid, ray_worker, spec = wait_for(float16_job, "the mixed_float16 conversion to start", batch)[0]
    assert not Path(spec["result"]).exists()
    os.kill(ray_worker, signal.SIGKILL)
    # Its conversion dies with it, and Ray runs the task again on another worker process.
    retried = wait_for(lambda: [c for c in float16_job() if c[1] != ray_worker], "Ray to retry the task", batch)
    assert retried[0][0] != pid
    stdout, stderr = batch.communicate(timeout=600)
    # The killed task's work folder on the node is gone too: the next task there removed it.
    assert not Path(spec["result"]).parent.exists()
    assert batch.returncode == 1, stderr  # the broken model is an error; both conversions pass
    summary = json.loads(stdout)
    assert summary["executor"] == "ray"
    assert summary == json.loads((ray_out / "batch.json").read_text())
    statuses = {m["folder"]: m["status"] for m in summary["models"]}
    assert statuses == {
        "broken/mixed_float16": "error",
        "cancer_mlp/mixed_bfloat16": "passed",
        "cancer_mlp/mixed_float16": "passed",
    }

    local = subprocess.run(
        [console_script(), "batch", "zoo.toml", "--out", local_out, "--jobs", "2", "--json"],
        cwd=zoo,
        capture_output=True,
        text=True,
    )
    assert local.returncode == 1, local.stderr
    local_summary = json.loads(local.stdout)
    assert local_summary["executor"] == "local"
    assert outcome(summary) == outcome(local_summary)
    # The same result folders, file for file, each with its key stamped beside the report.
    for m in summary["models"]:
        if m["status"] != "passed":
            continue
        files = sorted(p.relative_to(ray_out / m["folder"]) for p in (ray_out / m["folder"]).rglob("*"))
        assert files == sorted(p.relative_to(local_out / m["folder"]) for p in (local_out / m["folder"]).rglob("*"))
        stamp = json.loads((ray_out / m["folder"] / "batch_result.json").read_text())
        assert stamp["key"] == m["key"]
        report = json.loads((ray_out / m["folder"] / "report.json").read_text())
        assert report["passed"] is True and report["policy"] == m["folder"].split("/")[1]
    assert [p.name for p in ray_out.rglob(".*")] == []  # no work folder or unpacked leftovers

    # --resume over the Ray root trusts its stamps: nothing is converted again.
    again = subprocess.run(
        [console_script(), "batch", "zoo.toml", "--out", ray_out, "--executor", "ray", "--ray-address", address]
        + ["--resume", "--json"],
        cwd=zoo,
        capture_output=True,
        text=True,
        env=env,
    )
    assert again.returncode == 1, again.stderr
    reused = {m["folder"]: m["reused"] for m in json.loads(again.stdout)["models"]}
    assert reused == {
        "broken/mixed_float16": False,
        "cancer_mlp/mixed_bfloat16": True,
        "cancer_mlp/mixed_float16": True,
    }


def test_a_cluster_that_does_not_answer_fails_before_the_root_is_made(zoo):
    out = zoo / "nowhere_out"
    proc = subprocess.run(
        [console_script(), "batch", "zoo.toml", "--out", out, "--executor", "ray", "--ray-address"]
        + [f"127.0.0.1:{free_port()}"],
        cwd=zoo,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    assert "does not answer" in proc.stderr and "Traceback" not in proc.stderr
    assert not out.exists()


def test_a_ray_address_without_the_ray_executor_is_refused(zoo):
    proc = subprocess.run(
        [console_script(), "batch", "zoo.toml", "--out", zoo / "x", "--ray-address", "127.0.0.1:6379"],
        cwd=zoo,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1
    assert "--ray-address goes with --executor ray" in proc.stderr
    assert not (zoo / "x").exists()


def test_the_kuberay_recipe_runs_a_ray_batch_from_its_entrypoint():
    import shlex

    import yaml

    from mpconvert.cli.batch import batch_command

    job = yaml.safe_load((Path(__file__).parents[1] / "docs" / "recipes" / "kuberay-rayjob.yaml").read_text())
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["mpconvert", "batch"]
    params = batch_command.make_context("batch", argv[2:]).params
    # RayJob sets RAY_ADDRESS for its entrypoint: the recipe must not pin an address of its own.
    assert (params["executor"], params["ray_address"], params["resume"]) == ("ray", None, True)
    workers = job["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]
    mounts = [c["volumeMounts"] for g in [head, *workers] for c in g["template"]["spec"]["containers"]]
    # Every node reads the models at the manifest's paths.
    assert all({"name": "zoo", "mountPath": "/zoo", "readOnly": True} in m for m in mounts)


def test_a_ray_task_that_runs_too_long_is_cancelled_and_its_conversion_stopped(cluster, zoo):
    address, env = cluster
    # A custom-layer module that never returns: the conversion can only end by the timeout.
    (zoo / "never_returns.py").write_text("import threading\nthreading.Event().wait()\n")
    (zoo / "stuck.toml").write_text(
        '[defaults]\nimports = ["never_returns"]\n[[model]]\npath = "models/cancer_mlp.keras"\npolicy = "mixed_float16"\n'
    )
    out = zoo / "stuck_out"
    proc = subprocess.run(
        [console_script(), "batch", "stuck.toml", "--out", out, "--executor", "ray", "--ray-address", address]
        + ["--timeout", "3", "--json"],
        cwd=zoo,
        capture_output=True,
        text=True,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr
    [model] = json.loads(proc.stdout)["models"]
    assert (model["status"], model["message"]) == ("timed_out", "no result after 3 s (--timeout)")
    assert not (out / "cancer_mlp").exists()
    # Cancelling the task killed its Ray worker, and the conversion died with it. (Parent-death
    # signals act at once; the deadline only keeps a broken build from hanging.)
    deadline = time.monotonic() + 60
    while [c for c in conversions() if "never_returns" in c[2]["options"].get("imports", [])]:
        assert time.monotonic() < deadline, "the stuck conversion outlived its cancelled task"
        time.sleep(0.05)


def test_without_ray_installed_the_ray_executor_names_the_extra(zoo, monkeypatch):
    from click.testing import CliRunner

    from mpconvert.cli import cli

    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where it is not installed
    result = CliRunner().invoke(cli, ["batch", str(zoo / "zoo.toml"), "--out", str(zoo / "y"), "--executor", "ray"])
    assert result.exit_code == 1
    assert "pip install 'mpconvert[ray]'" in result.stderr
    assert not (zoo / "y").exists()
