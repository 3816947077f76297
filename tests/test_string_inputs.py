"""Models that take string inputs, end to end: data, conversion, fine-tuning, every artifact, verify.

Text travels as fixed-width unicode ('<U..'): an .npz holds it without
pickle (bytes 'S..' are read as UTF-8), Keras and the SavedModel take it as
tf.string, ONNX Runtime as tensor(string). StringLookup exports as an
ai.onnx.ml LabelEncoder keyed by the vocabulary; Hashing's FarmHash and
TextVectorization's regular-expression standardization have no ONNX
operator, so that file is refused as not exportable while the SavedModel
serves the model.
"""

import json

import numpy as np
import onnx
import onnxruntime as ort
import preprocessing_models as pm
import pytest
import tensorflow as tf
from conftest import invoke, refused

from mpconvert.data.signature import Signature, TensorSpec, generate_inputs
from mpconvert.data.tasks import check_input
from mpconvert.onnx.export import keras_to_onnx
from mpconvert.onnx.graph_checks import NotExportable
from mpconvert.runners.onnx import run_onnx
from mpconvert.system.errors import MpconvertError

COLOR = TensorSpec("color", (None, 1), "string")


def _report(out) -> dict:
    return json.loads((out / "report.json").read_text())


def _export(model, path):
    spec = model.inputs[0]
    return keras_to_onnx(model, [tf.TensorSpec((None, *spec.shape[1:]), spec.dtype, name=spec.name)], path)


@pytest.fixture(scope="module")
def text_model(tmp_path_factory):
    return pm.text_tabular(tmp_path_factory.mktemp("text") / "text.keras")


# --- one layer on a string input, against Keras -------------------------------------------------


@pytest.mark.parametrize("mode", ["int", "one_hot", "multi_hot", "count"])
def test_string_lookup_runs_in_onnx_runtime_as_in_keras(tmp_path, mode):
    model = pm.string_layer_model(mode)
    x = pm.string_layer_inputs(mode)
    exported = _export(model, tmp_path / "m.onnx")
    session = ort.InferenceSession(str(exported.path), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].type == "tensor(string)"
    got = session.run(None, {"words": x})[0]
    want = np.asarray(model(x))
    # Hand-computed: COLORS[k] is id k + 1, every other string (UNSEEN, "", "grün") the OOV id 0.
    ids = np.vectorize(lambda w: pm.COLORS.index(w) + 1 if w in pm.COLORS else 0)(x)
    if mode == "int":
        assert ids[0, 0] == 5 and ids[1, 0] == 0  # "magenta", and a non-ASCII word out of the vocabulary
        np.testing.assert_array_equal(got, ids)
    else:
        counts = np.stack([(ids == k).sum(axis=1) for k in range(len(pm.COLORS) + 1)], axis=1)
        np.testing.assert_array_equal(got, np.minimum(counts, 1) if mode != "count" else counts)
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype", ["string", "int64"])
def test_a_lookup_with_a_mask_token_runs_in_onnx_runtime_as_in_keras(tmp_path, dtype):
    # The mask compares the input with one value (Equal on strings: no ONNX Equal below opset 19)
    # and puts id 0 back with a SelectV2 of a scalar, whose shape tf2onnx 1.17 took from that scalar.
    import keras

    words = keras.Input((1,), dtype=dtype, name="words")
    if dtype == "string":
        layer = keras.layers.StringLookup(vocabulary=pm.COLORS, mask_token="", name="lookup")
        x = np.array([["red"], [""], ["black"], ["magenta"], ["grün"]])
    else:
        layer = keras.layers.IntegerLookup(vocabulary=pm.VOCAB, mask_token=-1, name="lookup")
        x = np.array([[0], [-1], [1], [18], [7]], dtype=np.int64)
    model = keras.Model(words, layer(words))
    session = ort.InferenceSession(str(_export(model, tmp_path / "m.onnx").path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"words": x})[0]
    # Hand-computed: the mask is 0, out of the vocabulary 1, the vocabulary's k-th entry k + 2.
    np.testing.assert_array_equal(got, [[2], [0], [1], [6], [1]] if dtype == "string" else [[2], [0], [1], [11], [1]])
    np.testing.assert_array_equal(got, np.asarray(model(x)))


