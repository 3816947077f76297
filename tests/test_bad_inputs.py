"""Everything a user can get wrong: each must exit 1 with one `error:` and one
`fix:` line naming the problem, never touch the input, and leave no output
or staging folder behind. Usage errors exit 2.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import keras
import newer_files
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
import tiny_models
from conftest import console_script, invoke

from mpconvert.system.errors import MpconvertError

REPO = Path(__file__).resolve().parent.parent
SAMPLES = REPO / "sample_models"
DIGITS_CNN = SAMPLES / "digits_cnn.keras"  # input "pixels" (n, 64), softmax over 10 classes
CANCER_MLP = SAMPLES / "cancer_mlp.keras"  # input "features" (n, 30), sigmoid
DIGITS_MLP = SAMPLES / "digits_mlp"  # tf-keras SavedModel
DIGITS_NPZ = SAMPLES / "data" / "digits.npz"
CANCER_NPZ = SAMPLES / "data" / "breast_cancer.npz"
POLICY = ["--policy", "mixed_float16"]
# ONNX export, fine-tuning, padding and the speed stage are slow and irrelevant to input
# errors (no test here reads a fine-tune, padding or speed section; one conversion of
# digits_cnn with them took 18.6 s, 14 s of it fine-tuning, padding and timing).
FAST = [*POLICY, "--export", "savedmodel", "--finetune-steps", "0", "--no-speed", "--pad-multiple", "0"]


@keras.saving.register_keras_serializable(package="tests")
class Float32ConstantAdd(keras.layers.Layer):
    """Adds a float32 constant without casting: fine in float32, broken when
    its input arrives as float16 under mixed_float16."""

    def call(self, x):
        return x + tf.constant(np.ones((1,), np.float32))


# --- helpers ----------------------------------------------------------------


def digest(path: Path) -> str:
    """Hash of a file, or of every file (with its relative path) in a folder."""
    h = hashlib.sha256()
    if path.is_file():
        h.update(path.read_bytes())
        return h.hexdigest()
    for p in sorted(path.rglob("*")):
        h.update(str(p.relative_to(path)).encode() + b"\0")
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def leftovers(out: Path) -> list[str]:
    """Hidden staging/backup folders that outdir.py creates beside `out`."""
    if not out.parent.is_dir():
        return []
    return [p.name for p in out.parent.iterdir() if p.name.startswith((f".{out.name}.partial-", f".{out.name}.old-"))]


def assert_failed(result, out: Path, *needles: str) -> None:
    """Exit 1, exactly one error and one fix line, the needles, nothing written."""
    err = result.stderr
    assert result.exit_code == 1, (result.exit_code, result.output, result.exception)
    assert err.count("error: ") == 1 and err.count("  fix: ") == 1, err
    assert err.index("error: ") < err.index("  fix: "), err
    assert "Traceback" not in err
    # A bug would surface as this generic message instead of a specific one.
    assert "conversion failed unexpectedly" not in err, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in {err!r}"
    assert not out.exists(), f"{out} was created by a failed run"
    assert leftovers(out) == []


def fails_leaving_input(model: Path, out: Path, *args, needles=()):
    before = digest(model) if model.exists() else None
    result = invoke(model, *FAST, "--out", out, *args)
    assert_failed(result, out, *needles)
    if before is not None:
        assert digest(model) == before, "the input model was modified"
    return result


def read_report(out: Path) -> dict:
    return json.loads((out / "report.json").read_text())


# --- models built once per module -------------------------------------------


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="module")
def lambda_keras(built):
    path = built / "lambda.keras"
    tiny_models.lambda_model(keras).save(path)
    return path


@pytest.fixture(scope="module")
def lambda_savedmodel(built):
    path = built / "lambda_savedmodel"
    tiny_models.lambda_model(tf_keras).save(str(path), save_format="tf")
    return path


@pytest.fixture(scope="module")
def custom_keras(built):
    x = keras.Input((8,), name="features")
    h = keras.layers.Dense(16, activation="relu", name="hidden")(x)
    h = Float32ConstantAdd(name="add_ones")(h)
    out = keras.layers.Dense(3, activation="softmax", name="predictions")(h)
    path = built / "custom.keras"
    keras.Model(x, out, name="custom").save(path)
    return path


@pytest.fixture(scope="module")
def mixed_keras(built):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = tiny_models.mlp(keras)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    path = built / "mixed.keras"
    model.save(path)
    return path


@pytest.fixture(scope="module")
def h5_files(built):
    full = built / "mlp.h5"
    tiny_models.mlp(keras).save(full)
    truncated = built / "truncated.h5"
    raw = full.read_bytes()
    truncated.write_bytes(raw[: len(raw) // 2])
    weights = built / "mlp.weights.h5"
    tiny_models.mlp(keras).save_weights(weights)
    return {"truncated": truncated, "weights": weights}


@pytest.fixture(scope="module")
def two_inputs(built):
    left = keras.Input((4,), name="left")
    right = keras.Input((3,), name="right")
    h = keras.layers.Concatenate(name="join")([left, right])
    out = keras.layers.Dense(3, activation="softmax", name="predictions")(h)
    path = built / "two_inputs.keras"
    keras.Model([left, right], out, name="two_inputs").save(path)
    return path


@pytest.fixture
def keras_safe_mode_restored():
    """--unsafe-deserialization turns off the frameworks' process-wide safe
    mode; other test modules in this process must not inherit that."""
    from keras.src.backend.common import global_state
    from tf_keras.src.saving import serialization_lib as tfk

    before = global_state.get_global_attribute("safe_mode_saving")
    tfk_before = getattr(tfk.SAFE_MODE, "safe_mode", None)
    yield
    global_state.set_global_attribute("safe_mode_saving", before)
    tfk.SAFE_MODE.safe_mode = tfk_before


# --- the model path ---------------------------------------------------------


def test_missing_model(tmp_path):
    out = tmp_path / "out"
    fails_leaving_input(tmp_path / "nope.keras", out, needles=("model not found", "nope.keras", ".keras"))


def test_unsupported_extension(tmp_path):
    model = tmp_path / "model.onnx"
    model.write_bytes(b"\x08\x07onnx-ish")
    fails_leaving_input(model, tmp_path / "out", needles=("unsupported model file", "model.onnx", ".keras", ".h5"))


def test_folder_that_is_not_a_savedmodel(tmp_path):
    folder = tmp_path / "just_a_folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a model")
    fails_leaving_input(folder, tmp_path / "out", needles=("not a SavedModel", "saved_model.pb"))


def test_savedmodel_without_keras_metadata(tmp_path):
    class Doubler(tf.Module):
        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32)])
        def __call__(self, x):
            return x * 2.0

    folder = tmp_path / "plain_savedmodel"
    tf.saved_model.save(Doubler(), str(folder))
    assert (folder / "saved_model.pb").is_file() and not (folder / "keras_metadata.pb").exists()
    # Converted at graph level now (tests/test_graph.py); a graph with nothing to compute in 16 bits
    # (one Mul) fails the policy-rewrite check, and the input is left as it was.
    before = sorted((p.relative_to(folder), p.stat().st_mtime_ns) for p in folder.rglob("*"))
    result = invoke(folder, "--policy", "mixed_float16", "--out", tmp_path / "out")
    assert result.exit_code == 3, result.output
    assert "graph-level: no Keras layers" in result.output and "FAIL policy rewrite" in result.output
    assert sorted((p.relative_to(folder), p.stat().st_mtime_ns) for p in folder.rglob("*")) == before


def test_corrupt_keras_file(tmp_path):
    model = tmp_path / "corrupt.keras"
    model.write_bytes(np.random.default_rng(0).bytes(4096))
    fails_leaving_input(model, tmp_path / "out", needles=("corrupt.keras", "damaged"))


def test_truncated_h5(tmp_path, h5_files):
    fails_leaving_input(h5_files["truncated"], tmp_path / "out", needles=("truncated.h5", "damaged"))


def test_weights_only_h5(tmp_path, h5_files):
    fails_leaving_input(h5_files["weights"], tmp_path / "out", needles=("weights only", "model.save("))


# --- files from a newer Keras (or TensorFlow) ---------------------------------------
#
# Each is a model this Keras saved, stamped with a newer version where its
# format keeps it and using a layer class (an op, at graph level) that no
# installed version has (tests/newer_files.py).

NEWER_KERAS = "9.0.0"  # newer than any Keras 3.x, for a file Keras 3 reads
NEWER_TF_KERAS = "2.99.0"  # newer than the installed tf-keras 2.x, for a file tf-keras reads


@pytest.fixture(scope="module")
def saved_files(built):
    """The files the newer ones are made from: a .keras and .h5 by Keras 3, an .h5 and SavedModel by tf-keras."""
    import graph_models

    tiny_models.mlp(keras).save(built / "keras3.keras")
    tiny_models.mlp(keras).save(built / "keras3.h5")
    tiny_models.mlp(tf_keras).save(str(built / "tf_keras.h5"))
    tiny_models.mlp(tf_keras).save(str(built / "tf_keras_savedmodel"), save_format="tf")
    graph_models.two_matmuls(built / "graph")
    return built


NEWER_FILES = [
    # (id, how to make it from saved_files, its version, the installed reader named in the message)
    (
        "keras",
        lambda b, t, v: newer_files.keras_file(b / "keras3.keras", t / "m.keras", v, *FANCY),
        NEWER_KERAS,
        "Keras",
    ),
    ("h5-keras3", lambda b, t, v: newer_files.h5_file(b / "keras3.h5", t / "m.h5", v, *FANCY), NEWER_KERAS, "Keras"),
    (
        "h5-tf-keras",
        lambda b, t, v: newer_files.h5_file(b / "tf_keras.h5", t / "m.h5", v, *FANCY),
        NEWER_TF_KERAS,
        "tf-keras",
    ),
    (
        "savedmodel",
        lambda b, t, v: newer_files.savedmodel(b / "tf_keras_savedmodel", t / "m", v, *FANCY),
        NEWER_TF_KERAS,
        "tf-keras",
    ),
]
FANCY = ("hidden", "FancyNewLayer")


def installed_version(reader: str) -> str:
    return keras.__version__ if reader == "Keras" else tf_keras.__version__


@pytest.mark.parametrize("make,version,reader", [pytest.param(m, v, r, id=i) for i, m, v, r in NEWER_FILES])
def test_a_file_from_a_newer_keras_names_both_versions(tmp_path, saved_files, make, version, reader):
    model = make(saved_files, tmp_path, version)
    result = fails_leaving_input(model, tmp_path / "out", needles=("FancyNewLayer",))
    error, fix = result.stderr.splitlines()[-2:]
    assert f"was saved by Keras {version}, and this is {reader} {installed_version(reader)}" in error, error
    wanted = ".".join(version.split(".")[:2])
    assert f"{reader} {wanted} or newer" in fix and "re-save" in fix, fix


@pytest.mark.parametrize("make,version,reader", [pytest.param(m, v, r, id=i) for i, m, v, r in NEWER_FILES])
def test_the_same_file_from_this_keras_says_nothing_of_versions(tmp_path, saved_files, make, version, reader):
    model = make(saved_files, tmp_path, installed_version(reader))
    result = fails_leaving_input(model, tmp_path / "out", needles=("FancyNewLayer",))
    assert "was saved by" not in result.stderr and "or newer" not in result.stderr


def test_an_unknown_layer_class_in_a_savedmodel_is_named_at_load(tmp_path, saved_files):
    # tf-keras revives such a layer as a stand-in; the rebuild used to fail on it with
    # "'str' object is not callable", naming neither the layer nor its class.
    model = newer_files.savedmodel(saved_files / "tf_keras_savedmodel", tmp_path / "m", tf_keras.__version__, *FANCY)
    fails_leaving_input(model, tmp_path / "out", needles=("layer 'hidden'", "'FancyNewLayer'", "--import"))


def test_a_graph_from_a_newer_tensorflow_names_both_versions(tmp_path, saved_files):
    model = newer_files.graph_savedmodel(saved_files / "graph", tmp_path / "g", "9.0.0", "MatMul", "FancyNewMatMul")
    result = fails_leaving_input(model, tmp_path / "out", needles=("FancyNewMatMul",))
    error, fix = result.stderr.splitlines()[-2:]
    assert f"was saved by TensorFlow 9.0.0, and this is TensorFlow {tf.__version__}" in error, error
    assert "TensorFlow 9.0 or newer" in fix, fix


def _truncate(path: Path) -> None:
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 3])


def _damage_keras_weights(model: Path) -> None:
    """A .keras whose config is intact but whose weights file is cut short."""
    import zipfile

    with zipfile.ZipFile(DIGITS_CNN) as src, zipfile.ZipFile(model, "w") as dst:
        for item in src.infolist():
            data = src.read(item.filename)
            dst.writestr(item.filename, data[: len(data) // 2] if item.filename.endswith(".h5") else data)


@pytest.mark.parametrize(
    "damage,needles",
    [
        pytest.param(lambda m: _truncate(m / "keras_metadata.pb"), ("damaged",), id="savedmodel-metadata-truncated"),
        pytest.param(lambda m: _truncate(m / "saved_model.pb"), ("cannot load",), id="savedmodel-graph-truncated"),
        pytest.param(
            lambda m: shutil.rmtree(m / "variables"), ("cannot load", "variables"), id="savedmodel-no-variables"
        ),
    ],
)
def test_damaged_savedmodel(tmp_path, damage, needles):
    model = tmp_path / "digits_mlp"
    shutil.copytree(DIGITS_MLP, model)
    damage(model)
    fails_leaving_input(model, tmp_path / "out", needles=("digits_mlp", *needles))


def test_keras_file_with_damaged_weights(tmp_path):
    model = tmp_path / "damaged_weights.keras"
    _damage_keras_weights(model)
    fails_leaving_input(model, tmp_path / "out", needles=("damaged_weights.keras", "cannot load"))


# --- Lambda layers (code that runs on load) ---------------------------------


@pytest.mark.parametrize("which", ["lambda_keras", "lambda_savedmodel"])
def test_lambda_layer_is_refused_without_opt_in(tmp_path, request, which):
    model = request.getfixturevalue(which)
    fails_leaving_input(model, tmp_path / "out", needles=("Lambda", "double", "--unsafe-deserialization"))


@pytest.mark.usefixtures("keras_safe_mode_restored")
@pytest.mark.parametrize("which", ["lambda_keras", "lambda_savedmodel"])
def test_lambda_layer_converts_with_opt_in(tmp_path, request, which):
    # Loading alone is not enough: the rewrite rebuilds the model from its
    # config and the export reloads it, and both deserialize the Lambda again.
    model = request.getfixturevalue(which)
    before = digest(model)
    out = tmp_path / "out"
    result = invoke(model, *FAST, "--out", out, "--unsafe-deserialization")
    assert result.exit_code in (0, 3), result.output
    assert (out / "report.json").is_file()
    assert digest(model) == before
    # The opt-in applies to that run only: mpconvert's own check still
    # refuses the next run without the flag in the same process.
    fails_leaving_input(model, tmp_path / "again", needles=("--unsafe-deserialization",))


# --- bad data ---------------------------------------------------------------


def _digits(rows=20):
    with np.load(DIGITS_NPZ) as npz:
        return npz["x"][:rows].copy(), npz["y"][:rows].copy()


def _with(**changes):
    """Valid digits arrays with some keys replaced (None removes the key)."""

    def build():
        x, y = _digits()
        arrays = {"x": x, "y": y}
        for key, value in changes.items():
            value = value(x, y) if callable(value) else value
            if value is None:
                arrays.pop(key, None)
            else:
                arrays[key] = value
        return arrays

    return build


def _nan(x, y):
    x = x.copy()
    x[3, 5] = np.nan
    return x


def _out_of_range(x, y):
    y = y.copy()
    y[0] = 10
    return y


# (id, arrays, substrings the message must contain)
DATA_CASES = [
    ("missing_x", _with(x=None), ["'x'", "(n, 64)"]),
    ("missing_y", _with(y=None), ["'y'", "(n, 64)"]),
    ("x_wrong_width", _with(x=lambda x, y: x[:, :63]), ["'x'", "(20, 63)", "(n, 64)"]),
    ("x_flat_image", _with(x=lambda x, y: x.reshape(-1, 8, 8)), ["'x'", "(n, 64)"]),
    ("x_strings", _with(x=lambda x, y: x.astype(str)), ["'x'", "dtype", "(n, 64)"]),
    ("x_empty", _with(x=np.zeros((0, 64), np.float32), y=np.zeros((0,), np.int64)), ["'x'", "empty", "(n, 64)"]),
    ("y_empty", _with(y=np.zeros((0,), np.int64)), ["'y'", "empty"]),
    ("x_nan", _with(x=_nan), ["'x'", "NaN"]),
    ("y_out_of_range", _with(y=_out_of_range), ["'y'", "10 classes"]),
    ("y_negative", _with(y=lambda x, y: y - 1), ["'y'", "10 classes"]),
    ("y_fractional", _with(y=lambda x, y: y + 0.5), ["'y'", "non-integer"]),
    ("y_strings", _with(y=lambda x, y: y.astype(str)), ["'y'", "dtype"]),
    ("rows_mismatch", _with(y=lambda x, y: y[:-1]), ["'x'", "20 rows", "'y'", "19"]),
    # Training splits are optional, but once present they are checked like x/y.
    ("x_train_without_y_train", _with(x_train=lambda x, y: x), ["'y_train'"]),
    ("y_train_without_x_train", _with(y_train=lambda x, y: y), ["'x_train'", "(n, 64)"]),
    ("x_train_wrong_width", _with(x_train=lambda x, y: x[:, :10], y_train=lambda x, y: y), ["'x_train'", "(n, 64)"]),
    ("x_train_nan", _with(x_train=_nan, y_train=lambda x, y: y), ["'x_train'", "NaN"]),
    ("y_train_out_of_range", _with(x_train=lambda x, y: x, y_train=_out_of_range), ["'y_train'", "10 classes"]),
    ("train_rows_mismatch", _with(x_train=lambda x, y: x, y_train=lambda x, y: y[:5]), ["'x_train'", "'y_train'"]),
]


@pytest.mark.parametrize("build,needles", [pytest.param(b, n, id=i) for i, b, n in DATA_CASES])
def test_bad_data_is_refused(tmp_path, build, needles):
    data = tmp_path / "data.npz"
    np.savez(data, **build())
    before = digest(data)
    fails_leaving_input(DIGITS_CNN, tmp_path / "out", "--data", data, needles=needles)
    assert digest(data) == before


def test_missing_data_file(tmp_path):
    data = tmp_path / "absent.npz"
    fails_leaving_input(DIGITS_CNN, tmp_path / "out", "--data", data, needles=("data file not found", "absent.npz"))


def test_corrupt_data_file(tmp_path):
    data = tmp_path / "corrupt.npz"
    data.write_bytes(b"PK\x03\x04" + np.random.default_rng(1).bytes(1000))
    fails_leaving_input(DIGITS_CNN, tmp_path / "out", "--data", data, needles=("corrupt.npz", "np.savez"))


def test_object_arrays_are_not_unpickled(tmp_path):
    x, y = _digits()
    data = tmp_path / "objects.npz"
    # Ragged rows force an object array, which np.savez can only pickle.
    np.savez(data, x=np.array([list(r) for r in x[:-1]] + [[1.0]], dtype=object), y=y)
    fails_leaving_input(DIGITS_CNN, tmp_path / "out", "--data", data, needles=("object arrays", "pickl"))


def test_sigmoid_labels_must_be_binary(tmp_path):
    with np.load(CANCER_NPZ) as npz:
        x, y = npz["x"][:20], npz["y"][:20].copy()
    y[0] = 2
    data = tmp_path / "data.npz"
    np.savez(data, x=x, y=y)
    fails_leaving_input(CANCER_MLP, tmp_path / "out", "--data", data, needles=("'y'", "0/1", "malignant"))


def test_multi_input_data_names_the_missing_input(tmp_path, two_inputs):
    data = tmp_path / "data.npz"
    rng = np.random.default_rng(0)
    # A single-input file (x) for a two-input model: the error must name the
    # per-input key the user has to write, not 'x'.
    np.savez(data, left=rng.standard_normal((10, 4)).astype(np.float32), y=rng.integers(0, 3, 10))
    result = fails_leaving_input(two_inputs, tmp_path / "out", "--data", data, needles=("'right'", "(n, 3)"))
    assert "'x'" not in result.stderr


def test_multi_input_data_converts(tmp_path, two_inputs):
    # Guards the test above: the same model with both keys is accepted.
    data = tmp_path / "data.npz"
    rng = np.random.default_rng(0)
    np.savez(
        data,
        left=rng.standard_normal((10, 4)).astype(np.float32),
        right=rng.standard_normal((10, 3)).astype(np.float32),
        y=rng.integers(0, 3, 10),
    )
    result = invoke(two_inputs, *FAST, "--out", tmp_path / "out", "--data", data, "--max-drop", "1")
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    # Both inputs were read by name and scored on the 10 labelled rows.
    assert [spec["name"] for spec in report["source"]["inputs"]] == ["left", "right"]
    assert report["validation"]["data"] == "npz" and report["validation"]["rows"] == 10
    assert report["validation"]["metric"] == "accuracy"


# --- layers that cannot be converted ----------------------------------------


def test_unconvertible_custom_layer_is_named(tmp_path, custom_keras):
    result = fails_leaving_input(
        custom_keras, tmp_path / "out", needles=("'add_ones'", "Float32ConstantAdd", "mixed_float16", "--keep-float32")
    )
    fix = result.stderr.split("  fix: ", 1)[1]
    assert "--keep-float32 'add_ones'" in fix
    # Without --out the default folder beside the model must not appear either.
    default = custom_keras.parent / "custom_mixed_float16"
    assert invoke(custom_keras, *FAST).exit_code == 1
    assert not default.exists() and leftovers(default) == []


def test_unconvertible_custom_layer_converts_when_kept_float32(tmp_path, custom_keras):
    before = digest(custom_keras)
    out = tmp_path / "out"
    result = invoke(custom_keras, *FAST, "--out", out, "--keep-float32", "add_ones")
    assert result.exit_code in (0, 3), result.output
    assert digest(custom_keras) == before
    layers = {layer["name"]: layer for layer in read_report(out)["layers"]}
    kept = layers["add_ones"]
    assert kept["class_name"] == "Float32ConstantAdd"
    assert kept["policy"] == "float32"
    assert "--keep-float32" in kept["pinned"]
    assert layers["hidden"]["policy"] == "mixed_float16"


def test_already_mixed_model(tmp_path, mixed_keras):
    fails_leaving_input(mixed_keras, tmp_path / "out", needles=("already mixed precision", "float32 original"))


def test_keep_float32_invalid_regex(tmp_path):
    fails_leaving_input(
        DIGITS_CNN, tmp_path / "out", "--keep-float32", "conv[", needles=("'conv['", "not a valid regular expression")
    )


def test_keep_float32_matching_no_layer(tmp_path):
    fails_leaving_input(
        DIGITS_CNN,
        tmp_path / "out",
        "--keep-float32",
        "no_such_layer",
        needles=("'no_such_layer'", "matches no layer", "inspect"),
    )


# --- the output folder ------------------------------------------------------


def test_existing_output_folder_needs_force(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    before = digest(out)
    result = invoke(DIGITS_CNN, *FAST, "--out", out)
    assert result.exit_code == 1
    assert "--force" in result.stderr and "Traceback" not in result.stderr
    assert digest(out) == before
    assert leftovers(out) == []


def test_force_replaces_output_folder(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old run")
    result = invoke(DIGITS_CNN, *FAST, "--out", out, "--data", DIGITS_NPZ, "--force")
    assert result.exit_code == 0, result.output
    assert not (out / "stale.txt").exists()
    assert (out / "report.json").is_file()
    assert leftovers(out) == []


def test_output_inside_input_savedmodel(tmp_path):
    model = tmp_path / "digits_mlp"
    shutil.copytree(DIGITS_MLP, model)
    fails_leaving_input(model, model / "converted", needles=("is inside the input", "--out"))
    assert not (model / "converted").exists()


def test_output_that_would_contain_the_input(tmp_path):
    model = tmp_path / "models" / "digits_cnn.keras"
    model.parent.mkdir()
    shutil.copy(DIGITS_CNN, model)
    result = invoke(model, *FAST, "--out", tmp_path / "models", "--force")
    assert result.exit_code == 1 and "would delete the input" in result.stderr
    assert digest(model) == digest(DIGITS_CNN)


def test_force_never_deletes_the_data_file(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    data = out / "digits.npz"
    shutil.copy(DIGITS_NPZ, data)
    before = digest(data)
    result = invoke(DIGITS_CNN, *FAST, "--data", data, "--out", out, "--force")
    assert data.is_file() and digest(data) == before, "--force deleted the user's data file"
    assert result.exit_code == 1 and "contains the input" in result.stderr


def test_output_path_is_a_file(tmp_path):
    out = tmp_path / "out"
    out.write_text("a file")
    result = invoke(DIGITS_CNN, *FAST, "--out", out)
    assert result.exit_code == 1 and "is a file" in result.stderr
    assert out.read_text() == "a file"


def test_failure_while_exporting_leaves_old_output_and_no_staging(tmp_path, monkeypatch):
    import mpconvert.pipeline as pipeline

    def failing_export(source, model, inputs, staging, options):
        (staging / "half_written.bin").write_bytes(b"\0" * 10)
        raise MpconvertError("export failed on purpose", hint="none")

    monkeypatch.setattr(pipeline, "export", failing_export)
    out = tmp_path / "out"
    out.mkdir()
    (out / "previous.txt").write_text("from an earlier run")
    before = digest(out)
    result = invoke(DIGITS_CNN, *FAST, "--out", out, "--force")
    assert result.exit_code == 1 and "export failed on purpose" in result.stderr
    # --force replaces the old folder only once the new one is complete.
    assert digest(out) == before
    assert leftovers(out) == []
    fresh = tmp_path / "fresh" / "nested" / "out"
    assert_failed(invoke(DIGITS_CNN, *FAST, "--out", fresh), fresh, "export failed on purpose")
    # Parent folders made for the staging folder are removed again too.
    assert not (tmp_path / "fresh").exists()


# --- usage errors -----------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        pytest.param([], id="no-policy"),
        pytest.param(["--policy", "float16"], id="policy-float16"),
        pytest.param([*POLICY, "--export", "bogus"], id="export-bogus"),
        pytest.param([*POLICY, "--export", ","], id="export-empty"),
        pytest.param([*POLICY, "--max-drop", "-1"], id="max-drop-negative"),
        pytest.param([*POLICY, "--metric", "f1"], id="metric-unknown"),
    ],
)
def test_usage_errors_exit_2(tmp_path, args):
    out = tmp_path / "out"
    result = invoke(DIGITS_CNN, *args, "--out", out)
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert not out.exists()


# --- the real entry point ---------------------------------------------------

TF_NOISE = ("I0000", "W0000", "E0000", "absl", "cudart", "oneDNN", "Traceback")


def run_cli(*args, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    # main() must quiet TensorFlow by itself, not rely on the caller's env.
    return subprocess.run([console_script(), *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)


def test_entry_point_missing_model_is_one_clean_message(tmp_path):
    proc = run_cli(tmp_path / "missing.keras", *FAST)
    assert proc.returncode == 1
    assert "error: model not found" in proc.stderr and "  fix: " in proc.stderr
    assert not any(noise in proc.stderr for noise in TF_NOISE), proc.stderr


def test_entry_point_hides_tensorflow_noise_after_loading(tmp_path):
    # A data error comes after TensorFlow and Keras are imported and the
    # model is loaded, when their C++ and Python logging has had its chance.
    out = tmp_path / "out"
    proc = run_cli(DIGITS_CNN, *FAST, "--data", tmp_path / "absent.npz", "--out", out)
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0].startswith("error: data file not found"), proc.stderr
    assert lines[1].startswith("  fix: ") and len(lines) == 2, proc.stderr
    assert proc.stdout == ""
    assert not out.exists()


def test_entry_point_debug_shows_traceback(tmp_path):
    proc = run_cli(tmp_path / "missing.keras", *FAST, "--debug")
    assert proc.returncode == 1
    assert "Traceback" in proc.stderr
    assert "MpconvertError" in proc.stderr
    assert "error: model not found" in proc.stderr
