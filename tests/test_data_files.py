"""Hostile `.npz` data files: members that are huge, lie about their size, or are damaged.

Every file is built small inside the test. Loading must read only the keys
the model uses, check each member's header before reading its data, and
turn every failure the file causes into one MpconvertError.
"""

import json
import os
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest
from conftest import console_script

from mpconvert.data import npz as npz_reader
from mpconvert.data import rows as data
from mpconvert.data.rows import Task, load_npz
from mpconvert.data.signature import Signature, TensorSpec
from mpconvert.system.errors import MpconvertError

REPO = Path(__file__).resolve().parent.parent
DIGITS_CNN = REPO / "sample_models" / "digits_cnn.keras"  # input "pixels" (n, 64), softmax over 10 classes
FAST = ["--policy", "mixed_float16", "--export", "savedmodel"]

# Like digits_cnn: one (n, 64) float32 input, softmax over 10 classes.
SIGNATURE = Signature((TensorSpec("pixels", (None, 64), "float32"),), (TensorSpec("dense", (None, 10), "float32"),))
TASK = Task("softmax", SIGNATURE.outputs[0])
JUNK_BYTES = 2**30  # 1 GiB of zeros, about 4.5 MB deflated
HUGE_ROWS = 2**38  # (2**38, 64) float32 is 64 TiB


def valid_arrays(rows: int = 20) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {"x": rng.standard_normal((rows, 64)).astype(np.float32), "y": rng.integers(0, 10, rows)}


def write_npz(path: Path, arrays: dict, *, declared: dict = (), zeros: dict = ()) -> Path:
    """An .npz of real `arrays`, plus members whose header says `declared[key]`
    (shape, float32) followed by `zeros[key]` zero bytes, however many that is."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for key, array in arrays.items():
            with archive.open(f"{key}.npy", "w") as fp:
                np.lib.format.write_array(fp, np.asarray(array))
        for key, shape in dict(declared).items():
            with archive.open(f"{key}.npy", "w", force_zip64=True) as fp:
                np.lib.format.write_array_header_2_0(fp, {"descr": "<f4", "fortran_order": False, "shape": shape})
                left = dict(zeros).get(key, 0)
                chunk = bytes(min(left, 2**22))
                while left > 0:
                    fp.write(chunk[:left])
                    left -= len(chunk)
    return path


def refused(path: Path, *needles: str, signature: Signature = SIGNATURE) -> MpconvertError:
    with pytest.raises(MpconvertError) as caught:
        load_npz(path, signature, TASK)
    for needle in needles:
        assert needle in str(caught.value), f"{needle!r} not in {caught.value}"
    return caught.value


# --- members that are never used are never read -------------------------------

MEASURE = """
import json, sys, tracemalloc
from pathlib import Path
from mpconvert.data.rows import Task, load_npz
from mpconvert.system.errors import MpconvertError
from mpconvert.data.signature import Signature, TensorSpec

path = Path(sys.argv[1])
output = TensorSpec("dense", (None, 10), "float32")
one_input = Signature((TensorSpec("pixels", (None, 64), "float32"),), (output,))
two_inputs = Signature(
    (TensorSpec("left", (None, 64), "float32"), TensorSpec("right", (None, 3), "float32")), (output,)
)
tracemalloc.start()
rows = load_npz(path, one_input, Task("softmax", output)).validation.rows
try:
    load_npz(path, two_inputs, Task("softmax", output))
    message = None
except MpconvertError as exc:
    message = exc.message
