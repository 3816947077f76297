"""SavedModels without Keras metadata, converted at graph level: op dtypes, parity, accuracy, refusals.

The models are tests/graph_models.py's: a Keras 3 `model.export()` CNN and
transformer encoder, a tf.Module with two matmuls and a softmax, a two-input
two-output module, an overflowing one, one saved without signatures, and a
graph whose float32 edges come from ops not typed by T.
"""

import json

import graph_models as gm
import numpy as np
import pytest
import tensorflow as tf
from conftest import invoke

import mpconvert
from mpconvert.graph.freeze import load_frozen
from mpconvert.graph.rewrite import RewriteError, check_edges, rewrite_graph


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("graphs")
    return {
        "cnn": gm.keras_export(root / "cnn"),
        "cnn_data": gm.digits_npz(root / "digits8x8.npz"),
        "mlp": gm.two_matmuls(root / "mlp"),
        "two": gm.two_inputs(root / "two"),
        "overflow": gm.overflowing(root / "overflow"),
        "offset": gm.offset(root / "offset"),
        "none": gm.no_signatures(root / "none"),
    }


def report_of(folder) -> dict:
    return json.loads((folder / "report.json").read_text())


def saved_op_dtypes(folder) -> dict[str, set[str]]:
    fn = tf.saved_model.load(str(folder)).signatures["serving_default"]
    found: dict[str, set[str]] = {}
    graphs = [fn.graph.as_graph_def()]
    for graph_def in graphs:
        for node in list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]:
            if "T" in node.attr and node.attr["T"].type:
                found.setdefault(node.op, set()).add(tf.as_dtype(node.attr["T"].type).name)
    return found


@pytest.mark.parametrize("policy,dtype", [("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")])
def test_a_keras_export_converts_with_real_16bit_kernels_and_keeps_its_accuracy(models, tmp_path, policy, dtype):
    out = tmp_path / "out"
    result = invoke(models["cnn"], "--policy", policy, "--data", models["cnn_data"], "--out", out)
    assert result.exit_code == 0, result.output
    assert "graph-level: no Keras layers" in result.output
    report = report_of(out)
    rewrite = next(c for c in report["gate"]["checks"] if c["name"] == "policy rewrite")
    assert rewrite["message"].endswith(f"nodes converted to {policy}, 0 kept float32")
    assert report["source"]["format"] == "graph" and report["finetune"] is None and report["padding"] is None
    v = report["validation"]
    assert v["metric"] == "accuracy" and v["reference"] > 0.85 and v["drop"] <= 0.01
    # The saved graph computes its MatMul and Conv2D in the 16-bit type, and takes and returns float32.
    dtypes = saved_op_dtypes(out / "savedmodel")
    assert dtype in dtypes["MatMul"] and dtype in dtypes["Conv2D"] and "float32" not in dtypes["MatMul"]
    fn = tf.saved_model.load(str(out / "savedmodel")).signatures["serving_default"]
    source = tf.saved_model.load(str(models["cnn"])).signatures["serving_default"]
    # Keras names the exported input keras_tensor_N, N counting the tensors its process made: compare with it.
    (name,) = source.structured_input_signature[1]
    _, inputs = fn.structured_input_signature
    assert {k: s.dtype for k, s in inputs.items()} == {name: tf.float32}
    assert {k: s.dtype for k, s in fn.structured_outputs.items()} == {"output_0": tf.float32}
    # Both artifacts re-ran to the converted graph's outputs.
    artifacts = {a["kind"]: a for a in report["artifacts"]}
    assert set(artifacts) == {"savedmodel", "onnx"} and artifacts["savedmodel"]["max_abs_diff"] == 0.0
    assert all(c["passed"] for c in report["gate"]["checks"])


def test_a_tf_module_with_two_matmuls_keeps_softmax_and_outputs_float32(models, tmp_path):
    out = tmp_path / "out"
    result = invoke(models["mlp"], "--policy", "mixed_float16", "--out", out)
    assert result.exit_code == 0, result.output
    layers = {layer["class_name"]: layer for layer in report_of(out)["layers"]}
    assert layers["MatMul"]["policy"] == "mixed_float16"
    dtypes = saved_op_dtypes(out / "savedmodel")
    assert dtypes["Softmax"] == {"float32"} and dtypes["MatMul"] == {"float16"}


