"""A zoo across machines: the recipes in docs/recipes run, scheduler variables simulated.

Every task is a real `mpconvert` process, run side by side with the others
into one root: a local folder, or a bucket on moto's S3 server on 127.0.0.1
(a real S3 protocol server; the credentials are dummies). The command lines
come from the recipe files themselves, so a recipe that stops working fails
here. The zoo is three jobs: two conversions and a broken file.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from conftest import REPO, SAMPLES, invoke
from moto_s3 import moto_s3

from mpconvert.batch.shards import shard_from_environment
from mpconvert.batch.storage import open_root
from mpconvert.system.errors import MpconvertError

RECIPES = REPO / "docs" / "recipes"
SECRET = "mpconvert-test-secret-0x5EC12E7"
SCHEDULER_VARIABLES = ("JOB_COMPLETION_INDEX", "MPCONVERT_SHARD")

ZOO = """
[defaults]
finetune_steps = 0
export = ["savedmodel"]
speed = false
pad_multiple = 0
data = "breast_cancer.npz"

[[model]]
path = "cancer_mlp.keras"
policy = ["mixed_float16", "mixed_bfloat16"]

[[model]]
path = "broken.keras"
policy = "mixed_float16"
"""
STATUSES = {
    "broken/mixed_float16": "error",
    "cancer_mlp/mixed_bfloat16": "passed",
    "cancer_mlp/mixed_float16": "passed",
}


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    base = tmp_path_factory.mktemp("shared_zoo")
    (base / "cancer_mlp.keras").write_bytes((SAMPLES / "cancer_mlp.keras").read_bytes())
    (base / "breast_cancer.npz").write_bytes((SAMPLES / "data" / "breast_cancer.npz").read_bytes())
    (base / "broken.keras").write_bytes(b"not a zip file")
    (base / "zoo.toml").write_text(ZOO)
    return base


def task_environment(tmp: Path, **extra: str) -> dict:
    """A task's environment: this interpreter's mpconvert first on PATH, no real scheduler or AWS variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "AWS_", "PYTEST_")) and k not in SCHEDULER_VARIABLES
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["TMPDIR"] = str(tmp)  # the S3 root's local staging, where the test can look at it
    return {**env, **extra}


def start(command: list[str], env: dict, cwd: Path) -> subprocess.Popen:
    # Its own process group, as a scheduler's task is: a kill reaches the whole task.
    return subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )


def finish_all(processes: list[subprocess.Popen]) -> list[tuple[int, str, str]]:
    outputs = [p.communicate(timeout=600) for p in processes]
    return [(p.returncode, *output) for p, output in zip(processes, outputs)]


@pytest.fixture(scope="module")
def unsharded(zoo):
    """The reference: the same zoo in one run."""
    out = zoo / "whole"
    proc = subprocess.run(
        ["mpconvert", "batch", "zoo.toml", "--out", str(out), "--json"],
        env=task_environment(zoo),
        cwd=zoo,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 1, proc.stderr
    summary = json.loads(proc.stdout)
    assert {m["folder"]: m["status"] for m in summary["models"]} == STATUSES
    return summary


def assert_like_one_run(combined: dict, whole: dict) -> None:
    same = ("folder", "status", "key", "metric", "before", "after", "failed_checks")
    assert [{k: m[k] for k in same} for m in combined["models"]] == [{k: m[k] for k in same} for m in whole["models"]]
    assert combined["exit_code"] == whole["exit_code"] and combined["finished"] is True and combined["shard"] is None
    counts = ("models", "passed", "gate_failed", "error", "timed_out")
    assert {k: combined["totals"][k] for k in counts} == {k: whole["totals"][k] for k in counts}


# --- the recipes' command lines -------------------------------------------------------


def slurm_tasks(count: int, first: int = 7) -> list[dict]:
    """The variables Slurm gives each task of `sbatch --array=7-...`."""
    return [
        {
            "SLURM_ARRAY_TASK_ID": str(first + i),
            "SLURM_ARRAY_TASK_MIN": str(first),
            "SLURM_ARRAY_TASK_MAX": str(first + count - 1),
            "SLURM_ARRAY_TASK_COUNT": str(count),
            "SLURM_ARRAY_JOB_ID": "4242",
        }
        for i in range(count)
    ]


def slurm_commands(root: str, manifest: str) -> list[tuple[list[str], dict]]:
    script = RECIPES / "slurm-array.sh"
    array = re.search(r"^#SBATCH --array=(\d+)-(\d+)$", script.read_text(), re.M)
    first, last = int(array[1]), int(array[2])
    return [
        (["bash", str(script)], {**task, "ROOT": root, "MANIFEST": manifest})
        for task in slurm_tasks(last - first + 1, first)
    ]


def kubernetes_commands(root: str, manifest: str) -> list[tuple[list[str], dict]]:
    job = yaml.safe_load((RECIPES / "kubernetes-indexed-job.yaml").read_text())
    assert job["kind"] == "Job" and job["spec"]["completionMode"] == "Indexed"
    (container,) = job["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"]}
    env.update(ROOT=root, MANIFEST=manifest)  # the cluster's paths, as this test's
    # Kubernetes expands $(VAR) in a container's command from its env.
    command = [re.sub(r"\$\((\w+)\)", lambda m: env[m[1]], part) for part in container["command"]]
    return [(command, {**env, "JOB_COMPLETION_INDEX": str(i)}) for i in range(job["spec"]["completions"])]


