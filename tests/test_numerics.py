"""Numerics that fix themselves: the lint, automatic float32, the accuracy-driven search (issue 11).

Each model is built here, small, with numbers chosen by hand so the failure
is known: activations beyond float16's 65504, and small differences riding
on a large value that 16-bit rounding erases without any overflow.
"""

import json
import math

import keras
import numpy as np
import pytest
from conftest import invoke

from mpconvert.keras.frameworks import KERAS3
from mpconvert.keras.lint import computes_in_float32, lint
from mpconvert.options.precision import Precision

FAST = ["--export", "savedmodel", "--finetune-steps", "0", "--pad-multiple", "0"]


def overflow_in_the_middle(seed=0):
    """input -> stem -> big (weights up to 3e4: |h| ~ 1e5 > 65504) -> small (x1e-4) -> tail -> softmax.

    Exact in float32; under float16 `big` overflows, and so does `small`,
    which casts that input to float16 before multiplying.
    """
    keras.utils.set_random_seed(seed)
    rng = np.random.default_rng(seed)
    x = keras.Input((8,), name="features")
    h = keras.layers.Dense(16, activation="relu", name="stem")(x)
    h = keras.layers.Dense(16, name="big")(h)
    h = keras.layers.Dense(16, name="small")(h)
    h = keras.layers.Dense(16, activation="relu", name="tail")(h)
    model = keras.Model(x, keras.layers.Dense(3, activation="softmax", name="predictions")(h))
    # Weights within float16's range (a weights finding would be a different story): only the activations overflow.
    model.get_layer("big").set_weights([rng.uniform(-1, 1, (16, 16)).astype("float32") * 3e4, np.zeros(16, "float32")])
    model.get_layer("small").set_weights([np.eye(16, dtype="float32") * 1e-4, np.zeros(16, "float32")])
    return model


def offset_carrier(spread: float, seed=0):
    """Inputs 3000 + spread * r; `carry` passes them on, `center` subtracts the 3000.

    The class is the sign of r0 + r1. float16's spacing at 3000 is 2, so
    rounding erases part of r unless both `carry` and `center` compute in
    float32: keeping either alone still casts 3000 + r to 16 bits on the way.
    """
    keras.utils.set_random_seed(seed)
    x = keras.Input((4,), name="readings")
    carry = keras.layers.Dense(4, name="carry")
    center = keras.layers.Dense(4, name="center")
    h = center(carry(x))
    h = keras.layers.Dense(16, activation="relu", name="hidden")(h)
    model = keras.Model(x, keras.layers.Dense(2, activation="softmax", name="predictions")(h))
    carry.set_weights([np.eye(4, dtype="float32"), np.zeros(4, "float32")])
    center.set_weights([np.eye(4, dtype="float32"), np.full(4, -3000.0, "float32")])
    carry.trainable = center.trainable = False
    rng = np.random.default_rng(seed)
    r = rng.standard_normal((1200, 4)).astype("float32")
    data = (3000.0 + spread * r).astype("float32")
    labels = (r[:, 0] + r[:, 1] > 0).astype("int64")
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="sparse_categorical_crossentropy")
    model.fit(data[:800], labels[:800], epochs=40, batch_size=64, verbose=0)
    return model, data[800:], labels[800:]


@pytest.fixture(scope="module")
def overflow_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("overflow")
    model = overflow_in_the_middle()
    x = np.random.default_rng(1).standard_normal((300, 8)).astype("float32")
    model.save(folder / "model.keras")
    np.savez(folder / "data.npz", x=x, y=model.predict(x, verbose=0).argmax(1))
    return folder / "model.keras", folder / "data.npz"


@pytest.fixture(scope="module")
def carrier_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("carrier")
    model, x, y = offset_carrier(spread=5.0)
    model.save(folder / "model.keras")
    np.savez(folder / "data.npz", x=x, y=y)
    return folder / "model.keras", folder / "data.npz"


def pinned(report):
    return {
        layer["name"]: layer["pinned"]
        for layer in report["layers"]
        if layer["pinned"] and layer["pinned"] != "input layer"
    }


def test_the_lint_alone_keeps_the_overflowing_layer_and_its_reader(overflow_files, tmp_path):
    model, data = overflow_files
    result = invoke(model, "--policy", "mixed_float16", "--data", data, "--out", tmp_path / "o", *FAST)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    kept = pinned(report)
    assert set(kept) == {"big", "small", "predictions"}, kept
    assert kept["big"].startswith("numeric lint: output max ") and kept["big"].endswith("> float16 max 65504")
    assert kept["small"].startswith("numeric lint: reads 'big': input max ")
    assert kept["predictions"] == "model output (softmax split from Dense)"
    converted = {layer["name"] for layer in report["layers"] if layer["policy"] == "mixed_float16"}
    assert converted == {"stem", "tail", "predictions_linear"}
    v = report["validation"]
    assert v["nonfinite_outputs"] == 0 and v["drop"] <= 0.01
    assert report["auto_keep"]["search"] is None  # the lint was enough