print(json.dumps({"rows": rows, "message": message, "peak": tracemalloc.get_traced_memory()[1]}))
"""


def test_unused_huge_member_is_never_decompressed(tmp_path):
    path = write_npz(
        tmp_path / "data.npz", valid_arrays(), declared={"junk": (JUNK_BYTES // 4,)}, zeros={"junk": JUNK_BYTES}
    )
    assert path.stat().st_size < JUNK_BYTES // 100
    # A fresh process, so the peak is this load's own; tracemalloc sees numpy's buffers.
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.splitlines()[-1])
    assert result["rows"] == 20
    # Keys are still listed, from the zip directory rather than by reading them.
    assert "has no key 'left' (it has: junk, x, y)" in result["message"]
    assert result["peak"] < JUNK_BYTES // 64, f"peak {result['peak']} bytes: the unused member was read"


def test_unused_member_with_a_lying_header_is_ignored(tmp_path):
    path = write_npz(tmp_path / "data.npz", valid_arrays(), declared={"notes": (HUGE_ROWS, 64)})
    assert load_npz(path, SIGNATURE, TASK).validation.rows == 20


# --- used members are checked before their data is read -----------------------


def test_header_claiming_64_tib_is_refused_without_allocating(tmp_path):
    arrays = valid_arrays()
    del arrays["x"]
    path = write_npz(tmp_path / "data.npz", arrays, declared={"x": (HUGE_ROWS, 64)}, zeros={"x": 16})
    refused(path, "'x'", "(274877906944, 64)", "float32", "truncated")


def test_header_beyond_any_integer_type_is_refused(tmp_path):
    arrays = valid_arrays()
    del arrays["x"]
    path = write_npz(tmp_path / "data.npz", arrays, declared={"x": (10**200, 10**200)}, zeros={"x": 16})
    refused(path, "'x'", "truncated")


def test_header_declaring_more_than_the_member_holds_is_refused(tmp_path):
    arrays = valid_arrays()
    del arrays["x"]
    # 20 x 64 float32 is 5120 bytes; only 100 follow the header.
    path = write_npz(tmp_path / "data.npz", arrays, declared={"x": (20, 64)}, zeros={"x": 100})
    error = refused(path, "'x'", "(20, 64)", "truncated", "header does not match")
    assert "np.savez" in error.hint


def test_training_split_is_checked_like_validation(tmp_path):
    arrays = {**valid_arrays(), "y_train": valid_arrays()["y"]}
    path = write_npz(tmp_path / "data.npz", arrays, declared={"x_train": (HUGE_ROWS, 64)}, zeros={"x_train": 16})
    refused(path, "'x_train'", "(274877906944, 64)")


def test_member_larger_than_available_memory_is_refused(tmp_path, monkeypatch):
    assert npz_reader.available_memory() > 0
    path = write_npz(tmp_path / "data.npz", valid_arrays())  # x is 20 x 64 float32: 5120 bytes
    monkeypatch.setattr(npz_reader, "available_memory", lambda: 4096)
    error = refused(path, "'x'", "(20, 64)", "float32", "memory available")
    assert "smaller validation split" in error.hint
    monkeypatch.setattr(npz_reader, "available_memory", lambda: 5120)
    assert load_npz(path, SIGNATURE, TASK).validation.rows == 20


def out_of_memory(*args, **kwargs):
    raise MemoryError


def test_memory_error_while_reading_names_the_key(tmp_path, monkeypatch):
    path = write_npz(tmp_path / "data.npz", valid_arrays())
    monkeypatch.setattr(np.lib.format, "read_array", out_of_memory)
    error = refused(path, "out of memory", "'x'", "(20, 64)")
    assert "smaller validation split" in error.hint


def test_memory_error_while_checking_is_an_mpconvert_error(tmp_path, monkeypatch):
    path = write_npz(tmp_path / "data.npz", valid_arrays())
    monkeypatch.setattr(data, "check_labels", out_of_memory)
    error = refused(path, "out of memory", path.name)
    assert "smaller validation split" in error.hint


# --- anything else a damaged file raises is "cannot read" ------------------------


def corrupt_deflate(path: Path) -> Path:
    """Overwrite part of the first member's deflate stream (zlib.error on reading)."""
    raw = bytearray(path.read_bytes())
    name_len, extra_len = struct.unpack("<HH", raw[26:30])
    start = 30 + name_len + extra_len
    raw[start + 10 : start + 20] = b"\xff" * 10
    path.write_bytes(bytes(raw))
    return path


def plain_npy(path: Path) -> Path:
    """An .npy (not an .npz) given as --data."""
    path = path.with_suffix(".npy")
    np.save(path, valid_arrays()["x"])
    return path


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda p: corrupt_deflate(write_npz(p, valid_arrays())), id="deflate"),
        pytest.param(plain_npy, id="npy"),
    ],
)
def test_damaged_file_is_unreadable(tmp_path, damage):
    path = damage(tmp_path / "data.npz")
    error = refused(path, "cannot read data file", path.name)
    assert "np.savez" in error.hint


def test_object_member_is_refused_without_unpickling(tmp_path):
    path = tmp_path / "data.npz"
    arrays = valid_arrays()
    np.savez(path, x=np.array([list(r) for r in arrays["x"][:-1]] + [[1.0]], dtype=object), y=arrays["y"])
    refused(path, "object arrays", "'x'", "pickl")


# --- end to end, through the installed console script ----------------------------


def test_cli_refuses_a_lying_header_with_one_clean_message(tmp_path):
    arrays = valid_arrays()
    del arrays["x"]
    path = write_npz(tmp_path / "data.npz", arrays, declared={"x": (HUGE_ROWS, 64)}, zeros={"x": 16})
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run(
        [console_script(), str(DIGITS_CNN), *FAST, "--data", str(path), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("error: ") and "'x'" in lines[0] and "(274877906944, 64)" in lines[0], proc.stderr
    assert lines[1].startswith("  fix: "), proc.stderr
    assert "Traceback" not in proc.stderr and "MemoryError" not in proc.stderr
    assert not out.exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out.")]
