"""Dict inputs where they arrive another way: through a nested dict-input model, and as a tf.data.Dataset.

A nested Functional model called with a dict is traced and rebuilt like
the outer one; a Dataset yielding ({key: array}, {output: array}) reads
as the same arrays given from Python. A serving SavedModel knows only the
Input layers' names, so data keyed by the dict keys is refused, naming them.
"""

import json
import os
import subprocess
import sys

import dict_models as dm
import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import invoke

import mpconvert

CONVERT = ["--policy", "mixed_float16", "--export", "savedmodel,onnx"]


def nested_model():
    """inputs {"tokens", "num"} into an inner model called with {"a", "b"}: neither keys the layers' names."""
    keras.utils.set_random_seed(0)
    a = keras.Input((4,), dtype="int32", name="ia")
    b = keras.Input((6,), name="ib")
    embedded = keras.layers.Flatten()(keras.layers.Embedding(dm.VOCAB, 8)(a))
    joined = keras.layers.Concatenate()([embedded, keras.layers.Dense(16, activation="relu")(b)])
    inner = keras.Model(
        {"a": a, "b": b}, keras.layers.Dense(32, activation="relu", name="hidden")(joined), name="inner"
    )
    tokens = keras.Input((4,), dtype="int32", name="tok_ids")
    num = keras.Input((6,), name="numbers")
    label = keras.layers.Dense(3, activation="softmax", name="label")(inner({"a": tokens, "b": num}))
    model = keras.Model({"tokens": tokens, "num": num}, label, name="outer")
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy")
    d = dm.data()
    model.fit({"tokens": d["tokens"][:300], "num": d["num"][:300]}, d["label"][:300], epochs=10, verbose=0)
    return model


def test_a_nested_dict_input_model_converts_and_its_artifacts_agree(tmp_path):
    nested_model().save(tmp_path / "nested.keras")
    dm.npz(tmp_path / "by_key.npz")
    out = tmp_path / "out"
    result = invoke(tmp_path / "nested.keras", *CONVERT, "--no-speed", "--data", tmp_path / "by_key.npz", "--out", out)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["passed"] and report["fidelity"]["max_abs_diff"] <= 1e-6
    assert report["finetune"]["steps"] == 100 and abs(report["validation"]["drop"]) <= 0.02
    assert {a["kind"]: a["failed"] for a in report["artifacts"]} == {"savedmodel": False, "keras": False, "onnx": False}
    converted = keras.models.load_model(out / "model.keras")
    assert converted.get_layer("inner").get_layer("hidden").compute_dtype == "float16"
    assert converted.get_layer("label").compute_dtype == "float32"
    d = dm.data()
    predicted = np.asarray(converted({"tokens": d["tokens"][300:], "num": d["num"][300:]}, training=False))
    assert predicted.shape == (100, 3) and np.isfinite(predicted).all()


def test_datasets_of_dicts_fine_tune_and_validate_a_dict_output_model():
    model = dm.tokens_and_num(keras, names="other", outputs="dict", epochs=5)
    d = dm.data()
    train = tf.data.Dataset.from_tensor_slices(
        ({"tokens": d["tokens"][:300], "num": d["num"][:300]}, {"label": d["label"][:300], "score": d["score"][:300]})
    ).batch(32)
    # Validation inputs by Input layer name, labels for one output only.
    validation = tf.data.Dataset.from_tensor_slices(
        ({"tok_ids": d["tokens"][300:], "numbers": d["num"][300:]}, {"label": d["label"][300:]})
    ).batch(32)
    conv = mpconvert.convert(model, "mixed_float16", data=(train, validation), finetune_steps=10)
    assert conv.passed, conv.report["gate"]
    assert conv.report["finetune"]["steps"] == 10
    metrics = {o["name"]: o["metric"] for o in conv.report["validation"]["outputs"]}
    assert metrics == {"label": "accuracy", "score": None}
    assert conv.model.get_layer("trunk").compute_dtype == "float16"
    with pytest.raises(mpconvert.MpconvertError, match="have no 'num'"):
        mpconvert.convert(model, "mixed_float16", data=(None, ({"tokens": d["tokens"][300:]}, d["label"][300:])))


def test_a_serving_savedmodel_refuses_data_keyed_by_the_dict_keys_naming_its_inputs(tmp_path):
    dm.tokens_and_num(keras, names="other", epochs=2).export(tmp_path / "served", verbose=False)
    dm.npz(tmp_path / "by_key.npz")
    result = invoke(tmp_path / "served", *CONVERT, "--data", tmp_path / "by_key.npz", "--out", tmp_path / "out")
    assert result.exit_code == 1
    assert "'tokens' (did you mean 'tok_ids'?)" in result.output
    fix = next(line for line in result.output.splitlines() if line.lstrip().startswith("fix:"))
    assert "tok_ids" in fix and "numbers" in fix  # the signature's order, which the export chooses
    assert result.output.count("error:") == 1 and "fix:" in result.output and "Traceback" not in result.output


def test_a_serving_savedmodels_inputs_keep_one_order_whatever_the_hash_seed(tmp_path):
    # A loaded signature's keywords come from a protobuf map, ordered by the
    # process's string hashing: without sorting, the inputs' order (and a list
    # of inputs given from Python) changed from run to run.
    dm.tokens_and_num(keras, names="other", epochs=1).export(tmp_path / "served", verbose=False)
    script = (
        "import sys; from mpconvert.graph.freeze import load_frozen; "
        "print([s.name for s in load_frozen(sys.argv[1]).signature.inputs])"
    )
    orders = {
        subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "served")],
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout.strip()
        for seed in range(4)
    }
    assert orders == {"['numbers', 'tok_ids']"}
