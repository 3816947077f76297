"""The agreement check end to end: fine-tuning that improves a model is not harm.

A small classifier is under-trained on purpose (3 epochs on an easy,
linearly separable task: about 0.6 accuracy), then converted with enough
fine-tuning to get (nearly) every row right. Most of its predictions change, so plain
agreement with the float32 model is far below 0.95, yet almost every row
the float32 model got right is still right: the gate passes.
"""

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import pytest
from conftest import invoke

HARM_KEYS = ("harmed", "fixed", "kept_correct", "kept_correct_rows")


@pytest.fixture(scope="module")
def under_trained(tmp_path_factory):
    """A model.keras with mediocre accuracy and data.npz with x, y, x_train, y_train."""
    import keras
    import numpy as np

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 8)).astype("float32")
    scores = x @ rng.standard_normal((8, 3)).astype("float32")
    top2 = np.sort(scores, axis=1)[:, -2:]
    # 3 linearly separable classes with a margin, so that a trained model gets every row right
    clear = (top2[:, 1] - top2[:, 0] > 1.0).nonzero()[0][:1500]
    x, y = x[clear], scores[clear].argmax(axis=1)
    inputs = keras.Input((8,), name="features")
    hidden = keras.layers.Dense(16, activation="relu", name="hidden")(inputs)
    outputs = keras.layers.Dense(3, activation="softmax", name="predictions")(hidden)
    model = keras.Model(inputs, outputs, name="under_trained")
    model.compile(keras.optimizers.Adam(1e-3), "sparse_categorical_crossentropy")
    model.fit(x[:1000], y[:1000], epochs=3, batch_size=32, verbose=0)
    folder = tmp_path_factory.mktemp("under_trained")
    model.save(folder / "model.keras")
    np.savez(folder / "data.npz", x=x[1000:], y=y[1000:], x_train=x[:1000], y_train=y[:1000])
    return folder


def test_fine_tuning_that_fixes_predictions_passes_the_agreement_check(under_trained, tmp_path):
    out = tmp_path / "out"
    result = invoke(
        under_trained / "model.keras",
        "--policy",
        "mixed_bfloat16",
        "--data",
        under_trained / "data.npz",
        "--out",
        out,
        "--finetune-steps",
        "300",
        "--learning-rate",
        "1e-2",
        "--export",
        "savedmodel",
        "--pad-multiple",
        "0",
    )
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    v = report["validation"]
    assert report["finetune"]["kept"] == "finetuned"
    assert 0.5 <= v["reference"] <= 0.8 and v["converted"] >= v["reference"] + 0.15
    assert v["agreement"] < 0.95  # most predictions changed...
    assert v["fixed"] > v["harmed"]  # ...because fine-tuning fixed them
    assert v["kept_correct"] >= 0.95
    assert v["kept_correct"] == pytest.approx(1 - v["harmed"] / v["kept_correct_rows"])
    (check,) = [c for c in report["gate"]["checks"] if c["name"] == "agreement"]
    assert check["passed"] and check["message"].startswith(
        f"kept {v['kept_correct']:.2%} of the {v['kept_correct_rows']} rows the float32 model got right "
        f"({v['harmed']} harmed, {v['fixed']} fixed"
    )
    # The rule before this change (agreement >= 0.95) failed this conversion
    # with exit code 3: `mpconvert check` still applies it to a report
    # written without the harm counts.
    for key in HARM_KEYS:
        del report["validation"][key]
    # Its verdict as that version stored it, by agreement (a stored gate that judged harm counts the
    # report does not hold contradicts it, and `mpconvert check` fails it as such).
    from mpconvert.report.report import Report

    judged = Report.from_json(report).to_json()
    report.update(passed=judged["passed"], gate=judged["gate"])
    (tmp_path / "old.json").write_text(json.dumps(report))
    recheck = invoke("check", tmp_path / "old.json")
    assert recheck.exit_code == 3, recheck.output
    assert f"FAIL agreement: predictions agree on {v['agreement']:.2%} of " in recheck.output
    assert "FAILED: agreement (exit code 3)" in recheck.output
