"""Per-layer policy decisions and the rebuilt model, through both frameworks."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import pytest
import tf_keras
import tiny_models

from mpconvert.data.signature import generate_inputs, signature_of
from mpconvert.keras.frameworks import KERAS3, TF_KERAS
from mpconvert.keras.rewrite import apply_plan, plan_conversion, rewrite
from mpconvert.options.rewrite import RewriteOptions
from mpconvert.system.errors import MpconvertError

FRAMEWORKS = [pytest.param((keras, KERAS3), id="keras3"), pytest.param((tf_keras, TF_KERAS), id="tf_keras")]
COMPUTE = {"mixed_float16": "float16", "mixed_bfloat16": "bfloat16"}


def convert(model, framework, policy="mixed_float16", keep=()):
    smoke = generate_inputs(model, signature_of(model), 2, seed=0)
    return rewrite(model, framework, RewriteOptions(policy, tuple(keep)), smoke)


def policies(model):
    return {layer.name: layer.dtype_policy for layer in model.layers}


def test_plan_from_a_hand_written_config_is_exact():
    # Legacy (tf-keras) node format; the planner needs no TensorFlow.
    config = {
        "name": "m",
        "layers": [
            {"class_name": "InputLayer", "name": "x", "config": {"name": "x", "dtype": "float32"}, "inbound_nodes": []},
            {
                "class_name": "Dense",
                "name": "hidden",
                "config": {"name": "hidden", "dtype": "float32", "activation": "relu"},
                "inbound_nodes": [[["x", 0, 0, {}]]],
            },
            {
                "class_name": "Softmax",
                "name": "attn",
                "config": {"name": "attn", "dtype": "float32"},
                "inbound_nodes": [[["hidden", 0, 0, {}]]],
            },
            {
                "class_name": "Dense",
                "name": "probs",
                "config": {"name": "probs", "dtype": "float32", "activation": "softmax"},
                "inbound_nodes": [[["attn", 0, 0, {}]]],
            },
        ],
        "input_layers": [["x", 0, 0]],
        "output_layers": [["probs", 0, 0]],
    }
    plan = plan_conversion(config, "Functional", RewriteOptions("mixed_bfloat16"))
    assert [(d.name, d.class_name, d.policy, d.pinned) for d in plan.decisions] == [
        ("x", "InputLayer", "float32", "input layer"),
        ("hidden", "Dense", "mixed_bfloat16", None),
        ("attn", "Softmax", "float32", "softmax"),
        ("probs_linear", "Dense", "mixed_bfloat16", None),
        ("probs", "Activation", "float32", "model output (softmax split from Dense)"),
    ]
    new = apply_plan(config, "Functional", plan)
    by_name = {e["config"]["name"]: e for e in new["layers"]}
    assert by_name["probs_linear"]["config"]["activation"] == "linear"
    assert by_name["probs_linear"]["config"]["dtype"] == "mixed_bfloat16"
    assert by_name["probs"]["inbound_nodes"] == [[["probs_linear", 0, 0, {}]]]
    assert by_name["attn"]["config"]["dtype"] == "float32"
    # the input config is not modified
    assert config["layers"][3]["config"]["activation"] == "softmax"


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_mlp_layers_compute_in_16_bits_with_float32_variables(fw, policy):
    K, framework = fw
    model = tiny_models.mlp(K)
    before = [w.copy() for w in model.get_weights()]
    new = convert(model, framework, policy).model

    pol = policies(new)
    for name in ("hidden", "predictions_linear"):
        assert pol[name].compute_dtype == COMPUTE[policy]
        assert pol[name].variable_dtype == "float32"
        assert all(w.dtype == "float32" for w in new.get_layer(name).weights)
    assert pol["predictions"].compute_dtype == "float32"
    assert new.get_layer("predictions").__class__.__name__ == "Activation"
    assert new.get_layer("predictions_linear").get_config()["activation"] == "linear"
    assert new.output_names == ["predictions"]
    assert str(getattr(new.outputs[0].dtype, "name", new.outputs[0].dtype)) == "float32"
    # weights copied exactly, original untouched
    np.testing.assert_array_equal(new.get_layer("hidden").get_weights()[0], model.get_layer("hidden").get_weights()[0])
    np.testing.assert_array_equal(
        new.get_layer("predictions_linear").get_weights()[0], model.get_layer("predictions").get_weights()[0]
    )
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert all(layer.dtype_policy.name == "float32" for layer in model.layers)
    assert model.get_layer("predictions").get_config()["activation"] == "softmax"
    assert K.mixed_precision.global_policy().name == "float32"


@pytest.mark.parametrize("policy", ["mixed_float16", "mixed_bfloat16"])
@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_sixteen_bit_rounding_is_visible_in_the_numbers(fw, policy):
    """1 + 1e-4 is 1.0001 in float32 but exactly 1.0 in float16 and bfloat16.

    float16 has 10 mantissa bits (spacing 2**-10 ~ 0.00098 at 1.0) and
    bfloat16 7 bits, so the 1e-4 term vanishes once the sum is rounded; the
    float32 output layer then passes 1.0 through unchanged.
    """
    K, framework = fw
    x = K.Input((2,), name="x")
    s = K.layers.Dense(1, use_bias=False, name="sum")(x)
    out = K.layers.Activation("linear", name="out")(s)
    model = K.Model(x, out)
    model.get_layer("sum").set_weights([np.array([[1.0], [1e-4]], dtype=np.float32)])
    new = convert(model, framework, policy).model
    inputs = np.ones((1, 2), dtype=np.float32)
    assert float(np.asarray(model(inputs))[0, 0]) == pytest.approx(1.0001, abs=1e-7)
    assert float(np.asarray(new(inputs))[0, 0]) == 1.0


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_nested_sequential_output_is_split_inside_the_nested_model(fw):
    K, framework = fw
    result = convert(tiny_models.nested(K), framework)
    decisions = {d.name: (d.class_name, d.policy, d.pinned) for d in result.plan.decisions}
    assert decisions["stem"] == ("Dense", "mixed_float16", None)
    assert decisions["head/head_hidden"] == ("Dense", "mixed_float16", None)
    assert decisions["head/head_out_linear"] == ("Dense", "mixed_float16", None)
    assert decisions["head/head_out"][1:] == ("float32", "model output (softmax split from Dense)")
    head = result.model.get_layer("head")
    assert head.get_layer("head_out_linear").dtype_policy.compute_dtype == "float16"
    assert head.get_layer("head_out").dtype_policy.compute_dtype == "float32"


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_recurrent_model_keeps_integer_ids_and_converts_lstm(fw):
    K, framework = fw
    model = tiny_models.recurrent(K)
    result = convert(model, framework)
    decisions = {d.name: d for d in result.plan.decisions}
    assert decisions["ids"].policy == "int32"
    assert decisions["embed"].policy == decisions["lstm"].policy == "mixed_float16"
    assert "int" in str(result.model.inputs[0].dtype)
    ids = np.random.default_rng(0).integers(0, 50, size=(4, 12)).astype("int32")
    np.testing.assert_allclose(np.asarray(result.model(ids)), np.asarray(model(ids)), atol=5e-3)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_keep_float32_matches_whole_names_and_class_names(fw):
    K, framework = fw
    model = tiny_models.mlp(K)
    by_name = {d.name: d for d in convert(model, framework, keep=["hid.*"]).plan.decisions}
    assert by_name["hidden"].policy == "float32"
    assert by_name["hidden"].pinned == "--keep-float32 'hid.*'"
    by_class = {d.name: d for d in convert(model, framework, keep=["Dense"]).plan.decisions}
    # a pinned output layer is kept whole: nothing left to split off
    assert by_class["hidden"].policy == by_class["predictions"].policy == "float32"
    assert "predictions_linear" not in by_class
    with pytest.raises(MpconvertError, match="matches no layer"):
        convert(model, framework, keep=["hid"])  # a prefix is not a whole name


def test_plain_keras_ops_are_left_alone_and_an_op_output_is_cast_to_float32():
    x = keras.Input((4,), name="x")
    a = keras.layers.Dense(4, name="a")(x)
    b = keras.layers.Dense(4, name="b")(x)
    out = keras.ops.add(a, b)  # an Operation, not a Layer: it has no dtype
    model = keras.Model(x, out)
    result = convert(model, KERAS3)
    ops = [d for d in result.plan.decisions if d.policy is None]
    assert len(ops) == 1 and ops[0].class_name == "Add"
    assert result.model.outputs[0].dtype == "float32"
    inputs = np.random.default_rng(1).standard_normal((3, 4)).astype("float32")
    np.testing.assert_allclose(np.asarray(result.model(inputs)), np.asarray(model(inputs)), atol=1e-2)


def test_an_already_mixed_model_is_refused():
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = tiny_models.mlp(keras)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    with pytest.raises(MpconvertError, match="already mixed precision"):
        convert(model, KERAS3)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_the_global_policy_is_restored_even_when_it_was_not_float32(fw):
    K, framework = fw
    model = tiny_models.mlp(K)
    K.mixed_precision.set_global_policy("mixed_bfloat16")
    try:
        convert(model, framework, "mixed_float16")
        assert K.mixed_precision.global_policy().name == "mixed_bfloat16"
    finally:
        K.mixed_precision.set_global_policy("float32")