def test_keep_float32_names_a_node_or_an_op_type(models, tmp_path):
    graph = load_frozen(models["mlp"])
    first = next(n.name for n in graph.graph_def.node if n.op == "MatMul")
    out = tmp_path / "out"
    result = invoke(models["mlp"], "--policy", "mixed_float16", "--keep-float32", first, "--out", out)
    assert result.exit_code == 0, result.output
    layers = {layer["name"]: layer for layer in report_of(out)["layers"]}
    assert layers[first]["policy"] == "float32" and layers[first]["pinned"] == f"--keep-float32 {first!r}"
    assert (
        sum(1 for layer in layers.values() if layer["class_name"] == "MatMul" and layer["policy"] == "mixed_float16")
        == 1
    )
    every = invoke(models["mlp"], "--policy", "mixed_float16", "--keep-float32", "MatMul", "--out", tmp_path / "o2")
    assert every.exit_code == 3  # nothing left to convert: the policy-rewrite check fails and says so
    assert "MatMul" not in op_dtypes_of_saved(tmp_path / "o2" / "savedmodel", "float16")


def op_dtypes_of_saved(folder, dtype) -> set[str]:
    return {op for op, dtypes in saved_op_dtypes(folder).items() if dtype in dtypes}


def test_two_inputs_and_two_outputs_are_named_and_compared(models, tmp_path):
    rng = np.random.default_rng(0)
    left, right = rng.normal(size=(50, 6)).astype("float32"), rng.normal(size=(50, 3)).astype("float32")
    np.savez(tmp_path / "d.npz", left=left, right=right, y_score=rng.normal(size=(50, 1)).astype("float32"))
    out = tmp_path / "out"
    result = invoke(models["two"], "--policy", "mixed_bfloat16", "--data", tmp_path / "d.npz", "--out", out)
    assert result.exit_code == 0, result.output
    report = report_of(out)
    outputs = {o["name"]: o for o in report["validation"]["outputs"]}
    assert outputs["score"]["metric"] == "mse" and outputs["joined_mean"]["metric"] is None
    onnx = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    assert set(onnx["outputs"]) == {"joined_mean", "score"}
    fn = tf.saved_model.load(str(out / "savedmodel")).signatures["serving_default"]
    assert sorted(fn.structured_input_signature[1]) == ["left", "right"]


def test_overflowing_float16_activations_are_kept_float32_by_the_default_command(models, tmp_path):
    off = invoke(models["overflow"], "--policy", "mixed_float16", "--auto-keep", "off", "--out", tmp_path / "off")
    assert off.exit_code == 3 and "NaN/inf" in off.output
    on = invoke(models["overflow"], "--policy", "mixed_float16", "--out", tmp_path / "on")
    assert on.exit_code == 0, on.output
    report = report_of(tmp_path / "on")
    kept = {layer["name"]: layer["pinned"] for layer in report["layers"] if layer["pinned"]}
    assert any(why.startswith("numeric lint: output max") for why in kept.values())
    assert report["auto_keep"]["lint"]["kept"] and report["validation"]["nonfinite_outputs"] == 0
    assert any(layer["policy"] == "mixed_float16" for layer in report["layers"])  # not everything kept


