import contextlib
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf_keras  # noqa: E402
from onnx import TensorProto  # noqa: E402
from onnx_graph import weights_by_node  # noqa: E402

from mpconvert.onnx import export as export_mod  # noqa: E402
from mpconvert.onnx.emulate import promote_16bit_ops  # noqa: E402
from mpconvert.onnx.export import DEFAULT_OPSET, keras_to_onnx, layer_of, pack_16bit_constants, reject_unconverted_ops  # noqa: E402
from mpconvert.onnx.repairs import fold_cast_pairs, insert_float32_islands  # noqa: E402
from mpconvert.runners import onnx as run_mod  # noqa: E402
from mpconvert.runners.base import RUNTIME_REFERENCE  # noqa: E402
from mpconvert.runners.onnx import RUNTIME_CPU, RUNTIME_CUDA, cuda_usable, run_onnx  # noqa: E402
from mpconvert.system.errors import MpconvertError  # noqa: E402

KERAS = {"keras3": keras, "tf_keras": tf_keras}
SIXTEEN_BIT = {"mixed_float16": "FLOAT16", "mixed_bfloat16": "BFLOAT16"}
# Observed max abs diffs on these softmax outputs are ~1e-7 (float32),
# ~5e-5 (float16) and ~1e-3 (bfloat16); the bounds are the precision's.
ATOL = {"float32": 1e-5, "mixed_float16": 5e-3, "mixed_bfloat16": 0.05}


@contextlib.contextmanager
def policy(kmod, name):
    kmod.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        kmod.mixed_precision.set_global_policy("float32")


def small_model(kmod, policy_name, kind):
    kmod.utils.set_random_seed(0)
    layers = kmod.layers
    with policy(kmod, policy_name):
        if kind == "dense":
            inp = kmod.Input((16,), name="x")
            h = layers.Dense(32, activation="relu")(inp)
        else:
            inp = kmod.Input((8, 8, 1), name="x")
            h = layers.Conv2D(8, 3, padding="same")(inp)
            h = layers.BatchNormalization()(h)
            h = layers.ReLU()(h)
            h = layers.Conv2D(16, 3)(h)
            h = layers.GlobalAveragePooling2D()(h)
        # float32 head, as the mixed-precision guides prescribe
        out = layers.Dense(5, activation="softmax", dtype="float32", name="probs")(h)
        return kmod.Model(inp, out)


def spec(model):
    return [tf.TensorSpec((None,) + tuple(model.input_shape[1:]), tf.float32, name="x")]


def batch(model, n=4, seed=0):
    return np.random.default_rng(seed).random((n,) + tuple(model.input_shape[1:])).astype(np.float32)


def weight_dtypes(proto):
    """(op type, dtype name) of the weight of each MatMul/Conv, looking through Casts."""
    return [(node.op_type, TensorProto.DataType.Name(init.data_type)) for node, init in weights_by_node(proto)]


def edge_types(proto):
    return {vi.type.tensor_type.elem_type for vi in list(proto.graph.input) + list(proto.graph.output)}


def expected_16bit_runtime():
    return RUNTIME_CUDA if run_mod.cuda_usable() else RUNTIME_CPU


