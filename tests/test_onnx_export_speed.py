"""The fast ONNX export writes what tf2onnx writes.

keras_to_onnx skips copies that tf2onnx makes of every weight (see
`_lean_tf2onnx`, `_take_weights`, `checks.check`, graph.without_weights); these
tests hold its file to a bare tf2onnx.convert.from_keras of the same model,
padded for an empty batch as mpconvert's files are: the same initializer
values, the same op types, the same outputs. Timing
is measured by bench/onnx_export_speed.py, not asserted here.
"""

import contextlib

import keras
import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tensorflow as tf
import tf2onnx

from mpconvert.onnx import proto as proto_mod
from mpconvert.onnx.empty_batch import serve_empty_batch
from mpconvert.onnx.export import _lean_tf2onnx, keras_to_onnx

ATOL = {"float32": 1e-6, "mixed_float16": 1e-3}


@contextlib.contextmanager
def policy(name):
    keras.mixed_precision.set_global_policy(name)
    try:
        yield
    finally:
        keras.mixed_precision.set_global_policy("float32")


def dense(policy_name):
    # Functional with a named head: from_keras cannot name a Keras 3
    # Sequential model's outputs. The head is float32, as the guides say.
    keras.utils.set_random_seed(0)
    with policy(policy_name):
        x = keras.Input((64,), name="x")
        h = keras.layers.Dense(256, activation="relu")(x)
        h = keras.layers.Dense(256, activation="relu")(h)
        return keras.Model(x, keras.layers.Dense(10, activation="softmax", dtype="float32", name="probs")(h))


def conv(policy_name):
    # Conv weights are transposed and BatchNormalization folded into them by
    # grappler and tf2onnx's optimizers: constants that change on the way.
    keras.utils.set_random_seed(0)
    with policy(policy_name):
        x = keras.Input((16, 16, 3), name="x")
        h = keras.layers.Conv2D(32, 3, padding="same")(x)
        h = keras.layers.BatchNormalization()(h)
        h = keras.layers.ReLU()(h)
        h = keras.layers.GlobalAveragePooling2D()(h)
        return keras.Model(x, keras.layers.Dense(10, activation="softmax", dtype="float32", name="probs")(h))


def run(path, x):
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {session.get_inputs()[0].name: x})[0]


@pytest.mark.parametrize("policy_name", sorted(ATOL))
@pytest.mark.parametrize("build", [dense, conv], ids=["dense", "conv"])
def test_export_matches_bare_tf2onnx(build, policy_name, tmp_path):
    model = build(policy_name)
    specs = [tf.TensorSpec((None,) + tuple(model.input_shape[1:]), tf.float32, name="x")]
    ours, theirs = tmp_path / "mpconvert.onnx", tmp_path / "tf2onnx.onnx"
    keras_to_onnx(model, specs, ours)
    tf2onnx.convert.from_keras(model, input_signature=specs, opset=17, output_path=str(theirs))

    bare = onnx.load(theirs)
    assert serve_empty_batch(bare)  # what every file of mpconvert's gets last, on tf2onnx's graph as it wrote it
    (our_inits, our_ops), (their_inits, their_ops) = proto_mod.contents(onnx.load(ours)), proto_mod.contents(bare)
    assert our_inits == their_inits
    assert our_ops == their_ops
    x = np.random.default_rng(0).random((4,) + tuple(model.input_shape[1:])).astype(np.float32)
    np.testing.assert_allclose(run(ours, x), run(theirs, x), atol=ATOL[policy_name], rtol=0)


def test_the_tf2onnx_patches_are_undone():
    from tf2onnx import graph as tf2onnx_graph
    from tf2onnx import tfonnx

    before = (tf2onnx_graph.Graph.update_proto, tfonnx.resolve_functions)
    with pytest.raises(RuntimeError), _lean_tf2onnx():
        assert (tf2onnx_graph.Graph.update_proto, tfonnx.resolve_functions) != before
        raise RuntimeError
    assert (tf2onnx_graph.Graph.update_proto, tfonnx.resolve_functions) == before


def test_tensor_types_without_weights_match_full_shape_inference(tmp_path, monkeypatch):
    # A bfloat16 conv model goes through both repair passes that type tensors;
    # with the threshold lowered, all its weights are left out.
    monkeypatch.setattr(proto_mod, "_WEIGHT_ELEMENTS", 16)
    model = conv("mixed_bfloat16")
    path = tmp_path / "m.onnx"
    keras_to_onnx(model, [tf.TensorSpec((None, 16, 16, 3), tf.float32, name="x")], path)
    proto = onnx.load(path)
    light = proto_mod.without_weights(proto)
    assert len(light.graph.initializer) < len(proto.graph.initializer)
    full = {}
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=False).graph
    for vi in list(inferred.input) + list(inferred.value_info) + list(inferred.output):
        if vi.type.tensor_type.elem_type:
            full[vi.name] = vi.type.tensor_type.elem_type
    full.update({t.name: t.data_type for t in inferred.initializer})
    assert proto_mod.tensor_types(proto) == full
