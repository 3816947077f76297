"""Ops a format cannot express: one rule for ONNX (hashes, crosses, regular expressions), and LiteRT's tables.

A FeatureSpace with a crossed feature (SparseCross, a FarmHash of the crossed values) has its ONNX file
refused, naming the op and the layer, while the SavedModel serves it (exit 0); asked for ONNX alone, the
run has nothing to serve (exit 3); LiteRT refuses the cross too, with its own cause's fix. An IntegerLookup's
int64 -> int64 table, which LiteRT's builtin tables do not hold, serves as two that they do.
"""

import json

import crossed_models as cm
import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import invoke

from mpconvert.data.signature import signature_of
from mpconvert.export.formats.litert import builtin_tables, write_litert
from mpconvert.onnx.graph_checks import refuse_inexpressible
from mpconvert.onnx.graphdef import computing_nodes
from mpconvert.runners.litert import LiteRTRunner
from mpconvert.system.errors import NotExportable

FAST = ["--policy", "mixed_float16", "--finetune-steps", "0", "--no-speed"]


@pytest.fixture(scope="module")
def crossed(tmp_path_factory):
    folder = tmp_path_factory.mktemp("crossed")
    return cm.crossed(folder / "crossed.keras"), cm.crossed_npz(folder / "crossed.npz")


def _report(out):
    return json.loads((out / "report.json").read_text())


def test_a_crossed_feature_refuses_the_onnx_file_naming_sparsecross_and_the_savedmodel_serves(tmp_path, crossed):
    model, data = crossed
    out = tmp_path / "out"
    result = invoke(model, *FAST, "--data", data, "--out", out, "--export", "savedmodel,onnx,litert")
    assert result.exit_code == 0, result.output
    report = _report(out)
    onnx = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    assert onnx["exportable"] is False and onnx["path"] is None and not (out / "model.onnx").exists()
    assert "not exportable to ONNX: layer 'sex_X_cp' (SparseCross)" in onnx["reason"]
    assert "FarmHash" in onnx["reason"] and "keep-float32" not in onnx["reason"]
    checks = {c["name"]: c for c in report["gate"]["checks"]}
    assert checks["artifact parity: onnx"]["passed"]
    assert checks["artifact parity: savedmodel"]["passed"]
    saved = next(a for a in report["artifacts"] if a["kind"] == "savedmodel")
    assert [(b["rows"], b["error"]) for b in saved["batches"]] == [(0, None), (1, None), (4096, None)]
    # The data holds one key per raw feature: each went in under its input's name.
    assert report["validation"]["rows"] == 200
    # LiteRT has no builtin for the cross either: refused, naming it, with its own cause's fix.
    litert = next(a for a in report["artifacts"] if a["kind"] == "litert")
    assert litert["exportable"] is False and not (out / "model.tflite").exists()
    assert "not exportable to LiteRT: layer 'sex_X_cp' (SparseCross)" in litert["reason"]
    assert "compute the crossed feature's ids before the model" in litert["reason"] and "LSTM" not in litert["reason"]
    assert checks["artifact parity: litert"]["passed"]


def test_a_crossed_feature_with_onnx_alone_fails_with_the_reason(tmp_path, crossed):
    model, data = crossed
    out = tmp_path / "out"
    result = invoke(model, *FAST, "--data", data, "--out", out, "--export", "onnx")
    assert result.exit_code == 3, result.output
    check = next(c for c in _report(out)["gate"]["checks"] if c["name"] == "artifact parity: onnx")
    assert not check["passed"] and "layer 'sex_X_cp' (SparseCross)" in check["message"]
    assert "no other file serves the model: add --export savedmodel" in check["message"]


def test_an_integer_lookup_serves_in_litert_through_two_builtin_tables(tmp_path):
    model = cm.int_lookup(tmp_path / "lookup.keras")
    out = tmp_path / "out"
    data = cm.int_lookup_npz(tmp_path / "lookup.npz")
    result = invoke(model, *FAST, "--data", data, "--out", out, "--export", "litert")
    assert result.exit_code == 0, result.output
    report = _report(out)
    litert = next(a for a in report["artifacts"] if a["kind"] == "litert")
    assert not litert["failed"] and (out / "model.tflite").is_file()
    assert litert["details"]["tables"] == ["id_lookup: int64 -> int64 as int64 -> string -> int64"]
    check = next(c for c in report["gate"]["checks"] if c["name"] == "artifact parity: litert")
    assert check["passed"] and [b["error"] for b in litert["batches"]] == [None, None, None]
    # Hand-checked ids through the written file: 3, 5, 7, 11 are ids 1..4, anything else 0.
    ids = np.array([[3], [4], [11], [0], [7], [13], [5]], np.int64)
    keras_model = keras.models.load_model(model)
    signature = signature_of(keras_model)
    got = LiteRTRunner(out / "model.tflite", signature).run([ids]).outputs[0]
    want = np.asarray(keras_model(ids))
    np.testing.assert_allclose(got, want, atol=2e-3)  # float16 weights, computed in float32
    hot = np.eye(5, dtype=np.float32)[[1, 0, 4, 0, 3, 0, 2]]
    dense = keras_model.get_layer("out")
    logits = hot @ np.asarray(dense.kernel) + np.asarray(dense.bias)
    np.testing.assert_allclose(want, np.exp(logits) / np.exp(logits).sum(1, keepdims=True), rtol=1e-5)


def test_the_two_tables_give_integer_lookup_ids_exactly(tmp_path):
    ids = keras.Input((1,), dtype="int64", name="ids")
    model = keras.Model(ids, keras.layers.IntegerLookup(vocabulary=cm.LOOKUP_VOCAB, name="id_lookup")(ids))
    assert builtin_tables(model) == ("id_lookup: int64 -> int64 as int64 -> string -> int64",)
    model.export(str(tmp_path / "saved"), verbose=False)
    written = write_litert(tmp_path / "saved", tmp_path / "ids.tflite", tables=("id_lookup",))
    x = np.array([[3], [4], [11], [0], [7], [-5], [5]], np.int64)
    got = LiteRTRunner(written.path, signature_of(model)).run([x]).outputs[0]
    np.testing.assert_array_equal(got.ravel(), [1, 0, 4, 0, 3, 0, 2])


def test_the_rule_reads_only_the_ops_the_outputs_depend_on():
    def hashed(x):
        tf.strings.to_hash_bucket_fast(tf.strings.as_string(x), 8)  # computed, never returned
        return tf.identity(x * 2.0, name="twice")

    concrete = tf.function(hashed).get_concrete_function(tf.TensorSpec((None,), tf.float32))
    graph_def = concrete.graph.as_graph_def()
    ops = {op for _, op in computing_nodes(graph_def, [t.name for t in concrete.outputs])}
    assert "Mul" in ops and "StringToHashBucketFast" not in ops
    refuse_inexpressible(computing_nodes(graph_def, [t.name for t in concrete.outputs]), lambda n: None)

    def returned(x):
        return tf.strings.to_hash_bucket_fast(tf.strings.as_string(x), 8)

    concrete = tf.function(returned).get_concrete_function(tf.TensorSpec((None,), tf.float32))
    with pytest.raises(NotExportable) as caught:
        refuse_inexpressible(computing_nodes(concrete.graph.as_graph_def(), [t.name for t in concrete.outputs]), {}.get)
    assert "(StringToHashBucketFast)" in str(caught.value) and "compute the hash before the model" in caught.value.hint
    assert np.asarray(returned(tf.constant([1.0]))).dtype == np.int64
