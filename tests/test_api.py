"""The Python API: the README example, one code path with the CLI, and its promises.

convert() writes nothing, prints nothing, leaves the model and Keras's
global policy as it found them; import mpconvert and check() never import
TensorFlow; every data form the README lists is accepted.
"""

import json
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
import tensorflow as tf
import tf_keras
import tiny_models
from click.testing import CliRunner
from conftest import REPO, SAMPLES
from reports import make_report, stored

import mpconvert
from mpconvert.cli import cli

DIGITS = SAMPLES / "data" / "digits.npz"
CANCER = SAMPLES / "data" / "breast_cancer.npz"
# Measured, not compared: they differ from run to run. File sizes differ by
# a few bytes too: TensorFlow numbers the traced functions it writes per process.
TIMED = ("timings", "speed")
TIMED_FINETUNE = ("seconds", "step_time", "step_time_ratio")


def readme_example() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("## Python API", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_example_runs_verbatim(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(readme_example(), "README.md", "exec"), namespace)
    conv, report, model = namespace["conv"], namespace["report"], namespace["model"]
    assert conv.passed and report["passed"]
    # The Dense layers compute in bfloat16, the softmax head in float32.
    policies = {layer.name: layer.dtype_policy.name for layer in conv.model.layers}
    assert "mixed_bfloat16" in policies.values()
    assert [(d.policy, d.pinned) for d in conv.layers][-1] == ("float32", "model output (softmax split from Dense)")
    # The original is untouched: still float32 everywhere.
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}
    assert [a["kind"] for a in report["artifacts"]] == ["savedmodel", "keras", "onnx"]
    out = tmp_path / "converted_model"
    assert (out / "report.json").is_file() and (out / "model.onnx").is_file()
    assert json.loads((out / "report.json").read_text())["passed"] is True
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("True ")
    assert printed[-1] == "True ['savedmodel', 'keras', 'onnx']"


def comparable(report: dict) -> dict:
    report = json.loads(json.dumps(report))
    for key in TIMED:
        report.pop(key)
    if report["finetune"]:
        for key in TIMED_FINETUNE:
            report["finetune"].pop(key)
    for artifact in report["artifacts"]:
        artifact["bytes"] = pytest.approx(artifact["bytes"], rel=0.01)
        artifact.pop("sha256")  # the same few bytes of traced-function names differ
    report["provenance"].pop("command")  # the API has none
    if report["slow_kernel"]:  # its figures are timings; what was found and done is what must agree
        report["slow_kernel"] = {key: report["slow_kernel"][key] for key in ("done", "cached")}
        report["slow_kernel"]["cached"] = None  # the second run reads the first one's probe from the cache
    return report


@pytest.mark.parametrize(
    "model,data,policy",
    [(SAMPLES / "digits_mlp", DIGITS, "mixed_float16"), (SAMPLES / "cancer_mlp.keras", CANCER, "mixed_bfloat16")],
    ids=["digits_mlp-savedmodel", "cancer_mlp-keras"],
)
def test_the_cli_and_the_api_give_the_same_report(tmp_path, model, data, policy):
    cli_out, api_out = tmp_path / "cli", tmp_path / "api"
    result = CliRunner().invoke(cli, [str(model), "--policy", policy, "--data", str(data), "--out", str(cli_out)])
    assert result.exit_code == 0, result.output
    conv = mpconvert.convert(str(model), policy, data=str(data))
    saved = conv.save(api_out)
    from_cli = json.loads((cli_out / "report.json").read_text())
    from_api = json.loads((api_out / "report.json").read_text())
    assert saved == from_api and from_cli["finetune"]["steps"] == 100
    assert comparable(from_cli) == comparable(from_api)


def test_import_mpconvert_does_not_import_tensorflow():
    code = "import mpconvert, sys; assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules; print(mpconvert.__version__)"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert re.fullmatch(r"\d+\.\d+\.\d+\S*", proc.stdout.strip())