def test_auto_keep_off_gives_the_old_gate_failure(overflow_files, tmp_path):
    model, data = overflow_files
    result = invoke(
        model, "--policy", "mixed_float16", "--data", data, "--out", tmp_path / "o", *FAST, "--auto-keep", "off"
    )
    assert result.exit_code == 3, result.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["validation"]["nonfinite_outputs"] > 0 and report["auto_keep"] == {
        "mode": "off",
        "lint": None,
        "search": None,
    }


def test_bfloat16_needs_nothing_kept_on_the_same_model(overflow_files, tmp_path):
    model, data = overflow_files
    result = invoke(model, "--policy", "mixed_bfloat16", "--data", data, "--out", tmp_path / "o", *FAST)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    assert report["auto_keep"]["lint"]["findings"] == [] and set(pinned(report)) == {"predictions"}


def test_the_search_finds_two_layers_that_only_matter_together(carrier_files, tmp_path):
    model, data = carrier_files
    off = invoke(
        model, "--policy", "mixed_float16", "--data", data, "--out", tmp_path / "off", *FAST, "--auto-keep", "off"
    )
    assert off.exit_code == 3, off.output  # 16 bits cost accuracy here
    lint_only = invoke(
        model, "--policy", "mixed_float16", "--data", data, "--out", tmp_path / "lint", *FAST, "--auto-keep", "lint"
    )
    assert lint_only.exit_code == 3  # a spread of 5 is above 2 spacings: the lint does not see it
    result = invoke(model, "--policy", "mixed_float16", "--data", data, "--out", tmp_path / "o", *FAST)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "o" / "report.json").read_text())
    search = report["auto_keep"]["search"]
    assert sorted(search["kept"]) == ["carry", "center"] and search["outcome"] == "passed"
    before = json.loads((tmp_path / "off" / "report.json").read_text())["validation"]["drop"]
    kept = pinned(report)
    assert (
        kept["carry"]
        == kept["center"]
        == f"accuracy-driven search: drop {before:.3f} -> {report['validation']['drop']:.3f}"
    )
    assert report["validation"]["drop"] <= 0.01
    # Far below node-level bisection: at most 2 log2(L) + 2 L_kept trials.
    convertible = 5  # carry, center, hidden, predictions_linear + the full-16-bit start
    assert search["trials"] <= 2 * math.log2(convertible) + 2 * 2
    assert [r["layer"] for r in search["ranking"][:2]] in (["carry", "center"], ["center", "carry"])
    assert f"search: {search['trials']} trials" in result.output


def test_the_lint_sees_small_differences_on_a_large_value(tmp_path):
    model, x, _ = offset_carrier(spread=1.0)
    found = lint(model, KERAS3, Precision.of("mixed_float16"), [x[:200]], {"carry", "center", "hidden"})
    keep = found.keep
    assert set(keep) == {"carry", "center"}
    assert (
        keep["carry"].startswith("numeric lint: input 'readings' varies by ")
        and "float16's spacing 2 there" in keep["carry"]
    )
    assert keep["center"].startswith("numeric lint: reads 'carry', whose output varies by ")


def test_the_lint_flags_integers_beyond_the_exact_range():
    keras.utils.set_random_seed(0)
    x = keras.Input((3,), name="ids_as_floats")
    model = keras.Model(x, keras.layers.Dense(2, name="dense")(x))
    ints = np.random.default_rng(0).integers(0, 1000, size=(64, 3)).astype("float32")
    assert lint(model, KERAS3, Precision.of("mixed_float16"), [ints], {"dense"}).findings == ()  # < 2048
    (finding,) = lint(model, KERAS3, Precision.of("mixed_bfloat16"), [ints], {"dense"}).findings
    assert finding.layer == "dense" and "beyond bfloat16's exact 256" in finding.message


def test_constants_and_epsilons_the_format_cannot_hold():
    keras.utils.set_random_seed(0)
    x = keras.Input((8,), name="x")
    h = keras.layers.Dense(8, name="dense")(x)
    h = keras.layers.LayerNormalization(epsilon=1e-12, name="layer_norm")(h)
    h = keras.layers.Reshape((2, 4), name="reshape")(h)
    h = keras.layers.GroupNormalization(groups=2, epsilon=1e-12, name="group_norm")(h)
    h = keras.layers.Masking(mask_value=-1e9, name="masking")(h)
    model = keras.Model(x, h)
    rows = [np.random.default_rng(0).standard_normal((32, 8)).astype("float32")]
    names = {"dense", "layer_norm", "reshape", "group_norm", "masking"}
    kinds = {(f.layer, f.kind) for f in lint(model, KERAS3, Precision.of("mixed_float16"), rows, names).findings}
    # Keras 3's LayerNormalization computes in float32 inside (checked by running it), GroupNormalization does not.
    assert computes_in_float32(KERAS3, "LayerNormalization", "mixed_float16")
    assert kinds == {("group_norm", "epsilon"), ("masking", "constant")}
    assert lint(model, KERAS3, Precision.of("mixed_bfloat16"), rows, names).findings == ()
