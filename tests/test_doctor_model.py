"""`mpconvert doctor MODEL` keeps its budget and never counts a broken kernel as 0.00x.

No CPU here need have a broken kernel (the Intel Xeon with AMX and
avx512_fp16 does: one float16 batch of a Dense(4096)x2 model took 77 s, and
the doctor ran to 158 s against its 60 s budget), so the `broken_kernel`
fixture stands in for one (tests/broken_kernels.py): the kernel probe's
cached answer says mixed_float16 takes 100x float32's time with oneDNN's
rewrites on, and the model holds a custom layer (`--import broken_kernels`)
that hangs in float16 with them on, in the doctor's timing child too.
"""

import json
import os
import subprocess

import keras
import tiny_models
from conftest import console_script, invoke

from mpconvert.speed.kernel_probe import ONEDNN_ENV
from mpconvert.speed.slow_kernel import FOUND_ENV, THRESHOLD_ENV


def doctor(model, *args, env):
    environment = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", **env}
    for name in (FOUND_ENV, ONEDNN_ENV, THRESHOLD_ENV):
        environment.pop(name, None) if name not in env else None
    done = subprocess.run(
        [console_script(), "doctor", str(model), "--json", "--speed-batch", "32", *map(str, args)],
        capture_output=True,
        text=True,
        env=environment,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_policy_the_probe_finds_broken_is_cut_short_and_timed_with_the_fix(tmp_path, broken_kernel):
    broken_kernel.probe_finds()
    found = doctor(broken_kernel.model(tmp_path), *broken_kernel.imports, env=broken_kernel.env)
    fp16, bf16 = found["policies"]["mixed_float16"], found["policies"]["mixed_bfloat16"]
    assert fp16["cut_short"] is True and fp16["ms"] is None and fp16["speedup"] is None  # never 0.00x
    assert fp16["note"].startswith("cut short: a broken kernel (the kernel probe")
    fix = fp16["with_fix"]
    assert fix["setting"].startswith("TF_ENABLE_ONEDNN_OPTS=0")
    assert fix["ms"] > 0 and fix["float32_ms"] > 0
    assert abs(fix["speedup"] - fix["float32_ms"] / fix["ms"]) < 1e-2 * fix["speedup"]
    assert bf16["cut_short"] is False and bf16["ms"] > 0  # the other policy is still timed
    assert found["kernel_probe"]["mixed_float16"]["slower"] >= 8
    assert "mixed_float16 cut short: a broken kernel" in found["cut_short"]
    assert "0.00x" not in found["recommendation"]


def test_the_budget_holds_when_a_kernel_the_probe_missed_hangs(tmp_path, broken_kernel):
    budget = 20
    broken_kernel.probe_finds()
    found = doctor(
        broken_kernel.model(tmp_path),
        "--budget",
        budget,
        *broken_kernel.imports,
        # the probe's 100x is below this threshold: the layer's hang in the timing child is only the budget's to stop
        env={**broken_kernel.env, THRESHOLD_ENV: "1000"},
    )
    fp16 = found["policies"]["mixed_float16"]
    assert fp16["cut_short"] is True and fp16["ms"] is None
    assert "budget ran out in one call" in fp16["note"]
    assert found["policies"]["mixed_bfloat16"]["ms"] > 0  # cheapest first: timed before the hang
    # Loading (TensorFlow's import, the model) is outside the budget; a few seconds, not the hour the child hangs.
    assert found["seconds"] < budget + 60


def test_a_user_error_in_the_timing_child_reaches_the_user_as_the_main_command_says_it(tmp_path):
    model = tmp_path / "lambda.keras"
    tiny_models.lambda_model(keras).save(model)
    done = subprocess.run([console_script(), "doctor", str(model)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    error, fix = done.stderr.strip().splitlines()
    assert error == f"error: {model} contains Lambda layer(s) double, whose Python code would run while loading"
    assert fix == "  fix: only if you trust this file, pass --unsafe-deserialization"
    main = invoke(model, "--policy", "mixed_float16", "--out", tmp_path / "out")
    assert main.exit_code == 1 and main.stderr.strip().splitlines() == [error, fix]