@pytest.mark.parametrize("mode", ["int", "multi_hot"])
def test_text_vectorization_on_tokens_runs_in_onnx_runtime_as_in_keras(tmp_path, mode):
    # Without standardization and split it is a lookup with the mask token "" (id 0), OOV id 1.
    import keras

    width = 3 if mode == "multi_hot" else 1
    words = keras.Input((width,), dtype="string", name="words")
    layer = keras.layers.TextVectorization(
        vocabulary=pm.COLORS, standardize=None, split=None, output_mode=mode, name="vocab"
    )
    model = keras.Model(words, layer(words))
    x = np.array([["red", "grün", "red"], ["magenta", "", "blue"]])[:, :width]
    session = ort.InferenceSession(str(_export(model, tmp_path / "m.onnx").path), providers=["CPUExecutionProvider"])
    got = session.run(None, {"words": x})[0]
    # Hand-computed: "red" 2, "blue" 4, "magenta" 6, "grün" out of the vocabulary (1), "" the mask (0).
    if mode == "int":
        np.testing.assert_array_equal(got, [[2], [6]])
    else:  # one column per id from 1 (OOV) on; the mask counts nowhere
        np.testing.assert_array_equal(got, [[1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 0, 1]])
    np.testing.assert_array_equal(got, np.asarray(model(x)))


def test_text_vectorization_that_splits_is_refused_as_not_exportable(tmp_path):
    import keras

    words = keras.Input((1,), dtype="string", name="words")
    model = keras.Model(
        words, keras.layers.TextVectorization(vocabulary=pm.COLORS, standardize=None, name="vocab")(words)
    )
    with pytest.raises(NotExportable) as caught:
        _export(model, tmp_path / "m.onnx")
    assert "not exportable to ONNX: layer 'vocab' (StringSplitV2)" in str(caught.value)
    assert "opset 20" in str(caught.value) and "split=None" in caught.value.hint


def test_hashing_a_string_input_is_refused_as_not_exportable_naming_the_layer(tmp_path):
    import keras

    color = keras.Input((1,), dtype="string", name="color")
    model = keras.Model(color, keras.layers.Hashing(8, name="hash")(color))
    with pytest.raises(NotExportable) as caught:
        _export(model, tmp_path / "m.onnx")
    assert "not exportable to ONNX: layer 'hash' (StringToHashBucketFast)" in str(caught.value)
    assert "FarmHash" in str(caught.value) and "compute the hash before the model" in caught.value.hint
    assert not (tmp_path / "m.onnx").exists()


# --- whole conversions --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "policy, text_as, io", [("mixed_float16", "unicode", "float16"), ("mixed_bfloat16", "bytes", "float32")]
)
def test_a_model_with_a_string_input_converts_and_every_artifact_serves_it(tmp_path, text_model, policy, text_as, io):
    data = pm.text_tabular_npz(tmp_path / "text.npz", text_as)
    out = tmp_path / "out"
    args = ["--data", data, "--out", out, "--finetune-steps", "5", "--no-speed", "--onnx-io", io]
    result = invoke(text_model, "--policy", policy, *args)
    assert result.exit_code == 0, result.output
    report = _report(out)
    assert {s["name"]: s["dtype"] for s in report["source"]["inputs"]} == {
        "color": "string",
        "ids": "int64",
        "num": "float32",
    }
    layers = {layer["name"]: layer for layer in report["layers"]}
    assert layers["words"]["policy"] == "float32" and layers["words"]["pinned"]
    assert layers["hidden"]["policy"] == policy
    # The string input went through fine-tuning unchanged: every step ran.
    assert report["finetune"]["steps"] == 5 and report["finetune"]["skipped_steps"] == 0
    assert report["validation"]["drop"] <= 0.01

    artifacts = {a["kind"]: a for a in report["artifacts"]}
    checks = {c["name"]: c for c in report["gate"]["checks"]}
    for kind in ("savedmodel", "onnx"):
        assert not artifacts[kind]["failed"] and checks[f"artifact parity: {kind}"]["passed"], kind
        assert [(b["rows"], b["error"]) for b in artifacts[kind]["batches"]] == [(0, None), (1, None), (4096, None)]
    assert artifacts["savedmodel"]["details"]["inputs"]["color"] == "string"

    # The ONNX file takes the text as it is, whatever --onnx-io does to the float input.
    # (Read from the graph: ONNX Runtime's CPU provider cannot open the bfloat16 file as written.)
    graph = onnx.load(out / "model.onnx").graph
    types = {i.name: onnx.TensorProto.DataType.Name(i.type.tensor_type.elem_type) for i in graph.input}
    assert types == {"color": "STRING", "ids": "INT64", "num": "FLOAT16" if io == "float16" else "FLOAT"}

    # ONNX Runtime against the converted Keras model on the validation rows, within the gate's limit.
    import keras

    d = pm.text_rows()
    x = {k: d[k][600:] for k in ("color", "ids", "num")}
    want = np.asarray(keras.models.load_model(out / "model.keras")(x), dtype=np.float32)
    ran = run_onnx(out / "model.onnx", x)
    assert ran.runtime.startswith("onnxruntime:")
    got = np.asarray(ran.outputs[0], dtype=np.float32)
    assert got.shape == want.shape == (200, 2)
    assert float(np.abs(got - want).max()) <= checks["artifact parity: onnx"]["values"]["limit"]

    # golden.npz holds the text as unicode: it loads without pickle, as the serving machine reads it.
    with np.load(out / "golden.npz", allow_pickle=False) as golden:
        text = golden["input.color"]
    assert text.dtype.kind == "U" and set(text.ravel()) <= set(pm.COLORS + pm.UNSEEN)

    # The serving machine's check: this CPU's ONNX Runtime has no bfloat16 kernels, so that file is
    # verified where it serves (a GPU) and the SavedModel here.
    served = ("savedmodel", "onnx") if policy == "mixed_float16" else ("savedmodel",)
    verified = invoke("verify", out, "--artifacts", ",".join(served))
    assert verified.exit_code == 0, verified.output
    assert all(f"ok   runs: {kind}: on " in verified.output for kind in served), verified.output