@pytest.mark.parametrize("kind", ["dense", "cnn"])
@pytest.mark.parametrize("policy_name", ["float32", "mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("kname", ["keras3", "tf_keras"])
def test_small_models(tmp_path, kname, policy_name, kind):
    model = small_model(KERAS[kname], policy_name, kind)
    x = batch(model)
    expected = np.asarray(model(x, training=False))

    export = keras_to_onnx(model, spec(model), tmp_path / "m.onnx")

    assert export.path.stat().st_size == export.bytes
    assert export.opset == DEFAULT_OPSET
    assert export.input_names == ["x"]
    assert export.output_names == ["probs"]
    onnx.checker.check_model(str(export.path), full_check=True)
    proto = onnx.load(export.path)
    assert edge_types(proto) == {TensorProto.FLOAT}

    weights = weight_dtypes(proto)
    hidden, head = weights[:-1], weights[-1]
    assert head == ("MatMul", "FLOAT")
    assert len(hidden) == (1 if kind == "dense" else 2)
    want = SIXTEEN_BIT.get(policy_name, "FLOAT")
    assert all(dtype == want for _, dtype in hidden), weights
    assert export.initializer_dtypes.get(want, 0) >= len(hidden)
    if policy_name == "mixed_float16":
        assert "BFLOAT16" not in export.initializer_dtypes
    if policy_name == "float32":
        assert set(export.initializer_dtypes) <= {"FLOAT", "INT64"}

    result = run_onnx(export.path, {"x": x})
    assert len(result.outputs) == 1 and result.outputs[0].dtype == np.float32
    np.testing.assert_allclose(result.outputs[0], expected, atol=ATOL[policy_name], rtol=0)

    if policy_name == "mixed_bfloat16":
        assert export.repairs
        if kind == "cnn":
            assert any("Conv" in r and "float32" in r for r in export.repairs), export.repairs
        if not run_mod.cuda_usable():
            # ORT's CPU provider has no bfloat16 MatMul/Relu kernels.
            assert result.runtime == RUNTIME_CPU
            assert "Relu" in result.promoted_ops
        reference = run_onnx(export.path, {"x": x}, emulate_16bit=False)
        assert reference.runtime in (RUNTIME_REFERENCE, RUNTIME_CUDA)
        np.testing.assert_allclose(reference.outputs[0], expected, atol=ATOL[policy_name], rtol=0)
    else:
        assert not any("Conv" in r for r in export.repairs)
        assert result.runtime == expected_16bit_runtime()
        assert result.promoted_ops == []


# --------------------------------------------------------------------------
# MobileNetV2 (keras.applications, untrained)


@pytest.fixture(scope="module")
def mobilenet():
    """A float32 MobileNetV2 with usable activations, and an input batch.

    Untrained BatchNorm statistics (mean 0, variance 1) shrink activations
    to ~1e-12, where float16 underflows and every export "matches".
    Setting them to the batch's own statistics, variances floored at their
    mean so that dead channels are not amplified, keeps outputs O(0.1).
    """
    keras.utils.set_random_seed(1)
    x = np.random.default_rng(1).normal(size=(4, 32, 32, 3)).astype(np.float32)
    model = keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10)
    norms = [layer for layer in model.layers if isinstance(layer, keras.layers.BatchNormalization)]
    for layer in norms:
        layer.momentum = 0.0
    model(x, training=True)
    for layer in norms:
        var = np.asarray(layer.moving_variance)
        layer.moving_variance.assign(np.maximum(var, var.mean()))
    return model, x, np.asarray(model(x, training=False))


@pytest.mark.parametrize("policy_name", ["mixed_float16", "mixed_bfloat16"])
def test_mobilenet_v2(tmp_path, mobilenet, policy_name):
    reference, x, truth = mobilenet
    with policy(keras, policy_name):
        model = keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=10)
    model.set_weights(reference.get_weights())
    expected = np.asarray(model(x, training=False)).astype(np.float32)

    export = keras_to_onnx(
        model, [tf.TensorSpec((None, 32, 32, 3), tf.float32, name="image")], tmp_path / "mobilenet.onnx"
    )

    assert export.input_names == ["image"]
    assert export.output_names == ["predictions"]
    onnx.checker.check_model(str(export.path), full_check=True)
    proto = onnx.load(export.path)
    assert edge_types(proto) == {TensorProto.FLOAT}
    weights = weight_dtypes(proto)
    assert len(weights) == 53  # 52 convolutions and the classifier
    assert {dtype for _, dtype in weights} == {SIXTEEN_BIT[policy_name]}
    # 16-bit weights: half of the 4 bytes per parameter of a float32 file.
    assert export.bytes < 0.55 * 4 * model.count_params()
    # tf2onnx optimized the graph: NHWC->NCHW once, not around every conv.
    assert sum(n.op_type == "Transpose" for n in proto.graph.node) <= 2

    result = run_onnx(export.path, {"image": x})
    probs = result.outputs[0]
    assert probs.shape == (4, 10) and probs.dtype == np.float32
    if policy_name == "mixed_float16":
        assert result.runtime == expected_16bit_runtime()
        # observed: 0.004
        np.testing.assert_allclose(probs, expected, atol=0.01, rtol=0)
    else:
        assert any("52 Conv" in r for r in export.repairs), export.repairs
        assert result.runtime == expected_16bit_runtime()
        if not run_mod.cuda_usable():
            assert "Clip" in result.promoted_ops
        # Rounding to bfloat16 after each of ~60 layers of a random net: Keras's
        # own bfloat16 run is 0.02-0.05 off float32 here (observed 0.055), the
        # ONNX file a bit less (fewer roundings; 0.043), and they differ by
        # about as much (0.039).
        np.testing.assert_allclose(probs, expected, atol=0.1, rtol=0)
        assert np.abs(probs - truth).max() <= 1.5 * np.abs(expected - truth).max() + 1e-3

        reference = run_onnx(export.path, {"image": x}, emulate_16bit=False)
        assert reference.runtime in (RUNTIME_REFERENCE, RUNTIME_CUDA)
        # onnx.reference accumulates in bfloat16 where the emulation computes
        # each op in float32: observed 0.0205 apart with onnx 1.23 (5 units of
        # bfloat16 at these probabilities); a wrong graph is O(0.1) off.
        np.testing.assert_allclose(reference.outputs[0], probs, atol=0.04, rtol=0)


