"""Speed, memory and the hardware doctor: structure and hand-computed numbers, never wall-clock limits.

Timings on a shared 2-core machine are noise at this size, so the tests
check what a report promises (keys, positivity, ratio = float32_ms /
converted_ms), the memory arithmetic by hand, the gate's logic on
hand-written reports, and the warnings and recommendation on faked
hardware facts.
"""

import importlib
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np
import pytest
import tiny_models
from click.testing import CliRunner
from junitparser import JUnitXml
from reports import make_report, stored, thresholds, typed, write

from mpconvert.cli import cli
from mpconvert.commands import doctor
from mpconvert.keras.activation_memory import COMPUTED, activation_bytes, activation_memory
from mpconvert.options.gate import GateOptions, Thresholds
from mpconvert.options.precision import POLICIES
from mpconvert.render import markdown, render_summary, speed_line, write_junit
from mpconvert.report.doctor import Bench, Timed
from mpconvert.report.gate import SPEED, evaluate
from mpconvert.report.sections.speed import Latency
from mpconvert.speed import (
    Gpu,
    Hardware,
    PathSpeed,
    Speed,
    fast_units,
    measure_speed,
    read_cpu,
    warning_for,
)
from mpconvert.system.errors import MpconvertError

ROWS = 100
BATCH = 64


# --- tiny models ------------------------------------------------------------------


def dense(K):
    """Input(8) -> Dense(16) -> Dense(4): the model whose memory is computed by hand below."""
    x = K.Input((8,), name="features")
    h = K.layers.Dense(16, activation="relu", name="hidden")(x)
    return K.Model(x, K.layers.Dense(4, name="out")(h), name="dense")


def timed_pairs(original, model, paths=("keras", "savedmodel")):
    """Each speed path's (float32 runner, converted runner), as a Keras model's kind gives them."""
    from mpconvert.runners.keras import KerasRunner

    return {path: (KerasRunner(original, path=path), KerasRunner(model, path=path)) for path in paths}


def converted(K, policy):
    from mpconvert.keras.frameworks import KERAS3, TF_KERAS
    from mpconvert.keras.rewrite import rewrite
    from mpconvert.options.rewrite import RewriteOptions

    original = dense(K)
    framework = KERAS3 if K.__name__ == "keras" else TF_KERAS
    rows = np.random.default_rng(0).standard_normal((ROWS, 8)).astype(np.float32)
    return original, rewrite(original, framework, RewriteOptions(policy), [rows[:2]]).model, rows


@pytest.fixture(scope="module", params=["keras", "tf_keras"])
def K(request):
    return importlib.import_module(request.param)


# --- measure_speed ------------------------------------------------------------------


def test_speed_of_both_paths_has_its_numbers_and_an_exact_ratio(K):
    original, model, rows = converted(K, "mixed_bfloat16")
    memory = lambda feeds: activation_memory(original, model, BATCH)  # noqa: E731
    speed = measure_speed(timed_pairs(original, model), [rows], batch=BATCH, memory=memory, repeats=3, budget_s=0.1)
    found = speed.as_dict()
    assert set(found) == {"device", "batch", "rows", "paths", "memory", "summary"}
    assert found["device"].startswith(("CPU: ", "GPU: ", "TPU"))
    assert (found["batch"], found["rows"]) == (BATCH, ROWS)
    assert set(found["paths"]) == {"keras", "savedmodel"}
    for path in found["paths"].values():
        assert path["float32_ms"] > 0 and path["converted_ms"] > 0
        assert path["ratio"] == path["float32_ms"] / path["converted_ms"]
        assert path["runtime"] == "tensorflow" and path["note"] is None
    assert f"batch {BATCH} of {ROWS} validation rows" in found["summary"]
    assert "above 1 is faster" in found["summary"]
    json.dumps(found, allow_nan=False)  # fits report.json
    for path in found["paths"].values():
        for side in ("float32", "converted"):
            latency = path["latency"][side]
            calls = latency["calls_ms"]
            assert latency["batch"] == BATCH and latency["calls"] == len(calls) >= 3
            # The median the ratio is taken of is the calls' p50.
            assert path[f"{side}_ms"] == pytest.approx(latency["p50_ms"], abs=1e-3)
            assert latency["p50_ms"] <= latency["p90_ms"] <= latency["p99_ms"] <= max(calls)
    assert "the converted model at batch" in found["summary"] and "rows/s" in found["summary"]