def test_text_vectorization_converts_and_its_standardization_is_not_exportable_to_onnx(tmp_path):
    import keras

    words = keras.Input((1,), dtype="string", name="words")
    ids = keras.layers.TextVectorization(vocabulary=pm.COLORS, output_sequence_length=1, name="vocab")(words)
    hot = keras.layers.CategoryEncoding(num_tokens=len(pm.COLORS) + 2, output_mode="one_hot")(ids)  # + pad, OOV
    out_layer = keras.layers.Dense(2, activation="softmax", name="predictions")
    keras.Model(words, out_layer(hot)).save(tmp_path / "text.keras")
    out = tmp_path / "out"
    # No --data: generated inputs are words of the model's vocabulary and words unknown to it.
    result = invoke(tmp_path / "text.keras", "--policy", "mixed_float16", "--out", out, "--no-speed")
    assert result.exit_code == 0, result.output
    report = _report(out)
    onnx = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    assert onnx["exportable"] is False and "layer 'vocab' (StaticRegexReplace)" in onnx["reason"]
    checks = {c["name"]: c for c in report["gate"]["checks"]}
    assert checks["artifact parity: onnx"]["passed"] and checks["artifact parity: savedmodel"]["passed"]


# --- the data ------------------------------------------------------------------------------------


def test_an_object_array_in_the_npz_is_refused_with_the_fixed_width_form(tmp_path, text_model):
    d = pm.text_rows(50)
    data = tmp_path / "objects.npz"
    np.savez(data, color=d["color"].astype(object), ids=d["ids"], num=d["num"], y=d["y"])
    out = tmp_path / "out"
    result = invoke(text_model, "--policy", "mixed_float16", "--data", data, "--out", out, "--no-speed")
    err = refused(result, out, "object arrays ('color')", "pickl", "np.array(list_of_str)", "not dtype=object")
    assert "Traceback" not in err


def test_text_is_read_as_unicode_and_bytes_that_are_not_utf8_arerefused():
    # Bytes decode as UTF-8, objects of str or bytes become fixed-width unicode; the shape is kept.
    got = check_input("data", "color", np.array([[b"gr\xc3\xbcn"], [b"red"]]), COLOR)
    assert got.dtype == np.dtype("<U4") and got.tolist() == [["grün"], ["red"]]
    got = check_input("data", "color", np.array([["red"], [b"blue"]], dtype=object), COLOR)
    assert got.dtype.kind == "U" and got.tolist() == [["red"], ["blue"]]
    with pytest.raises(MpconvertError) as caught:
        check_input("data", "color", np.array([[b"\xff\xfe"]]), COLOR)
    assert (
        "'color' holds bytes that are not UTF-8" in str(caught.value) and "np.array(list_of_str)" in caught.value.hint
    )
    with pytest.raises(MpconvertError) as caught:
        check_input("data", "color", np.array([[1.5]]), COLOR)
    assert "'color' has dtype float64, expected (n, 1) string" in str(caught.value)