def test_keras3_lstm_bfloat16_runs_with_right_shape(tmp_path):
    # Keras 3 RNNs become an ONNX Loop whose body computes in bfloat16.
    keras.utils.set_random_seed(3)
    with policy(keras, "mixed_bfloat16"):
        inp = keras.Input((5, 8), name="x")
        out = keras.layers.Dense(3, activation="softmax", dtype="float32", name="probs")(keras.layers.LSTM(6)(inp))
        model = keras.Model(inp, out)
    x = np.random.default_rng(3).random((2, 5, 8)).astype(np.float32)
    export = keras_to_onnx(model, spec(model), tmp_path / "lstm.onnx")
    assert any(n.op_type == "Loop" for n in onnx.load(export.path).graph.node)

    result = run_onnx(export.path, {"x": x})
    assert result.outputs[0].shape == (2, 3)
    np.testing.assert_allclose(result.outputs[0], np.asarray(model(x, training=False)), atol=0.05, rtol=0)
    # As written: on the CUDA provider where it loads; else onnx.reference, whose Loop (onnx 1.23) vstacks
    # scan outputs ((10, 6), not (5, 2, 6)), so the run is refused with that reason, not given a wrong shape.
    if cuda_usable():
        assert run_onnx(export.path, {"x": x}, emulate_16bit=False).outputs[0].shape == (2, 3)
    else:
        with pytest.raises(MpconvertError, match=r"onnx.reference is known to mis-stack Loop outputs"):
            run_onnx(export.path, {"x": x}, emulate_16bit=False)


# --------------------------------------------------------------------------
# repairs


def relu6_model():
    # Relu6 becomes a Clip whose bounds tf2onnx creates itself, as FLOAT16.
    keras.utils.set_random_seed(2)
    with policy(keras, "mixed_bfloat16"):
        inp = keras.Input((6, 6, 2), name="x")
        h = keras.layers.Conv2D(4, 3)(inp)
        h = keras.layers.ReLU(6.0)(h)
        h = keras.layers.Flatten()(h)
        h = keras.layers.Dense(8, activation="relu")(h)
        out = keras.layers.Dense(3, activation="softmax", dtype="float32", name="probs")(h)
        return keras.Model(inp, out)


def test_retype_pass_repairs_unpatched_tf2onnx_output(tmp_path, monkeypatch):
    @contextlib.contextmanager
    def unpatched():
        yield False

    monkeypatch.setattr(export_mod, "tf2onnx_knows_bfloat16", unpatched)
    model = relu6_model()
    x = batch(model)
    export = keras_to_onnx(model, spec(model), tmp_path / "m.onnx")

    retyped = [r for r in export.repairs if r.startswith("retyped FLOAT16 as BFLOAT16")]
    assert retyped and "Cast" in retyped[0] and "initializer" in retyped[0], export.repairs
    proto = onnx.load(export.path)
    assert "FLOAT16" not in export.initializer_dtypes
    assert not any(n.op_type == "Cast" and n.attribute[0].i == TensorProto.FLOAT16 for n in proto.graph.node)
    np.testing.assert_allclose(
        run_onnx(export.path, {"x": x}).outputs[0], np.asarray(model(x, training=False)), atol=0.05, rtol=0
    )