def test_the_search_keeps_the_one_node_that_bfloat16_rounds_the_signal_away_in(models, tmp_path):
    data = gm.offset_npz(models["offset"], tmp_path / "offset.npz")
    off = invoke(
        models["offset"], "--policy", "mixed_bfloat16", "--data", data, "--auto-keep", "lint", "--out", tmp_path / "l"
    )
    assert off.exit_code == 3, off.output  # no overflow: the lint finds nothing, the accuracy gate fails
    assert report_of(tmp_path / "l")["auto_keep"]["lint"]["kept"] == []
    out = tmp_path / "s"
    result = invoke(models["offset"], "--policy", "mixed_bfloat16", "--data", data, "--out", out, "--speed")
    assert result.exit_code == 0, result.output
    report = report_of(out)
    search = report["auto_keep"]["search"]
    assert search["outcome"] == "passed" and search["trials"] >= 1
    matmuls = [layer for layer in report["layers"] if layer["class_name"] == "MatMul"]
    kept = [layer for layer in matmuls if layer["pinned"]]
    # tf.function names the matmuls in call order: MatMul is features @ w1, the one under the offset.
    assert (
        len(matmuls) == 3
        and [layer["name"].rpartition("/")[2] for layer in kept] == ["MatMul"]
        and kept[0]["pinned"].startswith("accuracy-driven search: drop")
    )
    assert search["kept"] == [kept[0]["name"]] and search["ranking"][0]["layer"] == kept[0]["name"]
    assert report["validation"]["drop"] <= 0.01
    # The other two matmuls compute in bfloat16 in the saved graph, the kept one in float32.
    assert saved_op_dtypes(out / "savedmodel")["MatMul"] == {"bfloat16", "float32"}
    # The speed stage timed what the exported SavedModel runs, against the float32 graph.
    speed = report["speed"]
    assert list(speed["paths"]) == ["savedmodel"] and speed["paths"]["savedmodel"]["ratio"] > 0
    assert report["slow_kernel"] is None


def test_refusals_name_the_problem(models, tmp_path):
    tuned = invoke(models["mlp"], "--policy", "mixed_float16", "--finetune-steps", "5", "--out", tmp_path / "t")
    assert tuned.exit_code == 1 and "cannot be fine-tuned" in tuned.stderr and "--finetune-steps 0" in tuned.stderr
    none = invoke(models["none"], "--policy", "mixed_float16", "--out", tmp_path / "n")
    assert none.exit_code == 1 and "has no signature 'serving_default': it has no signatures at all" in none.stderr
    other = invoke(models["mlp"], "--policy", "mixed_float16", "--signature", "nope", "--out", tmp_path / "s")
    assert other.exit_code == 1 and "its signatures are serving_default" in other.stderr
    assert not any((tmp_path / name).exists() for name in ("t", "n", "s"))
    inspect = invoke("inspect", models["mlp"])
    assert inspect.exit_code == 1 and "no Keras layers" in inspect.stderr


def test_the_python_api_converts_a_graph_savedmodel(models, tmp_path):
    conversion = mpconvert.convert(models["mlp"], "mixed_bfloat16")
    assert conversion.report["source"]["format"] == "graph"
    report = conversion.save(tmp_path / "api", export=("savedmodel",))
    assert report["passed"] and (tmp_path / "api" / "savedmodel" / "saved_model.pb").is_file()


def test_a_batch_converts_graph_savedmodels_beside_keras_ones(models, tmp_path):
    """Batch workers run the same graph-level path: a manifest mixing a plain SavedModel and a .keras file."""
    import subprocess

    from conftest import SAMPLES, console_script

    manifest = tmp_path / "zoo.toml"
    manifest.write_text(
        f"""
[defaults]
finetune_steps = 0
export = ["savedmodel"]
speed = false  # no timing is read here (the search test reads a graph's)

[[model]]
path = "{models["cnn"]}"
data = "{models["cnn_data"]}"
name = "exported_cnn"
policy = ["mixed_float16", "mixed_bfloat16"]

[[model]]
path = "{SAMPLES / "cancer_mlp.keras"}"
data = "{SAMPLES / "data" / "breast_cancer.npz"}"
policy = "mixed_bfloat16"
"""
    )
    out = tmp_path / "out"
    proc = subprocess.run(
        [console_script(), "batch", str(manifest), "--out", str(out), "--jobs", "2"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "batch.json").read_text())
    statuses = {m["folder"]: m["status"] for m in summary["models"]}
    assert statuses == {
        "exported_cnn/mixed_float16": "passed",
        "exported_cnn/mixed_bfloat16": "passed",
        "cancer_mlp/mixed_bfloat16": "passed",
    }
    for policy, dtype in (("mixed_float16", "float16"), ("mixed_bfloat16", "bfloat16")):
        folder = out / "exported_cnn" / policy
        assert report_of(folder)["source"]["format"] == "graph"
        assert dtype in saved_op_dtypes(folder / "savedmodel")["Conv2D"]
    cnn = next(m for m in summary["models"] if m["folder"] == "exported_cnn/mixed_bfloat16")
    assert cnn["metric"] == "accuracy" and cnn["before"] > 0.85 and cnn["drop"] <= 0.01


