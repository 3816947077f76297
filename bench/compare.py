"""mpconvert's exports against mixed models built by hand, as ratios against float32 measured in this run.

The model: Dense(4096) x2 with ReLU on 784 inputs, Dense(10) softmax
(20.0M parameters), batch 256, both policies. Three versions of each:

- float32: the original, exported with `model.export` (SavedModel) and bare
  `tf2onnx.convert.from_keras` (ONNX);
- mpconvert: `mpconvert.convert(model, policy)` then `.save()`, as a user
  would run it (its SavedModel and model.onnx);
- hand-built: what the TensorFlow mixed-precision guide says to write: the
  policy set before building, Dense(10) followed by a float32 softmax, the
  same weights, exported like the float32 one.

For mixed_bfloat16 a fourth, mpconvert unpadded (`pad_multiple=0`), splits
the converted model's cost against the hand-built one into padding's
pad/slice ops and the rest (the casts at the signature, the serving
function's structure). A policy whose kernel the kernel probe finds broken
on this machine (mixed_float16 on an Intel Xeon with AMX and avx512_fp16:
one float16 batch of this model took 77 s) is skipped, with the probe's
figure.

Printed: SavedModel serving-signature speed and ONNX Runtime speed (median
of repeated runs, the versions taking turns; ratio = float32 time / time,
above 1 is faster), and file sizes (bytes / float32 bytes). A file ONNX
Runtime cannot load or run is reported with its error, not timed.
Takes about 2-3 minutes on 2 cores (most of it ONNX exports).
"""

import os
import re
import sys
import tempfile
import time
import warnings
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import tensorflow as tf  # noqa: E402
import tf2onnx  # noqa: E402

import mpconvert  # noqa: E402
from mpconvert.runners.onnx import cuda_usable  # noqa: E402
from mpconvert.speed import median_ms, probe_hardware  # noqa: E402
from mpconvert.system.errors import first_line  # noqa: E402

BATCH, INPUTS, WIDTH, CLASSES = 256, 784, 4096, 10
REPEATS = 10
POLICIES = ("mixed_bfloat16", "mixed_float16")
SPEC = [tf.TensorSpec((None, INPUTS), tf.float32, name="x")]


def build(policy: str = "float32"):
    """The functional model under `policy` (bare tf2onnx cannot read Keras 3 Sequential models)."""
    keras.mixed_precision.set_dtype_policy(policy)
    try:
        x = keras.Input((INPUTS,), name="x")
        h = keras.layers.Dense(WIDTH, activation="relu", name="dense_1")(x)
        h = keras.layers.Dense(WIDTH, activation="relu", name="dense_2")(h)
        h = keras.layers.Dense(CLASSES, name="logits")(h)
        return keras.Model(x, keras.layers.Activation("softmax", dtype="float32", name="predictions")(h))
    finally:
        keras.mixed_precision.set_dtype_policy("float32")


def size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def serving(path: Path, x: np.ndarray):
    """A call of the SavedModel's serving signature on `x`, result fetched."""
    fn = tf.saved_model.load(str(path)).signatures["serving_default"]
    (name,) = fn.structured_input_signature[1]
    feed = tf.constant(x)
    return lambda: [t.numpy() for t in fn(**{name: feed}).values()]


