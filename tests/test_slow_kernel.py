"""The conversion guards itself against a broken 16-bit kernel: detects it, restarts with the fix, says so.

No CPU here need have such a kernel (the Intel Xeon with AMX and
avx512_fp16 does: a float16 Dense in tf.function took 67x float32's time),
so MPCONVERT_SLOW_KERNEL_RATIO lowers the threshold until any 16-bit model
counts as slow, and the path is the one a real finding takes; where the
kernel probe must find it first, the `broken_kernel` fixture writes the
probe's answer for this machine into its cache (tests/broken_kernels.py).
"""

import json
import os
import subprocess

import keras
import pytest
import tiny_models
from conftest import SAMPLES, console_script

import mpconvert
from mpconvert.speed import kernel_probe
from mpconvert.speed.kernel_probe import CACHE_ENV
from mpconvert.speed.slow_kernel import FOUND_ENV, ONEDNN_ENV, THRESHOLD_ENV

CANCER = SAMPLES / "cancer_mlp.keras"


def run_cli(*args, env=None):
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    for name in (FOUND_ENV, ONEDNN_ENV, THRESHOLD_ENV):
        if name not in (env or {}):
            environment.pop(name, None)
    return subprocess.run(
        [console_script(), *map(str, args)], capture_output=True, text=True, env=environment, timeout=600
    )


def test_a_slow_kernel_restarts_the_command_with_onednn_off_and_reports_both_figures(tmp_path):
    out = tmp_path / "out"
    done = run_cli(
        CANCER, "--policy", "mixed_float16", "--out", out, "--export", "savedmodel", env={THRESHOLD_ENV: "0.0001"}
    )
    assert done.returncode == 0, done.stderr
    assert "running again with TF_ENABLE_ONEDNN_OPTS=0" in done.stderr
    found = json.loads((out / "report.json").read_text())["slow_kernel"]
    assert found["done"] == "restarted with TF_ENABLE_ONEDNN_OPTS=0 (oneDNN's graph rewrites off)"
    for figures in (found["found"], found["fixed"]):  # default settings, then the fix
        assert figures["float32_ms"] > 0 and figures["converted_ms"] > 0
        assert figures["slower"] == pytest.approx(figures["converted_ms"] / figures["float32_ms"], rel=0.02)
    # The kernel probe (one small Dense, in a child process) found it before the model ran; the fix is the model's.
    assert found["found"]["rows"] == 64 and found["found"]["what"].startswith("one fused Dense(256")
    assert found["fixed"]["rows"] == 256 and found["fixed"]["what"] == "the model, one batch of 256 rows"
    assert "slow kernel:" in done.stdout and found["summary"] in " ".join(done.stdout.split())
    # The restart happened after everything unwound: no staging folder or lock is left beside the output.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_normal_run_finds_no_slow_kernel(tmp_path):
    done = run_cli(CANCER, "--policy", "mixed_bfloat16", "--out", tmp_path / "o", "--export", "savedmodel")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "o" / "report.json").read_text())["slow_kernel"] is None
    assert "running again" not in done.stderr


def test_the_python_api_cannot_restart_and_says_what_to_set(monkeypatch):
    monkeypatch.setenv(THRESHOLD_ENV, "0.0001")
    monkeypatch.delenv(FOUND_ENV, raising=False)
    conversion = mpconvert.convert(tiny_models.mlp(keras), "mixed_float16", pad_multiple=0, speed=False)
    found = conversion.report["slow_kernel"]
    assert found["done"].startswith("nothing: a Python process cannot restart TensorFlow; set TF_ENABLE_ONEDNN_OPTS=0")
    assert found["fixed"] is None and found["found"]["slower"] > 0
    assert conversion.report["validation"]["rows"] == 64  # the conversion went on


