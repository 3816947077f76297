"""Fine-tuning: loss scaling through both frameworks, health checks, no harm, determinism."""

import json
import os
import textwrap

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import multi_models
import numpy as np
import pytest
import tf_keras
import tiny_models
from click.testing import CliRunner
from conftest import SAMPLES, invoke

from mpconvert.cli import cli
from mpconvert.data.context import Context
from mpconvert.data.formats import ModelFormat
from mpconvert.data.rows import EvalData, Split, Task
from mpconvert.data.signature import TensorSpec, signature_of
from mpconvert.keras.finetune import takes_class_ids, training_labels
from mpconvert.keras.frameworks import KERAS3, TF_KERAS
from mpconvert.keras.load import Loaded
from mpconvert.keras.rewrite import rewrite
from mpconvert.options.finetune import FinetuneOptions
from mpconvert.options.precision import Precision
from mpconvert.options.rewrite import RewriteOptions
from mpconvert.system.errors import MpconvertError

FRAMEWORKS = [pytest.param((keras, KERAS3), id="keras3"), pytest.param((tf_keras, TF_KERAS), id="tf_keras")]


def regression_data(model, rows=256, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2 * rows, 8)).astype("float32")
    y = (x[:, :1] * 0.5).astype("float32")
    return EvalData(Split((x[:rows],), y[:rows]), Split((x[rows:],), y[rows:]), "npz")


