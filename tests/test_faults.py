"""Faults of the machine and of other runs (issue 15): a full disk, two batches of one root,
lock files of killed runs, and a bfloat16 ONNX graph with mixed-type edges."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import keras
import numpy as np
import onnx
import pytest
from conftest import console_script, invoke
from onnx import TensorProto, helper

from mpconvert.onnx.repairs import unify_input_types
from mpconvert.system.errors import MpconvertError
from mpconvert.system.outdir import claimed_output, claimed_root

FAST = ["--policy", "mixed_bfloat16", "--finetune-steps", "0", "--no-speed"]


def small_model(path: Path, units: int = 256) -> Path:
    x = keras.Input((64,), name="features")
    h = keras.layers.Dense(units, activation="relu", name="hidden")(x)
    keras.Model(x, keras.layers.Dense(4, activation="softmax", name="predictions")(h), name="small").save(path)
    return path


# --- a full disk ------------------------------------------------------------------------


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A 96 KB tmpfs: room for a lock file and a staging folder, not for 70k weights in any format."""
    mount = tmp_path / "tiny"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=96k", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=True)


@pytest.mark.parametrize("export", ["savedmodel", "onnx"])
def test_a_full_disk_exits_1_naming_the_path_and_the_room_needed(tmp_path, tiny_filesystem, export):
    model = small_model(tmp_path / "small.keras", units=1024)  # 70k weights: 140 KB in 16 bits
    out = tiny_filesystem / "out"
    result = invoke(model, *FAST, "--export", export, "--out", out)
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 2 and lines[0].startswith("error: cannot write the "), result.output
    assert "No space left on device" in lines[0] and f" to {out}/" in lines[0]  # not the hidden staging folder
    assert "it needs about" in lines[0] and "free there" in lines[0]
    assert lines[1].startswith("  fix: free space")
    assert "report it" not in result.output and "Traceback" not in result.output
    # Nothing partial, no staging folder, and the lock is released.
    assert list(tiny_filesystem.iterdir()) == []
    with claimed_output(out, [], force=False):
        pass


# --- two batches, one root -------------------------------------------------------------------