def test_check_rejudges_a_report_without_tensorflow(tmp_path):
    report = stored(make_report(validation={"reference": 0.95, "converted": 0.94, "drop": 0.01, "max_drop": 0.01}))
    path = tmp_path / "report.json"
    path.write_text(json.dumps(report))
    code = (
        "import mpconvert, sys\n"
        f"strict = mpconvert.check({str(path)!r}, max_drop=0.005)\n"
        f"loose = mpconvert.check({str(path)!r})\n"
        "assert 'tensorflow' not in sys.modules\n"
        "print(strict['passed'], loose['passed'], strict['gate']['thresholds']['max_drop'])\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    # drop 0.01 against the default budget 0.01 passes; against 0.005 it fails
    assert proc.stdout.split() == ["False", "True", "0.005"]


def test_python_m_mpconvert_is_the_command(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mpconvert", "--help"], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # The main form's own options, then the other commands.
    assert "Usage: mpconvert [OPTIONS] MODEL" in proc.stdout
    for option in ("--policy", "--data", "--out", "--max-drop", "--opset"):
        assert option in proc.stdout
    commands = proc.stdout.split("Other commands (", 1)[1].splitlines()[1:]
    listed = [line.split()[0] for line in commands if line.startswith("  ") and not line.startswith("   ")]
    assert sorted(listed) == ["batch", "batch-merge", "check", "doctor", "inspect", "replay", "sign", "verify"]


def trained_mlp(K, rows=300, seed=0):
    K.utils.set_random_seed(seed)
    model = tiny_models.mlp(K, inputs=8, classes=3)
    x, _ = tiny_models.classification_data(rows, 8, 3, seed)
    y = (x[:, 0] > 0).astype("int64") + (x[:, 1] > 0.5)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    model.fit(x, y, epochs=30, verbose=0)
    return model, x, y


@pytest.mark.parametrize("K", [keras, tf_keras], ids=["keras3", "tf_keras"])
def test_convert_leaves_model_policy_and_disk_alone_and_prints_nothing(K, tmp_path, monkeypatch, capsys):
    model, x, y = trained_mlp(K)
    weights = [w.copy() for w in model.get_weights()]
    before_policy = K.mixed_precision.global_policy().name
    monkeypatch.chdir(tmp_path)
    stages = []
    conv = mpconvert.convert(model, "mixed_float16", data=(x, y), on_stage=stages.append)
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""
    assert list(tmp_path.iterdir()) == []
    assert K.mixed_precision.global_policy().name == before_policy
    assert all(np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))
    assert {layer.dtype_policy.name for layer in model.layers} == {"float32"}
    # The kernel probe's finding (mixed_float16 on an AMX Xeon) makes the model's own kernel check moot.
    probed = (conv.report["slow_kernel"] or {}).get("found", {}).get("what", "").startswith("one fused Dense")
    assert stages == [
        "load",
        "kernel probe",
        "lint",
        "rewrite",
        *([] if probed else ["kernel check"]),
        "validate",
        "pad",
        "speed",
    ]  # no training split: no fine-tune
    assert conv.passed and conv.report["validation"]["rows"] == 300 and conv.report["artifacts"] == []
    assert conv.report["source"]["format"] == "object" and conv.report["source"]["path"] is None
    hidden = conv.model.get_layer("hidden")
    assert hidden.dtype_policy.name == "mixed_float16" and hidden.units == 16  # 16 is already a multiple of 8
    # The converted model predicts the same classes as the original on clear rows.
    same = conv.model.predict(x, verbose=0).argmax(1) == model.predict(x, verbose=0).argmax(1)
    assert same.mean() >= 0.97


def test_every_data_form_gives_the_same_validation():
    model, x, y = trained_mlp(keras)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
    forms = {
        "arrays": (x, y),
        "train_and_validation": ((x[:100], y[:100]), (x, y)),
        "dataset": dataset,
        "datasets": (dataset.take(1), dataset),
    }
    results = {}
    for name, data in forms.items():
        # speed=False: only the validation is compared, and four timings would add seconds each.
        conv = mpconvert.convert(model, "mixed_bfloat16", data=data, finetune_steps=0, pad_multiple=0, speed=False)
        results[name] = conv.report["validation"]
    # The training parts here are copies of validation rows, and the leakage check counts them.
    overlaps = {name: v.pop("overlap") for name, v in results.items()}
    assert overlaps["arrays"] is None and overlaps["dataset"] is None
    assert (overlaps["train_and_validation"]["in_train"], overlaps["datasets"]["in_train"]) == (100, 64)
    first = results["arrays"]
    assert first["rows"] == 300 and first["metric"] == "accuracy"
    for name, validation in results.items():
        assert validation == first, name


def test_several_inputs_by_list_and_by_dict():
    keras.utils.set_random_seed(0)
    left, right = keras.Input((4,), name="left"), keras.Input((3,), name="right")
    h = keras.layers.Concatenate()([keras.layers.Dense(8, name="l")(left), keras.layers.Dense(8, name="r")(right)])
    model = keras.Model([left, right], keras.layers.Dense(2, activation="softmax", name="out")(h))
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(40, 4)).astype("float32"), rng.normal(size=(40, 3)).astype("float32")
    y = rng.integers(0, 2, 40)
    by_list = mpconvert.convert(model, "mixed_float16", data=([a, b], y), pad_multiple=0)
    by_dict = mpconvert.convert(model, "mixed_float16", data=({"right": b, "left": a}, y), pad_multiple=0)
    assert by_list.report["validation"] == by_dict.report["validation"]
    assert by_list.report["validation"]["rows"] == 40