def test_repaired_file_needs_no_further_repair(tmp_path):
    model = small_model(tf_keras, "mixed_bfloat16", "cnn")
    export = keras_to_onnx(model, spec(model), tmp_path / "m.onnx")
    proto = onnx.load(export.path)
    assert insert_float32_islands(proto) == []
    assert fold_cast_pairs(proto) == []
    convs = [n for n in proto.graph.node if n.op_type == "Conv"]
    producer = {o: n for n in proto.graph.node for o in n.output}
    # The float32 island is entered through Casts of the bfloat16 tensors.
    assert all(producer[n.input[1]].op_type == "Cast" for n in convs)


def test_promote_16bit_ops_keeps_the_graph_valid(tmp_path):
    model = small_model(keras, "mixed_bfloat16", "cnn")
    export = keras_to_onnx(model, spec(model), tmp_path / "m.onnx")
    original = onnx.load(export.path)
    promoted, ops = promote_16bit_ops(original)
    assert "Relu" in ops
    assert len(promoted.graph.node) > len(original.graph.node)
    onnx.checker.check_model(promoted, full_check=True)
    assert onnx.load(export.path) == original  # the file is not touched


# --------------------------------------------------------------------------
# naming


@pytest.mark.parametrize("kname", ["keras3", "tf_keras"])
def test_outputs_keep_model_order_and_names(tmp_path, kname):
    kmod = KERAS[kname]
    a = kmod.Input((4,), name="a")
    b = kmod.Input((3,), name="b")
    zeta = kmod.layers.Dense(2, name="zeta")(kmod.layers.Concatenate()([a, b]))
    alpha = kmod.layers.Dense(1, name="alpha")(a)
    model = kmod.Model([a, b], [zeta, alpha])
    specs = [tf.TensorSpec((None, 4), tf.float32, name="first"), tf.TensorSpec((None, 3), tf.float32, name="second")]

    export = keras_to_onnx(model, specs, tmp_path / "m.onnx")

    # TF would flatten the outputs alphabetically: alpha before zeta.
    assert export.input_names == ["first", "second"]
    assert export.output_names == ["zeta", "alpha"]
    feeds = {"first": np.ones((2, 4), np.float32), "second": np.ones((2, 3), np.float32)}
    outputs = run_onnx(export.path, feeds).outputs
    expected = model([feeds["first"], feeds["second"]], training=False)
    for got, want in zip(outputs, expected):
        np.testing.assert_allclose(got, np.asarray(want), atol=1e-5)


def test_keras3_sequential_output_named_after_last_layer(tmp_path):
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="head")])
    export = keras_to_onnx(model, [tf.TensorSpec((None, 4), tf.float32, name="x")], tmp_path / "m.onnx")
    assert export.output_names == ["head"]


# --------------------------------------------------------------------------
# user errors


def test_unconvertible_op_names_op_and_layer(tmp_path):
    inp = keras.Input((4,), name="x")
    h = keras.layers.Dense(4)(inp)
    h = keras.layers.Lambda(lambda t: tf.math.igamma(tf.abs(t) + 1.0, tf.abs(t) + 1.0), name="gamma_cdf")(h)
    model = keras.Model(inp, keras.layers.Dense(2)(h))
    with pytest.raises(MpconvertError) as err:
        keras_to_onnx(model, [tf.TensorSpec((None, 4), tf.float32, name="x")], tmp_path / "m.onnx")
    assert "Igamma" in err.value.message and "gamma_cdf" in err.value.message
    assert "--export savedmodel" in err.value.hint and "--keep-float32 gamma_cdf" in err.value.hint
    assert not (tmp_path / "m.onnx").exists()


def test_bad_opset_and_bad_spec_are_user_errors(tmp_path):
    model = small_model(keras, "float32", "dense")
    with pytest.raises(MpconvertError, match="opset 22"):
        keras_to_onnx(model, spec(model), tmp_path / "m.onnx", opset=22)
    with pytest.raises(MpconvertError, match="cannot be called"):
        keras_to_onnx(model, [tf.TensorSpec((None, 7), tf.float32, name="x")], tmp_path / "m.onnx")