def onnx_run(path: Path, x: np.ndarray, providers: list[str]):
    """A call of the ONNX file in ONNX Runtime, or the reason it cannot run here."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(path), options, providers=providers)
        feed = {session.get_inputs()[0].name: x}
        session.run(None, feed)
    except Exception as exc:  # ONNX Runtime's own classes: INVALID_GRAPH, NOT_IMPLEMENTED, FAIL
        # "[ONNXRuntimeError] : 1 : FAIL : Load model from PATH failed:Type Error: ..." -> "FAIL: Type Error: ..."
        text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : (\w+) : (Load model from \S+ failed:)?", r"\1: ", first_line(exc))
        return text[:110]
    return lambda: session.run(None, feed)


def row(label: str, values: dict[str, float | str], unit: str, faster: bool) -> str:
    """ "label  float32 52.1 ms | mpconvert 32.0 ms (1.63x) | hand-built ..." with ratios against float32."""
    base = values["float32"]
    cells = []
    for name, value in values.items():
        if isinstance(value, str):
            cells.append(f"{name}: {value}")
            continue
        text = f"{name} {value:.1f} {unit}"
        if name != "float32":
            text += f" ({base / value if faster else value / base:.2f}x)"
        cells.append(text)
    return f"  {label:<22}" + " | ".join(cells)


def main() -> None:
    start = time.perf_counter()
    warnings.filterwarnings("ignore")  # Keras's input-structure notes: noise beside the table
    tf.get_logger().setLevel("ERROR")  # retracing notes from mpconvert's validation
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, INPUTS)).astype(np.float32)
    keras.utils.set_random_seed(0)
    original = build()
    providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if cuda_usable() else ["CPUExecutionProvider"]
    print(
        f"Dense({WIDTH})x2 on {INPUTS} inputs ({original.count_params() / 1e6:.1f}M parameters), batch {BATCH}, "
        f"{probe_hardware().device}, {os.cpu_count()} cores; ONNX Runtime on {providers[0]}"
    )
    print("speed: median ms, ratio = float32 ms / ms (above 1 is faster); size: MB, ratio = bytes / float32 bytes")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        files = {"float32": (tmp / "float32_savedmodel", tmp / "float32.onnx")}
        original.export(str(files["float32"][0]), verbose=False)
        tf2onnx.convert.from_keras(original, input_signature=SPEC, opset=17, output_path=str(files["float32"][1]))
        from mpconvert.speed import kernel_probe
        from mpconvert.speed.slow_kernel import threshold

        probed = kernel_probe.start(POLICIES).result()
        for policy in POLICIES:
            if probed[policy].is_slow(threshold()):
                print(f"{policy}: skipped, a broken kernel here (kernel probe: {probed[policy].slower:g}x float32)")
                continue
            out = tmp / policy
            conversion = mpconvert.convert(original, policy)
            conversion.save(out / "mpconvert", export=("savedmodel", "onnx"))
            hand = build(policy)
            hand.set_weights(original.get_weights())
            hand.export(str(out / "hand_savedmodel"), verbose=False)
            try:
                tf2onnx.convert.from_keras(hand, input_signature=SPEC, opset=17, output_path=str(out / "hand.onnx"))
                hand_onnx = out / "hand.onnx"
            except Exception as exc:  # tf2onnx's own failure is a finding, not a crash of the benchmark
                hand_onnx = f"tf2onnx failed: {first_line(exc)[:120]}"
            versions = {
                "float32": files["float32"],
                "mpconvert": (out / "mpconvert" / "savedmodel", out / "mpconvert" / "model.onnx"),
                "hand-built": (out / "hand_savedmodel", hand_onnx),
            }
            if policy == "mixed_bfloat16":
                mpconvert.convert(original, policy, pad_multiple=0).save(
                    out / "unpadded", export=("savedmodel", "onnx")
                )
                versions["unpadded"] = (out / "unpadded" / "savedmodel", out / "unpadded" / "model.onnx")
            print(policy)
            saved = median_ms({name: serving(paths[0], x) for name, paths in versions.items()}, repeats=REPEATS)
            print(row("SavedModel serving", saved, "ms", faster=True))
            runs = {
                name: onnx_run(p[1], x, providers) if isinstance(p[1], Path) else p[1] for name, p in versions.items()
            }
            timed = median_ms({name: r for name, r in runs.items() if callable(r)}, repeats=REPEATS)
            onnx = {name: timed[name] if callable(r) else f"not run ({r})" for name, r in runs.items()}
            print(row("ONNX Runtime", onnx, "ms", faster=True))
            print(row("SavedModel size", {n: size(p[0]) / 2**20 for n, p in versions.items()}, "MB", faster=False))
            sizes = {n: size(p[1]) / 2**20 if isinstance(p[1], Path) else "no file" for n, p in versions.items()}
            print(row("ONNX size", sizes, "MB", faster=False))
    print(f"({time.perf_counter() - start:.0f} s in all)")


if __name__ == "__main__":
    main()
