"""--export litert: model.tflite with float16 weights, re-run in the LiteRT interpreter and gated like the others.

Every shape here is converted through the command line: the three sample
models (a tf-keras SavedModel, two Keras 3 files), a Conv model at graph
level (a plain SavedModel), an attention model and an LSTM. The file's
weights are checked to be float16 in the interpreter's own tensor table,
and its size against a float32 .tflite of the same float32 model.
"""

import json
from pathlib import Path

import graph_models
import numpy as np
import pytest
from conftest import SAMPLES, invoke

from mpconvert.data.signature import Signature, TensorSpec
from mpconvert.export.formats.litert import write_litert
from mpconvert.report.schema import problems
from mpconvert.runners.litert import LiteRTRunner, interpreter_class

DIGITS = SAMPLES / "data" / "digits.npz"


def made(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """(model, data) for each shape, built here or taken from the samples."""
    if name == "digits_mlp":
        return SAMPLES / "digits_mlp", DIGITS
    if name == "cancer_mlp":
        return SAMPLES / "cancer_mlp.keras", SAMPLES / "data" / "breast_cancer.npz"
    if name == "digits_cnn":
        return SAMPLES / "digits_cnn.keras", DIGITS
    if name == "graph_cnn":
        return graph_models.keras_export(tmp_path / "cnn"), graph_models.digits_npz(tmp_path / "digits.npz")
    tokens = graph_models.transformer_npz(tmp_path / "tokens.npz")
    if name == "attention":
        return graph_models.keras_attention(tmp_path / "att.keras"), tokens
    return graph_models.keras_lstm(tmp_path / "lstm.keras"), tokens


def convert(tmp_path: Path, name: str, policy: str) -> tuple[int, dict, Path]:
    model, data = made(tmp_path, name)
    out = tmp_path / "out"
    args = ["--policy", policy, "--data", data, "--out", out, "--export", "savedmodel,litert"]
    result = invoke(model, *args, "--finetune-steps", "0", "--no-speed")
    report = json.loads((out / "report.json").read_text())
    assert problems(report, "report") == []
    return result.exit_code, report, out


@pytest.fixture(scope="module")
def digits_cnn_float16(tmp_path_factory):
    """digits_cnn under mixed_float16, converted once: the parity test and verify's test read the same folder."""
    return convert(tmp_path_factory.mktemp("digits_cnn"), "digits_cnn", "mixed_float16")


def litert_of(report: dict) -> dict:
    return next(a for a in report["artifacts"] if a["kind"] == "litert")


@pytest.mark.parametrize(
    ("name", "policy"),
    [
        ("digits_mlp", "mixed_float16"),
        ("cancer_mlp", "mixed_bfloat16"),
        ("digits_cnn", "mixed_float16"),
        ("graph_cnn", "mixed_bfloat16"),
        ("attention", "mixed_float16"),
    ],
)
def test_the_tflite_file_runs_within_parity_with_float16_weights(tmp_path, request, name, policy):
    if (name, policy) == ("digits_cnn", "mixed_float16"):
        code, report, out = request.getfixturevalue("digits_cnn_float16")
    else:
        code, report, out = convert(tmp_path, name, policy)
    assert code == 0, [c["message"] for c in report["gate"]["checks"] if not c["passed"]]
    artifact = litert_of(report)
    assert artifact["path"] == "model.tflite" and (out / "model.tflite").stat().st_size == artifact["bytes"]
    assert artifact["runtime"] == "litert (CPU interpreter)" and len(artifact["sha256"]) == 64
    parity = next(c for c in report["gate"]["checks"] if c["name"] == "artifact parity: litert")
    assert parity["passed"] and artifact["max_abs_diff"] <= parity["values"]["limit"]
    assert [(b["rows"], b["error"]) for b in artifact["batches"]] == [(0, None), (1, None), (4096, None)]
    assert artifact["details"]["weights"] == "float16" and "float32" in artifact["details"]["what"]
    # The interpreter's own table: float16 weight tensors, dequantized into float32 ones at load.
    dtypes = artifact["details"]["tensor_dtypes"]
    assert dtypes.get("float16", 0) > 0 and dtypes.get("float32", 0) > 0


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
def test_an_lstm_converts_unrolled_and_serves_an_empty_request_padded(tmp_path, policy):
    code, report, out = convert(tmp_path, "lstm", policy)
    assert code == 0, [c["message"] for c in report["gate"]["checks"] if not c["passed"]]
    artifact = litert_of(report)
    parity = next(c for c in report["gate"]["checks"] if c["name"] == "artifact parity: litert")
    assert parity["passed"] and artifact["max_abs_diff"] <= parity["values"]["limit"]
    # LiteRT's UNPACK of the unrolled sequence refuses 0 rows: the file pads an empty request with a row
    # of zeros and cuts it away, so every size is served, each compared with the converted model.
    assert [(b["rows"], b["error"]) for b in artifact["batches"]] == [(0, None), (1, None), (4096, None)]
    assert "one row of zeros" in artifact["details"]["what"]
    # The interpreter itself, as a serving process would call the file.
    serving = interpreter_class()(model_path=str(out / "model.tflite")).get_signature_runner()
    [name] = serving.get_input_details()
    [key] = serving.get_output_details()
    tokens = np.load(tmp_path / "tokens.npz", allow_pickle=False)["x"].astype(np.int32)

    def run(x):
        return serving(**{name: x})[key]

    assert run(tokens[:0]).shape == (0, *run(tokens[:1]).shape[1:]) == (0, 3)
    # A padded row never leaks into a real one: each row alone is what it is in a batch of 5.
    alone = np.concatenate([run(tokens[i : i + 1]) for i in range(5)])
    np.testing.assert_allclose(alone, run(tokens[:5]), rtol=1e-5, atol=1e-6)


def test_float16_weights_halve_a_weight_heavy_file(tmp_path):
    import keras

    model = keras.models.load_model(graph_models.keras_wide(tmp_path / "wide.keras"))
    model.export(str(tmp_path / "saved"), verbose=False)
    half = write_litert(tmp_path / "saved", tmp_path / "half.tflite")
    full = write_litert(tmp_path / "saved", tmp_path / "full.tflite", float16_weights=False)
    ratio = half.path.stat().st_size / full.path.stat().st_size
    # 83k parameters: 332 kB in float32, 166 kB in float16, plus a few kB of graph.
    assert 0.45 <= ratio <= 0.55, ratio
    signature = Signature((TensorSpec("pixels", (None, 64), "float32"),), (TensorSpec("digit", (None, 10), "float32"),))
    with np.load(DIGITS, allow_pickle=False) as npz:
        x = npz["x"][:32].astype(np.float32)
    got = LiteRTRunner(half.path, signature).run([x]).outputs[0]
    want = model.predict(x, verbose=0)
    assert np.abs(got - want).max() < 1e-2  # float16 weights, float32 compute


def test_litert_is_not_written_unless_asked(tmp_path):
    out = tmp_path / "out"
    data = SAMPLES / "data" / "breast_cancer.npz"
    result = invoke(
        # The default export, without fine-tuning: only which artifacts were written is read.
        SAMPLES / "cancer_mlp.keras", "--policy", "mixed_float16", "--data", data, "--out", out, "--no-speed",
        "--finetune-steps", "0",
    )  # fmt: skip
    assert result.exit_code == 0 and not (out / "model.tflite").exists()
    kinds = [a["kind"] for a in json.loads((out / "report.json").read_text())["artifacts"]]
    assert kinds == ["savedmodel", "keras", "onnx"]


def test_verify_runs_the_tflite_file_on_the_serving_machine(digits_cnn_float16):
    code, report, out = digits_cnn_float16
    result = invoke("verify", out, "--artifacts", "litert", "--json")
    found = json.loads(result.stdout)
    assert result.exit_code == 0 and [a["kind"] for a in found["artifacts"]] == ["litert"]
    assert found["artifacts"][0]["latency"]["calls"] >= 5