def test_run_onnx_checks_feed_names_and_stays_quiet(tmp_path, capfd):
    model = small_model(keras, "float32", "dense")
    export = keras_to_onnx(model, spec(model), tmp_path / "m.onnx")
    capfd.readouterr()
    run_mod.provider_loads.cache_clear()
    run_onnx(export.path, {"x": batch(model)})
    # onnxruntime-gpu without CUDA would print a provider load error here.
    assert "CUDA" not in capfd.readouterr().err
    with pytest.raises(MpconvertError, match=r"\['x'\]"):
        run_onnx(export.path, {"input": batch(model)})


# --------------------------------------------------------------------------
# Keras 3 graphs that tf2onnx's from_function gets wrong


@pytest.mark.parametrize("policy_name", ["float32", "mixed_float16"])
def test_captured_tensors_are_frozen_not_inputs(tmp_path, policy_name):
    # Normalization keeps mean/variance as plain tensors, which the trace
    # captures: up to 128 values as a Const, more as a placeholder fed from
    # outside (EfficientNet's has 3; this one 200).
    rng = np.random.default_rng(4)
    keras.utils.set_random_seed(4)
    with policy(keras, policy_name):
        inp = keras.Input((200,), name="x")
        h = keras.layers.Normalization(mean=rng.random(200), variance=rng.random(200) + 0.5)(inp)
        h = keras.layers.Dense(4)(h)
        h = keras.layers.Normalization(mean=rng.random(4), variance=rng.random(4) + 0.5)(h)
        model = keras.Model(inp, keras.layers.Dense(3, activation="softmax", dtype="float32", name="probs")(h))
    x = rng.random((2, 200)).astype(np.float32)

    export = keras_to_onnx(model, spec(model), tmp_path / "m.onnx")

    assert export.input_names == ["x"]
    np.testing.assert_allclose(
        run_onnx(export.path, {"x": x}).outputs[0], np.asarray(model(x, training=False)), atol=ATOL[policy_name], rtol=0
    )