def github_commands(root: str, workflow: dict | None = None) -> tuple[list[tuple[list[str], dict]], list[str]]:
    """The convert job's mpconvert steps, one per matrix entry, and the merge job's."""
    workflow = workflow or yaml.safe_load((RECIPES / "github-actions-matrix.yml").read_text())
    shards = workflow["jobs"]["convert"]["strategy"]["matrix"]["shard"]

    def expand(text: str, shard: int | None = None) -> str:
        values = {"matrix.shard": str(shard), "strategy.job-total": str(len(shards))}
        return re.sub(r"\$\{\{\s*([\w.-]+)\s*\}\}", lambda m: values.get(m[1], os.environ.get(m[1], "")), text)

    def runs(job: str) -> list[str]:
        return [s["run"] for s in workflow["jobs"][job]["steps"] if s.get("run", "").startswith("mpconvert ")]

    top = {k: v for k, v in workflow["env"].items() if not k.startswith("AWS_")}  # secrets: the test's own
    tasks = []
    for shard in shards:
        env = {**top, **{k: expand(v, shard) for k, v in workflow["jobs"]["convert"]["env"].items()}, "ROOT": root}
        tasks += [(["bash", "-c", expand(line, shard)], env) for line in runs("convert")]
    return tasks, runs("merge")


def side_by_side(commands: list[tuple[list[str], dict]], zoo: Path, tmp: Path, **extra: str) -> list:
    processes = [start(command, task_environment(tmp, **env, **extra), zoo) for command, env in commands]
    return finish_all(processes)


def read_combined(root: str) -> dict:
    summary = open_root(root).read_batch("batch.json")
    assert summary is not None, f"no combined batch.json in {root}"
    return summary.to_json()


# The same path as the Kubernetes case below (and test_shard_auto_reads_each_scheduler covers
# the variable); both in `make test-full`, one in every run.
@pytest.mark.full
def test_two_slurm_array_tasks_into_one_local_root_are_one_batch(zoo, unsharded, tmp_path):
    root = tmp_path / "zoo-out"
    results = side_by_side(slurm_commands(str(root), str(zoo / "zoo.toml")), zoo, tmp_path)
    assert len(results) == 2
    for code, _, err in results:
        assert code in (0, 1), err
        assert re.search(
            r"shard ([12])/2 from SLURM_ARRAY_TASK_ID=(\d+), SLURM_ARRAY_TASK_MIN=0, SLURM_ARRAY_TASK_COUNT=2", err
        )
    last = [r for r in results if "finished last" in r[2]]
    assert len(last) == 1 and last[0][0] == 1  # the last task exits with the whole zoo's code
    assert_like_one_run(read_combined(str(root)), unsharded)
    assert [p.name for p in root.rglob(".*")] == []  # no staging, work folders or locks left
    # Each task wrote only its own jobs: its shard summary lists them, and the two are disjoint.
    shards = [json.loads((root / "shards" / f"{i}-of-2" / "batch.json").read_text()) for i in (1, 2)]
    folders = [{m["folder"] for m in s["models"]} for s in shards]
    assert folders[0] and folders[1] and not folders[0] & folders[1] and folders[0] | folders[1] == set(STATUSES)