def test_the_slow_kernel_guard_restarts_a_graph_conversion_with_onednn_off(models, tmp_path):
    """Plain SavedModels get real float16 MatMuls, the kernels the guard is for: the same restart applies."""
    import os
    import subprocess

    from conftest import console_script

    from mpconvert.speed.slow_kernel import FOUND_ENV, ONEDNN_ENV, THRESHOLD_ENV

    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", THRESHOLD_ENV: "0.0001"}
    env.pop(FOUND_ENV, None)
    env.pop(ONEDNN_ENV, None)
    out = tmp_path / "out"
    done = subprocess.run(
        [
            console_script(),
            str(models["mlp"]),
            "--policy",
            "mixed_float16",
            "--out",
            str(out),
            "--export",
            "savedmodel",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    assert "running again with TF_ENABLE_ONEDNN_OPTS=0" in done.stderr
    found = report_of(out)["slow_kernel"]
    assert found["done"].startswith("restarted with TF_ENABLE_ONEDNN_OPTS=0")
    assert found["found"]["float32_ms"] > 0 and found["fixed"]["converted_ms"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.fixture(scope="module")
def transformer(tmp_path_factory):
    root = tmp_path_factory.mktemp("transformer")
    return gm.transformer(root / "export"), gm.transformer_npz(root / "tokens.npz")


@pytest.mark.parametrize("policy,dtype", [("mixed_bfloat16", "bfloat16"), ("mixed_float16", "float16")])
def test_an_exported_transformer_converts_with_16bit_attention_and_keeps_its_accuracy(
    transformer, tmp_path, policy, dtype
):
    """Its embedding lookup (GatherV2, typed by Tparams) feeds the 16-bit query/key/value matmuls.

    That edge once got no Cast, and the first import of the rewritten graph failed.
    """
    model, data = transformer
    out = tmp_path / "out"
    result = invoke(model, "--policy", policy, "--data", data, "--out", out)
    assert result.exit_code == 0, result.output
    report = report_of(out)
    # Allow ops: 4 BatchMatMulV2 (query, key, value, output projections), 2 Einsum (scores, weighted values),
    # the head's MatMul. Infer ops following them: a Reshape and the bias AddV2 after each of query, key and
    # value, the score scaling Mul, the output projection's Reshape and BiasAdd, the head's BiasAdd: 10.
    rewrite = next(c for c in report["gate"]["checks"] if c["name"] == "policy rewrite")
    assert rewrite["message"] == f"17 nodes converted to {policy}, 0 kept float32"
    v = report["validation"]
    # The labels are a function of the tokens without ties; the trained float32 model scored 1.0 on these rows.
    assert v["metric"] == "accuracy" and v["rows"] == 400 and v["reference"] >= 0.95
    assert v["drop"] <= report["gate"]["thresholds"]["max_drop"] == 0.01
    dtypes = saved_op_dtypes(out / "savedmodel")
    assert dtypes["BatchMatMulV2"] == {dtype} and dtypes["Einsum"] == {dtype} and dtypes["MatMul"] == {dtype}
    # Softmax and LayerNormalization's statistics stay float32; the residual add reads the float32 lookup.
    assert dtypes["Softmax"] == {"float32"} and dtypes["Mean"] == {"float32"} and dtypes["Rsqrt"] == {"float32"}
    fn = tf.saved_model.load(str(out / "savedmodel")).signatures["serving_default"]
    assert [s.dtype for s in fn.structured_input_signature[1].values()] == [tf.int32]
    checks = {c["name"]: c for c in report["gate"]["checks"]}
    assert {a["kind"] for a in report["artifacts"]} == {"savedmodel", "onnx"}
    assert checks["artifact parity: savedmodel"]["passed"] and checks["artifact parity: onnx"]["passed"]
    assert all(c["passed"] for c in checks.values()) and report["passed"]


def test_the_embedding_lookup_reaches_the_16bit_matmuls_through_one_cast(transformer):
    graph = load_frozen(transformer[0])
    (gather,) = [n.name for n in graph.graph_def.node if n.op == "GatherV2"]
    readers = {n.name: n.op for n in graph.graph_def.node if gather in n.input}
    assert sorted(readers.values()) == ["AddV2", "BatchMatMulV2", "BatchMatMulV2", "BatchMatMulV2"]
    rewritten, _ = rewrite_graph(graph.graph_def, graph.output_tensors, "bfloat16")
    nodes = {n.name: n for n in rewritten.node}
    cast = nodes[f"{gather}/mpconvert_cast_bfloat16"]
    assert list(cast.input) == [gather] and (cast.attr["SrcT"].type, cast.attr["DstT"].type) == (
        tf.float32.as_datatype_enum,
        tf.bfloat16.as_datatype_enum,
    )
    for name, op in readers.items():
        node = nodes[name]
        if op == "BatchMatMulV2":  # query, key and value share the one cast
            assert node.input[0] == cast.name and node.attr["T"].type == tf.bfloat16.as_datatype_enum
        else:  # the residual add stays float32 beside the float32 lookup, and casts the attention output back
            assert node.input[0] == gather and node.attr["T"].type == tf.float32.as_datatype_enum
            assert (
                nodes[node.input[1]].op == "Cast"
                and nodes[node.input[1]].attr["DstT"].type == tf.float32.as_datatype_enum
            )


@pytest.mark.parametrize("dtype,rtol", [("bfloat16", 2e-2), ("float16", 2e-3)])
def test_every_edge_from_an_op_not_typed_by_T_gets_its_cast(dtype, rtol):
    graph = gm.typed_edges()
    rewritten, decisions = rewrite_graph(graph.graph_def, graph.output_tensors, dtype)
    assert sorted((d.class_name, d.policy) for d in decisions) == [
        ("AddV2", "16-bit"),  # counted + halves: both 16-bit matmuls
        ("BatchMatMulV2", "16-bit"),
        ("Einsum", "16-bit"),
        ("MatMul", "16-bit"),
        ("MatMul", "16-bit"),
    ]
    nodes = {n.name: n for n in rewritten.node}
    casts = sorted(
        (
            nodes[c.input[0].partition(":")[0]].op,
            c.input[0].partition(":")[2] or "0",
            tf.as_dtype(c.attr["DstT"].type).name,
        )
        for c in rewritten.node
        if c.name.rpartition("/")[2].startswith("mpconvert_cast_")
    )
    assert casts == sorted(
        [
            ("GatherV2", "0", dtype),  # one cast for the BatchMatMulV2 and the Einsum
            ("Cast", "0", dtype),
            ("Split", "1", dtype),
            ("BatchMatMulV3", "0", dtype),
            ("Einsum", "0", "float32"),  # into the Sum
            ("BatchMatMulV2", "0", "float32"),  # into the residual add, which reads the float32 lookup
            ("AddV2", "0", "float32"),  # into the add that reads the float32 Sum
        ]
    )
    assert nodes["BatchMatMulV3"].attr["Tout"].type == tf.float32.as_datatype_enum
    rng = np.random.default_rng(8)
    rows = [rng.integers(0, 10, size=(64, 3)).astype(np.int32), rng.normal(size=(64, 4)).astype(np.float32)]
    (expected,) = graph.predict(rows)
    (got,) = graph.with_graph(rewritten).predict(rows)
    assert np.abs(got - expected).max() <= rtol * np.abs(expected).max()


def test_casts_of_two_outputs_whose_names_differ_only_by_port_get_two_names():
    graph = gm.two_splits()
    rewritten, _ = rewrite_graph(graph.graph_def, graph.output_tensors, "bfloat16")
    casts = {n.name: n.input[0] for n in rewritten.node if "mpconvert_cast_bfloat16" in n.name}
    assert casts == {"split/mpconvert_cast_bfloat16_1": "split:1", "split_1/mpconvert_cast_bfloat16": "split_1"}
    (got,) = graph.with_graph(rewritten).predict([np.ones((3, 4), np.float32)])
    assert got.tolist() == [12.0, 12.0, 12.0]


def _node(graph_def, name, op, inputs=(), **types):
    node = graph_def.node.add(name=name, op=op)
    node.input.extend(inputs)
    for attr, dtype in types.items():
        node.attr[attr].type = dtype.as_datatype_enum
    return node


def test_the_edge_check_names_an_edge_left_without_its_cast():
    from tensorflow.core.framework import graph_pb2
    from tensorflow.python.framework import tensor_util

    graph_def = graph_pb2.GraphDef()
    table = _node(graph_def, "table", "Const", dtype=tf.float32)
    table.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(np.ones((5, 2), np.float32)))
    _node(graph_def, "ids", "Placeholder", dtype=tf.int32)
    axis = _node(graph_def, "axis", "Const", dtype=tf.int32)
    axis.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(0, tf.int32))
    _node(
        graph_def, "lookup", "GatherV2", ["table", "ids", "axis"], Tparams=tf.float32, Tindices=tf.int32, Taxis=tf.int32
    )
    weights = _node(graph_def, "w", "Const", dtype=tf.bfloat16)
    weights.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(np.ones((2, 2)), tf.bfloat16))
    matmul = _node(graph_def, "mm", "MatMul", ["lookup", "w"], T=tf.bfloat16)
    with pytest.raises(
        RewriteError, match=r"input 0 of mm \(MatMul\) takes bfloat16 but lookup \(GatherV2\) gives float32$"
    ):
        check_edges(graph_def)
    with pytest.raises(ValueError, match="incompatible with expected bfloat16"), tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph_def, name="")  # TensorFlow agrees

    _node(graph_def, "lookup/cast", "Cast", ["lookup"], SrcT=tf.float32, DstT=tf.bfloat16).attr["Truncate"].b = False
    matmul.input[0] = "lookup/cast"
    check_edges(graph_def)
    with tf.Graph().as_default():
        tf.graph_util.import_graph_def(graph_def, name="")

    _node(graph_def, "mm", "Identity", ["lookup"], T=tf.float32)
    with pytest.raises(RewriteError, match="two nodes are named mm"):
        check_edges(graph_def)
    graph_def.node.pop()

    # A dtype its op does not allow (Betainc is float32 and float64 only) is named before its edges.
    _node(graph_def, "beta", "Betainc", ["lookup", "lookup", "lookup"], T=tf.float16)
    with pytest.raises(RewriteError, match=r"beta \(Betainc\) has T=float16, which its op does not allow"):
        check_edges(graph_def)


