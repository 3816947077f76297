"""The conversion guards itself against a broken 16-bit kernel: detects it, restarts with the fix, says so.

No CPU here need have such a kernel (the Intel Xeon with AMX and
avx512_fp16 does: a float16 Dense in tf.function took 67x float32's time),
so MPCONVERT_SLOW_KERNEL_RATIO lowers the threshold until any 16-bit model
counts as slow, and the path is the one a real finding takes.
"""

import json
import os
import subprocess

import keras
import pytest
import tiny_models
from conftest import SAMPLES, console_script

import mpconvert
from mpconvert.speed.slow_kernel import FOUND_ENV, ONEDNN_ENV, THRESHOLD_ENV

CANCER = SAMPLES / "cancer_mlp.keras"


def run_cli(*args, env=None):
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **(env or {})}
    environment.pop(FOUND_ENV, None)
    environment.pop(ONEDNN_ENV, None)
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
        assert figures["rows"] == 64 and figures["float32_ms"] > 0 and figures["converted_ms"] > 0
        assert figures["slower"] == pytest.approx(figures["converted_ms"] / figures["float32_ms"], rel=0.02)
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
