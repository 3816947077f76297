"""Models over the size where the ONNX file keeps its weights in external data, shown on tiny models whose
threshold is lowered through the export's own parameter (`external_data_over`, `--onnx-external-data`).

The external path traces the weights as inputs and writes them one at a time to model.onnx.data; the file
it writes must be the one-file export's graph and weights, checked by path, served by ONNX Runtime with the
same outputs, recorded in report.json with the data file's sha256, and verified with it.
"""

import hashlib
import json
from collections import Counter

import keras
import large_models
import numpy as np
import onnx
import pytest
import tensorflow as tf
from conftest import invoke
from onnx import TensorProto

from mpconvert.data.signature import generate_inputs, signature_of
from mpconvert.export.artifacts import write_checked
from mpconvert.keras.frameworks import KERAS3
from mpconvert.keras.rewrite import rewrite
from mpconvert.onnx.export import keras_to_onnx
from mpconvert.onnx.graph_checks import TooLarge
from mpconvert.options.artifact_kinds import ArtifactKind
from mpconvert.options.rewrite import RewriteOptions
from mpconvert.runners.onnx import open_session
from mpconvert.system.errors import MpconvertError

POLICY = "mixed_float16"  # ONNX Runtime's CPU provider runs float16 files as written (not bfloat16 ones)


def conv_net(K):
    x = K.Input((8, 8, 3), name="x")
    h = K.layers.Conv2D(16, 3, activation="relu", name="conv")(x)
    h = K.layers.GlobalAveragePooling2D()(h)
    return K.Model(x, K.layers.Dense(4, activation="softmax", name="probs")(h))


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("build", [large_models.dense_stack, conv_net], ids=["dense", "conv"])
def test_external_data_file_is_the_one_file_export_split(tmp_path, build):
    model = build(keras)
    signature = signature_of(model)
    rows = generate_inputs(model, signature, 8, 0)
    converted = rewrite(model, KERAS3, RewriteOptions(POLICY), rows).model
    specs = [tf.TensorSpec(s.shape, s.dtype, name=s.name) for s in signature.inputs]

    one = keras_to_onnx(converted, specs, tmp_path / "one.onnx")
    split = keras_to_onnx(converted, specs, tmp_path / "split.onnx", external_data_over=1024)

    assert one.external_data == ()
    assert split.external_data == ("split.onnx.data",)
    data = tmp_path / "split.onnx.data"
    assert split.bytes == (tmp_path / "split.onnx").stat().st_size + data.stat().st_size
    graph = onnx.load(tmp_path / "split.onnx", load_external_data=False).graph
    external = [t for t in graph.initializer if t.data_location == TensorProto.EXTERNAL]
    assert external and {e.value for t in external for e in t.external_data if e.key == "location"} == {data.name}
    # Stored in 16 bits, as the one-file export folds them: the Casts were applied before writing.
    assert {t.data_type for t in external} == {TensorProto.FLOAT16}
    assert split.initializer_dtypes == one.initializer_dtypes
    assert Counter(n.op_type for n in graph.node) == Counter(
        n.op_type for n in onnx.load(tmp_path / "one.onnx").graph.node
    )
    onnx.checker.check_model(str(tmp_path / "split.onnx"), full_check=True)  # by path: finds the data file

    feeds = {spec.name: x for spec, x in zip(signature.inputs, rows)}
    expected = open_session(tmp_path / "one.onnx").run(None, feeds)
    got = open_session(tmp_path / "split.onnx").run(None, feeds)
    for e, g in zip(expected, got):
        np.testing.assert_array_equal(g, e)  # the same weights, bit for bit


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    base = tmp_path_factory.mktemp("large")
    large_models.dense_stack(keras).save(base / "m.keras")
    out = base / "out"
    result = invoke(
        base / "m.keras", "--policy", POLICY, "--export", "onnx,savedmodel", "--onnx-external-data", "1024",
        "--out", out, "--no-speed",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "model.onnx + model.onnx.data (external data)" in result.output
    return out


def verified(folder):
    result = invoke("verify", folder, "--artifacts", "onnx", "--json")
    return result.exit_code, {c["name"]: c for c in json.loads(result.stdout)["checks"]}


def test_report_records_the_data_file_and_verify_checks_it(converted, tmp_path):
    report = json.loads((converted / "report.json").read_text())
    onnx_artifact = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    data = converted / "model.onnx.data"
    assert onnx_artifact["external_data"] == [
        {"path": "model.onnx.data", "bytes": data.stat().st_size, "sha256": sha256(data)}
    ]
    assert onnx_artifact["bytes"] == (converted / "model.onnx").stat().st_size + data.stat().st_size
    assert onnx_artifact["sha256"] == sha256(converted / "model.onnx")

    code, checks = verified(converted)
    assert code == 0, checks
    assert checks["hash: model.onnx.data"]["passed"] and checks["runs: onnx"]["passed"]

    copy = tmp_path / "copy"
    import shutil

    shutil.copytree(converted, copy)
    raw = bytearray((copy / "model.onnx.data").read_bytes())
    raw[0] ^= 0xFF  # a flipped bit in the first weight
    (copy / "model.onnx.data").write_bytes(bytes(raw))
    code, checks = verified(copy)
    assert code == 3
    assert "has changed" in checks["hash: model.onnx.data"]["message"]
    assert checks["hash: model.onnx"]["passed"]
    assert checks["runs: onnx"]["message"].startswith("not run: model.onnx.data has changed")

    (copy / "model.onnx.data").unlink()
    code, checks = verified(copy)
    assert code == 3
    assert checks["hash: model.onnx.data"]["message"] == "model.onnx.data is missing"
    assert not checks["runs: onnx"]["passed"]


def test_a_size_limit_stops_the_run_while_another_failure_fails_only_its_artifact(tmp_path):
    path = tmp_path / "model.onnx"

    def half_written(error):
        def write(p):
            p.write_bytes(b"graph")
            (tmp_path / "model.onnx.data").write_bytes(b"weights")
            raise error

        return write

    with pytest.raises(TooLarge):
        write_checked([(ArtifactKind.ONNX, path, half_written(TooLarge("too large", hint="h")))], [], 0)
    [failed] = write_checked([(ArtifactKind.ONNX, path, half_written(MpconvertError("bad", hint="h")))], [], 0)
    assert failed.failed and failed.reason == "bad; fix: h"
    assert not path.exists() and not (tmp_path / "model.onnx.data").exists()  # nothing half-written is left


@pytest.mark.full
def test_a_model_over_2_gib_converts_with_external_data(tmp_path):
    """The user report's model: 553.8M float32 parameters (2.22 GB) under mixed_bfloat16 (about 7 GB of memory)."""
    inputs, width, layers = large_models.WIDE
    model = large_models.dense_stack(keras, inputs=inputs, width=width, layers=layers, classes=10)
    assert large_models.weight_bytes(model) > 2**31
    model.save(tmp_path / "big.keras")
    del model
    out = tmp_path / "out"
    result = invoke(tmp_path / "big.keras", "--policy", "mixed_bfloat16", "--export", "onnx,savedmodel", "--out", out)
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    onnx_artifact = next(a for a in report["artifacts"] if a["kind"] == "onnx")
    assert onnx_artifact["external_data"][0]["path"] == "model.onnx.data"
    assert onnx_artifact["details"]["initializer_dtypes"].get("BFLOAT16")
    assert (out / "model.onnx.data").stat().st_size > 2**30  # 16-bit weights: about half the float32 model