def test_generated_text_is_the_vocabulary_and_words_out_of_it(text_model):
    import keras

    model = keras.models.load_model(text_model)
    signature = Signature((COLOR,), ())
    (words,) = generate_inputs(model, signature, 400, seed=0)
    assert words.shape == (400, 1) and words.dtype.kind == "U"
    # "[UNK]" is StringLookup's own OOV token, part of its vocabulary; the two unseen words are no one's.
    assert set(words.ravel()) == set(pm.COLORS) | {"[UNK]", "mpconvert-unseen-0", "mpconvert-unseen-1"}


def test_the_api_takes_a_dataset_of_text_and_a_live_model(text_model):
    # A tf.data pipeline yields text as object arrays of bytes: read as unicode, like the CLI's .npz.
    import keras

    import mpconvert

    d = pm.text_rows()
    x = {k: d[k][600:] for k in ("color", "ids", "num")}
    dataset = tf.data.Dataset.from_tensor_slices((x, d["y"][600:])).batch(50)
    assert next(dataset.as_numpy_iterator())[0]["color"].dtype == object
    model = keras.models.load_model(text_model)
    conversion = mpconvert.convert(model, "mixed_bfloat16", data=dataset, finetune_steps=0, speed=False)
    assert conversion.passed, [c["message"] for c in conversion.report["gate"]["checks"] if not c["passed"]]
    validation = conversion.report["validation"]
    assert validation["data"] == "arrays" and validation["rows"] == 200 and validation["drop"] <= 0.01
    # The converted model answers the same text as the float32 one, within bfloat16's rounding.
    want = np.asarray(model(x))
    got = np.asarray(conversion.model(x), dtype=np.float32)
    assert float(np.abs(got - want).max()) <= 0.05


def test_the_large_batch_counts_text_at_four_bytes_a_character():
    from mpconvert.export.artifacts import LARGE_BATCH, large_batch

    short = [np.array([["red"]] * 3), np.zeros((3, 1), np.float32)]
    assert large_batch(short) == LARGE_BATCH  # 12 + 4 bytes a row: far below 64 MiB at 4096 rows
    # One text column of 8192 characters: NumPy's '<U8192' holds 32 KiB a row, so 64 MiB is 2048 rows.
    long = [np.array([["x" * 8192]] * 3)]
    assert long[0].dtype == np.dtype("<U8192") and large_batch(long) == (64 << 20) // (4 * 8192) == 2048


def test_a_model_that_returns_text_is_refused_naming_the_output(tmp_path):
    # Keras declares an inverted StringLookup's output int64; it returns text, which no check compares.
    import keras

    x = keras.Input((4,), name="x")
    scores = keras.layers.Dense(3, name="scores")(x)
    names = keras.layers.StringLookup(vocabulary=["a", "b", "c"], invert=True, name="names")(
        keras.ops.argmax(scores, axis=-1)
    )
    path = tmp_path / "names.keras"
    keras.Model(x, [keras.layers.Activation("softmax", name="p")(scores), names]).save(path)
    out = tmp_path / "out"
    result = invoke(path, "--policy", "mixed_float16", "--out", out, "--no-speed")
    refused(result, out, "output 'names' is a string tensor, made by 'names' (StringLookup)", "ids")


def test_the_litert_file_takes_the_text_and_serves_every_batch(tmp_path):
    # Its float32-computing copy keeps the string Input and the lookup's dtype (only float policies become float32).
    model = pm.text_lookup(tmp_path / "lookup.keras")
    d = pm.text_rows()
    np.savez(tmp_path / "text.npz", color=d["color"][600:], num=d["num"][600:], y=d["y"][600:])
    out = tmp_path / "out"
    args = ["--data", tmp_path / "text.npz", "--out", out, "--no-speed", "--export", "savedmodel,litert"]
    result = invoke(model, "--policy", "mixed_float16", *args)
    assert result.exit_code == 0, result.output
    report = _report(out)
    litert = next(a for a in report["artifacts"] if a["kind"] == "litert")
    check = next(c for c in report["gate"]["checks"] if c["name"] == "artifact parity: litert")
    assert not litert["failed"] and (out / "model.tflite").is_file()
    assert check["passed"] and litert["max_abs_diff"] <= check["values"]["limit"]
    assert [(b["rows"], b["error"]) for b in litert["batches"]] == [(0, None), (1, None), (4096, None)]