def test_stages_a_frozen_graph_cannot_do_are_skipped_and_said(models, tmp_path):
    """A training split would fine-tune a Keras model; a frozen graph has no layers to train or pad."""
    with np.load(models["cnn_data"], allow_pickle=False) as npz:
        x, y = npz["x"], npz["y"]
    data = tmp_path / "with_train.npz"
    np.savez(data, x=x[:300], y=y[:300], x_train=x[300:], y_train=y[300:])
    out = tmp_path / "out"
    result = invoke(models["cnn"], "--policy", "mixed_bfloat16", "--data", data, "--out", out)
    assert result.exit_code == 0, result.output
    report = report_of(out)
    assert report["finetune"] is None and report["padding"] is None and report["speed"]["memory"] is None
    skipped = {s["stage"]: s["reason"] for s in report["skipped"]}
    assert list(skipped) == ["finetune", "pad", "activation memory"]
    assert all("converted as a frozen graph" in reason for reason in skipped.values())
    assert "cannot be fine-tuned" in skipped["finetune"]
    # Without a training split nothing would fine-tune: only what the options ask for is listed.
    quiet = invoke(
        models["cnn"],
        "--policy",
        "mixed_bfloat16",
        "--data",
        models["cnn_data"],
        "--no-speed",
        "--pad-multiple",
        "0",
        "--out",
        tmp_path / "quiet",
    )
    assert quiet.exit_code == 0, quiet.output
    assert "skipped" not in report_of(tmp_path / "quiet")