def test_latency_percentiles_and_throughput_by_hand():
    # Four calls of 1, 2, 3 and 4 ms at 8 rows: linear percentiles p50 = 2.5, p90 = 3.7, p99 = 3.97;
    # 32 rows in 10 ms is 3200 rows/s.
    latency = Latency.of([4.0, 1.0, 3.0, 2.0], batch=8)
    found = latency.to_json()
    assert (found["p50_ms"], found["p90_ms"], found["p99_ms"]) == (2.5, 3.7, 3.97)
    assert found["rows_per_s"] == 3200.0 and found["calls"] == 4
    assert Latency.from_json(json.loads(json.dumps(found))) == latency
    assert Latency.of([], batch=8).to_json()["p99_ms"] is None


def test_speed_batch_is_generated_from_the_inputs_shapes_when_the_data_has_fewer_rows(K):
    # Timing at the data's 20 rows would say little about a serving batch: rows are generated up to it.
    original, model, rows = converted(K, "mixed_float16")
    speed = measure_speed(timed_pairs(original, model, ("keras",)), [rows[:20]], batch=48, repeats=3, budget_s=0.1)
    assert (speed.batch, speed.rows, list(speed.paths), speed.memory) == (48, 20, ["keras"], None)
    assert "batch 48, the data's 20 rows repeated" in speed.summary
    exact = measure_speed(timed_pairs(original, model, ("keras",)), [rows[:20]], batch=20, repeats=3)
    assert "batch 20 of all 20 validation rows" in exact.summary


def test_an_unknown_path_is_refused():
    import keras

    original, model, rows = converted(keras, "mixed_float16")
    with pytest.raises(ValueError, match="unknown speed path 'tflite'"):
        measure_speed(timed_pairs(original, model, ("tflite",)), [rows])


def test_speed_round_trips_and_takes_a_later_path():
    speed = Speed("CPU: test", 256, 450, {"keras": PathSpeed(10.0, 8.0, "tensorflow")})
    again = Speed.from_dict(json.loads(json.dumps(speed.as_dict())))
    assert again == speed
    onnx = PathSpeed(12.0, None, "onnxruntime:CPUExecutionProvider", "model.onnx does not run as written")
    more = speed.with_path("onnx", onnx)
    assert list(more.paths) == ["keras", "onnx"] and list(speed.paths) == ["keras"]  # the original is unchanged
    assert more.as_dict()["paths"]["onnx"]["ratio"] is None
    assert more.summary.startswith("keras 1.25x as fast as float32")
    assert "onnx not timed: model.onnx does not run as written" in more.summary


# --- activation memory, by hand -----------------------------------------------------


def test_activation_memory_is_computed_from_output_shapes_and_dtypes(K):
    original, model, _ = converted(K, "mixed_float16")
    batch = 64
    # Inputs do not count. float32: hidden 16 + output 4 values per row, 4 bytes each.
    float32_bytes = batch * (16 + 4) * 4  # 5120
    # Converted: hidden in float16 (2 bytes); the model output stays float32.
    converted_bytes = batch * (16 * 2 + 4 * 4)  # 3072
    found = activation_memory(original, model, batch)
    assert found.to_json() == {
        "batch": batch,
        "float32_bytes": float32_bytes,
        "converted_bytes": converted_bytes,
        "ratio": converted_bytes / float32_bytes,  # 0.6
        "method": COMPUTED,
        "unknown_layers": [],
    }


def test_a_shared_layer_counts_once_per_call(K):
    x = K.Input((8,), name="features")
    shared = K.layers.Dense(8, name="shared")
    model = K.Model(x, shared(shared(x)))
    assert activation_bytes(model, 3) == (2 * 3 * 8 * 4, [])  # two calls of 8 float32 values per row


def test_a_dynamic_dimension_is_listed_not_guessed():
    import keras

    x = keras.Input((None, 8), name="tokens")
    h = keras.layers.Dense(16, name="per_step")(x)
    model = keras.Model(x, keras.layers.GlobalAveragePooling1D(name="pool")(h))
    total, unknown = activation_bytes(model, 2)
    assert unknown == ["per_step"] and total == 2 * 16 * 4  # only the pooled output has a known size