@pytest.mark.parametrize("policy_name", ["float32", "mixed_float16", "mixed_bfloat16"])
def test_grouped_conv_and_exact_gelu(tmp_path, policy_name):
    # ConvNeXt's two: Keras 3 runs grouped convs in an XLA-compiled function
    # (a call grappler would not inline), and the exact GELU uses Erfc.
    keras.utils.set_random_seed(5)
    with policy(keras, policy_name):
        inp = keras.Input((6, 6, 4), name="x")
        h = keras.layers.Conv2D(8, 3, padding="same", groups=4)(inp)
        h = keras.layers.Dense(8, activation="gelu")(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        model = keras.Model(inp, keras.layers.Dense(3, activation="softmax", dtype="float32", name="probs")(h))
    x = np.random.default_rng(5).normal(size=(3, 6, 6, 4)).astype(np.float32)

    export = keras_to_onnx(model, spec(model), tmp_path / "m.onnx")

    proto = onnx.load(export.path)
    ops = {n.op_type for n in proto.graph.node}
    assert "Erf" in ops and not ops & {"Erfc", "StatefulPartitionedCall", "PartitionedCall"}, ops
    conv = next(n for n in proto.graph.node if n.op_type == "Conv")
    assert onnx.helper.get_attribute_value(next(a for a in conv.attribute if a.name == "group")) == 4
    onnx.checker.check_model(proto, full_check=True)
    np.testing.assert_allclose(
        run_onnx(export.path, {"x": x}).outputs[0], np.asarray(model(x, training=False)), atol=ATOL[policy_name], rtol=0
    )


def test_unconverted_ops_are_blamed_on_their_own_layers():
    # Keras 3 names the ops of layer "act" under "act_1/" and those of a
    # layer named "act_1" under "act_1_1/"; a nested model's as "outer/inner".
    inp = keras.Input((4,), name="x")
    h = keras.layers.Dense(4, name="dw")(inp)
    h = keras.layers.Activation("gelu", name="act")(h)
    h = keras.layers.Activation("relu", name="act_1")(h)
    head = keras.Sequential([keras.layers.Dense(2, name="inner")], name="head")
    model = keras.Model(inp, head(h))
    assert layer_of("functional_1/act_1/Gelu/Erfc", model) == "act"
    assert layer_of("functional_1/act_1_1/Relu", model) == "act_1"
    assert layer_of("functional_1/head_1/inner_1/MatMul", model) == "head/inner"
    assert layer_of("Transpose__12", model) is None

    # A call wrapper listed first in the graph is not the op to blame.
    nodes = [
        onnx.helper.make_node(
            "StatefulPartitionedCall", ["x"], ["a"], name="functional_1/dw_1/StatefulPartitionedCall"
        ),
        onnx.helper.make_node("Erfc", ["a"], ["b"], name="functional_1/act_1/Gelu/Erfc"),
    ]
    graph = onnx.helper.make_graph(
        nodes,
        "g",
        [onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [onnx.helper.make_tensor_value_info("b", TensorProto.FLOAT, [1])],
    )
    proto = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    with pytest.raises(MpconvertError) as err:
        reject_unconverted_ops(proto, lambda node: layer_of(node, model))
    message = err.value.message
    assert message.index("Erfc (node 'functional_1/act_1/Gelu/Erfc' in layer 'act')") < message.index(
        "StatefulPartitionedCall (node 'functional_1/dw_1/StatefulPartitionedCall' in layer 'dw')"
    )
    assert "--keep-float32 act " in err.value.hint


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
def test_16bit_constants_are_packed_without_changing_values(dtype):
    # As grappler writes folded weights: bit patterns in half_val, the last
    # one repeated to fill the shape.
    values = np.array([[1.5, -2.0, 3.25], [0.1, 0.1, 0.1]], np.float32)
    exact = tf.make_tensor_proto(tf.constant(values, dtype).numpy())
    packed = tf.make_tensor_proto(tf.constant(values, dtype).numpy())
    packed.ClearField("tensor_content")
    packed.half_val.extend(np.frombuffer(exact.tensor_content, np.uint16)[:4].tolist())
    graph_def = tf.compat.v1.GraphDef()
    node = graph_def.node.add(name="w", op="Const")
    node.attr["dtype"].type = dtype.as_datatype_enum
    node.attr["value"].tensor.CopyFrom(packed)

    pack_16bit_constants(graph_def)

    tensor = graph_def.node[0].attr["value"].tensor
    assert not tensor.half_val and tensor.tensor_content == exact.tensor_content
    np.testing.assert_array_equal(tf.make_ndarray(tensor).astype(np.float32), tf.make_ndarray(exact).astype(np.float32))


def test_a_failing_tf2onnx_optimizer_is_skipped_not_fatal(tmp_path, monkeypatch):
    # The first pass runs tf2onnx's optimizers without their safety copies;
    # one that raises sends the conversion through the guarded pass, which
    # skips it, as tf2onnx's from_function would.
    from tf2onnx.optimizer.reshape_optimizer import ReshapeOptimizer

    calls = []

    def broken(self, graph):
        calls.append(1)
        raise RuntimeError("optimizer bug")

    monkeypatch.setattr(ReshapeOptimizer, "_optimize", broken)
    model = small_model(keras, "mixed_float16", "cnn")
    x = batch(model)
    export = keras_to_onnx(model, spec(model), tmp_path / "m.onnx")
    assert len(calls) > 1
    np.testing.assert_allclose(
        run_onnx(export.path, {"x": x}).outputs[0],
        np.asarray(model(x, training=False)),
        atol=ATOL["mixed_float16"],
        rtol=0,
    )


# --------------------------------------------------------------------------
# module layout


def test_running_onnx_does_not_import_tensorflow():
    # Only mpconvert.onnx.export needs TensorFlow and tf2onnx; checking a file
    # must not pay for importing them.
    code = (
        "import mpconvert.runners.onnx, mpconvert.onnx.proto, mpconvert.onnx.repairs, sys; "
        "assert 'tensorflow' not in sys.modules and 'tf2onnx' not in sys.modules"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parent.parent,
    )
    assert proc.returncode == 0, proc.stderr
