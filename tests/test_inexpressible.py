"""Ops a format cannot express: one rule for ONNX (hashes, crosses, regular expressions), and LiteRT's tables.

A FeatureSpace with a crossed feature (SparseCross, a FarmHash of the crossed values) has its ONNX file
refused, naming the op and the layer, while the SavedModel serves it (exit 0); asked for ONNX alone, the
run has nothing to serve (exit 3). An IntegerLookup's int64 -> int64 table has no LiteRT builtin: the
.tflite is refused naming the layer and that cause, not another model's.
"""

import json

import crossed_models as cm
import numpy as np
import pytest
import tensorflow as tf
from conftest import invoke

from mpconvert.errors import NotExportable
from mpconvert.onnx.checks import refuse_inexpressible
from mpconvert.onnx.graphdef import computing_nodes

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
    result = invoke(model, *FAST, "--data", data, "--out", out, "--export", "savedmodel,onnx")
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


def test_a_crossed_feature_with_onnx_alone_fails_with_the_reason(tmp_path, crossed):
    model, data = crossed
    out = tmp_path / "out"
    result = invoke(model, *FAST, "--data", data, "--out", out, "--export", "onnx")
    assert result.exit_code == 3, result.output
    check = next(c for c in _report(out)["gate"]["checks"] if c["name"] == "artifact parity: onnx")
    assert not check["passed"] and "layer 'sex_X_cp' (SparseCross)" in check["message"]
    assert "no other file serves the model: add --export savedmodel" in check["message"]


def test_an_integer_lookup_is_refused_by_litert_naming_the_layer_and_its_table(tmp_path):
    model = cm.int_lookup(tmp_path / "lookup.keras")
    out = tmp_path / "out"
    data = cm.int_lookup_npz(tmp_path / "lookup.npz")
    result = invoke(model, *FAST, "--data", data, "--out", out, "--export", "litert")
    # Nothing else was asked for, so nothing serves the model.
    assert result.exit_code == 3, result.output
    litert = next(a for a in _report(out)["artifacts"] if a["kind"] == "litert")
    assert litert["exportable"] is False and not (out / "model.tflite").exists()
    reason = litert["reason"]
    assert "not exportable to LiteRT: layer 'id_lookup' (LookupTableFindV2): an int64 -> int64 lookup table" in reason
    assert "Flex delegate" in reason and "StringLookup" in reason
    assert "LSTM" not in reason and "TensorList" not in reason  # another model's cause


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