# --- ONNX (--bench-onnx) --------------------------------------------------------------


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_onnx_speed_times_the_file_against_a_float32_export(tmp_path, policy):
    import keras

    from mpconvert.data.formats import ModelFormat
    from mpconvert.data.signature import signature_of
    from mpconvert.keras.frameworks import KERAS3
    from mpconvert.keras.kind import KerasKind
    from mpconvert.keras.load import Loaded
    from mpconvert.onnx.export import keras_to_onnx
    from mpconvert.pipeline import bench_onnx
    from mpconvert.runners.keras import input_specs
    from mpconvert.runners.onnx import cuda_usable

    original, model, rows = converted(keras, policy)
    path = tmp_path / "model.onnx"
    keras_to_onnx(model, input_specs(signature_of(model)), path)
    timing = bench_onnx(KerasKind(Loaded(original, KERAS3, ModelFormat.OBJECT, False)), path, [rows], BATCH, 17)
    assert timing.float32_ms > 0 and timing.runtime.startswith("onnxruntime:")
    assert list(tmp_path.iterdir()) == [path]  # the float32 export was temporary
    if policy == "mixed_bfloat16" and not cuda_usable():
        # The CPU provider has no bfloat16 MatMul: said, not timed on an emulated copy.
        assert timing.converted_ms is None and timing.ratio is None
        assert "model.onnx does not run as written on onnxruntime:CPUExecutionProvider" in timing.note
    else:
        assert timing.converted_ms > 0 and timing.ratio == timing.float32_ms / timing.converted_ms


# --- hardware facts and warnings --------------------------------------------------------

PLAIN_CPU = Hardware("AMD EPYC", ())
BF16_CPU = Hardware("AMD EPYC 9454", ("avx512f", "avx512_bf16"))
SAPPHIRE_RAPIDS = Hardware("Intel Xeon", ("avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"))


def gpu_machine(cc):
    return Hardware("host", (), (Gpu("Tesla P100" if cc and cc < (7, 0) else "A GPU", cc),))


@pytest.mark.parametrize(
    "hardware,policy,needle",
    [
        (PLAIN_CPU, "mixed_float16", "no float16 units on this CPU: neither avx512_fp16 nor amx_fp16"),
        (PLAIN_CPU, "mixed_bfloat16", "no bfloat16 units on this CPU: neither avx512_bf16 nor amx_bf16"),
        (BF16_CPU, "mixed_float16", "no float16 units on this CPU"),
        (BF16_CPU, "mixed_bfloat16", None),
        (SAPPHIRE_RAPIDS, "mixed_float16", None),
        (
            gpu_machine((6, 1)),
            "mixed_float16",
            "no float16 Tensor Cores on Tesla P100: compute capability 6.1, they need 7.0",
        ),
        (gpu_machine((7, 5)), "mixed_float16", None),
        (gpu_machine((7, 5)), "mixed_bfloat16", "compute capability 7.5, they need 8.0"),
        (gpu_machine((8, 0)), "mixed_bfloat16", None),
        (gpu_machine(None), "mixed_float16", None),  # unknown: no warning on a guess
        (Hardware("host", (), (), tpus=8), "mixed_float16", "TPUs have no float16 units"),
        (Hardware("host", (), (), tpus=8), "mixed_bfloat16", None),
    ],
)
def test_warning_for_a_policy_on_faked_hardware(hardware, policy, needle):
    warning = warning_for(policy, hardware)
    if needle is None:
        assert warning is None
    else:
        assert warning.startswith(f"{policy} may run slower than float32 here (") and needle in warning
        assert "\n" not in warning and "mpconvert doctor" in warning


def test_warning_for_an_unknown_policy_names_the_valid_ones():
    with pytest.raises(MpconvertError, match="unknown policy 'float8'"):
        warning_for("float8", PLAIN_CPU)


def test_the_device_says_where_tensorflow_runs():
    assert PLAIN_CPU.device == "CPU: AMD EPYC"
    assert gpu_machine((9, 0)).device == "GPU: A GPU"
    assert gpu_machine((9, 0)).as_dict()["gpus"] == [
        {"name": "A GPU", "compute_capability": "9.0", "float16_tensor_cores": True, "bfloat16_tensor_cores": True}
    ]
    assert fast_units(gpu_machine((9, 0)), "bfloat16") == (
        True,
        "bfloat16 Tensor Cores on A GPU (compute capability 9.0)",
    )


