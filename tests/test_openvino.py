"""--export openvino: an OpenVINO IR folder, run in the real openvino runtime, gated, timed and verified.

Three conversions in all (each costs seconds of the suite's budget): one
model holding a Conv, an LSTM and an attention block (openvino_models.py)
under each policy; and the cancer_mlp sample to mixed_bfloat16 with the
speed stage on and this CPU's BF16 units hidden from the writer (the
capability probe replaced in this process, the only seam), which writes
and runs the f32 fallback and says so, then is verified here, where the
units are (it passes, in bf16; one flipped byte of model.bin fails it). Each IR must compute within the policy's parity tolerance, serve 0, 1
and 4096 rows, store its weights in float16 with float32 inputs and
outputs, and record (and have run) the precision hint this CPU takes.
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import numpy as np
import openvino_models
import pytest
from conftest import SAMPLES, invoke
from graph_models import transformer_npz

from mpconvert.export.formats import openvino as openvino_format
from mpconvert.render import render_summary, speed_line
from mpconvert.report.report import Report
from mpconvert.report.schema import problems
from mpconvert.report.sections.details import OpenVinoDetails, read_details
from mpconvert.runners.openvino import capabilities
from mpconvert.system.digests import digest

ov = pytest.importorskip("openvino")

POLICIES = ("mixed_float16", "mixed_bfloat16")
COMPUTE = {"mixed_float16": "f16", "mixed_bfloat16": "bf16"}
UNITS = {"f16": "FP16", "bf16": "BF16"}
FLAGS = ("--finetune-steps", "0", "--no-speed", "--export", "openvino")


def convert(model: Path, data: Path, out: Path, policy: str, *flags: str) -> tuple[int, dict]:
    result = invoke(model, "--policy", policy, "--data", data, "--out", out, *flags)
    report = json.loads((out / "report.json").read_text())
    assert problems(report, "report") == []
    return result.exit_code, report


def openvino_of(report: dict) -> dict:
    return next(a for a in report["artifacts"] if a["kind"] == "openvino")


def speed_line_of(report: dict) -> str:
    return speed_line(Report.from_json(report)) or ""


def ir_io_types(folder: Path) -> tuple[list[str], list[str]]:
    model = ov.Core().read_model(str(folder / "model.xml"))
    return [p.get_element_type().to_string() for p in model.inputs], [
        p.get_element_type().to_string() for p in model.outputs
    ]


@pytest.fixture(scope="module")
def model_and_data(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("ov-model")
    return openvino_models.conv_lstm_attention(base / "cla.keras"), transformer_npz(base / "tokens.npz")


@pytest.fixture(scope="module", params=POLICIES)
def converted(request, model_and_data, tmp_path_factory) -> tuple[str, int, dict, Path]:
    policy = request.param
    out = tmp_path_factory.mktemp(f"ov-{policy}") / "out"
    code, report = convert(*model_and_data, out, policy, *FLAGS)
    return policy, code, report, out


def test_a_conv_lstm_attention_ir_computes_within_parity_serves_every_batch_in_the_policys_precision(converted):
    policy, code, report, out = converted
    compute = COMPUTE[policy]
    # What this CPU lists decides the hint; the AMX Xeon here lists both BF16 and FP16.
    hint = compute if UNITS[compute] in capabilities("CPU") else "f32"
    assert code == 0, [c["message"] for c in report["gate"]["checks"] if not c["passed"]]
    artifact = openvino_of(report)
    parity = next(c for c in report["gate"]["checks"] if c["name"] == "artifact parity: openvino")
    assert parity["passed"] and artifact["max_abs_diff"] <= parity["values"]["limit"]
    # The policy's tolerance for the IR: rtol 2e-2 (float16) or 1e-1 (bfloat16) of the largest output.
    rtol = {"mixed_float16": 2e-2, "mixed_bfloat16": 1e-1}[policy]
    assert parity["values"]["limit"] == pytest.approx(1e-5 + rtol * artifact["max_abs_ref"], rel=1e-6)
    assert artifact["max_abs_ref"] > 0.5  # trained: its probabilities are not the near-uniform ones of random weights
    assert [(b["rows"], b["error"]) for b in artifact["batches"]] == [(0, None), (1, None), (4096, None)]
    details = artifact["details"]
    assert (details["compute"], details["precision"], details["ran_precision"]) == (compute, hint, hint)
    assert details["execution_devices"] == ["CPU"] and "fallback" not in details
    assert (details["input_names"], details["output_names"]) == (["tokens"], ["head"])
    assert artifact["runtime"] == f"openvino:CPU ({hint} on CPU)"
    # The folder as written: model.xml + model.bin, its sha256 the folder's digest, float16 weights only.
    folder = out / "openvino"
    assert sorted(p.name for p in folder.iterdir()) == ["model.bin", "model.xml"]
    assert (artifact["sha256"], artifact["bytes"]) == (digest(folder).sha256, digest(folder).bytes)
    xml = (folder / "model.xml").read_text()
    constants = set(re.findall(r'type="Const"[^>]*>\s*<data element_type="(\w+)"', xml))
    assert "f16" in constants and "bf16" not in constants
    assert f'<INFERENCE_PRECISION_HINT value="{hint}"' in xml and f'<compute value="{compute}"' in xml
    assert ir_io_types(folder) == (["i32"], ["f32"])


def test_float32_compute_drops_16bit_converts_and_widens_16bit_constants():
    from openvino import opset13 as ops

    x = ops.parameter([-1, 4], np.float32, name="x")
    weights = ops.constant(np.array([[1.5, -2.25, 3e-3, 7.0]] * 4, np.float32), dtype=ov.Type.bf16)
    y = ops.matmul(ops.convert(x, "bf16"), weights, False, False)
    model = ov.Model([ops.convert(y, "f32")], [x], "bf16 matmul")
    assert openvino_format.float32_compute(model) == "bf16"
    types = {op.get_type_name(): op.get_output_element_type(0) for op in model.get_ordered_ops()}
    assert "Convert" not in types and types["MatMul"] == ov.Type.f32 and types["Constant"] == ov.Type.f32
    # The bfloat16 constant's values, not its bits read as float16 (3e-3 is 0.00299072 in bfloat16).
    got = ov.Core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})([np.eye(4, dtype=np.float32)])[0]
    assert got[0].tolist() == pytest.approx([1.5, -2.25, 0.00299072, 7.0], rel=1e-5)
    # Nothing 16-bit: an f32 model, unchanged.
    plain = ov.Model([ops.relu(x)], [x], "f32")
    assert openvino_format.float32_compute(plain) == "f32"


def test_the_hint_falls_back_to_f32_by_name_where_the_device_lacks_the_units():
    assert openvino_format.hint_for("bf16", frozenset({"BF16", "FP32"})) == ("bf16", None)
    precision, fallback = openvino_format.hint_for("f16", frozenset({"BF16", "FP32"}))
    assert precision == "f32" and "no FP16" in fallback and "BF16, FP32" in fallback
    assert openvino_format.hint_for("f32", frozenset()) == ("f32", None)


def test_the_details_read_back_as_written_and_from_a_report_without_them():
    stored = {
        "weights": "float16",
        "compute": "bf16",
        "precision": "f32",
        "fallback": "no BF16",
        "ran_precision": "f32",
        "execution_devices": ["CPU"],
        "input_names": ["x"],
        "output_names": ["y"],
    }
    details = read_details("openvino", False, stored)
    assert isinstance(details, OpenVinoDetails) and details.execution_devices == ("CPU",)
    assert details.to_json() == stored
    assert read_details("openvino", False, {}).to_json() == {}


@pytest.fixture(scope="module")
def timed_folder(tmp_path_factory) -> tuple[int, dict, Path]:
    """cancer_mlp to mixed_bfloat16 with the speed stage on, written as on a CPU without BF16 units: the writer
    asks OpenVINO what this CPU lists, and here the answer lacks BF16 (as on an AVX2-only EPYC)."""
    out = tmp_path_factory.mktemp("ov-timed") / "out"
    data = SAMPLES / "data" / "breast_cancer.npz"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(openvino_format, "capabilities", lambda device="CPU": frozenset({"FP32", "INT8"}))
        flags = ("--finetune-steps", "0", "--export", "openvino")
        code, report = convert(SAMPLES / "cancer_mlp.keras", data, out, "mixed_bfloat16", *flags)
    return code, report, out


def test_the_speed_stage_times_the_ir_against_float32_with_percentiles(timed_folder):
    code, report, _ = timed_folder
    assert code == 0
    paths = report["speed"]["paths"]
    assert {"keras", "savedmodel", "openvino"} <= set(paths)
    timed = paths["openvino"]
    assert timed["runtime"].startswith("openvino:CPU (openvino) against float32 on tensorflow")
    assert timed["ratio"] == pytest.approx(timed["float32_ms"] / timed["converted_ms"])
    latency = timed["latency"]["converted"]
    assert len(latency["calls_ms"]) >= 3 and latency["p50_ms"] <= latency["p90_ms"] <= latency["p99_ms"]
    calls = latency["calls_ms"]
    assert latency["rows_per_s"] == pytest.approx(256 * len(calls) / (sum(calls) / 1000), rel=1e-2)
    assert "fastest here:" in speed_line_of(report)


def test_a_cpu_without_bf16_units_gets_the_f32_fallback_named(timed_folder):
    code, report, out = timed_folder
    assert code == 0, [c["message"] for c in report["gate"]["checks"] if not c["passed"]]
    artifact = openvino_of(report)
    details = artifact["details"]
    assert (details["compute"], details["precision"], details["ran_precision"]) == ("bf16", "f32", "f32")
    assert "lists no BF16" in details["fallback"] and "(FP32, INT8)" in details["fallback"]
    assert artifact["runtime"] == "openvino:CPU (f32 on CPU)"
    assert [(b["rows"], b["error"]) for b in artifact["batches"]] == [(0, None), (1, None), (4096, None)]
    xml = (out / "openvino" / "model.xml").read_text()
    assert '<INFERENCE_PRECISION_HINT value="f32"' in xml and '<compute value="bf16"' in xml
    shown = io.StringIO()
    render_summary(Report.from_json(report), shown)
    assert "openvino asks f32 (fallback): this machine's CPU lists no BF16" in " ".join(shown.getvalue().split())


def test_verify_runs_the_ir_and_fails_a_flipped_byte_in_model_bin(timed_folder):
    _, _, out = timed_folder
    result = invoke("verify", out, "--artifacts", "openvino", "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    run = next(a for a in found["artifacts"] if a["kind"] == "openvino")
    # Written where BF16 was hidden (the IR asks f32), served here, where the CPU lists BF16: run in bf16.
    hint = "bf16" if "BF16" in capabilities("CPU") else "f32"
    assert run["passed"] and run["runtime"] == f"openvino:CPU ({hint} on CPU)" and run["latency"]["p50_ms"] > 0
    assert "GPU" in invoke("verify", out, "--artifacts", "openvino", "--ov-device", "GPU").output  # none here
    weights = out / "openvino" / "model.bin"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    result = invoke("verify", out, "--artifacts", "openvino", "--json")
    assert result.exit_code == 3
    found = json.loads(result.stdout)
    hashed = next(f for f in found["files"] if f["path"] == "openvino")
    assert not hashed["passed"]
    run = next(a for a in found["artifacts"] if a["kind"] == "openvino")
    assert not run["passed"] and "not run" in run["message"]


def test_a_conversion_openvino_refuses_names_its_ops_and_reason_not_an_assertions_location():
    from mpconvert.export.formats.openvino import unconverted

    # OpenVINO 2026.4.1's text for an IntegerLookup model (its first line names no op).
    text = (
        "Check 'false' failed at src/frontends/common_translators/src/unconverted_ops_report.cpp:151:\n"
        "[TensorFlow Frontend] Internal error or incorrect input model: number of inputs to If and number of "
        "inputs in then branch do not match.\n\nSummary:\n-- Conversion is failed for: HashTableV2, If\n"
    )
    error = unconverted(text)
    assert error.message.startswith("OpenVINO cannot convert the model's HashTableV2, If ops ([TensorFlow Frontend]")
    assert "unconverted_ops_report" not in error.message and "--export savedmodel,onnx" in error.hint
    # Without the summary: the first line, as the frontend gave it.
    assert unconverted("some other failure\nmore").message == "OpenVINO cannot convert the model: some other failure"