def test_a_batch_worker_restarts_itself(tmp_path):
    zoo = tmp_path / "zoo"
    zoo.mkdir()
    tiny_models.mlp(keras).save(zoo / "m.keras")
    done = run_cli(
        "batch", zoo, "--out", tmp_path / "root", "--policy", "mixed_float16", "--export", "savedmodel",
        "--json", env={THRESHOLD_ENV: "0.0001"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert [m["status"] for m in summary["models"]] == ["passed"]
    report = json.loads((tmp_path / "root" / "m" / "mixed_float16" / "report.json").read_text())
    assert report["slow_kernel"]["done"].startswith("restarted with TF_ENABLE_ONEDNN_OPTS=0")


def test_the_kernel_probe_finds_a_broken_kernel_before_the_model_runs_and_restarts(tmp_path, broken_kernel):
    broken_kernel.probe_finds()  # what the probe found on this machine with oneDNN's rewrites on, cached
    out = tmp_path / "out"
    done = run_cli(
        CANCER, "--policy", "mixed_float16", "--out", out, "--export", "savedmodel", env=broken_kernel.env
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "running again with TF_ENABLE_ONEDNN_OPTS=0" in done.stderr
    found = json.loads((out / "report.json").read_text())["slow_kernel"]
    assert found["done"].startswith("restarted with TF_ENABLE_ONEDNN_OPTS=0")
    assert found["found"]["what"].startswith("one fused Dense(256") and found["found"]["slower"] >= 8
    assert found["cached"] is True  # the probe's answer for this machine, read before any model ran
    assert found["fixed"]["rows"] == 256 and found["fixed"]["slower"] < 8  # the stand-in is sound with the fix
    assert "set TF_ENABLE_ONEDNN_OPTS=0 where this model serves" in found["summary"]


def test_a_sound_policy_is_not_touched_by_the_stand_in(tmp_path, broken_kernel):
    broken_kernel.probe_finds()
    done = run_cli(
        CANCER, "--policy", "mixed_bfloat16", "--out", tmp_path / "o", "--export", "savedmodel", env=broken_kernel.env
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "o" / "report.json").read_text())["slow_kernel"] is None


def test_the_probe_answer_is_cached_per_machine_and_tensorflow_build(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    first = kernel_probe.start(("mixed_float16",)).result()["mixed_float16"]
    assert first.cached is False and first.slower is not None and first.float32_ms > 0
    again = kernel_probe.start(("mixed_float16",))
    assert again.child is None  # no child process: the answer is on disk
    second = again.result()["mixed_float16"]
    assert second.cached is True and second.slower == first.slower
    # Another oneDNN setting is another key: it is probed afresh.
    assert kernel_probe.cache_file({ONEDNN_ENV: "0"}) != kernel_probe.cache_file({})


def test_the_in_run_guard_judges_at_the_serving_batch(tmp_path, monkeypatch):
    # The probe's answer (cached) says nothing is slow; the threshold makes the model itself count as slow.
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    monkeypatch.delenv(FOUND_ENV, raising=False)
    monkeypatch.delenv(ONEDNN_ENV, raising=False)
    sound = {"float32_ms": None, "converted_ms": None, "slower": None}  # the probe could not tell
    kernel_probe.cache_file().parent.mkdir(parents=True, exist_ok=True)
    kernel_probe.cache_file().write_text(json.dumps({"mixed_float16": sound}))
    monkeypatch.setenv(THRESHOLD_ENV, "0.0001")
    conversion = mpconvert.convert(tiny_models.mlp(keras), "mixed_float16", pad_multiple=0, speed=False)
    found = conversion.report["slow_kernel"]["found"]
    assert (found["rows"], found["what"]) == (256, "the model, one batch of 256 rows")


@pytest.mark.full  # two conversions and a restart (55 s on 2 cores); the restart itself is tested above
def test_a_replay_restarts_as_the_conversion_it_replays_did(tmp_path):
    # Fine-tuning computes otherwise with oneDNN's rewrites on: a replay that stayed in-process on a machine
    # where the conversion restarted would not reproduce its loss history.
    env = {THRESHOLD_ENV: "0.0001"}
    data = CANCER.parent / "data" / "breast_cancer.npz"
    args = [
        "--policy",
        "mixed_float16",
        "--data",
        data,
        "--finetune-steps",
        "5",
        "--no-speed",
        "--export",
        "savedmodel",
    ]
    assert run_cli(CANCER, *args, "--out", tmp_path / "out", env=env).returncode == 0
    done = run_cli("replay", tmp_path / "out", "--out", tmp_path / "again", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert "running again with TF_ENABLE_ONEDNN_OPTS=0" in done.stderr
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    before = json.loads((tmp_path / "out" / "report.json").read_text())
    assert again["slow_kernel"]["done"].startswith("restarted with TF_ENABLE_ONEDNN_OPTS=0")
    assert again["finetune"]["history"] == before["finetune"]["history"]