def test_cpu_features_are_read_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: AMD EPYC 9454 48-Core Processor\n"
        "flags\t\t: fpu avx2 avx512f avx512_bf16 avx512vl\n\nprocessor\t: 1\nmodel name\t: AMD EPYC 9454 48-Core Processor\n"
    )
    assert read_cpu(cpuinfo) == ("AMD EPYC 9454 48-Core Processor", ("avx512f", "avx512_bf16"))
    assert read_cpu(tmp_path / "missing")[1] == ()


# --- the doctor ---------------------------------------------------------------------------


def layers(float16, bfloat16):
    """A layer benchmark with these (dense, conv) speed-ups over float32; None: no kernel."""

    def entry(speedup):
        if speedup is None:
            return Timed(None, None, "not supported: no kernel")
        return Timed(10.0 / speedup, speedup, None)

    return {
        case: Bench(
            f"a {case} layer",
            {"float32": entry(1.0), "mixed_float16": entry(float16[i]), "mixed_bfloat16": entry(bfloat16[i])},
        )
        for i, case in enumerate(("dense", "conv"))
    }


def test_the_doctor_recommends_the_policy_measured_faster_on_layers():
    found = doctor.recommend(BF16_CPU, layers(float16=(0.5, 0.8), bfloat16=(1.7, 1.2)))
    assert found.policy == "mixed_bfloat16"
    assert found.lines[0] == (
        "mixed_bfloat16: dense 1.70x, conv 1.20x of float32's speed (geometric mean 1.43x) "
        "for Keras layers in tf.function here (CPU: AMD EPYC 9454)"
    )
    assert found.lines[1] == (
        "mixed_float16 will not pay here: dense 0.50x, conv 0.80x of float32's speed "
        "(no float16 units on this CPU: neither avx512_fp16 nor amx_fp16)"
    )
    assert found.policies["mixed_bfloat16"].speedup == pytest.approx((1.7 * 1.2) ** 0.5, abs=1e-3)
    assert found.policies["mixed_float16"].pays is False


def test_the_doctor_keeps_float32_when_nothing_pays():
    found = doctor.recommend(PLAIN_CPU, layers(float16=(0.6, 0.9), bfloat16=(1.05, 1.0)))
    assert found.policy is None
    assert found.lines[0].startswith("keep float32 here: neither policy is at least 1.1x as fast as float32")
    assert all(any(p in line for line in found.lines) for p in POLICIES)  # each policy is named with its numbers


def test_the_doctor_says_not_supported_for_a_missing_kernel():
    found = doctor.recommend(PLAIN_CPU, layers(float16=(2.0, 2.0), bfloat16=(None, None)))
    assert found.policy == "mixed_float16"
    assert "mixed_bfloat16 will not pay here: dense not supported, conv not supported" in found.lines[1]
    # A policy that runs the Dense fast but has no conv kernel does not pay.
    partial = doctor.recommend(PLAIN_CPU, layers(float16=(0.5, 0.5), bfloat16=(2.0, None)))
    assert partial.policy is None and partial.policies["mixed_bfloat16"].speedup is None


def test_a_pathological_kernel_is_named_with_its_fixes_first():
    # The Xeon's figures: a float16 Dense 67x slower than float32, bfloat16 fine.
    timed = layers(float16=(1 / 67, 0.9), bfloat16=(1.3, 1.1))
    fixed = {"dense": Bench("a dense layer", {"mixed_float16": Timed(8.3, 1.2)})}
    found = doctor.explain_pathologies(timed, fixed)
    assert [(f.layer, f.policy, f.slower) for f in found] == [("dense", "mixed_float16", 67.0)]
    assert found[0].summary == (
        "mixed_float16's dense kernel is 67x slower than float32 here (a dense layer): a broken kernel, "
        "not a missing speed-up; mixed_bfloat16 runs it at 1.30x of float32's speed; "
        "with TF_ENABLE_ONEDNN_OPTS=0 mixed_float16 runs it at 1.20x"
    )
    advice = doctor.recommend(PLAIN_CPU, timed, found=found)
    assert advice.lines[0] == found[0].summary and advice.pathologies[0].onednn_off_speedup == 1.2
    assert (
        doctor.explain_pathologies(layers(float16=(0.3, 0.9), bfloat16=(1.0, 1.0)), {}) == []
    )  # 3.3x: slow, not broken


TINY_CASES = {
    "dense": (
        "Dense(16, relu), batch 8",
        lambda K: (K.Input((16,)), lambda x, dtype: K.layers.Dense(16, activation="relu", dtype=dtype)(x), 8),
    )
}