@pytest.fixture
def manifest(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    for name in ("a", "b"):
        small_model(models / f"{name}.keras", units=16)
    path = tmp_path / "zoo.toml"
    path.write_text(
        '[defaults]\npolicy = "mixed_bfloat16"\nfinetune_steps = 0\nspeed = false\nexport = ["savedmodel"]\n'
        '[[model]]\npath = "models/a.keras"\n[[model]]\npath = "models/b.keras"\n'
    )
    return path


def _wait_for(condition, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def test_a_second_batch_of_a_running_root_is_refused_and_the_first_is_unaffected(tmp_path, manifest):
    root = tmp_path / "root"
    first = subprocess.Popen(
        [console_script(), "batch", str(manifest), "--out", str(root), "--jobs", "1", "--quiet"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lock = tmp_path / ".root.mpconvert-lock"
        _wait_for(lambda: lock.is_file() and lock.read_text().strip() == str(first.pid), "the first batch's claim")
        for extra in ([], ["--resume"], ["--force"]):
            second = subprocess.run(
                [console_script(), "batch", str(manifest), "--out", str(root), *extra],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert second.returncode == 1, second.stderr
            assert f"output root {root} is in use by another mpconvert batch (pid {first.pid})" in second.stderr
        shard = subprocess.run(
            [console_script(), "batch", str(manifest), "--out", str(root), "--shard", "1/2"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert shard.returncode == 1 and f"pid {first.pid}" in shard.stderr
        _, stderr = first.communicate(timeout=600)
    finally:
        first.kill()
    assert first.returncode == 0, stderr
    summary = json.loads((root / "batch.json").read_text())
    assert [job["status"] for job in summary["models"]] == ["passed", "passed"]
    assert not lock.exists()


def test_shards_share_a_root_but_one_shard_runs_once(tmp_path):
    root = tmp_path / "root"
    with claimed_root(root, (1, 2)), claimed_root(root, (2, 2)):
        with pytest.raises(MpconvertError, match=rf"shard 1/2 of output root {root} is in use .*pid {os.getpid()}"):
            with claimed_root(root, (1, 2)):
                pass
        with pytest.raises(MpconvertError, match="is in use by another mpconvert batch"):
            with claimed_root(root):
                pass
    with claimed_root(root):  # all released
        pass
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_lock_files_of_killed_runs_are_removed_by_the_next_run(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a pid that no process has any more
    stale = [tmp_path / ".gone.mpconvert-lock", tmp_path / ".other.mpconvert-lock"]
    for path in stale:
        path.write_text(f"{child.pid}\n")
    alive = tmp_path / ".alive.mpconvert-lock"
    alive.write_text(f"{os.getpid()}\n")
    with claimed_output(tmp_path / "new", [], force=False):
        assert not any(p.exists() for p in stale)
        assert alive.exists()


# --- mixed-type edges in a bfloat16 ONNX graph ---------------------------------------------------------


def _pool_beside_add() -> onnx.ModelProto:
    """What tf2onnx 1.17 writes for NASNet's `AvgPool(h) + h` under bfloat16: the pool's input Cast is
    put on h's output, so the Add and the Concat read a float32 copy beside bfloat16 tensors."""
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=TensorProto.BFLOAT16),
        helper.make_node("Cast", ["h"], ["h_f32"], to=TensorProto.FLOAT, name="pool_cast"),
        helper.make_node("AveragePool", ["h_f32"], ["pooled"], kernel_shape=[1, 1]),
        helper.make_node("Cast", ["pooled"], ["pooled16"], to=TensorProto.BFLOAT16),
        helper.make_node("Add", ["pooled16", "h_f32"], ["sum"], name="add"),
        helper.make_node("Concat", ["sum", "h_f32"], ["joined"], axis=1, name="concat"),
        helper.make_node("Cast", ["joined"], ["y"], to=TensorProto.FLOAT),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 3, 3])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_mixed_type_inputs_are_brought_to_the_16bit_type_exactly():
    proto = _pool_beside_add()
    with pytest.raises((onnx.checker.ValidationError, onnx.shape_inference.InferenceError)):
        onnx.checker.check_model(proto, full_check=True)
    notes = unify_input_types(proto)
    assert notes and "2 input(s) read their 16-bit source again" in notes[0] and "0 cast" in notes[0]
    onnx.checker.check_model(proto, full_check=True)
    by_name = {n.name: n for n in proto.graph.node}
    assert list(by_name["add"].input) == ["pooled16", "h"] and list(by_name["concat"].input) == ["sum", "h"]
    assert unify_input_types(proto) == []  # nothing left to do
    # Same numbers as TensorFlow's bfloat16 Add: (pool(h) + h) with h rounded once.
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(0).standard_normal((1, 2, 3, 3)).astype(np.float32)
    (y,) = ReferenceEvaluator(proto).run(None, {"x": x})
    import ml_dtypes

    h = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    expected = np.concatenate([(h + h).astype(ml_dtypes.bfloat16).astype(np.float32), h], axis=1)
    np.testing.assert_array_equal(y, expected)


# --- a Ctrl-C that a library swallows ----------------------------------------------------------


def test_a_swallowed_ctrl_c_still_keeps_the_output_from_appearing(tmp_path):
    import signal

    from mpconvert.system import interrupts
    from mpconvert.system.outdir import staged_output

    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    interrupts.install()
    try:
        out = tmp_path / "out"
        with pytest.raises(KeyboardInterrupt):
            with staged_output(out) as staging:
                (staging / "report.json").write_text("{}")
                try:  # what a bare `except:` in a library does to Ctrl-C
                    signal.raise_signal(signal.SIGINT)
                except BaseException:
                    pass
        assert not out.exists() and list(tmp_path.iterdir()) == []
    finally:
        interrupts.forget()
        signal.signal(signal.SIGINT, before[0])
        signal.signal(signal.SIGTERM, before[1])