def test_two_kubernetes_indexes_into_one_local_root_are_one_batch(zoo, unsharded, tmp_path):
    root = tmp_path / "zoo-out"
    results = side_by_side(kubernetes_commands(str(root), str(zoo / "zoo.toml")), zoo, tmp_path)
    assert sorted(
        re.search(r"shard (\d/\d) from JOB_COMPLETION_INDEX=\d; --shards 2", err)[1] for *_, err in results
    ) == [
        "1/2",
        "2/2",
    ]
    assert_like_one_run(read_combined(str(root)), unsharded)
    # batch-merge ROOT (what a separate step may run) writes the same.
    before = (root / "batch.json").read_text()
    proc = subprocess.run(
        ["mpconvert", "batch-merge", str(root), "--json"],
        env=task_environment(tmp_path),
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 1 and json.loads(proc.stdout)["models"] == json.loads(before)["models"]


# --- object storage -------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3():
    """moto's S3 server on 127.0.0.1 and the variables a task reaches it with (dummy credentials)."""
    with moto_s3("zoo-bucket", SECRET) as (env, fs, _):
        yield env, fs


def objects(fs, prefix: str) -> dict[str, bytes]:
    fs.invalidate_cache()
    return {name[len(prefix) + 1 :]: fs.cat_file(name) for name in fs.find(prefix)}


def assert_no_secret(outputs: list, stored: dict[str, bytes], local: Path) -> None:
    for text in outputs:
        assert SECRET not in text
    for name, data in stored.items():
        assert SECRET.encode() not in data, name
    for path in local.rglob("*"):
        assert not path.is_file() or SECRET.encode() not in path.read_bytes(), path


def whole_results(stored: dict[str, bytes]) -> set[str]:
    """The result folders in the bucket; each must be whole: its stamp there, with every file its report names."""
    folders = {name.rsplit("/", 1)[0] for name in stored if name.count("/") >= 2 and not name.startswith("shards/")}
    folders = {"/".join(f.split("/")[:2]) for f in folders}
    for folder in folders:
        assert f"{folder}/batch_result.json" in stored, f"{folder} has files but no stamp"
        report = json.loads(stored[f"{folder}/report.json"])
        assert f"{folder}/savedmodel/saved_model.pb" in stored and report["policy"] == folder.split("/")[1]
    return folders


def test_a_github_matrix_into_a_bucket_is_one_batch_and_no_secret_is_written(zoo, unsharded, s3, tmp_path):
    env, fs = s3
    root = "s3://zoo-bucket/matrix"
    convert, merge = github_commands(root)
    summary = tmp_path / "step-summary.md"
    results = side_by_side(convert, zoo, tmp_path, **env)
    assert all(code in (0, 1) for code, *_ in results), results
    merged = subprocess.run(
        ["bash", "-c", merge[0]],
        env=task_environment(tmp_path, **env, ROOT=root, GITHUB_STEP_SUMMARY=str(summary)),
        capture_output=True,
        text=True,
        cwd=zoo,
    )
    assert merged.returncode == 1, merged.stderr  # the broken file fails the run
    assert summary.read_text().startswith("## mpconvert batch: ❌ FAILED")
    combined = read_combined(root)
    assert_like_one_run(combined, unsharded)
    assert combined["root"] == root and all(m["folder"] in STATUSES for m in combined["models"])
    stored = objects(fs, "zoo-bucket/matrix")
    assert whole_results(stored) == {f for f, s in STATUSES.items() if s == "passed"}
    outputs = [text for _, out, err in results for text in (out, err)] + [merged.stdout, merged.stderr]
    assert_no_secret(outputs, stored, tmp_path)
    assert not (tmp_path / "mpconvert-staging").exists() or not any((tmp_path / "mpconvert-staging").rglob("*.json"))


def test_a_task_killed_with_sigkill_and_retried_redoes_nothing_it_finished(zoo, s3, tmp_path):
    """Shard 1 has a quick model and one whose module blocks until the test lets it go: the kill lands mid-work."""
    env, fs = s3
    (zoo / "held.keras").write_bytes((SAMPLES / "cancer_mlp.keras").read_bytes())
    gate = tmp_path / "hold"
    gate.write_text("")
    (zoo / "hold_while_flagged.py").write_text(
        f"import os, time\nwhile os.path.exists({str(gate)!r}):\n    time.sleep(0.1)\n"
    )
    manifest = zoo / "held.toml"
    manifest.write_text(
        ZOO.split('[[model]]\npath = "broken.keras"')[0]
        + '[[model]]\npath = "held.keras"\npolicy = "mixed_float16"\nimports = ["hold_while_flagged"]\n'
    )
    root = "s3://zoo-bucket/killed"
    (first, env1), (second, env2) = slurm_commands(root, str(manifest))
    task1 = start(first, task_environment(tmp_path, **env, **env1, PYTHONPATH=str(zoo)), zoo)
    task2 = start(second, task_environment(tmp_path, **env, **env2, PYTHONPATH=str(zoo)), zoo)
    code2, _, err2 = finish_all([task2])[0]
    assert code2 == 0 and "waiting for shard(s) 1/2" in err2, err2

    def shard1_done() -> list[str]:
        summary = open_root(root).read_batch("shards/1-of-2/batch.json")
        return [m.folder for m in summary.models] if summary else []

    deadline = time.monotonic() + 300
    while not shard1_done() and time.monotonic() < deadline and task1.poll() is None:
        time.sleep(0.2)
    assert shard1_done() == ["cancer_mlp/mixed_bfloat16"], task1.stderr.read() if task1.poll() is not None else ""
    os.killpg(task1.pid, signal.SIGKILL)  # the held model is still converting: it can only be mid-work
    task1.wait()
    killed = objects(fs, "zoo-bucket/killed")
    assert "batch.json" not in killed  # no combined summary while a shard is unfinished
    assert json.loads(killed["shards/1-of-2/batch.json"])["finished"] is False
    assert whole_results(killed) == {"cancer_mlp/mixed_bfloat16", "cancer_mlp/mixed_float16"}  # no held/ at all
    etag = fs.info("zoo-bucket/killed/cancer_mlp/mixed_bfloat16/report.json")["ETag"]

    gate.unlink()  # the retry's held model goes through
    retry = start(first, task_environment(tmp_path, **env, **env1, PYTHONPATH=str(zoo)), zoo)
    code, out, err = finish_all([retry])[0]
    assert code == 0 and "finished last" in err, err
    combined = read_combined(root)
    assert {m["folder"]: (m["status"], m["reused"]) for m in combined["models"]} == {
        "cancer_mlp/mixed_bfloat16": ("passed", True),  # finished before the kill: not redone
        "cancer_mlp/mixed_float16": ("passed", False),
        "held/mixed_float16": ("passed", False),
    }
    stored = objects(fs, "zoo-bucket/killed")
    assert fs.info("zoo-bucket/killed/cancer_mlp/mixed_bfloat16/report.json")["ETag"] == etag
    assert whole_results(stored) == set(m["folder"] for m in combined["models"])
    # The bucket's page links each model's report.html, uploaded with its folder.
    links = re.findall(r'<a href="([^"]+)">', stored["index.html"].decode())
    assert sorted(links) == sorted(f"{m['folder']}/report.html" for m in combined["models"])
    assert all(link in stored for link in links)
    assert_no_secret([err2, out, err], stored, tmp_path)


# --- --shard auto and the extra, without converting ----------------------------------------


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({}, "found no shard index: none of JOB_COMPLETION_INDEX, SLURM_ARRAY_TASK_ID"),
        ({"JOB_COMPLETION_INDEX": "1"}, "JOB_COMPLETION_INDEX=1 gives this task's index but not the number of shards"),
        (
            {
                "SLURM_ARRAY_TASK_ID": "3",
                "SLURM_ARRAY_TASK_MIN": "3",
                "SLURM_ARRAY_TASK_COUNT": "2",
                "MPCONVERT_SHARD": "2/2",
            },
            "contradictory shard values (SLURM_ARRAY_TASK_ID=3, SLURM_ARRAY_TASK_MIN=3, SLURM_ARRAY_TASK_COUNT=2; "
            "MPCONVERT_SHARD=2/2)",
        ),
        (
            {"SLURM_ARRAY_TASK_ID": "3"},
            "SLURM_ARRAY_TASK_ID is set but not SLURM_ARRAY_TASK_MIN (found SLURM_ARRAY_TASK_ID=3)",
        ),
        ({"MPCONVERT_SHARD": "3/2"}, "MPCONVERT_SHARD '3/2' is not I/N"),
    ],
)
def test_shard_auto_without_an_index_or_with_a_contradictory_one_exits_1(zoo, tmp_path, env, needle):
    unset = {name: None for name in os.environ if name.startswith("SLURM_") or name in SCHEDULER_VARIABLES}
    result = invoke("batch", zoo / "zoo.toml", "--out", tmp_path / "out", "--shard", "auto", env={**unset, **env})
    assert result.exit_code == 1 and needle in result.stderr, result.stderr
    assert "Traceback" not in result.output + result.stderr and not (tmp_path / "out").exists()