def test_data_function_does_not_leave_the_current_folder_on_sys_path(tmp_path, monkeypatch):
    (tmp_path / "apidata.py").write_text(
        "import numpy as np\n"
        "def load():\n"
        "    rng = np.random.default_rng(0)\n"
        "    return None, (rng.normal(size=(20, 8)).astype('float32'), rng.integers(0, 3, 20))\n"
    )
    monkeypatch.chdir(tmp_path)
    before = list(sys.path)
    model = tiny_models.mlp(keras)
    conv = mpconvert.convert(model, "mixed_float16", data="apidata:load", pad_multiple=0)
    assert conv.report["validation"]["rows"] == 20 and conv.report["validation"]["data"] == "callable"
    assert sys.path == before


def test_inspect_returns_the_plan_without_converting():
    found = mpconvert.inspect(SAMPLES / "cancer_mlp.keras", "mixed_bfloat16")
    assert found.source["format"] == "keras" and found.source["loader"] == "keras"
    decisions = {d.name: (d.policy, d.pinned) for d in found.layers}
    assert ("float32", "input layer") in decisions.values()
    assert any(policy == "mixed_bfloat16" for policy, _ in decisions.values())
    assert found.padding is not None and found.padding.multiple == 8


@pytest.mark.parametrize(
    "keywords,needle",
    [
        ({"max_drop": -1}, "max_drop=-1"),
        ({"min_agreement": 2}, "min_agreement=2"),
        ({"atol": {"tflite": 1e-3}}, "'tflite'"),
        ({"finetune_steps": -5}, "finetune_steps=-5"),
        ({"pad_multiple": -8}, "pad_multiple=-8"),
        ({"metric": "f1"}, "metric='f1'"),
        ({"data": 3}, "int"),
    ],
)
def test_bad_api_values_raise_one_clear_error(keywords, needle):
    with pytest.raises(mpconvert.MpconvertError) as caught:
        mpconvert.convert(tiny_models.mlp(keras), "mixed_float16", **keywords)
    assert needle in caught.value.message and caught.value.hint


def test_unknown_policy_and_model_object_are_refused():
    with pytest.raises(mpconvert.MpconvertError, match="unknown policy 'float16'"):
        mpconvert.convert(tiny_models.mlp(keras), "float16")
    with pytest.raises(mpconvert.MpconvertError, match="neither a path nor a Keras model"):
        mpconvert.convert(object(), "mixed_float16")


def test_save_refuses_an_occupied_folder_and_force_replaces_it(tmp_path):
    model, x, y = trained_mlp(keras)
    conv = mpconvert.convert(model, "mixed_bfloat16", data=(x, y), pad_multiple=0, speed=False)  # save() is the subject
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.txt").write_text("keep me")
    with pytest.raises(mpconvert.MpconvertError, match="not empty"):
        conv.save(out, export=["savedmodel"])
    assert (out / "old.txt").read_text() == "keep me"
    report = conv.save(out, export=["savedmodel"], force=True)
    assert not (out / "old.txt").exists() and [a["kind"] for a in report["artifacts"]] == ["savedmodel", "keras"]
    assert conv.report == report and "export" in report["timings"]


def test_summary_names_the_format_and_framework(tmp_path):
    out = tmp_path / "o"
    result = CliRunner().invoke(
        cli,
        [
            str(SAMPLES / "cancer_mlp.keras"),
            "--policy",
            "mixed_bfloat16",
            "--data",
            str(CANCER),
            "--out",
            str(out),
            "--export",
            "savedmodel",
            "--finetune-steps",
            "0",
            "--no-speed",  # only the summary's first line is read
        ],
    )
    assert result.exit_code == 0, result.output
    # (a "warning:" line may come first on hardware without bfloat16 units)
    first = next(line for line in result.output.splitlines() if line.startswith("mpconvert "))
    assert first.endswith("cancer_mlp.keras (.keras file, Keras 3) -> mixed_bfloat16"), first


def test_opset_option_reaches_the_onnx_file(tmp_path):
    import onnx

    out = tmp_path / "o"
    result = CliRunner().invoke(
        cli,
        [
            str(SAMPLES / "cancer_mlp.keras"),
            "--policy",
            "mixed_float16",
            "--data",
            str(CANCER),
            "--out",
            str(out),
            "--export",
            "onnx",
            "--finetune-steps",
            "0",
            "--opset",
            "13",
            "--no-speed",  # only the file's opset is read
        ],
    )
    assert result.exit_code == 0, result.output
    proto = onnx.load(out / "model.onnx")
    assert [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")] == [13]
    report = json.loads((out / "report.json").read_text())
    assert report["artifacts"][0]["details"]["opset"] == 13
    assert (
        CliRunner()
        .invoke(cli, [str(SAMPLES / "cancer_mlp.keras"), "--policy", "mixed_float16", "--opset", "19"])
        .exit_code
        == 2
    )
