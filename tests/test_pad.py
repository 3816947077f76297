"""Tensor-Core padding: which dimensions, exact numbers, and the exported ONNX graph."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import onnx
import pytest
import tensorflow as tf
import tf_keras
import tiny_models
from onnx_graph import io_dims, weight_initializers

from mpconvert.data.signature import generate_inputs, signature_of
from mpconvert.keras.frameworks import KERAS3, TF_KERAS
from mpconvert.keras.pad import pad, plan_model_padding
from mpconvert.keras.rewrite import rewrite
from mpconvert.onnx.export import keras_to_onnx
from mpconvert.options.pad import PadOptions
from mpconvert.options.precision import Precision
from mpconvert.options.rewrite import RewriteOptions
from mpconvert.runners.onnx import run_onnx

FRAMEWORKS = {"keras3": (keras, KERAS3), "tf_keras": (tf_keras, TF_KERAS)}


def with_batchnorm_statistics(model):
    """Non-trivial BatchNormalization statistics, so neutral padding is really tested."""
    for layer in model.layers:
        if type(layer).__name__ == "BatchNormalization":
            gamma, beta, mean, var = layer.get_weights()
            layer.set_weights([gamma * 1.5, beta + 0.1, mean + 0.2, var * 2.0])
    return model


def convert_and_pad(model, framework, policy="mixed_float16", **pad_options):
    inputs = generate_inputs(model, signature_of(model), 64, seed=0)
    converted = rewrite(model, framework, RewriteOptions(policy), [x[:2] for x in inputs]).model
    result = pad(converted, framework, PadOptions(**pad_options), inputs, Precision.of(policy))
    return converted, result, inputs


@pytest.mark.parametrize(
    "fw,policy", [("keras3", "mixed_float16"), ("keras3", "mixed_bfloat16"), ("tf_keras", "mixed_float16")]
)
def test_every_unfriendly_dimension_is_padded_and_the_function_is_unchanged(fw, policy):
    K, framework = FRAMEWORKS[fw]
    model = with_batchnorm_statistics(tiny_models.unfriendly(K))
    converted, result, inputs = convert_and_pad(model, framework, policy)
    report = result.report.to_json()
    assert [(d["layer"], d["dim"], d["from"], d["to"]) for d in report["padded"]] == [
        ("conv30", "filters", 30, 32),
        ("dense100", "units", 100, 104),
        ("features", "features", 30, 32),
        ("predictions_linear", "units", 10, 16),
    ]
    assert report["skipped"] == []
    # Multiply-adds per sample, by hand: dense100 30*100, dense64 100*64,
    # conv30 3*3*1*30 * 8*8 positions, head (4*4*30)*10 = 31480; padded:
    # 32*104 + 104*64 + 3*3*1*32*64 + (4*4*32)*16 = 36608.
    assert report["flops_overhead"] == pytest.approx(36608 / 31480 - 1, abs=1e-6)
    assert report["passed"] and report["exported"] == "padded"
    assert report["float32_max_abs_diff"] <= 1e-6
    tolerance = Precision.of(policy).pad_tolerance
    assert report["tolerance"] == {"float32": 1e-6, policy: tolerance}
    assert report["max_abs_diff"] <= tolerance
    padded = result.model
    assert tuple(padded.inputs[0].shape) == (None, 30) and tuple(padded.outputs[0].shape) == (None, 10)
    assert padded.output_names == ["predictions"]
    assert padded.get_layer("dense100").units == 104 and padded.get_layer("conv30").filters == 32
    assert padded.get_layer("predictions").dtype_policy.compute_dtype == "float32"
    assert padded.get_layer("dense100").dtype_policy.name == policy
    # the converted model itself is untouched
    assert converted.get_layer("dense100").units == 100
    np.testing.assert_allclose(
        padded.predict(inputs[0], verbose=0), converted.predict(inputs[0], verbose=0), atol=tolerance
    )


def test_padded_weight_dimensions_in_the_onnx_graph_are_multiples_of_8(tmp_path):
    model = with_batchnorm_statistics(tiny_models.unfriendly(keras))
    converted, result, inputs = convert_and_pad(model, KERAS3)
    path = tmp_path / "padded.onnx"
    keras_to_onnx(result.model, [tf.TensorSpec((None, 30), tf.float32, name="features")], path)
    proto, shapes = onnx_weight_dims(path)
    matmuls = sorted(s for s in shapes if len(s) == 2)
    convs = [s for s in shapes if len(s) == 4]
    # dense100 (32, 104), dense64 (104, 64), head (4*4*32, 16): every dimension a multiple of 8
    assert matmuls == [(32, 104), (104, 64), (512, 16)]
    assert convs == [(32, 1, 3, 3)]  # ONNX Conv weights are (out, in, kh, kw)
    assert io_dims(proto.graph.input[0]) == [None, 30] and io_dims(proto.graph.output[0]) == [None, 10]
    run = run_onnx(path, {"features": inputs[0]})
    np.testing.assert_allclose(run.outputs[0], converted.predict(inputs[0], verbose=0), atol=5e-3)


@pytest.mark.parametrize("fw", ["keras3", "tf_keras"])
def test_a_layernorm_after_dense100_is_skipped_with_its_reason(fw):
    K, framework = FRAMEWORKS[fw]
    _, result, _ = convert_and_pad(tiny_models.layernorm_after_dense(K), framework)
    assert result.report.to_json()["skipped"] == [
        {
            "layer": "dense100",
            "dim": "units",
            "from": 100,
            "reason": "feeds LayerNormalization 'ln', which normalizes across this axis",
        },
        {
            "layer": "predictions_linear",
            "dim": "units",
            "from": 4,
            "reason": "narrower than the multiple (4 < 8); padding would not pay",
        },
    ]
    assert result.model.get_layer("dense100").units == 100


def test_the_overhead_budget_takes_the_cheapest_paddings_first():
    # Costs by hand (multiply-adds): features +200, dense100 +376,
    # conv30 +1472, head +2880 over 31480; a 5% budget fits the first two.
    _, result, _ = convert_and_pad(tiny_models.unfriendly(keras), KERAS3, max_overhead=0.05)
    assert [d["layer"] for d in result.report.to_json()["padded"]] == ["dense100", "features"]
    reasons = {s["layer"]: s["reason"] for s in result.report.to_json()["skipped"]}
    assert set(reasons) == {"conv30", "predictions_linear"}
    assert all("--max-pad-overhead 0.05" in r for r in reasons.values())
    assert result.report.to_json()["flops_overhead"] <= 0.05


def test_residual_branches_are_padded_together_or_not_at_all():
    x = keras.Input((8, 8, 16), name="image")
    a = keras.layers.Conv2D(30, 3, padding="same", name="a")(x)
    b = keras.layers.Conv2D(30, 1, name="b")(x)
    s = keras.layers.Add(name="sum")([a, b])
    s = keras.layers.GlobalAveragePooling2D(name="gap")(s)
    out = keras.layers.Dense(1, name="value")(s)
    _, result, _ = convert_and_pad(keras.Model(x, out), KERAS3)
    padded = {d["layer"]: d["to"] for d in result.report.to_json()["padded"]}
    assert padded == {"a": 32, "b": 32}
    assert result.report.to_json()["float32_max_abs_diff"] <= 1e-6


@pytest.mark.parametrize("reloaded", [False, True])
def test_a_sequential_model_pads_like_its_functional_twin(tmp_path, reloaded):
    def layers():
        return [
            keras.layers.Dense(100, activation="relu", name="hidden"),
            keras.layers.Dense(10, activation="softmax", name="predictions"),
        ]

    x = keras.Input((30,), name="features")
    hidden, predictions = layers()
    functional = keras.Model(x, predictions(hidden(x)))
    sequential = keras.Sequential([keras.Input((30,), name="features"), *layers()])
    if reloaded:
        # A loaded Sequential's first layer also keeps the node of its build:
        # two live inbound nodes, one call in the model's config.
        sequential.save(tmp_path / "sequential.keras")
        sequential = keras.models.load_model(tmp_path / "sequential.keras")
    expected = plan_model_padding(functional, KERAS3, PadOptions()).padded
    assert [(d.layer, d.to) for d in expected] == [("features", 32), ("hidden", 104), ("predictions", 16)]
    assert plan_model_padding(sequential, KERAS3, PadOptions()).padded == expected


def test_other_multiples_round_up_to_that_multiple():
    _, result, _ = convert_and_pad(tiny_models.unfriendly(keras), KERAS3, multiple=16, max_overhead=1.0)
    assert {(d["layer"], d["to"]) for d in result.report.to_json()["padded"]} == {
        ("conv30", 32),
        ("dense100", 112),
        ("features", 32),
    }
    assert result.report.to_json()["skipped"] == [
        {
            "layer": "predictions_linear",
            "dim": "units",
            "from": 10,
            "reason": "narrower than the multiple (10 < 16); padding would not pay",
        }
    ]
    assert result.report.to_json()["float32_max_abs_diff"] <= 1e-6


@pytest.mark.parametrize("name", ["MobileNetV2", "EfficientNetB0"])
def test_keras_applications_pad_and_keep_their_function(name):
    model = getattr(keras.applications, name)(weights=None, input_shape=(32, 32, 3), classes=10)
    _, result, _ = convert_and_pad(model, KERAS3)
    report = result.report.to_json()
    assert report["passed"] and report["exported"] == "padded"
    assert ("predictions_linear", 16) in {(d["layer"], d["to"]) for d in report["padded"]}
    assert report["float32_max_abs_diff"] <= 1e-6
    assert any(s["dim"] == "features" for s in report["skipped"])  # 3 image channels stay
    assert tuple(result.model.outputs[0].shape) == (None, 10)


def onnx_weight_dims(path):
    proto = onnx.load(str(path))
    return proto, [tuple(w.dims) for w in weight_initializers(proto)]


@pytest.mark.parametrize("fw,policy", [("keras3", "mixed_bfloat16"), ("tf_keras", "mixed_float16")])
def test_the_cli_exports_padded_files_with_the_original_signature(tmp_path, fw, policy):
    from click.testing import CliRunner

    from mpconvert.cli import cli

    K, _ = FRAMEWORKS[fw]
    model = with_batchnorm_statistics(tiny_models.unfriendly(K))
    path = tmp_path / ("unfriendly.keras" if fw == "keras3" else "unfriendly_savedmodel")
    if fw == "keras3":
        model.save(path)
    else:
        model.save(str(path), save_format="tf")
    out = tmp_path / "out"
    result = CliRunner().invoke(cli, [str(path), "--policy", policy, "--out", str(out), "--no-speed"])
    assert result.exit_code == 0, result.output
    import json

    padding = json.loads((out / "report.json").read_text())["padding"]
    assert {d["layer"]: d["to"] for d in padding["padded"]} == {
        "conv30": 32,
        "dense100": 104,
        "features": 32,
        "predictions_linear": 16,
    }
    assert padding["exported"] == "padded" and padding["float32_max_abs_diff"] <= 1e-6
    proto, dims = onnx_weight_dims(out / "model.onnx")
    assert all(d % 8 == 0 for shape in dims for d in shape if d not in (1, 3)), dims  # 3x3 kernels, 1 input channel
    assert io_dims(proto.graph.input[0]) == [None, 30] and io_dims(proto.graph.output[0]) == [None, 10]
    serving = tf.saved_model.load(str(out / "savedmodel")).signatures["serving_default"]
    (spec,) = serving.structured_input_signature[1].values()
    (output,) = serving.structured_outputs.values()
    assert spec.shape.as_list() == [None, 30] and output.shape.as_list() == [None, 10]


def test_pad_multiple_0_turns_padding_off(tmp_path):
    from click.testing import CliRunner

    from mpconvert.cli import cli

    path = tmp_path / "unfriendly.keras"
    tiny_models.unfriendly(keras).save(path)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            str(path),
            "--policy",
            "mixed_float16",
            "--out",
            str(out),
            "--pad-multiple",
            "0",
            "--export",
            "onnx",
            "--no-speed",
        ],
    )
    assert result.exit_code == 0, result.output
    import json

    assert json.loads((out / "report.json").read_text())["padding"] is None
    _, dims = onnx_weight_dims(out / "model.onnx")
    assert (30, 100) in dims


def test_inspect_shows_what_padding_would_add(tmp_path):
    from click.testing import CliRunner

    from mpconvert.cli import cli

    path = tmp_path / "ln.keras"
    tiny_models.layernorm_after_dense(keras).save(path)
    result = CliRunner().invoke(cli, ["inspect", str(path)])
    assert result.exit_code == 0, result.output
    padding_table = result.output.split("Tensor-Core padding")[1]
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in padding_table.splitlines() if line.startswith("│ ")]
    # inspect plans padding on the rewritten model, as the conversion does:
    # the softmax is split off "predictions" into "predictions_linear"
    assert {row[0]: row[4] for row in cells} == {
        "dense100": "feeds LayerNormalization 'ln', which normalizes across this axis",
        "predictions_linear": "narrower than the multiple (4 < 8); padding would not pay",
    }
    assert [p.name for p in tmp_path.iterdir()] == ["ln.keras"]


def test_a_model_with_nothing_to_pad_says_why_and_claims_no_comparison(tmp_path):
    import json

    from conftest import invoke

    # 8 inputs and 16 hidden units: multiples of 8 already; 3 classes: too narrow for padding to pay.
    tiny_models.mlp(keras).save(tmp_path / "mlp.keras")
    x, y = tiny_models.classification_data(64, 8, 3)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    out = tmp_path / "out"
    args = ("--data", tmp_path / "data.npz", "--out", out, "--export", "savedmodel", "--finetune-steps", "0")
    result = invoke(tmp_path / "mlp.keras", "--policy", "mixed_float16", *args)
    assert result.exit_code == 0, result.output
    reason = (
        "nothing to pad: every channel dimension is a multiple of 8 already or left as it is "
        "(predictions_linear units 3: narrower than the multiple (3 < 8); padding would not pay)"
    )
    report = json.loads((out / "report.json").read_text())
    padding = report["padding"]
    assert padding["padded"] == [] and padding["reason"] == reason
    assert (padding["passed"], padding["exported"], padding["max_abs_diff"], padding["max_abs_ref"]) == (
        True,
        "unpadded",
        None,
        None,
    )
    (check,) = [c for c in report["gate"]["checks"] if c["name"] == "padding proof"]
    said = f"{reason}; nothing was compared, the unpadded model was exported"
    assert check["passed"] and check["message"] == said
    # The terminal, report.html and a re-check say the same, and none claims the models agree.
    assert f"pass padding proof: {said}" in result.output and "agree (max abs diff n/a" not in result.output
    page = (out / "report.html").read_text()
    assert "No padded model was built, so none was compared" in page and "proof passed" not in page
    again = invoke("check", out)
    assert again.exit_code == 0 and f"pass padding proof: {said}" in again.output