def tiny_doctor(monkeypatch):
    # Tiny shapes: the structure is the point, not the numbers.
    from mpconvert.speed import layers as layer_bench

    monkeypatch.setattr(doctor, "MATMUL", (8, 16, 16))
    monkeypatch.setattr(doctor, "CONV", (2, 8, 8, 4, 4))
    monkeypatch.setattr(layer_bench, "CASES", TINY_CASES)


def test_doctor_json_has_every_section(monkeypatch):
    tiny_doctor(monkeypatch)
    result = CliRunner().invoke(cli, ["doctor", "--json"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert set(found) == {"hardware", "onnxruntime", "versions", "benchmark", "recommendation"}
    assert set(found["hardware"]) == {"device", "cpu", "cpu_features", "gpus", "tpus"}
    assert set(found["hardware"]["cpu_features"]) == {"avx512f", "avx512_bf16", "amx_bf16", "avx512_fp16", "amx_fp16"}
    assert "CPUExecutionProvider" in found["onnxruntime"]["usable"]
    assert found["versions"]["tensorflow"] and found["versions"]["mpconvert"]
    timed = found["benchmark"]["layers"]
    assert timed["device"] == found["hardware"]["device"]
    dense = timed["dense"]
    assert dense["what"] == "Dense(16, relu), batch 8"
    assert dense["float32"]["ms"] > 0 and dense["float32"]["speedup"] == 1.0
    for policy in ("float32", *POLICIES):
        assert (dense[policy]["ms"] is None) == (dense[policy]["note"] is not None)
        assert dense[policy]["speedup"] == pytest.approx(dense["float32"]["ms"] / dense[policy]["ms"], rel=2e-3)
    cpu = found["benchmark"]["onnxruntime"]["CPUExecutionProvider"]
    assert cpu["matmul"]["float32"]["ms"] > 0
    if "CUDAExecutionProvider" not in found["onnxruntime"]["usable"]:
        assert cpu["matmul"]["bfloat16"]["note"].startswith("not supported")  # no bfloat16 MatMul on the CPU provider
    recommendation = found["recommendation"]
    assert recommendation["policy"] in (None, *POLICIES)
    assert set(recommendation["policies"]) == set(POLICIES)
    # The recommendation follows the layer timings: it names the policy whose Dense is fastest, if that pays.
    best = max(POLICIES, key=lambda p: dense[p]["speedup"] or 0)
    assert recommendation["policy"] == (best if dense[best]["speedup"] >= doctor.PAYS else None)


def test_doctor_measures_the_onednn_fix_in_a_child_process_for_a_slow_kernel(monkeypatch):
    # No pathological kernel on most machines: a threshold that flags any slower layer stands in for one.
    from mpconvert.speed import layers as layer_bench

    tiny_doctor(monkeypatch)
    monkeypatch.setattr(layer_bench, "PATHOLOGICAL", 0.01)
    found = json.loads(CliRunner().invoke(cli, ["doctor", "--json"]).stdout)["recommendation"]
    assert found["pathologies"], "a threshold of 0.01 flags every layer"
    for finding in found["pathologies"]:
        # the child process ran the real dense layer with oneDNN's rewrites off and gave a figure
        assert finding["onednn_off_speedup"] is not None and finding["onednn_off_speedup"] > 0
        assert "with TF_ENABLE_ONEDNN_OPTS=0" in finding["summary"] and finding["summary"] in found["lines"]


def test_doctor_prints_the_facts_the_tables_and_the_recommendation(monkeypatch):
    tiny_doctor(monkeypatch)
    result = CliRunner().invoke(cli, ["doctor"])
    assert result.exit_code == 0, result.output
    for needle in (
        "mpconvert doctor: TensorFlow runs on",
        "avx512_bf16",
        "ONNX Runtime providers:",
        "Keras layers in tf.function",
        "Dense(16, relu), batch 8",
        "8x16 @ 16x16",
        "recommendation:",
    ):
        assert needle in result.output


def test_doctor_model_times_the_users_model_under_each_policy(tmp_path):
    import keras

    path = tmp_path / "m.keras"
    tiny_models.mlp(keras).save(path)
    result = CliRunner().invoke(cli, ["doctor", str(path), "--json", "--speed-batch", "32"])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    assert (found["model"], found["batch"]) == (str(path), 32)
    assert set(found["policies"]) == {"float32", *POLICIES}
    for policy, entry in found["policies"].items():
        if entry["cut_short"]:  # a broken kernel on this CPU (the AMX Xeon's float16): no speed, the fix's figure
            assert entry["ms"] is None and entry["speedup"] is None and entry["with_fix"]["ms"] > 0
            assert f"{policy} cut short: a broken kernel" in found["cut_short"]
            continue
        assert entry["ms"] > 0 and entry["speedup"] == pytest.approx(
            found["policies"]["float32"]["ms"] / entry["ms"], rel=2e-3
        )
    # The IR each policy's conversion writes (--export openvino), timed against float32 in the same child.
    assert set(found["openvino"]) == set(POLICIES) and found["openvino_note"] is None
    for ir in found["openvino"].values():
        assert ir["ms"] > 0 and ir["precision"] in ("bf16", "f16", "f32")
        assert ir["speedup"] > 0 and ir["speedup"] == pytest.approx(ir["float32_ms"] / ir["ms"], rel=2e-3)
    # The line names the fastest of every figure in the JSON: the policy and the runtime.
    ways = [(ir["speedup"], p, "openvino") for p, ir in found["openvino"].items()]
    for policy in POLICIES:
        entry = found["policies"][policy]
        ways += [(s, policy, "tensorflow") for s in (entry["speedup"], (entry["with_fix"] or {}).get("speedup")) if s]
    speedup, policy, runtime = max(ways)
    said = found["recommendation"]
    if speedup >= 1.1:
        assert (found["recommended_policy"], found["recommended_runtime"]) == (policy, runtime)
        assert said.startswith(policy) and f"{speedup:.2f}x" in said.split(";")[0]
        assert ("served by OpenVINO" in said.split(";")[0]) == (runtime == "openvino")
    else:
        assert found["recommended_policy"] is None and said.startswith("keep float32")
    with pytest.MonkeyPatch.context() as hidden:  # no openvino package: the line says what would add it
        hidden.setitem(sys.modules, "openvino", None)
        result = CliRunner().invoke(cli, ["doctor", str(path), "--json", "--budget", "0.000001"])
    assert result.exit_code == 0, result.output
    short = json.loads(result.stdout)
    assert "the 1e-06 s budget ran out before mixed_" in short["cut_short"]
    assert short["policies"]["float32"]["ms"] > 0
    assert all(short["policies"][p]["ms"] is None for p in POLICIES)
    assert short["openvino"] == {} and "pip install 'mpconvert[openvino]'" in short["openvino_note"]


# --- the speed gate, on hand-written reports ---------------------------------------------------

SPEED_SECTION = {
    "device": "CPU: AMD EPYC",
    "batch": 256,
    "rows": 450,
    "paths": {
        "keras": {"float32_ms": 60.0, "converted_ms": 50.0, "ratio": 1.2, "runtime": "tensorflow", "note": None},
        "savedmodel": {"float32_ms": 52.0, "converted_ms": 32.5, "ratio": 1.6, "runtime": "tensorflow", "note": None},
    },
    "memory": {
        "batch": 256,
        "float32_bytes": 2000,
        "converted_bytes": 1000,
        "ratio": 0.5,
        "method": COMPUTED,
        "unknown_layers": [],
    },
    "summary": "...",
}


def speed_checks(speed, min_speedup):
    report = make_report(validation={"drop": 0.0})
    if speed is not None:
        report["speed"] = speed
    th = thresholds(min_speedup=min_speedup)
    return {c.name: c for c in evaluate(typed(report, th), th).checks}


@pytest.mark.parametrize(
    "min_speedup,passed", [(1.2, True), (1.6, True), (1.61, False)], ids=["loose", "exact", "tight"]
)
def test_the_speed_check_judges_the_savedmodel_path(min_speedup, passed):
    check = speed_checks(SPEED_SECTION, min_speedup)[SPEED]
    assert check.passed is passed
    assert check.values.path == "savedmodel" and check.values.ratio == 1.6
    sign = ">=" if passed else "<"
    assert check.message == (
        f"savedmodel 1.60x as fast as float32 (52 ms -> 32.5 ms, batch 256, CPU: AMD EPYC) {sign} min {min_speedup:.2f}x"
    )


def test_the_speed_check_falls_back_to_the_keras_path():
    speed = json.loads(json.dumps(SPEED_SECTION))
    speed["paths"]["savedmodel"].update(converted_ms=None, ratio=None, note="not timed")
    check = speed_checks(speed, 1.3)[SPEED]
    assert not check.passed and check.values.path == "keras"
    assert check.message.startswith("keras 1.20x as fast as float32") and check.message.endswith("< min 1.30x")


def test_the_speed_check_fails_when_speed_was_not_measured():
    check = speed_checks(None, 1.2)[SPEED]
    assert not check.passed and check.values.ratio is None
    assert check.message.startswith("speed was not measured")


def test_the_speed_check_is_off_by_default():
    assert SPEED not in speed_checks(SPEED_SECTION, None)
    assert Thresholds.defaults("mixed_float16").min_speedup is None


def test_old_thresholds_load_and_the_option_overrides_them():
    old = {k: v for k, v in thresholds().as_dict().items() if k != "min_speedup"}
    loaded = Thresholds.from_dict(old)
    assert loaded.min_speedup is None
    assert loaded.overridden(GateOptions(min_speedup=1.2)).min_speedup == 1.2
    assert thresholds(min_speedup=1.5).overridden(GateOptions()).min_speedup == 1.5  # stored value kept
    with pytest.raises(MpconvertError, match="min_speedup=0"):
        GateOptions(min_speedup=0)


def test_the_speed_check_is_a_junit_case_and_a_markdown_row(tmp_path):
    report = make_report(validation={"drop": 0.0}, speed=SPEED_SECTION)
    judged = typed(report, thresholds(min_speedup=2.0))
    write_junit(judged, tmp_path / "junit.xml")
    (suite,) = JUnitXml.fromfile(str(tmp_path / "junit.xml"))
    assert [case.name for case in suite if not case.is_passed] == [SPEED]
    text = markdown(judged)
    assert "| speed | ❌ **fail** | savedmodel 1.60x as fast as float32" in text
    assert (
        "Speed (CPU, batch 256): keras 1.20x, savedmodel 1.60x faster than float32; activations 0.50x (computed)."
        in text
    )


def test_the_summary_line_for_speed_and_memory(capsys):
    report = make_report(speed=SPEED_SECTION)
    assert speed_line(typed(report)) == (
        "speed (CPU, batch 256): keras 1.20x, savedmodel 1.60x faster than float32; activations 0.50x (computed)"
    )
    slower = json.loads(json.dumps(SPEED_SECTION))
    for path in slower["paths"].values():  # the ratio is float32_ms / converted_ms
        path["converted_ms"] = 2 * path["float32_ms"]
    slower["paths"]["onnx"] = {"float32_ms": 1.0, "converted_ms": None, "ratio": None, "runtime": "x", "note": "n"}
    assert speed_line(typed(make_report(speed=slower))).startswith(
        "speed (CPU, batch 256): keras 0.50x, savedmodel 0.50x float32's speed (slower); onnx not timed"
    )
    assert speed_line(typed(make_report())) is None
    render_summary(typed(report, thresholds()))
    assert "speed (CPU, batch 256): keras 1.20x" in capsys.readouterr().out


@pytest.mark.parametrize("min_speedup,code", [("1.2", 0), ("1.7", 3)])
def test_check_re_applies_min_speedup_from_the_report(tmp_path, min_speedup, code):
    # A drop of 0 is no change in accuracy (a stored drop its figures contradict fails the re-check).
    content = stored(make_report(validation={"converted": 0.962, "drop": 0.0}), thresholds())
    content["speed"] = SPEED_SECTION
    path = write(tmp_path / "report.json", content)
    result = CliRunner().invoke(cli, ["check", str(path), "--min-speedup", min_speedup, "--json"])
    assert result.exit_code == code, result.output
    (check,) = [c for c in json.loads(result.stdout)["gate"]["checks"] if c["name"] == SPEED]
    assert check["passed"] is (code == 0) and check["values"]["ratio"] == 1.6


def test_check_min_speedup_on_a_report_without_speed_fails(tmp_path):
    path = write(
        tmp_path / "report.json", stored(make_report(validation={"converted": 0.962, "drop": 0.0}), thresholds())
    )
    result = CliRunner().invoke(cli, ["check", str(path), "--min-speedup", "1.2"])
    assert result.exit_code == 3, result.output
    assert "FAIL speed: speed was not measured" in result.output