def test_shard_auto_reads_each_scheduler_and_agrees_with_shards():
    slurm = {"SLURM_ARRAY_TASK_ID": "9", "SLURM_ARRAY_TASK_MIN": "5", "SLURM_ARRAY_TASK_STEP": "2"}
    shard = shard_from_environment({**slurm, "SLURM_ARRAY_TASK_COUNT": "4"}, None)
    assert (shard.index, shard.count) == (3, 4)  # tasks 5, 7, 9, 11
    assert "SLURM_ARRAY_TASK_STEP=2" in shard.source
    assert shard_from_environment({"JOB_COMPLETION_INDEX": "0"}, 3).source == "JOB_COMPLETION_INDEX=0; --shards 3"
    assert (shard_from_environment({"MPCONVERT_SHARD": "2/5"}, None).index, 5) == (2, 5)
    with pytest.raises(MpconvertError, match="contradictory"):
        shard_from_environment({"MPCONVERT_SHARD": "2/5"}, 4)
    with pytest.raises(MpconvertError, match="does not exist"):
        shard_from_environment({"JOB_COMPLETION_INDEX": "3"}, 3)


def test_an_s3_root_without_the_extra_names_it(monkeypatch, zoo, tmp_path):
    monkeypatch.setitem(sys.modules, "fsspec", None)  # as if fsspec were not installed
    with pytest.raises(MpconvertError) as caught:
        open_root("s3://bucket/prefix")
    assert "pip install mpconvert[s3]" in caught.value.hint
    result = invoke("batch", zoo / "zoo.toml", "--out", "s3://bucket/prefix")
    assert result.exit_code == 1 and "pip install mpconvert[s3]" in result.stderr


def test_the_recipes_parse_and_run_mpconvert_into_one_root():
    job = yaml.safe_load((RECIPES / "kubernetes-indexed-job.yaml").read_text())
    spec = job["spec"]
    (container,) = spec["template"]["spec"]["containers"]
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # podFailurePolicy requires it
    assert container["command"][container["command"].index("--shards") + 1] == str(spec["completions"])
    workflow = yaml.safe_load((RECIPES / "github-actions-matrix.yml").read_text())
    assert workflow["jobs"]["merge"]["needs"] == "convert"
    convert, merge = github_commands("ROOT", workflow)
    assert len(convert) == len(workflow["jobs"]["convert"]["strategy"]["matrix"]["shard"]) and len(merge) == 1
    for _, env in convert:
        assert re.fullmatch(r"\d+/\d+", env["MPCONVERT_SHARD"])
    for command in (c for c, _ in kubernetes_commands("ROOT", "zoo.toml")):
        assert command[:2] == ["mpconvert", "batch"] and "--resume" in command
    script = (RECIPES / "slurm-array.sh").read_text()
    assert 'exec mpconvert batch "$MANIFEST" --out "$ROOT" --shard auto --resume' in script