def run_finetune(K, framework, model, data, task, metric, policy, seed=0, **options):
    from mpconvert.keras.finetune import finetune

    converted = rewrite(model, framework, RewriteOptions(policy), [data.validation.inputs[0][:2]]).model
    before = [w.copy() for w in converted.get_weights()]
    context = Context(signature_of(model), task, metric, data, Precision.of(policy))
    loaded = Loaded(model, framework, ModelFormat.OBJECT, safe=False)
    result = finetune(context, loaded, converted, FinetuneOptions(**options), seed)
    return result, converted, before


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_loss_scale_collapse_stops_training_and_restores_the_weights(fw):
    K, framework = fw
    model = tiny_models.gradient_overflow(K)
    original = [w.copy() for w in model.get_weights()]
    data = regression_data(model)
    task = Task("regression", signature_of(model).outputs[0])
    result, converted, before = run_finetune(K, framework, model, data, task, "mse", "mixed_float16", steps=60)
    assert not result.healthy
    assert "loss scale collapsed" in result.problem
    assert "--keep-float32" in result.advice and "mixed_bfloat16" in result.advice
    # 2**15 halves to 1 in 15 skipped steps; the check stops it right there
    assert result.loss_scale is not None and result.loss_scale.to_json() == {
        "initial": 32768.0,
        "final": 1.0,
        "min": 1.0,
    }
    assert result.steps == result.skipped_steps == 15
    assert result.kept == "rewritten" and result.metric_after is None
    for a, b in zip(before, converted.get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(original, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_a_nan_loss_stops_at_the_first_step():
    model = tiny_models.float16_overflow(keras)
    x = np.random.default_rng(0).standard_normal((64, 8)).astype("float32")
    y = model.predict(x, verbose=0).argmax(axis=1)
    data = EvalData(Split((x,), y), Split((x,), y), "npz")
    task = Task("softmax", signature_of(model).outputs[0])
    result, converted, before = run_finetune(keras, KERAS3, model, data, task, "accuracy", "mixed_float16", steps=50)
    assert not result.healthy and result.steps == 1
    assert "the loss became nan" in result.problem
    for a, b in zip(before, converted.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_bfloat16_trains_without_loss_scaling_and_improves_a_regressor(fw):
    K, framework = fw
    model = tiny_models.regression(K)
    data = regression_data(model)
    task = Task("regression", signature_of(model).outputs[0])
    result, _, _ = run_finetune(K, framework, model, data, task, "mse", "mixed_bfloat16", steps=150, learning_rate=3e-3)
    assert result.healthy and result.loss_scale is None and result.skipped_steps == 0
    # An untrained regressor on y = x0 / 2: fine-tuning must lower the error.
    assert result.kept == "finetuned" and result.metric_after < result.metric_before
    assert result.loss.last < result.loss.first
    assert result.step_time.float32_ms > 0 and result.step_time_ratio > 0


def test_no_harm_keeps_the_better_weights():
    # A learning rate this large wrecks a trained classifier; the fine-tuned
    # weights must then be thrown away.
    model = keras.models.load_model(SAMPLES / "cancer_mlp.keras", compile=False)
    with np.load(SAMPLES / "data" / "breast_cancer.npz") as npz:
        data = EvalData(
            Split((npz["x"],), npz["y"].reshape(-1, 1).astype("float32")),
            Split((npz["x_train"],), npz["y_train"].reshape(-1, 1).astype("float32")),
            "npz",
        )
    task = Task("sigmoid", signature_of(model).outputs[0])
    result, converted, before = run_finetune(
        keras, KERAS3, model, data, task, "accuracy", "mixed_float16", steps=40, learning_rate=0.3
    )
    assert result.metric_after < result.metric_before
    assert result.kept == "rewritten"
    for a, b in zip(before, converted.get_weights()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_same_seed_same_numbers(fw):
    K, framework = fw
    results = []
    for _ in range(2):
        K.utils.set_random_seed(1)
        model = tiny_models.regression(K)
        data = regression_data(model)
        task = Task("regression", signature_of(model).outputs[0])
        result, _, _ = run_finetune(K, framework, model, data, task, "mse", "mixed_float16", steps=30, seed=7)
        results.append((result.loss, result.metric_before, result.metric_after, result.loss_scale))
    assert results[0] == results[1]
    assert result.seed == 7  # what report.json's finetune.seed says


def test_cli_runs_give_identical_reports_with_the_same_seed(tmp_path):
    reports = []
    for i in range(2):
        out = tmp_path / f"run{i}"
        result = CliRunner().invoke(
            cli,
            [
                str(SAMPLES / "digits_cnn.keras"),
                "--policy",
                "mixed_float16",
                "--data",
                str(SAMPLES / "data" / "digits.npz"),
                "--out",
                str(out),
                "--export",
                "savedmodel",
                "--finetune-steps",
                "20",
                "--seed",
                "3",
                "--no-speed",  # only the fine-tune and validation figures are compared
            ],
        )
        assert result.exit_code == 0, result.output
        report = json.loads((out / "report.json").read_text())
        ft = report["finetune"]
        reports.append(
            (ft["loss"], ft["metric_before"], ft["metric_after"], ft["kept"], report["validation"]["converted"])
        )
    assert reports[0] == reports[1]


def test_data_function_feeds_fine_tuning_from_a_tf_data_pipeline(tmp_path, monkeypatch):
    (tmp_path / "cancer_pipeline.py").write_text(
        textwrap.dedent(
            f"""
            import numpy as np
            import tensorflow as tf

            def load():
                with np.load({str(SAMPLES / "data" / "breast_cancer.npz")!r}) as npz:
                    train = tf.data.Dataset.from_tensor_slices((npz["x_train"], npz["y_train"])).batch(50)
                    return train, (npz["x"], npz["y"])
            """
        )
    )
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            str(SAMPLES / "cancer_mlp.keras"),
            "--policy",
            "mixed_bfloat16",
            "--data",
            "cancer_pipeline:load",
            "--out",
            str(out),
            "--export",
            "savedmodel",
            "--finetune-steps",
            "10",
            "--no-speed",  # the data's path into fine-tuning is the subject, not the timing
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["validation"]["data"] == "callable" and report["validation"]["rows"] == 143
    assert report["finetune"]["steps"] == 10
    assert report["finetune"]["loss_function"].startswith("binary_crossentropy")


def test_fine_tuning_without_a_training_split_is_a_clear_error(tmp_path):
    with np.load(SAMPLES / "data" / "digits.npz") as npz:
        np.savez(tmp_path / "val.npz", x=npz["x"], y=npz["y"])
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli,
        [
            str(SAMPLES / "digits_cnn.keras"),
            "--policy",
            "mixed_float16",
            "--data",
            str(tmp_path / "val.npz"),
            "--out",
            str(out),
            "--finetune-steps",
            "5",
        ],
    )
    assert result.exit_code == 1
    assert "x_train" in result.stderr and "--finetune-steps 0" in result.stderr
    assert not out.exists()


# --- labels in the form the loss takes ----------------------------------------------

SOFTMAX3 = Task("softmax", TensorSpec("predictions", (None, 3), "float32"))
LOGITS3 = Task("regression", TensorSpec("logits", (None, 3), "float32"))
IDS = np.array([2, 0, 1])
ONE_HOT = np.array([[0, 0, 1], [1, 0, 0], [0, 1, 0]], np.float32)


@pytest.mark.parametrize(
    "name", ["categorical_crossentropy (saved with the model)", "CategoricalCrossentropy (--loss)", "kld (--loss)"]
)
def test_class_ids_become_one_hot_rows_for_a_loss_that_compares_rows(name):
    np.testing.assert_array_equal(training_labels(SOFTMAX3, IDS, name), ONE_HOT)


@pytest.mark.parametrize(
    "name", ["sparse_categorical_crossentropy (default for a softmax output)", "SparseCategoricalCrossentropy (--loss)"]
)
def test_class_ids_stay_ids_for_a_sparse_loss(name):
    assert training_labels(SOFTMAX3, IDS, name) is IDS


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_one_hot_rows_become_class_ids_for_a_sparse_loss_object(fw):
    K, framework = fw
    # Named only by the Loss object, as a loss saved as a config is: its class and its `name` say sparse.
    loss = framework.loss_function(K.losses.SparseCategoricalCrossentropy(from_logits=True, name="ce"))
    assert takes_class_ids("ce (saved with the model)", loss)
    np.testing.assert_array_equal(training_labels(LOGITS3, ONE_HOT, "ce (saved with the model)", loss), IDS)


def test_labels_a_sparse_loss_cannot_take_are_refused_naming_output_loss_and_shape():
    tags = Task("sigmoid", TensorSpec("tags", (None, 3), "float32"))
    multi_label = np.array([[1, 0, 1], [0, 0, 0]], np.float32)
    with pytest.raises(MpconvertError) as caught:
        training_labels(tags, multi_label, "sparse_categorical_crossentropy (--loss)")
    message = caught.value.message
    assert "'tags'" in message and "sparse_categorical_crossentropy (--loss)" in message and "(n, 3)" in message
    assert "--loss" in caught.value.hint


def converted_with_finetune(model_path, data, out, *args):
    result = invoke(
        model_path,
        "--policy",
        "mixed_float16",
        "--data",
        data,
        "--out",
        out,
        "--export",
        "savedmodel",
        "--no-speed",
        "--finetune-steps",
        "30",
        *args,
    )
    assert result.exit_code == 0, result.output
    finetune = json.loads((out / "report.json").read_text())["finetune"]
    assert finetune["healthy"] and finetune["steps"] == 30 and finetune["skipped_steps"] == 0, finetune
    assert finetune["loss"]["first"] is not None and finetune["loss"]["last"] is not None
    return finetune


def saved(K, model, path):
    """A Keras 3 model as .keras; a tf-keras one as a Keras-2 SavedModel, which stays in tf-keras to fine-tune."""
    if K is keras:
        model.save(path.with_suffix(".keras"))
        return path.with_suffix(".keras")
    model.save(str(path), save_format="tf")
    return path


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_a_classifier_saved_with_a_categorical_loss_fine_tunes_on_class_ids(fw, tmp_path):
    K, _ = fw
    model = saved(K, tiny_models.compiled_classifier(K, "categorical_crossentropy"), tmp_path / "categorical")
    data = tiny_models.classifier_npz(tmp_path / "ids.npz", one_hot=False)
    finetune = converted_with_finetune(model, data, tmp_path / "out")
    assert finetune["loss_function"] == "categorical_crossentropy (saved with the model)"


@pytest.mark.parametrize("fw", FRAMEWORKS)
def test_a_logits_classifier_saved_with_a_sparse_loss_fine_tunes_on_one_hot_rows(fw, tmp_path):
    K, _ = fw
    loss = K.losses.SparseCategoricalCrossentropy(from_logits=True)
    model = saved(K, tiny_models.compiled_classifier(K, loss, logits=True), tmp_path / "logits")
    data = tiny_models.classifier_npz(tmp_path / "one_hot.npz", one_hot=True)
    # The logits are scored as regression targets (mse against the one-hot rows): only fine-tuning is judged here.
    finetune = converted_with_finetune(model, data, tmp_path / "out", "--max-drop", "1")
    assert finetune["loss_function"] == "sparse_categorical_crossentropy (saved with the model)"


def test_a_softmax_classifier_saved_with_a_sparse_loss_fine_tunes_on_one_hot_rows(tmp_path):
    model = saved(keras, tiny_models.compiled_classifier(keras, "sparse_categorical_crossentropy"), tmp_path / "m")
    data = tiny_models.classifier_npz(tmp_path / "one_hot.npz", one_hot=True)
    converted_with_finetune(model, data, tmp_path / "out")


@pytest.fixture(scope="module")
def two_heads(tmp_path_factory):
    """Two softmax heads (digit, odd) saved with a categorical loss on one and a sparse loss on the other."""
    root = tmp_path_factory.mktemp("two_heads")
    model = multi_models.two_classifiers(keras, epochs=10)
    model.compile(optimizer="adam", loss=["categorical_crossentropy", "sparse_categorical_crossentropy"])
    model.save(root / "two.keras")
    data = multi_models.digits()
    np.savez(
        root / "ids.npz",
        x=data["x"],
        y_digit=data["y"],
        y_odd=data["y"] % 2,
        x_train=data["x_train"],
        y_digit_train=data["y_train"],
        y_odd_train=data["y_train"] % 2,
    )
    return root / "two.keras", root / "ids.npz"


def test_each_output_gets_labels_in_the_form_of_its_saved_loss(two_heads, tmp_path):
    model, data = two_heads
    finetune = converted_with_finetune(model, data, tmp_path / "out")
    assert finetune["loss_function"] == (
        "digit: categorical_crossentropy (saved with the model); odd: sparse_categorical_crossentropy (saved with the model)"
    )


def test_a_categorical_loss_given_with_the_flag_one_hots_every_output(two_heads, tmp_path):
    model, data = two_heads
    finetune = converted_with_finetune(model, data, tmp_path / "out", "--loss", "categorical_crossentropy")
    assert (
        finetune["loss_function"] == "digit: categorical_crossentropy (--loss); odd: categorical_crossentropy (--loss)"
    )


def test_multi_label_rows_with_a_sparse_loss_are_refused_naming_the_output(tmp_path):
    model = tmp_path / "tags.keras"
    tiny_models.mlp(keras, activation="sigmoid").save(model)
    rng = np.random.default_rng(0)
    x, tags = rng.standard_normal((64, 8)).astype(np.float32), rng.integers(0, 2, (64, 3)).astype(np.float32)
    np.savez(tmp_path / "tags.npz", x=x[:32], y=tags[:32], x_train=x[32:], y_train=tags[32:])
    out = tmp_path / "out"
    args = ["--policy", "mixed_float16", "--data", tmp_path / "tags.npz", "--out", out, "--export", "savedmodel"]
    result = invoke(model, *args, "--loss", "sparse_categorical_crossentropy")
    assert result.exit_code == 1 and result.stderr.count("error: ") == 1 and result.stderr.count("  fix: ") == 1
    assert "output 'predictions'" in result.stderr and "sparse_categorical_crossentropy (--loss)" in result.stderr
    assert "(n, 3)" in result.stderr and "conversion failed unexpectedly" not in result.stderr
    assert not out.exists()
