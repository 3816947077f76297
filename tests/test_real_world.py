"""Kinds of real model that failed or lost a feature (issue 11, part 4).

* An Embedding + LSTM text classifier saved by tf.keras 2.x: its
  `Input((maxlen,))` is float, so padding took the token positions for
  features and appended tokens; under bfloat16 its ONNX export failed on
  ConstantOfShape (no bfloat16 before opset 20) and threw the SavedModel away.
* A Dense(2, "sigmoid") classifier labelled with class ids.
* An autoencoder whose sigmoid output reconstructs values in [0, 1].
* An ONNX export that fails must leave the other artifacts and the report.

Small models, built and trained here with fixed seeds.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from conftest import invoke
from onnx import TensorProto, helper
from pad_nets import Net

from mpconvert.keras.pad import plan_padding
from mpconvert.onnx.repairs import insert_float32_islands
from mpconvert.options.pad import PadOptions
from mpconvert.report.gate import _padding
from mpconvert.report.sections import PaddingReport
from mpconvert.system.errors import MpconvertError

VOCAB, STEPS = 40, 10


def report_of(out):
    return json.loads((out / "report.json").read_text())


def checks_of(report):
    return {c["name"]: c for c in report["gate"]["checks"]}


def text_data(seed=0, rows=480):
    """Token sequences, zero-padded at the end; the class: more small ids (< 20) than large ones."""
    rng = np.random.default_rng(seed)
    x = rng.integers(1, VOCAB, size=(rows, STEPS))
    lengths = rng.integers(4, STEPS + 1, size=rows)
    x[np.arange(STEPS)[None, :] >= lengths[:, None]] = 0
    small, large = ((x > 0) & (x < 20)).sum(1), (x >= 20).sum(1)
    return x, (small > large).astype(np.int64)


def text_classifier(K, recurrent, float_input):
    x = K.Input((STEPS,), name="tokens", **({} if float_input else {"dtype": "int32"}))
    h = K.layers.Embedding(VOCAB, 12, mask_zero=True, name="embed")(x)
    h = recurrent(12, name="rnn")(h)
    h = K.layers.Dense(12, activation="relu", name="hidden")(h)
    out = K.layers.Dense(2, activation="softmax", name="predictions")(h)
    return K.Model(x, out, name="text")


@pytest.fixture(scope="module")
def text_models(tmp_path_factory):
    """(tf.keras .h5 LSTM with a float input, as tf.keras 2.x writes `Input((maxlen,))`; Keras 3 .keras GRU), data."""
    import keras
    import tensorflow as tf
    import tf_keras

    root = tmp_path_factory.mktemp("text")
    x, y = text_data()
    models = []
    for K, recurrent, name in ((tf_keras, tf_keras.layers.LSTM, "lstm.h5"), (keras, keras.layers.GRU, "gru.keras")):
        tf.random.set_seed(0)
        keras.utils.set_random_seed(0)
        float_input = K is tf_keras
        model = text_classifier(K, recurrent, float_input)
        model.compile(optimizer=K.optimizers.Adam(0.02), loss="sparse_categorical_crossentropy")
        model.fit(x[:320], y[:320], epochs=4, batch_size=32, verbose=0)
        model.save(root / name)
        data = root / f"{name}.npz"
        np.savez(data, x=x[320:].astype(np.float32 if float_input else np.int32), y=y[320:])
        models.append((root / name, data))
    return models


# Each model under one policy in every run (the LSTM's bfloat16 file needs the most
# repairs; 20 s a conversion here), the other two pairs with `make test-full`.
@pytest.mark.parametrize(
    "which,policy",
    [
        pytest.param(0, "mixed_bfloat16", id="mixed_bfloat16-tf_keras-lstm-h5"),
        pytest.param(1, "mixed_float16", id="mixed_float16-keras3-gru"),
        pytest.param(0, "mixed_float16", id="mixed_float16-tf_keras-lstm-h5", marks=pytest.mark.full),
        pytest.param(1, "mixed_bfloat16", id="mixed_bfloat16-keras3-gru", marks=pytest.mark.full),
    ],
)
def test_text_classifier_converts(text_models, tmp_path, which, policy):
    path, data = text_models[which]
    out = tmp_path / "out"
    # ONNX only: a tf-keras SavedModel of an LSTM takes 27 s to write here;
    # the forced-failure test below writes one.
    result = invoke(path, "--policy", policy, "--data", data, "--out", out, "--export", "onnx")
    assert result.exit_code == 0, result.output
    report = report_of(out)
    assert report["validation"]["metric"] == "accuracy" and report["validation"]["reference"] > 0.8
    padding, check = report["padding"], checks_of(report)["padding proof"]
    assert check["passed"]
    if padding["exported"] == "padded":
        assert padding["passed"] and padding["float32_max_abs_diff"] <= 1e-6
    else:
        assert padding["reason"] and "unpadded model was exported" in check["message"]
    padded = {d["layer"]: d["to"] for d in padding["padded"]}
    assert padded.get("embed") == 16 and "tokens" not in padded
    if which == 0:  # the float input: its last axis is token positions, never padded
        (tokens,) = [d for d in padding["skipped"] if d["layer"] == "tokens"]
        assert tokens["reason"] == "feeds Embedding 'embed': its last axis is token positions, not channels"
    (artifact,) = report["artifacts"]
    onnx.checker.check_model(onnx.load(out / "model.onnx"), full_check=True)
    assert not artifact["failed"] and checks_of(report)["artifact parity: onnx"]["passed"]
    if policy == "mixed_bfloat16":
        assert any("ConstantOfShape" in r for r in artifact["details"]["repairs"])
        # ONNX Runtime on an upcast copy, not onnx.reference (which mis-stacks Loop outputs)
        assert artifact["runtime"] == "onnxruntime:CPUExecutionProvider on an emulated copy"


@pytest.mark.parametrize("fmt", ["keras3", "tf_keras"])
def test_an_embedding_input_is_never_padded(fmt):
    """The plan alone: a float (25,) input feeding an Embedding holds 25 token positions, not 25 features.

    Padding it to 32 appended 7 tokens of id 0 that the LSTM read as 7 more
    steps (outputs off by 0.017 on a trained classifier, so the proof
    rejected the whole padding); the Embedding width is still padded.
    """
    net = Net(fmt)
    tokens = net.input("tokens", (25,))
    embed = net("Embedding", "embed", tokens, shape=(25, 100), input_dim=300, output_dim=100)
    lstm = net("LSTM", "lstm", embed, shape=(64,), units=64)
    plan = plan_padding(net.graph(net("Dense", "hidden", lstm, shape=(30,), units=30)), PadOptions())
    assert plan.input_pads == {} and plan.sizes == {"embed": 104, "hidden": 32}
    skipped = {d.layer: d.reason for d in plan.skipped}
    assert skipped["tokens"] == "feeds Embedding 'embed': its last axis is token positions, not channels"


def test_gate_passes_a_rejected_padding_that_was_not_exported():
    padding = {
        "multiple": 8,
        "padded": [],
        "skipped": [],
        "flops_overhead": 0.02,
        "max_abs_diff": 0.0168,
        "float32_max_abs_diff": 0.0168,
        "passed": False,
        "exported": "unpadded",
        "reason": "padding changed the outputs: float32 outputs differ by 0.0168 (> 1e-06)",
    }
    check = _padding(PaddingReport.from_json(padding))
    assert check.passed
    assert check.message == (
        "padding rejected by its proof and not used: padding changed the outputs: float32 outputs differ by 0.0168 "
        "(> 1e-06); the unpadded model was exported (max abs diff 0.0168)"
    )
    assert not _padding(
        PaddingReport.from_json({**padding, "exported": "padded"})
    ).passed  # a rejected padding that shipped fails


def test_constant_of_shape_in_a_loop_body_computes_in_float32():
    """ConstantOfShape makes its bfloat16 output from an attribute: the island must retype that too."""
    bf16 = helper.make_tensor("value", TensorProto.BFLOAT16, [1], [0])
    body = helper.make_graph(
        [
            helper.make_node("ConstantOfShape", ["shape"], ["zeros"], value=bf16),
            helper.make_node("Add", ["zeros", "state_in"], ["sum"]),
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("state_in", TensorProto.BFLOAT16, [2]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("sum", TensorProto.BFLOAT16, [2]),
        ],
    )
    graph = helper.make_graph(
        [
            helper.make_node("Cast", ["x"], ["x16"], to=TensorProto.BFLOAT16),
            helper.make_node("Loop", ["trips", "", "x16"], ["y16"], body=body),
            helper.make_node("Cast", ["y16"], ["y"], to=TensorProto.FLOAT),
        ],
        "loop",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [
            helper.make_tensor("trips", TensorProto.INT64, [], [3]),
            helper.make_tensor("shape", TensorProto.INT64, [1], [2]),
        ],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(onnx.shape_inference.InferenceError, match="ConstantOfShape"):
        onnx.checker.check_model(proto, full_check=True)
    changes = insert_float32_islands(proto)
    assert changes and "1 ConstantOfShape in float32" in changes[0]
    onnx.checker.check_model(proto, full_check=True)
    from onnx.reference import ReferenceEvaluator

    (y,) = ReferenceEvaluator(proto).run(None, {"x": np.array([1.5, -2.0], np.float32)})
    np.testing.assert_array_equal(y, [1.5, -2.0])


# --- sigmoid outputs that are not binary classifiers ----------------------------------


@pytest.fixture(scope="module")
def two_unit_sigmoid(tmp_path_factory):
    """Dense(2, "sigmoid") trained on one-hot rows, labelled with class ids (n,)."""
    import keras

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 8)).astype(np.float32)
    y = (x[:, :3].sum(1) + 0.5 * rng.standard_normal(600) > 0).astype(np.int64)
    inputs = keras.Input((8,), name="features")
    h = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(2, activation="sigmoid", name="scores")(h), name="ids")
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    model.fit(x[:400], np.eye(2)[y[:400]], epochs=10, batch_size=32, verbose=0)
    root = tmp_path_factory.mktemp("ids")
    model.save(root / "ids.keras")
    np.savez(root / "ids.npz", x=x[400:], y=y[400:], x_train=x[:400], y_train=y[:400])
    return root / "ids.keras", root / "ids.npz", model.predict(x[400:], verbose=0), y[400:]


def test_class_ids_on_a_two_unit_sigmoid_are_scored_by_argmax(two_unit_sigmoid, tmp_path):
    path, data, float32_scores, labels = two_unit_sigmoid
    out = tmp_path / "out"
    result = invoke(
        path,
        "--policy",
        "mixed_bfloat16",
        "--data",
        data,
        "--out",
        out,
        "--export",
        "savedmodel",
        "--finetune-steps",
        "30",
    )
    assert result.exit_code == 0, result.output
    v = report_of(out)["validation"]
    by_hand = float(np.mean(float32_scores.argmax(1) == labels))
    assert v["metric"] == "accuracy" and v["reference"] == pytest.approx(by_hand, abs=1e-9) and by_hand > 0.85
    # agreement and harm by the same argmax: decisive rows are those whose two
    # scores differ by more than bfloat16's 2^-7, right ones those whose argmax is the label
    decisive = np.abs(float32_scores[:, 0] - float32_scores[:, 1]) > 2.0**-7
    right = float32_scores.argmax(1) == labels
    assert (v["agreement_rows"], v["kept_correct_rows"]) == (decisive.sum(), (decisive & right).sum())
    assert v["harmed"] == 0 and v["note"] is None
    tuning = report_of(out)["finetune"]
    # one-hot ids against binary cross-entropy (the saved loss); the better weights are kept
    assert tuning["healthy"] and tuning["loss_function"] == "binary_crossentropy (saved with the model)"
    assert tuning["metric_after"] >= tuning["metric_before"] - 0.02 and v["converted"] >= v["reference"] - 0.01


def test_fine_tuning_class_ids_on_a_sigmoid_compares_one_hot_rows():
    from mpconvert.data.rows import Task
    from mpconvert.data.signature import TensorSpec
    from mpconvert.keras.finetune import training_labels

    task = Task("sigmoid", TensorSpec("scores", (None, 3), "float32"))
    ids = np.array([2, 0, 1])
    one_hot = training_labels(task, ids, "binary_crossentropy (default for a sigmoid output)")
    np.testing.assert_array_equal(one_hot, [[0, 0, 1], [1, 0, 0], [0, 1, 0]])
    assert training_labels(task, ids, "sparse_categorical_crossentropy (--loss)") is ids
    multi_label = np.array([[1, 0, 1], [0, 0, 0], [1, 1, 1]], np.float32)
    assert training_labels(task, multi_label, "binary_crossentropy") is multi_label


@pytest.fixture(scope="module")
def autoencoder(tmp_path_factory):
    """A sigmoid output reconstructing 16 values in [0, 1] through a bottleneck of 4."""
    import keras

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(1)
    codes = rng.random((500, 4)).astype(np.float32)
    x = 1 / (1 + np.exp(-(codes @ rng.standard_normal((4, 16)).astype(np.float32))))
    inputs = keras.Input((16,), name="pixels")
    h = keras.layers.Dense(8, activation="relu", name="encoder")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(16, activation="sigmoid", name="decoder")(h), name="autoencoder")
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy")
    model.fit(x[:400], x[:400], epochs=20, batch_size=32, verbose=0)
    root = tmp_path_factory.mktemp("autoencoder")
    model.save(root / "ae.keras")
    np.savez(root / "ae.npz", x=x[400:], y=x[400:])
    mse = float(np.mean((model.predict(x[400:], verbose=0) - x[400:]) ** 2))
    return root / "ae.keras", root / "ae.npz", mse


@pytest.mark.parametrize("metric", [(), ("--metric", "mse")], ids=["automatic", "--metric mse"])
def test_an_autoencoder_with_a_sigmoid_output_is_scored_by_mse(autoencoder, tmp_path, metric):
    path, data, mse = autoencoder
    out = tmp_path / "out"
    result = invoke(path, "--policy", "mixed_float16", "--data", data, "--out", out, "--export", "savedmodel", *metric)
    assert result.exit_code == 0, result.output
    report = report_of(out)
    v = report["validation"]
    assert v["metric"] == "mse" and v["reference"] == pytest.approx(mse, rel=1e-4) and v["drop"] < 1e-3
    assert v["agreement"] is None and "agreement" not in checks_of(report)
    assert v["note"] == (
        "the targets of sigmoid output 'decoder' are in [0, 1] but not all 0/1 (reconstructions or probabilities): "
        "scored by mse, with no agreement check (there is no class to agree on)"
    )


def test_accuracy_on_reconstruction_targets_is_refused(autoencoder, tmp_path):
    path, data, _ = autoencoder
    result = invoke(
        path, "--policy", "mixed_float16", "--data", data, "--out", tmp_path / "out", "--metric", "accuracy"
    )
    assert result.exit_code == 1
    assert "--metric accuracy needs 0/1 labels or class ids" in result.output and "--metric mse" in result.output


# --- one artifact failing keeps the others --------------------------------------------


def test_a_failed_onnx_export_keeps_the_savedmodel_and_the_report(two_unit_sigmoid, tmp_path, monkeypatch):
    import mpconvert.onnx.export

    def fails(*args, **kwargs):
        raise MpconvertError(
            "the converted ONNX graph is invalid: made up for the test", hint="use --export savedmodel"
        )

    monkeypatch.setattr(mpconvert.onnx.export, "keras_to_onnx", fails)
    path, data, _, _ = two_unit_sigmoid
    out = tmp_path / "out"
    result = invoke(path, "--policy", "mixed_float16", "--data", data, "--out", out, "--finetune-steps", "0")
    assert result.exit_code == 3, result.output
    assert (out / "savedmodel" / "saved_model.pb").is_file() and (out / "model.keras").is_file()
    assert not (out / "model.onnx").exists()
    report = report_of(out)
    reason = "the converted ONNX graph is invalid: made up for the test; fix: use --export savedmodel"
    onnx_artifact = {a["kind"]: a for a in report["artifacts"]}["onnx"]
    assert onnx_artifact == {
        "kind": "onnx",
        "path": None,
        "bytes": 0,
        "max_abs_diff": None,
        "max_abs_ref": onnx_artifact["max_abs_ref"],
        "runtime": None,
        "details": {"error": reason},
        "failed": True,
        "reason": reason,
        "exportable": True,  # a failure, not a model ONNX cannot express
        "outputs": None,
        "sha256": None,  # nothing was written to hash
        "batches": None,  # nothing to run at other batch sizes
        "rows": None,  # no rows compared
        "external_data": None,  # no file beside it
    }
    checks = checks_of(report)
    assert not checks["artifact parity: onnx"]["passed"]
    assert checks["artifact parity: onnx"]["message"] == f"onnx export failed: {reason}"
    assert checks["artifact parity: savedmodel"]["passed"] and checks["artifact parity: keras"]["passed"]
    assert [c["name"] for c in report["gate"]["checks"] if not c["passed"]] == ["artifact parity: onnx"]
    assert "onnx export failed" in result.output


def test_an_export_bug_still_stops_the_run(two_unit_sigmoid, tmp_path, monkeypatch):
    """Only an MpconvertError is the artifact's failure; anything else is mpconvert's bug: exit 1, nothing written."""
    import mpconvert.onnx.export

    def crashes(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(mpconvert.onnx.export, "keras_to_onnx", crashes)
    path, data, _, _ = two_unit_sigmoid
    out = tmp_path / "out"
    result = invoke(
        path, "--policy", "mixed_float16", "--data", data, "--out", out, "--finetune-steps", "0", "--export", "onnx"
    )
    assert result.exit_code == 1 and "conversion failed unexpectedly: RuntimeError: a bug" in result.output
    assert not out.exists()
